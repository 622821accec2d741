package app

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// The web console (server.console): pages rendered by html/template from
// embedded files, one embedded script and style sheet, no external assets.
//
// Security model:
//   - Reads. The console follows the API's read policy unless
//     server.console_auth says otherwise: unset, it is "none" with
//     server.public_read and "token" without (config.Server.ConsoleReadAuth).
//     With "none" the pages render their data for anyone who can reach the
//     listener. With "token" a page requested without the admin token is
//     its empty shell (401, no data; 403 when no token is configured); the
//     shell's script, given the token once (kept in the tab's
//     sessionStorage, never in a cookie), fetches the same URL with
//     Authorization: Bearer and swaps the rendered content in.
//   - Actions (replay, purge, reload) are POST/DELETE requests to /ui/api/...
//     with a JSON body: they need Content-Type: application/json (a form or
//     a "simple" cross-site request cannot send it without a CORS
//     preflight, which this server never grants) and the admin token as a
//     bearer token. No cookie carries authority, so a cross-site page has
//     nothing to ride on.
//   - Everything the pages show is escaped by html/template; the script
//     never builds markup from data (it moves nodes the server rendered, and
//     writes messages with textContent). The pages send a strict
//     Content-Security-Policy: scripts and styles from this origin only, no
//     inline script, no framing.

//go:embed console
var consoleFiles embed.FS

const (
	// consoleSampleEvery is the sampling interval of the sparklines' ring
	// buffer, consoleSamples its length: 15 minutes.
	consoleSampleEvery = 10 * time.Second
	consoleSamples     = int(15 * time.Minute / consoleSampleEvery)
	// consoleListLimit is the dead-letter page size of the console.
	consoleListLimit = 50
	// consoleRefresh is how often the overview refreshes itself, seconds.
	consoleRefresh = 5
	// consoleShownBytes caps the pretty-printed entry shown on a dead
	// letter's page; the rest is cut (the API shows it whole).
	consoleShownBytes = 256 << 10
)

// consoleCSP is the pages' Content-Security-Policy: nothing but this
// origin's script and style sheet, no inline script or style, no framing,
// forms and fetches to this origin only.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// consolePages holds each page's template (the layout plus the page);
// parsed once, read-only afterwards.
var consolePages = func() map[string]*template.Template {
	funcs := template.FuncMap{
		"ts":   consoleTime,
		"ago":  consoleAgo,
		"num":  consoleNum,
		"qs":   func(v url.Values) string { return v.Encode() },
		"json": consoleJSON,
		"path": url.PathEscape,
		"kinds": func() []string {
			return []string{string(deadletter.KindFailed), string(deadletter.KindParked), string(deadletter.KindGap)}
		},
	}
	out := map[string]*template.Template{}
	for _, p := range []string{"overview", "deadletters", "deadletter", "rules"} {
		out[p] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(consoleFiles, "console/layout.html", "console/"+p+".html"))
	}
	return out
}()

func consoleTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func consoleAgo(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String() + " ago"
}

func consoleNum(f float64) string {
	switch {
	case math.IsNaN(f):
		return "—"
	case f >= 100 || f == math.Trunc(f):
		return strconv.FormatFloat(f, 'f', 0, 64)
	case f >= 10:
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'f', 2, 64)
}

// consoleJSON renders a BSON document as relaxed Extended JSON, for
// display.
func consoleJSON(raw bson.Raw) string {
	if len(raw) == 0 {
		return ""
	}
	b, err := bson.MarshalExtJSON(raw, false, false)
	if err != nil {
		return "(unprintable: " + err.Error() + ")"
	}
	return string(b)
}

