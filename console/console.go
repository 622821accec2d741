// Package console owns the web console (server.console): its pages
// (overview, dead letters, one dead letter, rules, the delivery log's
// search, event, deliveries and analytics pages, subscriptions) rendered by html/template
// from embedded templates, its one embedded script and style sheet (no
// external assets), its actions (replay, purge, reload) and the ring of
// samples its sparklines are drawn from. It registers its routes on the
// admin server (api.Server), whose auth layer, dead-letter selection,
// replay, purge, reload, bound on whole entries read at once, delivery
// log reads (Deliveries, Analytics) and subscriptions (Subscriptions) it
// shares.
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
//   - Subscriptions. Their page needs a token the subscriptions' API
//     serves (the admin token, or a [[server.tokens]] token, which sees its
//     prefix only) whatever console_auth says; its script acts through
//     that API (/api/v1/subscriptions, a JSON body, the bearer token,
//     If-Match), and shows a signing secret from the answer of a creation
//     or rotation once, with textContent, outside the refreshed content;
//     the server never renders one.
//   - Everything the pages show is escaped by html/template; the script
//     never builds markup from data (it moves nodes the server rendered, and
//     writes messages with textContent). The pages send a strict
//     Content-Security-Policy: scripts and styles from this origin only, no
//     inline script, no framing.

package console

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/metrics"
)

// files are the pages' templates and the static files.
//
//go:embed templates static
var files embed.FS

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

// Gateway is the running gateway as the console reads it. Its methods are
// safe for concurrent use.
type Gateway interface {
	// Config returns the configuration in force.
	Config() *config.Config
	// Status reports every unit, source and sink.
	Status() api.Status
	// Pushdowns returns the $match stage each source's stream runs with,
	// by source, and whether pushdown is off (-no-pushdown).
	Pushdowns() (stages map[string]bson.D, off bool)
}

// Options are what a Console shows.
type Options struct {
	Gateway     Gateway
	DeadLetters api.DeadLetters
	// Metrics are the counters the sparklines and rule matches are read
	// from; nil: unregistered ones (all zero).
	Metrics *metrics.Metrics
	// SampleEvery is the sparklines' sampling interval (default 10s; they
	// show the last 15 minutes).
	SampleEvery time.Duration
	// Log receives the console's log lines; nil discards.
	Log *slog.Logger
}

// Console is the web console of one admin server.
type Console struct {
	gw      Gateway
	dls     api.DeadLetters
	metrics *metrics.Metrics
	every   time.Duration
	api     *api.Server
	samples consoleRing
}

// New returns the console and registers its routes on srv.
func New(srv *api.Server, o Options) *Console {
	c := &Console{gw: o.Gateway, dls: o.DeadLetters, metrics: o.Metrics, every: o.SampleEvery, api: srv}
	if c.metrics == nil {
		c.metrics = metrics.New(nil)
	}
	if c.every <= 0 {
		c.every = consoleSampleEvery
	}
	c.register(srv)
	return c
}

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
	for _, p := range []string{"overview", "deadletters", "deadletter", "rules", "search", "event", "deliveries", "analytics", "subscriptions"} {
		out[p] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+p+".html"))
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
	Nav   string // the page's name: overview, deadletters, rules, ...
	// Locked is set when the page's data needs the admin token and the
	// request carried none: the template renders the shell only.
	Locked bool
	// NoToken is set with Locked when no admin token is configured: no
	// token can unlock the page (the API refuses reads too).
	NoToken bool
	// Scoped is set on the subscriptions' pages: their data needs the
	// admin token or a [[server.tokens]] token, whatever console_auth.
	Scoped   bool
	Auth     string // server.console_auth, as in effect (ConsoleReadAuth)
	Refresh  int    // seconds between self-refreshes; 0: none
	Instance string
	Error    string

	Overview      *consoleOverview
	DeadLetters   *consoleDeadLetters
	Entry         *consoleEntry
	Rules         *consoleRules
	Event         *consoleEvent
	Deliveries    *consoleDeliveries
	Analytics     *consoleAnalytics
	Subscriptions *consoleSubscriptions
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

