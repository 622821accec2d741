package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/source"
)

// statusReport is the body of /readyz and /api/v1/status.
type statusReport struct {
	Ready bool `json:"ready"`
	// Instance names this replica ([cluster] instance).
	Instance string `json:"instance"`
	// Cluster is true in cluster mode; Members lists the live replicas
	// then, and Reason says why the lease loop is not healthy.
	Cluster bool     `json:"cluster"`
	Members []string `json:"members,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// Units lists every unit of work (a source, or a partition of one):
	// its lease and whether this replica is active or standby for it.
	// Sources lists the units running here.
	Units   []unitStatus   `json:"units"`
	Sources []sourceReport `json:"sources"`
	Sinks   []sinkReport   `json:"sinks"`
	// Memory is the byte budget (max_in_flight_bytes) and what it holds.
	Memory memoryReport `json:"memory"`
}

// memoryReport is the byte budget in /api/v1/status.
type memoryReport struct {
	// InflightBytes are the bytes of events held now; BudgetBytes the
	// budget, BudgetFrom where it comes from.
	InflightBytes int64  `json:"inflightBytes"`
	BudgetBytes   int64  `json:"budgetBytes"`
	BudgetFrom    string `json:"budgetFrom"`
	// ContainerLimitBytes is the container's memory limit (0: none);
	// GoMemLimitBytes the Go runtime's soft limit in force (0: none).
	ContainerLimitBytes int64  `json:"containerLimitBytes,omitempty"`
	GoMemLimitBytes     int64  `json:"goMemLimitBytes,omitempty"`
	GoMemLimitFrom      string `json:"goMemLimitFrom"`
	// HeldBackSince is set while a reader waits for the budget: reading
	// is held back since then.
	HeldBackSince time.Time `json:"heldBackSince,omitzero"`
}

func (g *gateway) memoryReport() memoryReport {
	r := memoryReport{
		InflightBytes: g.budget.InUse(), BudgetBytes: g.budget.Limit(), BudgetFrom: g.sizing.BudgetFrom,
		ContainerLimitBytes: g.sizing.Container.Limit, GoMemLimitFrom: g.sizing.GoMemLimitFrom,
		HeldBackSince: g.budget.Waiting(),
	}
	if l := debug.SetMemoryLimit(-1); l < math.MaxInt64 {
		r.GoMemLimitBytes = l
	}
	return r
}

type sourceReport struct {
	Name             string    `json:"name"` // the unit's name
	Source           string    `json:"source"`
	State            string    `json:"state"`
	Ready            bool      `json:"ready"`
	Reason           string    `json:"reason,omitempty"`
	LastError        string    `json:"lastError,omitempty"`
	InFlight         int       `json:"inFlight"`
	CheckpointTime   time.Time `json:"checkpointTime,omitzero"`
	CheckpointSaved  time.Time `json:"checkpointSavedAt,omitzero"`
	CheckpointCT     uint32    `json:"checkpointClusterTime,omitempty"`
	CheckpointToken  string    `json:"checkpointToken,omitempty"`
	LastEvent        time.Time `json:"lastEventTime,omitzero"`
	CheckpointLagSec float64   `json:"checkpointLagSeconds"`
	// Snapshot is the progress of the unit's initial snapshot
	// (snapshot = "initial"), when one ran in this process.
	Snapshot *snapshotReport `json:"snapshot,omitempty"`
	// brief is Reason without the error text, for the open /readyz.
	brief string
}

// snapshotReport is the progress of an initial snapshot in /api/v1/status.
type snapshotReport struct {
	ID        string `json:"id"`
	State     string `json:"state"` // scanning, draining, done
	Namespace string `json:"namespace,omitempty"`
	// Scanned documents read (earlier runs of the same snapshot included),
	// Acked those covered by the saved progress, Estimated the collections'
	// estimatedDocumentCount.
	Scanned    int64   `json:"scanned"`
	Acked      int64   `json:"acked"`
	Estimated  int64   `json:"estimated"`
	Percent    float64 `json:"percent"`
	Rate       float64 `json:"docsPerSecond"`
	ETASeconds float64 `json:"etaSeconds"`
}

func newSnapshotReport(sn *source.SnapshotStatus) *snapshotReport {
	if sn == nil {
		return nil
	}
	r := &snapshotReport{ID: sn.ID, State: sn.State, Namespace: sn.Namespace, Scanned: sn.Scanned, Acked: sn.Acked,
		Estimated: sn.Estimated, Rate: sn.Rate, ETASeconds: sn.ETA.Seconds()}
	switch {
	case sn.State == "done":
		r.Percent = 100
	case sn.Estimated > 0:
		r.Percent = min(100, float64(sn.Scanned)*100/float64(sn.Estimated))
	}
	return r
}

type sinkReport struct {
	Name        string    `json:"name"`
	Ready       bool      `json:"ready"`
	Reason      string    `json:"reason,omitempty"`
	Queued      int64     `json:"queueDepth"`
	InProgress  int64     `json:"inProgress"`
	Parked      bool      `json:"parked"`
	Failing     bool      `json:"failing"`
	LastError   string    `json:"lastError,omitempty"`
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	// PausedUntil is set while the receiver's Retry-After holds the sink's
	// requests back.
	PausedUntil time.Time `json:"pausedUntil,omitzero"`
	// ConcurrencyLimit is the current limit of concurrent requests (adaptive
	// with max_in_flight = "auto"), Requests those in flight, LatencyMs the
	// smoothed latency of successful requests, and Circuit the breaker's
	// state (closed, open, half-open).
	Adaptive         bool    `json:"adaptive"`
	ConcurrencyLimit int     `json:"concurrencyLimit"`
	Requests         int     `json:"requestsInFlight"`
	LatencyMs        float64 `json:"latencyMs"`
	Circuit          string  `json:"circuit,omitempty"`
	// brief is Reason without the error text, for the open /readyz.
	brief string
}

func (g *gateway) report() statusReport {
	r := statusReport{Ready: true, Instance: g.instance, Sources: []sourceReport{}, Memory: g.memoryReport()}
	if g.cl != nil {
		var healthy bool
		r.Cluster = true
		r.Units, healthy, r.Members = g.cl.status()
		if !healthy {
			// A standby is ready (it can take over); one that cannot
			// reach the leases collection is not.
			r.Ready = false
			r.Reason = "no membership heartbeat within the lease ttl: the leases collection cannot be reached"
		}
	} else {
		for _, d := range g.defs {
			r.Units = append(r.Units, unitStatus{Name: d.name, Source: d.source, Role: "active"})
		}
	}
	// server.ready_max_lag: a checkpoint or sink this long without progress
	// is not ready. Read per report, so a reload applies it.
	staleAfter := g.config().Server.ReadyMaxLag
	for _, u := range g.units.snapshot() {
		s := u.src
		st := s.Status()
		sr := sourceReport{
			Name: st.Name, Source: st.Source, State: string(st.State), LastError: st.LastError, InFlight: st.InFlight,
			CheckpointTime: st.Checkpoint.WallTime, CheckpointSaved: st.CheckpointSave,
			CheckpointCT: st.Checkpoint.ClusterTime.T, LastEvent: st.LastEvent,
			Snapshot: newSnapshotReport(st.Snapshot),
		}
		if st.Checkpoint.Token != nil {
			sr.CheckpointToken = st.Checkpoint.Token.String()
		}
		if !st.LastEvent.IsZero() && !st.Checkpoint.WallTime.IsZero() {
			sr.CheckpointLagSec = max(0, st.LastEvent.Sub(st.Checkpoint.WallTime).Seconds())
		}
		switch {
		case st.State == source.StateSnapshot:
			// Scanning is progress: ready unless the progress stalls.
			if st.InFlight > 0 && !st.CheckpointSave.IsZero() && time.Since(st.CheckpointSave) > staleAfter {
				sr.Reason = "snapshot progress has not advanced for " + time.Since(st.CheckpointSave).Round(time.Second).String()
			}
		case st.State != source.StateOpen:
			sr.Reason = "change stream is " + string(st.State)
			sr.brief = sr.Reason
			if st.LastError != "" {
				sr.Reason += ": " + st.LastError
			}
		case time.Since(st.LastPoll) > g.stuckAfter:
			sr.Reason = "change stream has not answered for " + time.Since(st.LastPoll).Round(time.Second).String()
		case st.InFlight > 0 && !st.CheckpointSave.IsZero() && time.Since(st.CheckpointSave) > staleAfter:
			sr.Reason = "checkpoint has not advanced for " + time.Since(st.CheckpointSave).Round(time.Second).String()
		}
		if sr.brief == "" {
			sr.brief = sr.Reason
		}
		sr.Ready = sr.Reason == ""
		r.Ready = r.Ready && sr.Ready
		r.Sources = append(r.Sources, sr)
	}
	for _, l := range g.engine.Lanes() {
		st := l.Status()
		kr := sinkReport{
			Name: st.Name, Queued: st.Queued, InProgress: st.InProgress, Parked: st.Parked,
			Failing: st.Failing, LastError: st.LastError, LastSuccess: st.LastSuccess,
			PausedUntil: st.PausedUntil,
			Adaptive:    st.Limit.Adaptive, ConcurrencyLimit: st.Limit.Limit, Requests: st.Limit.InFlight,
			LatencyMs: float64(st.Limit.RTT.Microseconds()) / 1000, Circuit: st.Limit.Circuit,
		}
		// A parked sink does not hold the sources back, but it is not
		// delivering: report it so an operator sees it.
		if st.Failing && st.Queued+st.InProgress > 0 && time.Since(st.LastSuccess) > staleAfter {
			kr.brief = "sink has not delivered for " + time.Since(st.LastSuccess).Round(time.Second).String()
			kr.Reason = kr.brief + ": " + st.LastError
		}
		kr.Ready = kr.Reason == ""
		r.Ready = r.Ready && kr.Ready
		r.Sinks = append(r.Sinks, kr)
	}
	return r
}

// verdict is r without details: which sources and sinks are ready and
// why not, without error texts, positions or counts. /readyz shows it to callers that may not
// read data.
func (r statusReport) verdict() statusReport {
	out := statusReport{Ready: r.Ready}
	for _, s := range r.Sources {
		out.Sources = append(out.Sources, sourceReport{Name: s.Name, State: s.State, Ready: s.Ready, Reason: s.brief})
	}
	for _, s := range r.Sinks {
		out.Sinks = append(out.Sinks, sinkReport{Name: s.Name, Ready: s.Ready, Reason: s.brief})
	}
	return out
}

func (g *gateway) handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		r := g.report()
		code := http.StatusOK
		if !r.Ready {
			code = http.StatusServiceUnavailable
		}
		if !g.mayRead(req) {
			// The verdict is open (probes); the details are data.
			writeJSON(w, code, r.verdict())
			return
		}
		writeJSON(w, code, r)
	})
	mux.HandleFunc("GET /api/v1/status", g.reading(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, g.report())
	}))
	mux.HandleFunc("GET /api/v1/deadletters", g.reading(g.listDeadLetters))
	if g.payloads == nil {
		g.payloads = newPayloadGate(maxPayloads)
	}
	mux.HandleFunc("GET /api/v1/deadletters/{id...}", g.reading(g.showDeadLetter(g.payloads)))
	mux.HandleFunc("POST /api/v1/deadletters/replay", g.mutating(g.replayDeadLetters))
	mux.HandleFunc("DELETE /api/v1/deadletters", g.mutating(g.purgeDeadLetters))
	mux.HandleFunc("POST /api/v1/reload", g.mutating(g.reloadHandler))
	mux.HandleFunc("POST /api/v1/backfills", g.mutating(g.startBackfill))
	mux.HandleFunc("GET /api/v1/backfills", g.reading(g.listBackfills))
	mux.HandleFunc("GET /api/v1/backfills/{id}", g.reading(g.showBackfill))
	mux.HandleFunc("DELETE /api/v1/backfills/{id}", g.mutating(g.cancelBackfill))
	g.consoleRoutes(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/readyz" {
			apiHeaders(w.Header())
		}
		mux.ServeHTTP(w, r)
	})
}

// apiHeaders sets the headers of every /api/v1 and /readyz response: they
// carry data (documents of dead letters, error texts, positions) that no
// cache may keep and no browser may sniff into another type, as the
// console's pages do.
func apiHeaders(h http.Header) {
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
}

// maxPayloads bounds the whole entries read and rendered at once, by GET
// /api/v1/deadletters/{id} and the console's dead-letter page together.
const maxPayloads = 2

// payloadGate bounds the requests that hold a whole dead-letter entry in
// memory (up to a few times MongoDB's 16 MiB document limit each). Safe for
// concurrent use.
type payloadGate struct {
	slots chan struct{}
	// held, when set, runs while a slot is held (tests).
	held func()
	// inside and waiting count the requests holding a slot and those
	// waiting for one; most is the highest inside seen (tests).
	inside, waiting, most atomic.Int64
}

func newPayloadGate(n int) *payloadGate {
	return &payloadGate{slots: make(chan struct{}, n)}
}

// enter waits for a slot; false when ctx ended first. A true enter must be
// followed by leave.
func (p *payloadGate) enter(ctx context.Context) bool {
	p.waiting.Add(1)
	select {
	case p.slots <- struct{}{}:
		p.waiting.Add(-1)
		n := p.inside.Add(1)
		for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
		}
		if p.held != nil {
			p.held()
		}
		return true
	case <-ctx.Done():
		p.waiting.Add(-1)
		return false
	}
}

func (p *payloadGate) leave() {
	p.inside.Add(-1)
	<-p.slots
}

type apiError struct {
	Error string `json:"error"`
}

func queryOf(r *http.Request) DeadLetterQuery {
	v := r.URL.Query()
	return DeadLetterQuery{
		Sink: v.Get("sink"), Source: v.Get("source"), Kind: v.Get("kind"), Since: v.Get("since"),
		DocumentKey: v.Get("document_key"), DocumentKeyBSON: v.Get("document_key_bson"), Limit: v.Get("limit"), After: v.Get("after"),
	}
}

// listDeadLetters streams a page of dead-letter summaries: memory stays
// bounded by one cursor batch of summaries whatever the entries' sizes. The
// body is {"entries": [...], "next": ID, "error": MSG}: entries are
// summaries (no change, no envelope: GET /api/v1/deadletters/{id} shows
// one in full), next is the after parameter of the next page (absent on the
// last), error is present when the listing failed half way (the entries
// before it are valid, the page is incomplete).
func (g *gateway) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := queryOf(r).ListFilter(time.Now())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	n, last, started := 0, "", false
	err = g.dls.Summaries(r.Context(), f, func() {
		started = true
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"entries":[`)
	}, func(e deadletter.Entry) error {
		sep := "\n  "
		if n > 0 {
			sep = ",\n  "
		}
		if _, err := io.WriteString(w, sep); err != nil {
			return err
		}
		b, err := e.MarshalJSON()
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		n++
		last = e.ID
		return nil
	})
	if err != nil && !started {
		code := http.StatusInternalServerError
		if errors.Is(err, deadletter.ErrNotFound) {
			code = http.StatusNotFound
		}
		writeJSON(w, code, apiError{err.Error()})
		return
	}
	tail := "\n]"
	if n == 0 {
		tail = "]"
	}
	if err == nil && n == f.Limit {
		nb, _ := json.Marshal(last)
		tail += `,"next":` + string(nb)
	}
	if err != nil {
		eb, _ := json.Marshal(err.Error())
		tail += `,"error":` + string(eb)
	}
	_, _ = io.WriteString(w, tail+"}\n")
}