// consolePage is what a page's template renders.
type consolePage struct {
	Title string
	Nav   string // overview, deadletters, rules
	// Locked is set when the page's data needs the admin token and the
	// request carried none: the template renders the shell only.
	Locked bool
	// NoToken is set with Locked when no admin token is configured: no
	// token can unlock the page (the API refuses reads too).
	NoToken  bool
	Auth     string // server.console_auth, as in effect (ConsoleReadAuth)
	Refresh  int    // seconds between self-refreshes; 0: none
	Instance string
	Error    string

	Overview    *consoleOverview
	DeadLetters *consoleDeadLetters
	Entry       *consoleEntry
	Rules       *consoleRules
}

// Health colours of the overview.
const (
	healthGreen = "green"
	healthAmber = "amber"
	healthRed   = "red"
)

type consoleOverview struct {
	Ready   bool
	Cluster bool
	Members []string
	Reason  string
	Sources []consoleSource
	Sinks   []consoleSink
	// Memory is the byte budget line: held / budget, where it comes from,
	// and whether reading is held back by it.
	Memory consoleMemory
}

type consoleMemory struct {
	Inflight, Budget, From string
	Percent                int64
	HeldBack               bool
}

type consoleSource struct {
	Name, Source, State, Health, Reason string
	Owner                               string
	CheckpointTime                      time.Time
	LagSeconds                          float64
	EventsPerSec                        float64 // NaN until two samples exist
	InFlight                            int
	Lag, Rate                           spark
}

type consoleSink struct {
	Name, State, Health, Reason, LastError, Circuit string
	Queued, InProgress                              int64
	Parked                                          bool
	ParkedEntries, FailedEntries                    float64
	Adaptive                                        bool
	ConcurrencyLimit, Requests                      int
	DeliveredPerMin, FailedPerMin                   float64 // NaN until two samples exist
	LastSuccess                                     time.Time
	Delivered                                       spark
}

// spark is a sparkline: an SVG polyline's points in a sparkW × sparkH box.
type spark struct {
	Points string
	Max    float64
	Last   float64
	N      int
}

const (
	sparkW = 150
	sparkH = 30
)

// makeSpark scales values into the box; NaN values are skipped.
func makeSpark(values []float64) spark {
	var s spark
	for _, v := range values {
		if !math.IsNaN(v) {
			s.Max = max(s.Max, v)
			s.Last = v
			s.N++
		}
	}
	if s.N == 0 {
		s.Last = math.NaN()
		return s
	}
	var b strings.Builder
	step := float64(sparkW) / float64(max(1, consoleSamples-1))
	x0 := float64(sparkW) - step*float64(len(values)-1)
	for i, v := range values {
		if math.IsNaN(v) {
			continue
		}
		y := float64(sparkH)
		if s.Max > 0 {
			y = float64(sparkH) - v/s.Max*float64(sparkH-2) - 1
		} else {
			y--
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x0+step*float64(i), y)
	}
	s.Points = strings.TrimSpace(b.String())
	return s
}

// sourceHealth is red when the stream is not open, amber when it is open
// but not ready (stalled checkpoint, unanswered getMore), green otherwise.
func sourceHealth(s sourceReport) string {
	switch {
	case s.State != string(source.StateOpen):
		return healthRed
	case !s.Ready:
		return healthAmber
	}
	return healthGreen
}

// sinkState names what a sink is doing, and its colour: red when parked or
// not ready (failing for longer than ready_max_lag), amber while it fails,
// waits out a Retry-After or has its circuit open, green otherwise
// (buildOverview turns it amber too when deliveries failed in the last
// minute).
func sinkState(s sinkReport) (string, string) {
	switch {
	case s.Parked:
		return "parked", healthRed
	case !s.Ready:
		return "not delivering", healthRed
	case s.Failing:
		return "failing", healthAmber
	case !s.PausedUntil.IsZero():
		return "paused (Retry-After)", healthAmber
	case s.Circuit != "" && s.Circuit != "closed":
		return "circuit " + s.Circuit, healthAmber
	}
	return "delivering", healthGreen
}