// register registers the console's routes on srv. Each request reads
// server.console and server.console_auth from the current configuration,
// so a reload applies them: while server.console is false every route
// answers 404.
func (c *Console) register(srv *api.Server) {
	rs := srv.Routes(func() bool { return c.gw.Config().Server.Console })
	// The pages are open: each renders its data only for a principal
	// that may read it (consolePage), else its shell.
	rs.Handle("GET /{$}", api.Open, c.consolePage("overview", c.consoleOverview))
	rs.Handle("GET /ui/{$}", api.Open, c.consolePage("overview", c.consoleOverview))
	rs.Handle("GET /ui/deadletters", api.Open, c.consolePage("deadletters", c.consoleDeadLetters))
	rs.Handle("GET /ui/deadletters/{id...}", api.Open, c.consolePage("deadletter", c.consoleEntry))
	rs.Handle("GET /ui/rules", api.Open, c.consolePage("rules", c.consoleRules))
	rs.Handle("GET /ui/search", api.Open, c.consoleSearch)
	rs.Handle("GET /ui/events/{id...}", api.Open, c.consolePage("event", c.consoleEvent))
	rs.Handle("GET /ui/deliveries", api.Open, c.consolePage("deliveries", c.consoleDeliveries))
	rs.Handle("GET /ui/analytics", api.Open, c.consolePage("analytics", c.consoleAnalytics))
	rs.Handle("GET /ui/subscriptions", api.Open, c.consoleScopedPage("subscriptions", c.consoleSubscriptions))
	for name, ctype := range map[string]string{"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"} {
		b, err := fs.ReadFile(files, "static/"+name)
		if err != nil {
			panic("console: embedded file missing: " + err.Error()) // a build defect
		}
		rs.Handle("GET /ui/static/"+name, api.Open, func(w http.ResponseWriter, _ *http.Request) {
			consoleHeaders(w.Header())
			w.Header().Set("Content-Type", ctype)
			w.Header().Set("Cache-Control", "no-cache")
			_, _ = w.Write(b)
		})
	}
	rs.Handle("POST /ui/api/replay", api.Mutate, c.consoleAction(c.consoleReplay))
	rs.Handle("DELETE /ui/api/deadletters", api.Mutate, c.consoleAction(c.consolePurge))
	rs.Handle("POST /ui/api/reload", api.Mutate, c.consoleAction(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		srv.ServeReload(w, r)
	}))
}

var consoleTitles = map[string]string{"overview": "Overview", "deadletters": "Dead letters", "deadletter": "Dead letter", "rules": "Rules",
	"search": "Search", "event": "Event", "deliveries": "Deliveries", "analytics": "Analytics", "subscriptions": "Subscriptions"}

// consolePage serves a page: the shell (401, no data) when reads need the
// token and the request lacks it, else the page fill fills.
func (c *Console) consolePage(name string, fill func(*http.Request, *consolePage) int) http.HandlerFunc {
	return c.page(name, false, fill)
}

// consoleScopedPage serves a page of the subscriptions: its data needs a
// token the subscriptions' API serves (the admin token, or a
// [[server.tokens]] one, which sees its own prefix), whatever
// server.console_auth says, as that API needs one whatever
// server.public_read says.
func (c *Console) consoleScopedPage(name string, fill func(*http.Request, *consolePage) int) http.HandlerFunc {
	return c.page(name, true, fill)
}

func (c *Console) page(name string, scoped bool, fill func(*http.Request, *consolePage) int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cfg := c.gw.Config()
		p := consolePage{Nav: name, Title: consoleTitles[name], Auth: cfg.Server.ConsoleReadAuth(), Instance: cfg.Cluster.Instance, Scoped: scoped}
		pr := api.PrincipalOf(r)
		locked, noToken := p.Auth == config.ConsoleAuthToken && !pr.Admin, cfg.Server.AdminToken.Value() == ""
		if scoped {
			locked, noToken = !pr.Admin && pr.Prefix == "", noToken && len(cfg.Server.Tokens) == 0
		}
		if locked {
			p.Locked = true
			if noToken {
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
	}
}

func (c *Console) consoleOverview(_ *http.Request, p *consolePage) int {
	p.Refresh = consoleRefresh
	p.Overview = buildOverview(c.gw.Status(), c.samples.snapshot())
	return http.StatusOK
}