// showDeadLetter returns one entry in full (change and envelope included).
// At most maxPayloads such replies are built at once, each up to a few
// times MongoDB's 16 MiB document limit.
func (g *gateway) showDeadLetter(payloads *payloadGate) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !payloads.enter(r.Context()) {
			return
		}
		defer payloads.leave()
		e, ok, err := g.dls.Get(r.Context(), id)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
			return
		}
		if !ok {
			writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("no dead letter %q", id)})
			return
		}
		writeJSON(w, http.StatusOK, e)
	}
}

type replayReport struct {
	Replayed int      `json:"replayed"`
	Failed   int      `json:"failed"`
	Skipped  int      `json:"skipped"`
	Errors   []string `json:"errors,omitempty"`
}

func (g *gateway) replayDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := queryOf(r).Filter(time.Now(), 0)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	g.replay(w, r, f)
}

// replay re-delivers the dead letters f selects (no kind: the
// failed ones; parked ones are refused) and answers with a replayReport.
// deliver_unrouted=true also delivers those no current rule routes to
// their sink (ReplayOptions).
// The admin API and the console share it.
func (g *gateway) replay(w http.ResponseWriter, r *http.Request, f deadletter.Filter) {
	switch f.Kind {
	case "":
		f.Kind = deadletter.KindFailed
	case deadletter.KindParked:
		writeJSON(w, http.StatusBadRequest, apiError{"parked entries are re-driven automatically, in order, once their sink accepts again; only failed entries can be replayed"})
		return
	}
	var opts ReplayOptions
	switch v := r.URL.Query().Get("deliver_unrouted"); v {
	case "", "false":
	case "true":
		opts.DeliverUnrouted = true
	default:
		writeJSON(w, http.StatusBadRequest, apiError{fmt.Sprintf("deliver_unrouted=%q: want true or false", v)})
		return
	}
	// A replay waits for its deliveries (retries included): no write
	// deadline for it.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	res, err := g.dls.ReplayGrouped(memory.WithBudget(r.Context(), g.budget), f, opts.deliverer(g.engine), opts.groups(g.engine))
	rep := replayReport{Replayed: res.Replayed, Failed: res.Failed, Skipped: res.Skipped}
	for _, e := range res.Errors {
		rep.Errors = append(rep.Errors, e.Error())
	}
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
		writeJSON(w, http.StatusInternalServerError, rep)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (g *gateway) purgeDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := queryOf(r).Filter(time.Now(), 0)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	// Judge the filter, not the parameters: limit=0 (no limit) or empty
	// values select everything too.
	everything := f.Sink == "" && f.Source == "" && f.Kind == "" && f.Since.IsZero() &&
		f.DocumentKey == nil && f.ExactDocumentKey == nil && f.Limit == 0 && f.AfterID == ""
	if everything && r.URL.Query().Get("all") != "true" {
		writeJSON(w, http.StatusBadRequest, apiError{"refusing to purge every dead letter without a filter: add all=true to mean it"})
		return
	}
	n, err := g.dls.Purge(r.Context(), f)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"purged": n})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