// overview builds the overview from a status report and the samples.
func buildOverview(r statusReport, samples []consoleSample) *consoleOverview {
	o := &consoleOverview{Ready: r.Ready, Cluster: r.Cluster, Members: r.Members, Reason: r.Reason}
	o.Memory = consoleMemory{
		Inflight: memory.FormatBytes(r.Memory.InflightBytes), Budget: memory.FormatBytes(r.Memory.BudgetBytes),
		From: r.Memory.BudgetFrom, HeldBack: !r.Memory.HeldBackSince.IsZero(),
	}
	if r.Memory.BudgetBytes > 0 {
		o.Memory.Percent = r.Memory.InflightBytes * 100 / r.Memory.BudgetBytes
	}
	owners := map[string]string{}
	for _, u := range r.Units {
		owners[u.Name] = u.Owner
	}
	for _, s := range r.Sources {
		cs := consoleSource{
			Name: s.Name, Source: s.Source, State: s.State, Health: sourceHealth(s), Reason: s.Reason,
			Owner: owners[s.Name], CheckpointTime: s.CheckpointTime, LagSeconds: s.CheckpointLagSec, InFlight: s.InFlight,
		}
		lag := make([]float64, len(samples))
		for i, sm := range samples {
			v, ok := sm.lag[s.Name]
			if !ok {
				v = math.NaN()
			}
			lag[i] = v
		}
		rates := rateSeries(samples, func(sm consoleSample) (float64, bool) { v, ok := sm.read[s.Name]; return v, ok })
		cs.Lag, cs.Rate = makeSpark(lag), makeSpark(rates)
		cs.EventsPerSec = cs.Rate.Last
		o.Sources = append(o.Sources, cs)
	}
	for _, s := range r.Sinks {
		state, health := sinkState(s)
		k := consoleSink{
			Name: s.Name, State: state, Health: health, Reason: s.Reason, LastError: s.LastError, Circuit: s.Circuit,
			Queued: s.Queued, InProgress: s.InProgress, Parked: s.Parked, Adaptive: s.Adaptive,
			ConcurrencyLimit: s.ConcurrencyLimit, Requests: s.Requests, LastSuccess: s.LastSuccess,
			DeliveredPerMin: math.NaN(), FailedPerMin: math.NaN(),
		}
		if n := len(samples); n > 0 {
			last := samples[n-1]
			k.ParkedEntries = last.deadLetters[s.Name+"\x00"+string(deadletter.KindParked)]
			k.FailedEntries = last.deadLetters[s.Name+"\x00"+string(deadletter.KindFailed)]
		}
		del := func(sm consoleSample) (float64, bool) { v, ok := sm.delivered[s.Name]; return v, ok }
		fail := func(sm consoleSample) (float64, bool) { v, ok := sm.failed[s.Name]; return v, ok }
		k.DeliveredPerMin, k.FailedPerMin = perMinute(samples, del), perMinute(samples, fail)
		k.Delivered = makeSpark(rateSeries(samples, del))
		if k.Health == healthGreen && k.FailedPerMin > 0 {
			// A permanent failure dead-letters at once and leaves the lane
			// "delivering": the failure counter tells.
			k.State, k.Health = "failures in the last minute", healthAmber
		}
		o.Sinks = append(o.Sinks, k)
	}
	return o
}

// rateSeries returns the per-second rate of a counter between consecutive
// samples (NaN where a sample lacks it); one value per sample, the first
// NaN.
func rateSeries(samples []consoleSample, get func(consoleSample) (float64, bool)) []float64 {
	out := make([]float64, len(samples))
	for i := range samples {
		out[i] = math.NaN()
		if i == 0 {
			continue
		}
		a, okA := get(samples[i-1])
		b, okB := get(samples[i])
		dt := samples[i].at.Sub(samples[i-1].at).Seconds()
		if okA && okB && dt > 0 {
			out[i] = max(0, b-a) / dt
		}
	}
	return out
}

// perMinute returns a counter's increase over the last minute of samples
// (over all of them when they span less), NaN with fewer than two.
func perMinute(samples []consoleSample, get func(consoleSample) (float64, bool)) float64 {
	n := len(samples)
	if n < 2 {
		return math.NaN()
	}
	last := samples[n-1]
	b, ok := get(last)
	if !ok {
		return math.NaN()
	}
	i := n - 2
	for i > 0 && last.at.Sub(samples[i-1].at) <= time.Minute {
		i--
	}
	a, ok := get(samples[i])
	if !ok {
		return math.NaN()
	}
	return max(0, b-a)
}

type consoleDeadLetters struct {
	Filter url.Values // the filter as given (sink, source, kind, since, document_key, document_key_bson)
	// Selection is the listing's filter as the JSON body of the bulk
	// actions (consoleActionBody): since made absolute and until set to
	// when the listing was read, so "Purge matching" and "Replay matching"
	// act on exactly the entries the filter matched then, never on more.
	// PurgeCount and ReplayCount are how many those are (ReplayCount: the
	// failed ones; Replayable is false for a kind replay refuses).
	Selection   string
	PurgeCount  int64
	ReplayCount int64
	Replayable  bool
	Sinks       []string
	Sources     []string
	Entries     []consoleEntrySummary
	// Next is the URL of the next page, empty on the last. It is built
	// with url.Values.Encode, so the template may use it as is.
	Next    template.URL
	Partial string // the listing failed half way: why
}

type consoleEntrySummary struct {
	ID, Kind, Source, Sink, Operation, DocumentKey, Reason, LastError string
	Attempts                                                          int
	CreatedAt                                                         time.Time
}

type consoleEntry struct {
	consoleEntrySummary
	Namespace, EventID, FirstError string
	Rules                          []string
	ChangeDropped                  bool
	FirstFailedAt, LastFailedAt    time.Time
	// JSON is the whole entry (envelope and change included), indented;
	// Cut is set when it was cut at consoleShownBytes (then compact), Size
	// is its whole length in bytes.
	JSON string
	Cut  bool
	Size int
}

func summaryOf(e deadletter.Entry) consoleEntrySummary {
	return consoleEntrySummary{
		ID: e.ID, Kind: string(e.Kind), Source: e.Source, Sink: e.Sink, Operation: e.Operation,
		DocumentKey: consoleJSON(e.DocumentKey), Reason: e.Reason, LastError: e.LastError,
		Attempts: e.Attempts, CreatedAt: e.CreatedAt,
	}
}

type consoleRules struct {
	PushdownOff bool
	Sources     []consoleRuleSource
}

type consoleRuleSource struct {
	Name string
	// Stage is the $match stage the source's change stream runs with
	// (relaxed Extended JSON), empty when none.
	Stage string
	// StateDB is changegate's state database and StateStage the $match
	// stage that leaves it out (source.StateFilter), first in the
	// pipeline of a whole-cluster source; empty for the others.
	StateDB, StateStage string
	Rules               []consoleRule
}

type consoleRule struct {
	Name, Operations, Namespaces, Filter, Sinks string
	// Pushed is the rule's condition inside the source's $match stage,
	// empty when nothing of it is pushed down; Why says what is not.
	Pushed, Why string
	Matches     float64
}

// buildRules describes cfg's rules: per source, the stage pushed down and
// each rule's share of it, and the matches counted so far (by "source\x00rule").
func buildRules(cfg *config.Config, stages map[string]bson.D, noPushdown bool, matches map[string]float64) *consoleRules {
	out := &consoleRules{PushdownOff: noPushdown}
	names := make([]string, len(cfg.Sinks))
	for i, s := range cfg.Sinks {
		names[i] = s.Name
	}
	for _, sc := range cfg.Sources {
		rs := consoleRuleSource{Name: sc.Name}
		if st := stages[sc.Name]; st != nil {
			rs.Stage = extJSON(st)
		}
		if sc.Database == "" && cfg.Mongo.StateDatabase != "" {
			// As source.Source.open builds the pipeline.
			rs.StateDB, rs.StateStage = cfg.Mongo.StateDatabase, extJSON(source.StateFilter(cfg.Mongo.StateDatabase))
		}
		for _, r := range cfg.Rules {
			if r.Source != sc.Name {
				continue
			}
			cr := consoleRule{
				Name: r.Name, Operations: strings.Join(r.Operations, ", "), Sinks: strings.Join(r.Sinks, ", "),
				Matches: matches[r.Source+"\x00"+r.Name],
			}
			var ns []string
			for _, n := range r.Namespaces {
				ns = append(ns, n.String())
			}
			cr.Namespaces = strings.Join(ns, ", ")
			if len(r.Filter) > 0 {
				cr.Filter = extJSON(r.Filter)
			}
			switch pushed, ok := rulePushdown(r, names); {
			case noPushdown:
				cr.Why = "pushdown disabled (-no-pushdown)"
			case !ok:
				cr.Why = "matches every change (as pushed down): the source's stream is not filtered"
			default:
				cr.Pushed = pushed
			}
			if why := backtrackRisk(r); why != "" && !noPushdown {
				cr.Why = strings.TrimSpace(cr.Why + " the filter is evaluated in changegate only: " + why)
			}
			rs.Rules = append(rs.Rules, cr)
		}
		out.Sources = append(out.Sources, rs)
	}
	return out
}

// backtrackRisk is why r's filter is not pushed down (PushdownNotes), or "".
func backtrackRisk(r config.Rule) string {
	if len(r.Filter) == 0 {
		return ""
	}
	raw, err := bson.Marshal(r.Filter)
	if err != nil {
		return ""
	}
	return query.BacktrackRisk(raw)
}

// rulePushdown returns the condition rule r contributes to its source's
// $match stage: the rule compiled alone, its Pushdown's $or without the
// lifecycle clause every stage carries.
func rulePushdown(r config.Rule, sinkNames []string) (string, bool) {
	var ns []string
	for _, n := range r.Namespaces {
		ns = append(ns, n.String())
	}
	rules, err := router.CompileRules([]router.RuleSpec{{
		Name: r.Name, Source: r.Source, Operations: r.Operations, Namespaces: ns, Filter: r.Filter, Sinks: r.Sinks,
	}}, sinkNames)
	if err != nil {
		return "", false
	}
	stage, ok := rules.Pushdown(r.Source)
	if !ok || len(stage) != 1 {
		return "", false
	}
	m, _ := stage[0].Value.(bson.D)
	if len(m) != 1 {
		return "", false
	}
	ors, _ := m[0].Value.(bson.A)
	if len(ors) != 2 {
		return "", false
	}
	return extJSON(ors[1]), true
}

func extJSON(v any) string {
	b, err := bson.MarshalExtJSON(v, false, false)
	if err != nil {
		// A bare value (not a document): wrap it to print it.
		if b, err = bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false); err != nil {
			return fmt.Sprint(v)
		}
	}
	return string(b)
}

// consoleHeaders sets the headers of every console response.
func consoleHeaders(h http.Header) {
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// renderConsole renders page p with code; a template error answers 500.
func renderConsole(w http.ResponseWriter, code int, name string, p consolePage) {
	var buf bytes.Buffer
	if err := consolePages[name].Execute(&buf, p); err != nil {
		http.Error(w, "console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	consoleHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// consoleRoutes registers the console on mux. Each request reads
// server.console and server.console_auth from the current configuration,
// so a reload applies them.
func (g *gateway) consoleRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", g.consolePage("overview", g.consoleOverview))
	mux.HandleFunc("GET /ui/{$}", g.consolePage("overview", g.consoleOverview))
	mux.HandleFunc("GET /ui/deadletters", g.consolePage("deadletters", g.consoleDeadLetters))
	mux.HandleFunc("GET /ui/deadletters/{id...}", g.consolePage("deadletter", g.consoleEntry))
	mux.HandleFunc("GET /ui/rules", g.consolePage("rules", g.consoleRules))
	for name, ctype := range map[string]string{"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"} {
		b, err := fs.ReadFile(consoleFiles, "console/static/"+name)
		if err != nil {
			panic("console: embedded file missing: " + err.Error()) // a build defect
		}
		mux.HandleFunc("GET /ui/static/"+name, g.consoleOn(func(w http.ResponseWriter, _ *http.Request) {
			consoleHeaders(w.Header())
			w.Header().Set("Content-Type", ctype)
			w.Header().Set("Cache-Control", "no-cache")
			_, _ = w.Write(b)
		}))
	}
	mux.HandleFunc("POST /ui/api/replay", g.consoleOn(g.consoleAction(g.consoleReplay)))
	mux.HandleFunc("DELETE /ui/api/deadletters", g.consoleOn(g.consoleAction(g.consolePurge)))
	mux.HandleFunc("POST /ui/api/reload", g.consoleOn(g.consoleAction(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		g.reloadHandler(w, r)
	})))
}

var consoleTitles = map[string]string{"overview": "Overview", "deadletters": "Dead letters", "deadletter": "Dead letter", "rules": "Rules"}

// consoleOn answers 404 while server.console is false.
func (g *gateway) consoleOn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !g.config().Server.Console {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}
}

// consolePage serves a page: the shell (401, no data) when reads need the
// token and the request lacks it, else the page fill fills.
func (g *gateway) consolePage(name string, fill func(*http.Request, *consolePage) int) http.HandlerFunc {
	return g.consoleOn(func(w http.ResponseWriter, r *http.Request) {
		cfg := g.config()
		p := consolePage{Nav: name, Title: consoleTitles[name], Auth: cfg.Server.ConsoleReadAuth(), Instance: g.instance}
		if p.Auth == config.ConsoleAuthToken && !g.authorized(r) {
			p.Locked = true
			if cfg.Server.AdminToken.Value() == "" {
				// As the API: reads are refused, and no token can help.
				p.NoToken = true
				renderConsole(w, http.StatusForbidden, name, p)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="changegate"`)
			renderConsole(w, http.StatusUnauthorized, name, p)
			return
		}
		code := fill(r, &p)
		renderConsole(w, code, name, p)
	})
}

func (g *gateway) consoleOverview(_ *http.Request, p *consolePage) int {
	p.Refresh = consoleRefresh
	p.Overview = buildOverview(g.report(), g.samples.snapshot())
	return http.StatusOK
}

func (g *gateway) consoleDeadLetters(r *http.Request, p *consolePage) int {
	cfg := g.config()
	d := &consoleDeadLetters{Filter: url.Values{}}
	for _, s := range cfg.Sinks {
		d.Sinks = append(d.Sinks, s.Name)
	}
	for _, s := range cfg.Sources {
		d.Sources = append(d.Sources, s.Name)
	}
	p.DeadLetters = d
	q := queryOf(r)
	for k, v := range map[string]string{"sink": q.Sink, "source": q.Source, "kind": q.Kind, "since": q.Since,
		"document_key": q.DocumentKey, "document_key_bson": q.DocumentKeyBSON} {
		if v != "" {
			d.Filter.Set(k, v)
		}
	}
	if q.Limit == "" {
		q.Limit = strconv.Itoa(consoleListLimit)
	}
	now := time.Now()
	f, err := q.ListFilter(now)
	if err != nil {
		p.Error = err.Error()
		return http.StatusBadRequest
	}
	if err := g.selection(r, d, q, f, now); err != nil {
		p.Error = err.Error()
		return http.StatusInternalServerError
	}
	started := false
	err = g.dls.Summaries(r.Context(), f, func() { started = true }, func(e deadletter.Entry) error {
		d.Entries = append(d.Entries, summaryOf(e))
		return nil
	})
	if err != nil {
		if !started {
			p.Error = err.Error()
			if errors.Is(err, deadletter.ErrNotFound) {
				return http.StatusNotFound // the after entry is gone
			}
			return http.StatusInternalServerError
		}
		d.Partial = err.Error()
	}
	if err == nil && len(d.Entries) == f.Limit {
		next := url.Values{}
		for k, v := range d.Filter {
			next[k] = v
		}
		next.Set("after", d.Entries[len(d.Entries)-1].ID)
		if q.Limit != strconv.Itoa(consoleListLimit) {
			next.Set("limit", q.Limit)
		}
		d.Next = template.URL("/ui/deadletters?" + next.Encode())
	}
	return http.StatusOK
}

// selection fills d's bulk-action selection from the listing's query q
// (filter f, read at now) and counts what it selects.
func (g *gateway) selection(r *http.Request, d *consoleDeadLetters, q DeadLetterQuery, f deadletter.Filter, now time.Time) error {
	// Entries are created with millisecond times: until is just after
	// now's millisecond, so every entry the listing could see is in.
	until := now.Truncate(time.Millisecond).Add(time.Millisecond)
	body := consoleActionBody{Sink: q.Sink, Source: q.Source, Kind: q.Kind, DocumentKey: q.DocumentKey,
		DocumentKeyBSON: q.DocumentKeyBSON, Until: until.UTC().Format(time.RFC3339Nano)}
	if !f.Since.IsZero() {
		body.Since = f.Since.UTC().Format(time.RFC3339Nano)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	d.Selection = string(b)
	all := f
	all.Limit, all.AfterID, all.Until = 0, "", until
	if d.PurgeCount, err = g.dls.Count(r.Context(), all); err != nil {
		return err
	}
	switch all.Kind {
	case "", deadletter.KindFailed:
		d.Replayable = true
		all.Kind = deadletter.KindFailed
		d.ReplayCount, err = g.dls.Count(r.Context(), all)
	}
	return err
}

func (g *gateway) consoleEntry(r *http.Request, p *consolePage) int {
	id := r.PathValue("id")
	// The whole entry is read (up to a few times 16 MiB): at most
	// maxPayloads at once, with the API's reads; what the page keeps of it
	// is cut at consoleShownBytes.
	if !g.payloads.enter(r.Context()) {
		p.Error = "the request ended while waiting for a turn to read the entry"
		return http.StatusServiceUnavailable
	}
	defer g.payloads.leave()
	e, ok, err := g.dls.Get(r.Context(), id)
	if err != nil {
		p.Error = err.Error()
		return http.StatusInternalServerError
	}
	if !ok {
		p.Error = fmt.Sprintf("no dead letter %q (replayed or purged?)", id)
		return http.StatusNotFound
	}
	p.Entry = entryView(e)
	return http.StatusOK
}

func entryView(e deadletter.Entry) *consoleEntry {
	v := &consoleEntry{
		consoleEntrySummary: summaryOf(e), Namespace: e.Namespace, EventID: e.EventID, FirstError: e.FirstError,
		Rules: e.Rules, ChangeDropped: e.ChangeDropped, FirstFailedAt: e.FirstFailedAt, LastFailedAt: e.LastFailedAt,
	}
	if b, err := e.MarshalJSON(); err == nil {
		v.Size = len(b)
		if len(b) > consoleShownBytes {
			// Too large to show whole: the start of it, compact (no
			// indented copy of the whole).
			b, v.Cut = b[:consoleShownBytes], true
		} else {
			var ind bytes.Buffer
			if json.Indent(&ind, b, "", "  ") == nil {
				b = ind.Bytes()
			}
			if len(b) > consoleShownBytes {
				b, v.Cut = b[:consoleShownBytes], true
			}
		}
		v.JSON = strings.ToValidUTF8(string(b), "\uFFFD")
	} else {
		v.JSON = "(cannot render: " + err.Error() + ")"
	}
	return v
}

func (g *gateway) consoleRules(_ *http.Request, p *consolePage) int {
	matches := map[string]float64{}
	collect(g.metrics.EventsMatched, func(l map[string]string, v float64) {
		matches[l["source"]+"\x00"+l["rule"]] += v
	})
	p.Rules = buildRules(g.config(), g.units.pushdownSnapshot(), g.noPushdown, matches)
	return http.StatusOK
}

// consoleActionBody is the JSON body of the console's actions: a
// dead-letter selection (ids, or a filter as on the dead-letter page).
type consoleActionBody struct {
	IDs             []string `json:"ids,omitempty"`
	Sink            string   `json:"sink,omitempty"`
	Source          string   `json:"source,omitempty"`
	Kind            string   `json:"kind,omitempty"`
	Since           string   `json:"since,omitempty"`
	DocumentKey     string   `json:"document_key,omitempty"`
	DocumentKeyBSON string   `json:"document_key_bson,omitempty"`
	// Until (RFC 3339) selects entries created before it: the time the
	// listing the action comes from was read.
	Until string `json:"until,omitempty"`
	// All must be true to purge with an empty selection (until aside).
	All bool `json:"all,omitempty"`
}

// consoleMaxIDs bounds the ids of one action.
const consoleMaxIDs = 1000

// consoleAction guards an action: the admin token (as for /api/v1's
// mutating calls), Content-Type: application/json and a JSON body.
func (g *gateway) consoleAction(h func(http.ResponseWriter, *http.Request, []byte)) http.HandlerFunc {
	return g.mutating(func(w http.ResponseWriter, r *http.Request) {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			writeJSON(w, http.StatusUnsupportedMediaType, apiError{"console actions take a JSON body: send Content-Type: application/json"})
			return
		}
		var body bytes.Buffer
		if _, err := body.ReadFrom(r.Body); err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{"reading the body: " + err.Error()})
			return
		}
		if !json.Valid(body.Bytes()) {
			writeJSON(w, http.StatusBadRequest, apiError{"the body is not JSON"})
			return
		}
		h(w, r, body.Bytes())
	})
}

// selection decodes an action body into a dead-letter filter.
func selection(b []byte) (deadletter.Filter, bool, error) {
	var body consoleActionBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return deadletter.Filter{}, false, fmt.Errorf("body: %w", err)
	}
	q := DeadLetterQuery{Sink: body.Sink, Source: body.Source, Kind: body.Kind, Since: body.Since,
		DocumentKey: body.DocumentKey, DocumentKeyBSON: body.DocumentKeyBSON}
	f, err := q.Filter(time.Now(), 0)
	if err != nil {
		return f, false, err
	}
	if body.Until != "" {
		if f.Until, err = time.Parse(time.RFC3339Nano, body.Until); err != nil {
			return f, false, fmt.Errorf("until: %q is not an RFC 3339 time", body.Until)
		}
	}
	if body.IDs != nil {
		if len(body.IDs) == 0 || len(body.IDs) > consoleMaxIDs {
			return f, false, fmt.Errorf("ids: give 1 to %d ids, or none and a filter", consoleMaxIDs)
		}
		f.IDs = slices.Clone(body.IDs)
	}
	everything := body.IDs == nil && f.Sink == "" && f.Source == "" && f.Kind == "" && f.Since.IsZero() &&
		f.DocumentKey == nil && f.ExactDocumentKey == nil
	return f, everything && !body.All, nil
}

func (g *gateway) consoleReplay(w http.ResponseWriter, r *http.Request, b []byte) {
	f, _, err := selection(b)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	g.replay(w, r, f)
}

func (g *gateway) consolePurge(w http.ResponseWriter, r *http.Request, b []byte) {
	f, refuse, err := selection(b)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	if refuse {
		writeJSON(w, http.StatusBadRequest, apiError{`refusing to purge every dead letter without a filter: send "all": true to mean it`})
		return
	}
	n, err := g.dls.Purge(r.Context(), f)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"purged": n})
}
