package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"golang.org/x/time/rate"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/lease"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// Backfill limits and defaults.
const (
	// DefaultBackfillRate is the documents per second of a backfill that
	// names no rate.
	DefaultBackfillRate = 1000
	// MaxBackfillRate bounds the rate a backfill may ask for.
	MaxBackfillRate = 1_000_000
	// maxBackfillFilter bounds the filter's JSON.
	maxBackfillFilter = 16 << 10
	// backfillInFlight caps the backfill events handed on but not finished.
	backfillInFlight = 1000
	// backfillLeaseTTL is the lifetime of a sink's backfill lock, renewed
	// every third of it while the backfill runs.
	backfillLeaseTTL = 30 * time.Second
	// backfillCollection holds the per-sink backfill locks (lease
	// documents "backfill:<sink>") in the state database.
	backfillCollection = "backfills"
	// backfillHistory is how many finished backfills the API lists (the
	// newest); running ones are listed besides, at most one per sink.
	backfillHistory = 20
	// backfillKeptFilter bounds the filter text a finished backfill keeps
	// for the listing (a longer one is cut, marked with "…").
	backfillKeptFilter = 512
)

// ErrBackfillInput wraps every reason a backfill request was refused
// before anything started (unknown source or sink, invalid filter or
// rate); ErrBackfillBusy a sink that runs another backfill.
var (
	ErrBackfillInput = errors.New("invalid backfill request")
	ErrBackfillBusy  = errors.New("sink busy with another backfill")
	// ErrBackfillNotFound: no backfill of that id in this process.
	ErrBackfillNotFound = errors.New("no such backfill")
)

// BackfillRequest asks for the documents of Source that match Filter to be
// sent again, to Sink (a sink the source's rules route to) or, when Sink is
// empty, to every sink whose rules match them.
type BackfillRequest struct {
	Source string `json:"source"`
	Sink   string `json:"sink,omitempty"`
	// Filter is a MongoDB query filter over the documents, as (relaxed or
	// canonical) Extended JSON; empty: every document.
	Filter string `json:"filter,omitempty"`
	// Rate is the most documents per second the backfill reads (default
	// DefaultBackfillRate).
	Rate float64 `json:"rate,omitempty"`
}

// BackfillStatus is the progress of one backfill.
type BackfillStatus struct {
	ID     string  `json:"id"`
	Source string  `json:"source"`
	Sink   string  `json:"sink,omitempty"`
	Filter string  `json:"filter,omitempty"`
	Rate   float64 `json:"rate"`
	// State is running, done, cancelled or failed.
	State     string `json:"state"`
	Error     string `json:"error,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	// Scanned documents were read; Sent were handed to at least one sink;
	// Finished of those were delivered or dead-lettered (Failed: a CLI
	// delivery that failed for good). Estimated is the count of matching
	// documents when the backfill started (0: unknown).
	Scanned  int64 `json:"scanned"`
	Sent     int64 `json:"sent"`
	Finished int64 `json:"finished"`
	Failed   int64 `json:"failed,omitempty"`
	// Reread counts documents read again because a change of them was
	// dispatched after they were read; Unordered those sent after
	// backfillRereads re-reads without the ordering guarantee.
	Reread     int64     `json:"reread,omitempty"`
	Unordered  int64     `json:"unordered,omitempty"`
	Estimated  int64     `json:"estimated"`
	Percent    float64   `json:"percent"`
	DocsPerSec float64   `json:"docsPerSecond"`
	ETASeconds float64   `json:"etaSeconds"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

// backfillTarget is where a backfill's events go: the lanes of a running
// gateway, or direct deliveries from the CLI.
type backfillTarget interface {
	// send hands ev on to sink (every matching sink when empty); done is
	// called once, when every sink finished (failed: some delivery failed
	// for good without a dead letter). It returns false, without calling
	// done, when no rule routes ev there.
	send(ctx context.Context, sink string, ev *event.Event, done func(failed bool)) bool
	// liveQueued returns the events queued for the sinks beyond own of the
	// backfill's: live changes waiting, which go first.
	liveQueued(sinks []string, own int64) int64
	// mark is taken before documents of source are read; sendAfter is
	// send, run only if no change of ev's document was dispatched since
	// mark (changed: one was; read the document again). A target that
	// cannot order returns nil and sends at once.
	mark(source string) any
	sendAfter(ctx context.Context, sink string, ev *event.Event, mark any, done func(failed bool)) (routed, changed bool)
}

// backfillRereads bounds the re-reads of a document that keeps changing
// while a backfill tries to send it in order; after them it is sent as
// read, unordered (counted in BackfillStatus.Unordered).
const backfillRereads = 10

// backfiller runs backfills: at most one per sink at a time (a lease
// document per sink in the state database, so also across processes).
type backfiller struct {
	client   *mongo.Client
	stateDB  string // never read by a cluster-level backfill
	locks    *lease.Store
	instance string
	target   backfillTarget
	sinksOf  func(source string) []string
	metrics  *metrics.Metrics
	log      *slog.Logger
	// budget is the process's byte budget (nil: none): each document
	// read is admitted against it before it is handed on.
	budget *memory.Budget

	// records, when set, keeps each backfill's request and acknowledged
	// progress, so that a restart resumes it (same id) from the last
	// acknowledged _id: the gateway's at its next start, the command
	// line's with ResumeBackfill.
	records *mongo.Collection
	// origin is written into the records: backfillOriginCLI for the
	// command line's, "" (none) for the gateway's. A gateway resumes only
	// records without it; the command line resumes its own with -resume.
	origin string

	mu    sync.Mutex
	runs  map[string]*backfillRun
	order []string // ids, oldest first
}

// backfillRecordsCollection holds one backfillRecord per backfill in the
// state database.
const backfillRecordsCollection = "backfill_runs"

// backfillRecord is the stored form of a backfill: its request and its
// acknowledged progress. Every document before After in Namespace (and
// every namespace before it, in the scan's sorted order) was delivered,
// dead-lettered or parked for every sink.
type backfillRecord struct {
	ID        string        `bson:"_id"`
	Source    string        `bson:"source"`
	Sink      string        `bson:"sink,omitempty"`
	Filter    string        `bson:"filter,omitempty"`
	Rate      float64       `bson:"rate"`
	State     string        `bson:"state"` // running, done, failed, cancelled
	Namespace string        `bson:"namespace,omitempty"`
	After     bson.RawValue `bson:"after,omitempty"` // the last acknowledged _id
	Scanned   int64         `bson:"scanned"`
	StartedAt time.Time     `bson:"startedAt"`
	UpdatedAt time.Time     `bson:"updatedAt"`
	// Origin is backfillOriginCLI for a backfill of the command line;
	// absent for the gateway's (and for every record written before the
	// command line's were recorded).
	Origin string `bson:"origin,omitempty"`
}

// backfillOriginCLI marks the records of the command line's backfills.
const backfillOriginCLI = "cli"

// resume returns the request of rec and where a resumed run starts.
func (rec backfillRecord) resume() (BackfillRequest, *backfillResume) {
	req := BackfillRequest{Source: rec.Source, Sink: rec.Sink, Filter: rec.Filter, Rate: rec.Rate}
	rs := &backfillResume{id: rec.ID, namespace: rec.Namespace, scanned: rec.Scanned, startedAt: rec.StartedAt}
	if rec.Namespace != "" && rec.After.Type != 0 {
		rs.after, _ = bson.Marshal(bson.D{{Key: "_id", Value: rec.After}})
	}
	return req, rs
}

// backfillResume is where a resumed backfill starts.
type backfillResume struct {
	id        string
	namespace string
	after     bson.Raw
	scanned   int64
	startedAt time.Time
}

func newBackfiller(client *mongo.Client, stateDB *mongo.Database, instance string, target backfillTarget, sinksOf func(string) []string, m *metrics.Metrics, log *slog.Logger) *backfiller {
	if m == nil {
		m = metrics.New(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &backfiller{
		client: client, stateDB: stateDB.Name(), locks: lease.NewStore(stateDB, backfillCollection, backfillLeaseTTL),
		instance: instance, target: target, sinksOf: sinksOf, metrics: m, log: log,
		runs: map[string]*backfillRun{},
	}
}

// backfillRun is one backfill.
type backfillRun struct {
	id     string
	req    BackfillRequest
	filter bson.Raw
	sinks  []string // sinks locked
	cancel context.CancelFunc
	done   chan struct{}

	inFlight atomic.Int64
	mu       sync.Mutex
	st       BackfillStatus

	resume        *backfillResume // nil: from the start
	userCancelled atomic.Bool     // cancelled by cancelRun, not by a stop
	acked         *checkpoint.Tracker
}

func (r *backfillRun) status() BackfillStatus {
	r.mu.Lock()
	st := r.st
	r.mu.Unlock()
	if st.State == "running" {
		if el := time.Since(st.StartedAt).Seconds(); el > 0 {
			st.DocsPerSec = float64(st.Scanned) / el
		}
		if st.DocsPerSec > 0 && st.Estimated > st.Scanned {
			st.ETASeconds = float64(st.Estimated-st.Scanned) / st.DocsPerSec
		}
	}
	switch {
	case st.State == "done":
		st.Percent = 100
	case st.Estimated > 0:
		st.Percent = min(100, float64(st.Scanned)*100/float64(st.Estimated))
	}
	return st
}

// ParseBackfillFilter parses a backfill filter: a JSON object in MongoDB
// query syntax (as accepted by rules' filters: the query operators, no
// $where, $expr or $function, no regular expression MongoDB could backtrack
// on catastrophically: query.BacktrackRisk), at most 16 KiB. Empty means
// every document.
func ParseBackfillFilter(s string) (bson.Raw, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if len(s) > maxBackfillFilter {
		return nil, fmt.Errorf("filter of %d bytes: at most %d", len(s), maxBackfillFilter)
	}
	if !strings.HasPrefix(s, "{") {
		return nil, errors.New(`filter must be a JSON object in MongoDB query syntax, e.g. {"status": "paid"}`)
	}
	var d bson.D
	if err := bson.UnmarshalExtJSON([]byte(s), false, &d); err != nil {
		return nil, fmt.Errorf("filter is not valid Extended JSON: %v", err)
	}
	raw, err := bson.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("filter: %v", err)
	}
	if _, err := query.Compile(raw); err != nil {
		return nil, fmt.Errorf("filter is not a valid query: %v", err)
	}
	// The filter runs inside MongoDB (find, count): a pattern its
	// backtracking regex engine could take exponential time on is refused.
	if why := query.BacktrackRisk(raw); why != "" {
		return nil, fmt.Errorf("filter refused: %s; rewrite the pattern without the nested repetition", why)
	}
	return raw, nil
}

// validate checks req against cfg and returns the parsed filter and the
// sinks it targets.
func (b *backfiller) validate(cfg *config.Config, req *BackfillRequest) (bson.Raw, []string, error) {
	var names []string
	var src *config.Source
	for i := range cfg.Sources {
		names = append(names, cfg.Sources[i].Name)
		if cfg.Sources[i].Name == req.Source {
			src = &cfg.Sources[i]
		}
	}
	if req.Source == "" {
		return nil, nil, fmt.Errorf("%w: source is required (one of %s)", ErrBackfillInput, strings.Join(names, ", "))
	}
	if src == nil {
		return nil, nil, fmt.Errorf("%w: unknown source %q (sources: %s)", ErrBackfillInput, req.Source, strings.Join(names, ", "))
	}
	routed := b.sinksOf(req.Source)
	sinks := routed
	if req.Sink != "" {
		known := false
		var all []string
		for _, s := range cfg.Sinks {
			all = append(all, s.Name)
			known = known || s.Name == req.Sink
		}
		if !known {
			return nil, nil, fmt.Errorf("%w: unknown sink %q (sinks: %s)", ErrBackfillInput, req.Sink, strings.Join(all, ", "))
		}
		if !slices.Contains(routed, req.Sink) {
			return nil, nil, fmt.Errorf("%w: no rule routes source %q to sink %q: add one (with \"snapshot\" in its operations, if it lists operations) first", ErrBackfillInput, req.Source, req.Sink)
		}
		sinks = []string{req.Sink}
	}
	if len(sinks) == 0 {
		return nil, nil, fmt.Errorf("%w: no rule of source %q routes to any sink", ErrBackfillInput, req.Source)
	}
	if req.Rate == 0 {
		req.Rate = DefaultBackfillRate
	}
	if req.Rate < 0 || req.Rate > MaxBackfillRate || req.Rate != req.Rate {
		return nil, nil, fmt.Errorf("%w: rate %v: want documents per second, more than 0 and at most %d", ErrBackfillInput, req.Rate, MaxBackfillRate)
	}
	filter, err := ParseBackfillFilter(req.Filter)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBackfillInput, err)
	}
	return filter, sinks, nil
}

// start validates req, locks its sinks and starts the backfill under ctx.
// Nothing starts when it returns an error.
func (b *backfiller) start(ctx context.Context, cfg *config.Config, req BackfillRequest) (*backfillRun, error) {
	return b.startRun(ctx, cfg, req, nil)
}

// startRun is start, resuming from rs when it is not nil.
func (b *backfiller) startRun(ctx context.Context, cfg *config.Config, req BackfillRequest, rs *backfillResume) (*backfillRun, error) {
	filter, sinks, err := b.validate(cfg, &req)
	if err != nil {
		return nil, err
	}
	var id string
	if rs != nil {
		id = rs.id
	} else {
		var idb [6]byte
		_, _ = rand.Read(idb[:])
		id = hex.EncodeToString(idb[:])
	}
	owner := b.instance + "/" + id
	var held []lease.Lease
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, l := range held {
			_, _ = b.locks.Release(rctx, l.Unit, l.Owner, l.Epoch)
		}
	}
	for _, s := range sinks {
		l, ok, err := b.locks.Acquire(ctx, "backfill:"+s, owner)
		if err != nil {
			release()
			return nil, fmt.Errorf("backfill: lock sink %s: %w", s, err)
		}
		if !ok {
			release()
			return nil, fmt.Errorf("%w: sink %q runs another backfill (one at a time per sink); cancel it or wait for it to finish", ErrBackfillBusy, s)
		}
		held = append(held, l)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &backfillRun{id: id, req: req, filter: filter, sinks: sinks, cancel: cancel, done: make(chan struct{}), resume: rs}
	r.st = BackfillStatus{ID: id, Source: req.Source, Sink: req.Sink, Filter: req.Filter, Rate: req.Rate, State: "running", StartedAt: time.Now().UTC()}
	if rs != nil {
		r.st.Scanned = rs.scanned
		if !rs.startedAt.IsZero() {
			r.st.StartedAt = rs.startedAt.UTC()
		}
	}
	if err := b.saveRecord(ctx, r, "running"); err != nil {
		cancel()
		release()
		return nil, fmt.Errorf("backfill: record: %w", err)
	}
	b.mu.Lock()
	b.runs[id] = r
	b.order = append(b.order, id)
	b.pruneLocked()
	b.mu.Unlock()
	// A shutdown of the process (ctx) cancels the backfill too.
	stopOnCtx := context.AfterFunc(ctx, cancel)
	var src config.Source
	for _, s := range cfg.Sources {
		if s.Name == req.Source {
			src = s
		}
	}
	log := b.log.With("backfill", id, "source", req.Source, "sink", req.Sink)
	log.Info("backfill started", "filter", req.Filter, "rate", req.Rate)
	go func() {
		defer close(r.done)
		defer stopOnCtx()
		defer release()
		defer cancel() // first: stops the lock renewal before the release
		lost := make(chan struct{})
		go b.renew(rctx, held, lost, cancel)
		saverDone := make(chan struct{})
		go func() {
			defer close(saverDone)
			b.saveProgress(rctx, r)
		}()
		err := b.run(rctx, r, src, log)
		// What was sent is finished first (bounded: a cancelled CLI run
		// stops its deliveries after this).
		for deadline := time.Now().Add(30 * time.Second); r.inFlight.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		r.mu.Lock()
		r.st.FinishedAt = time.Now().UTC()
		switch {
		case err == nil:
			r.st.State = "done"
		case rctx.Err() != nil:
			r.st.State = "cancelled"
			select {
			case <-lost:
				r.st.State, r.st.Error = "failed", "the sink's backfill lock was lost"
			default:
			}
		default:
			r.st.State, r.st.Error = "failed", err.Error()
		}
		st := r.st
		// What a finished run keeps is small: the filter's text cut, its
		// parsed form dropped.
		r.st.Filter = cutFilter(r.st.Filter)
		r.filter = nil
		r.mu.Unlock()
		cancel()
		<-saverDone
		switch {
		case st.State == "cancelled" && !r.userCancelled.Load():
			// The process is stopping: the record stays running, with
			// its last acknowledged progress, and the next start resumes.
			b.saveProgressNow(context.WithoutCancel(ctx), r)
			log.Info("backfill stopped with the process; it resumes on the next start", "scanned", st.Scanned)
		default:
			b.saveProgressNow(context.WithoutCancel(ctx), r)
			if err := b.saveRecord(context.WithoutCancel(ctx), r, st.State); err != nil {
				log.Warn("cannot record the backfill's end", "err", err)
			}
		}
		log.Info("backfill ended", "state", st.State, "scanned", st.Scanned, "sent", st.Sent, "err", st.Error)
		b.mu.Lock()
		b.pruneLocked()
		b.mu.Unlock()
	}()
	return r, nil
}

// saveRecord writes r's request and state (not its progress).
func (b *backfiller) saveRecord(ctx context.Context, r *backfillRun, state string) error {
	if b.records == nil {
		return nil
	}
	st := r.status()
	set := bson.D{
		{Key: "source", Value: r.req.Source}, {Key: "sink", Value: r.req.Sink}, {Key: "filter", Value: r.req.Filter},
		{Key: "rate", Value: r.req.Rate}, {Key: "state", Value: state}, {Key: "startedAt", Value: st.StartedAt},
		{Key: "updatedAt", Value: time.Now().UTC()},
	}
	if b.origin != "" {
		set = append(set, bson.E{Key: "origin", Value: b.origin})
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.records.UpdateOne(wctx, bson.D{{Key: "_id", Value: r.id}}, bson.D{{Key: "$set", Value: set}}, options.UpdateOne().SetUpsert(true))
	return err
}

// saveProgress saves r's acknowledged progress every second until ctx ends.
func (b *backfiller) saveProgress(ctx context.Context, r *backfillRun) {
	if b.records == nil {
		return
	}
	var saved uint64
	for {
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if tr := r.tracker(); tr != nil {
			if _, v := tr.Position(); v != saved {
				if b.saveProgressNow(ctx, r) {
					saved = v
				}
			}
		}
	}
}

// saveProgressNow saves r's acknowledged progress once.
func (b *backfiller) saveProgressNow(ctx context.Context, r *backfillRun) bool {
	tr := r.tracker()
	if b.records == nil || tr == nil {
		return false
	}
	pos, _ := tr.Position()
	var at struct {
		NS string        `bson:"ns"`
		ID bson.RawValue `bson:"_id"`
	}
	if len(pos.Token) == 0 || bson.Unmarshal(pos.Token, &at) != nil || at.NS == "" {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.records.UpdateOne(wctx, bson.D{{Key: "_id", Value: r.id}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "namespace", Value: at.NS}, {Key: "after", Value: at.ID},
		{Key: "scanned", Value: r.status().Scanned}, {Key: "updatedAt", Value: time.Now().UTC()},
	}}})
	if err != nil {
		b.log.Warn("cannot save backfill progress", "backfill", r.id, "err", err)
		return false
	}
	return true
}

func (r *backfillRun) tracker() *checkpoint.Tracker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked
}

// resumeAll resumes, from their acknowledged progress and with the same
// ids, the backfills a previous run of the gateway (or another replica)
// left running: stopped, killed or crashed. A backfill whose sink lock is
// still held (by its crashed owner until the lock expires, or by another
// replica running it) is retried until it can be taken or is no longer
// running. It returns when ctx ends or every such backfill was resumed.
func (b *backfiller) resumeAll(ctx context.Context, cfg func() *config.Config) {
	if b.records == nil {
		return
	}
	for {
		// The command line's backfills are resumed by the command line
		// (changegate backfill -resume ID), not by a gateway.
		cur, err := b.records.Find(ctx, bson.D{{Key: "state", Value: "running"}, {Key: "origin", Value: bson.D{{Key: "$ne", Value: backfillOriginCLI}}}})
		var recs []backfillRecord
		if err == nil {
			err = cur.All(ctx, &recs)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			b.log.Warn("cannot list backfills to resume", "err", err)
		}
		waiting := err != nil
		for _, rec := range recs {
			b.mu.Lock()
			_, mine := b.runs[rec.ID]
			b.mu.Unlock()
			if mine {
				continue
			}
			req, rs := rec.resume()
			_, err := b.startRun(ctx, cfg(), req, rs)
			switch {
			case err == nil:
				b.log.Info("resumed a backfill left running", "backfill", rec.ID, "namespace", rec.Namespace, "scanned", rec.Scanned)
			case errors.Is(err, ErrBackfillInput):
				b.log.Warn("cannot resume a backfill: its request no longer fits the configuration", "backfill", rec.ID, "err", err)
				_, _ = b.records.UpdateOne(ctx, bson.D{{Key: "_id", Value: rec.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: "failed"}}}})
			default:
				waiting = true // busy: its lock is still held
			}
		}
		if !waiting {
			return
		}
		t := time.NewTimer(5 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// pruneLocked forgets all but the newest backfillHistory finished
// backfills, whatever runs (a long-running old backfill does not keep
// later finished ones listed). b.mu must be held.
func (b *backfiller) pruneLocked() {
	finished := 0
	keep := b.order[:0:0]
	for i := len(b.order) - 1; i >= 0; i-- {
		id := b.order[i]
		if b.runs[id].status().State != "running" {
			finished++
			if finished > backfillHistory {
				delete(b.runs, id)
				continue
			}
		}
		keep = append(keep, id)
	}
	slices.Reverse(keep)
	b.order = keep
}

// cutFilter returns a backfill filter's text cut to backfillKeptFilter
// bytes (on a rune boundary, marked with "…").
func cutFilter(s string) string {
	if len(s) <= backfillKeptFilter {
		return s
	}
	n := backfillKeptFilter
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// renew keeps the sinks' locks while the backfill runs; a lock it cannot
// keep cancels the backfill.
func (b *backfiller) renew(ctx context.Context, held []lease.Lease, lost chan struct{}, cancel context.CancelFunc) {
	t := time.NewTicker(backfillLeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i, l := range held {
			nl, ok, err := b.locks.Renew(ctx, l)
			if err == nil && ok {
				held[i] = nl
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				close(lost)
				cancel()
				return
			}
			b.log.Warn("cannot renew a backfill lock; will retry", "err", err)
		}
	}
}

// run scans the source's collections in _id order and sends each matching
// document, throttled: at most req.Rate documents per second, at most
// backfillInFlight unfinished, and never while the sinks have live
// changes queued.
func (b *backfiller) run(ctx context.Context, r *backfillRun, src config.Source, log *slog.Logger) error {
	nss, err := source.Namespaces(ctx, b.client, src.Database, src.Collection, b.stateDB)
	if err != nil {
		return err
	}
	var est int64
	if len(r.filter) == 0 {
		est = source.EstimateDocuments(ctx, b.client, nss)
	} else {
		for _, ns := range nss {
			db, coll, _ := strings.Cut(ns, ".")
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := b.client.Database(db).Collection(coll).CountDocuments(cctx, r.filter)
			cancel()
			if err != nil {
				est = 0
				break
			}
			est += n
		}
	}
	r.mu.Lock()
	r.st.Estimated = est
	r.mu.Unlock()
	burst := max(1, min(int(r.req.Rate), 100))
	lim := rate.NewLimiter(rate.Limit(r.req.Rate), burst)
	space := make(chan struct{}, 1)
	docsSent := b.metrics.BackfillDocuments.WithLabelValues(r.req.Source, r.req.Sink)
	finish := func(failed bool) {
		r.inFlight.Add(-1)
		r.mu.Lock()
		r.st.Finished++
		if failed {
			r.st.Failed++
		}
		r.mu.Unlock()
		select {
		case space <- struct{}{}:
		default:
		}
	}
	// The acknowledged progress: each document read is a slot, its
	// position {ns, _id}; the watermark is saved (saveProgress).
	tr := checkpoint.NewTracker(backfillInFlight+1, checkpoint.Position{})
	r.mu.Lock()
	r.acked = tr
	r.mu.Unlock()
	for _, ns := range nss {
		var after bson.Raw
		if rs := r.resume; rs != nil && rs.namespace != "" {
			if ns < rs.namespace {
				continue // scanned before the restart
			}
			if ns == rs.namespace {
				after = rs.after
			}
		}
		db, coll, _ := strings.Cut(ns, ".")
		r.mu.Lock()
		r.st.Namespace = ns
		r.mu.Unlock()
		// Events carry the documentKey the stream gives (with the shard
		// key of a sharded collection).
		shardKey, err := source.ShardKeyFields(ctx, b.client, db, coll)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Warn("backfill: cannot read the shard key; documentKey is {_id} only", "namespace", ns, "err", err)
		}
		for {
			mark := b.target.mark(r.req.Source) // before the read
			var f any = bson.D{}
			switch {
			case after != nil:
				f = source.AfterIDFilter(after.Lookup("_id"), r.filter)
			case len(r.filter) > 0:
				f = r.filter
			}
			cur, err := b.client.Database(db).Collection(coll).Find(ctx, f,
				options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(int32(min(max(burst*2, 100), 1000))))
			if err != nil {
				return fmt.Errorf("read %s: %w", ns, err)
			}
			for cur.Next(ctx) {
				if err := lim.Wait(ctx); err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				// Live changes first, and a bounded backlog of our own.
				for r.inFlight.Load() >= backfillInFlight || b.target.liveQueued(r.sinks, r.inFlight.Load()) > 0 {
					t := time.NewTimer(20 * time.Millisecond)
					select {
					case <-ctx.Done():
						t.Stop()
						_ = cur.Close(context.WithoutCancel(ctx))
						return ctx.Err()
					case <-space:
					case <-t.C:
					}
					t.Stop()
				}
				doc := cur.Current
				idv := doc.Lookup("_id")
				after, _ = bson.Marshal(bson.D{{Key: "_id", Value: idv}})
				tok, _ := bson.Marshal(bson.D{{Key: "ns", Value: ns}, {Key: "_id", Value: idv}})
				seq, err := tr.Add(ctx, tok, bson.Timestamp{}, time.Time{})
				if err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				done := func(failed bool) {
					tr.Ack(seq)
					finish(failed)
				}
				ev, err := source.SnapshotEventKeyed(r.req.Source, source.BackfillPrefix(r.id), db, coll, bson.Timestamp{}, time.Now(), doc, shardKey)
				r.mu.Lock()
				r.st.Scanned++
				r.mu.Unlock()
				if err != nil {
					tr.Ack(seq)
					continue
				}
				// Admitted against the byte budget as a change is; the
				// lanes it is handed to hold their own references.
				mem, err := b.budget.Acquire(ctx, int64(len(ev.Raw)), "backfill "+r.id)
				if err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				ev.Mem = mem
				r.inFlight.Add(1)
				sent := b.sendOrdered(ctx, r, db, coll, shardKey, ev, idv, mark, done)
				mem.Release()
				if !sent {
					r.inFlight.Add(-1)
					if ctx.Err() != nil {
						// Not handed over because the backfill stops
						// (the CLI's send gives up waiting for a
						// delivery slot): not acknowledged, so that a
						// resume reads it again. Acknowledging it lost
						// the document on resume.
						_ = cur.Close(context.WithoutCancel(ctx))
						return ctx.Err()
					}
					tr.Ack(seq) // no sink routes it
					continue
				}
				docsSent.Inc()
				r.mu.Lock()
				r.st.Sent++
				r.mu.Unlock()
			}
			err = cur.Err()
			_ = cur.Close(context.WithoutCancel(ctx))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Warn("backfill read failed; reopening after the last document read", "namespace", ns, "err", err)
			time.Sleep(time.Second)
		}
	}
	// Wait for the deliveries of what was sent.
	for r.inFlight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-space:
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// sendOrdered hands ev (the document read after mark) on in order with the
// live stream: if a change of the document was dispatched since mark, it
// reads the document again (with a new mark) and retries; a document
// deleted or no longer matching meanwhile is not sent (its change is on
// the way). It reports whether ev (or its re-read) was handed to a sink.
func (b *backfiller) sendOrdered(ctx context.Context, r *backfillRun, db, coll string, shardKey []string, ev *event.Event, id bson.RawValue, mark any, done func(bool)) bool {
	routed, changed := b.target.sendAfter(ctx, r.req.Sink, ev, mark, done)
	for try := 0; changed && try < backfillRereads; try++ {
		r.mu.Lock()
		r.st.Reread++
		r.mu.Unlock()
		mark = b.target.mark(r.req.Source)
		f := bson.D{{Key: "_id", Value: id}}
		if len(r.filter) > 0 {
			f = bson.D{{Key: "$and", Value: bson.A{f, r.filter}}}
		}
		raw, err := b.client.Database(db).Collection(coll).FindOne(ctx, f).Raw()
		if err != nil {
			if !errors.Is(err, mongo.ErrNoDocuments) {
				b.log.Warn("backfill: cannot read a document again; not sending it", "namespace", db+"."+coll, "err", err)
			}
			return false
		}
		mem := ev.Mem
		if ev, err = source.SnapshotEventKeyed(r.req.Source, source.BackfillPrefix(r.id), db, coll, bson.Timestamp{}, time.Now(), raw, shardKey); err != nil {
			return false
		}
		mem.Resize(int64(len(ev.Raw))) // the re-read replaces the first read
		ev.Mem = mem
		routed, changed = b.target.sendAfter(ctx, r.req.Sink, ev, mark, done)
	}
	if changed {
		r.mu.Lock()
		r.st.Unordered++
		r.mu.Unlock()
		routed = b.target.send(ctx, r.req.Sink, ev, done)
	}
	return routed
}

// get returns the status of backfill id.
func (b *backfiller) get(id string) (BackfillStatus, bool) {
	b.mu.Lock()
	r := b.runs[id]
	b.mu.Unlock()
	if r == nil {
		return BackfillStatus{}, false
	}
	return r.status(), true
}

// list returns the backfills of this process, oldest first.
func (b *backfiller) list() []BackfillStatus {
	b.mu.Lock()
	runs := make([]*backfillRun, 0, len(b.order))
	for _, id := range b.order {
		runs = append(runs, b.runs[id])
	}
	b.mu.Unlock()
	out := make([]BackfillStatus, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.status())
	}
	return out
}

// cancel stops backfill id: nothing more is read; what was sent is still
// delivered. It returns the status once the backfill ended.
func (b *backfiller) cancelRun(ctx context.Context, id string) (BackfillStatus, error) {
	b.mu.Lock()
	r := b.runs[id]
	b.mu.Unlock()
	if r == nil {
		return BackfillStatus{}, fmt.Errorf("%w %q", ErrBackfillNotFound, id)
	}
	r.userCancelled.Store(true)
	r.cancel()
	select {
	case <-r.done:
	case <-ctx.Done():
	}
	return r.status(), nil
}

// stopAll cancels every running backfill and waits (a bounded time) for
// them to end: the gateway is stopping.
func (b *backfiller) stopAll() {
	b.mu.Lock()
	var runs []*backfillRun
	for _, r := range b.runs {
		runs = append(runs, r)
	}
	b.mu.Unlock()
	deadline := time.After(10 * time.Second)
	for _, r := range runs {
		r.cancel()
		select {
		case <-r.done:
		case <-deadline:
			return
		}
	}
}

// laneTarget sends through a running engine's lanes, each event in order
// with the live stream of the unit that owns its document when that unit
// runs in this process (see source.Source.DispatchIfUnchanged).
type laneTarget struct {
	engine *router.Engine
	// units returns the sources of the units of source running here, by
	// unit name, and the source's partition count.
	units func(source string) (map[string]*source.Source, int)
}

// unitMarks is laneTarget's mark: each running unit's DispatchMark.
type unitMarks struct {
	parts int
	srcs  map[string]*source.Source
	marks map[string]uint64
}

func (t laneTarget) mark(src string) any {
	if t.units == nil {
		return nil
	}
	srcs, n := t.units(src)
	m := unitMarks{parts: n, srcs: srcs, marks: make(map[string]uint64, len(srcs))}
	for name, s := range srcs {
		m.marks[name] = s.DispatchMark()
	}
	return m
}

func (t laneTarget) sendAfter(ctx context.Context, sink string, ev *event.Event, mark any, done func(bool)) (bool, bool) {
	m, ok := mark.(unitMarks)
	if !ok {
		return t.send(ctx, sink, ev, done), false
	}
	unit := source.UnitName(ev.Source, 0, 1)
	if m.parts > 1 {
		h := mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: ev.DocumentKey})
		unit = source.UnitName(ev.Source, mhash.Partition(h, m.parts), m.parts)
	}
	src, running := m.srcs[unit]
	if !running {
		// Another replica owns the unit (cluster mode): no ordering.
		return t.send(ctx, sink, ev, done), false
	}
	var routed bool
	sent := src.DispatchIfUnchanged(ev, m.marks[unit], func() {
		routed = t.engine.DispatchTo(sink, ev, func() { done(false) })
	})
	return routed, !sent
}

func (t laneTarget) send(_ context.Context, sink string, ev *event.Event, done func(bool)) bool {
	return t.engine.DispatchTo(sink, ev, func() { done(false) })
}

func (t laneTarget) liveQueued(sinks []string, own int64) int64 {
	var q int64
	for _, s := range sinks {
		if l := t.engine.Lane(s); l != nil {
			st := l.Status()
			q += st.Queued
		}
	}
	// Our own events are at most own of those queued; the rest are live.
	return max(0, q-own)
}

// directTarget delivers from the CLI with Engine.DeliverNow (the sinks'
// retry policy, no lanes: the running gateway's lanes and parked
// backlogs are its own), a few deliveries at a time.
type directTarget struct {
	engine *router.Engine
	sem    chan struct{}
	log    *slog.Logger
}

func (t *directTarget) send(ctx context.Context, sink string, ev *event.Event, done func(bool)) bool {
	m := t.engine.Rules().Route(ev)
	var names []string
	for _, i := range m.Sinks {
		name := t.engine.Lanes()[i].Name()
		if sink == "" || name == sink {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return false
	}
	ev.Rules = m.Rules
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	ev.Mem.Retain(1) // this goroutine's, until it delivered
	go func() {
		defer func() { <-t.sem }()
		defer ev.Mem.Release()
		failed := false
		for _, n := range names {
			if err := t.engine.DeliverNow(context.WithoutCancel(ctx), n, ev); err != nil {
				failed = true
				t.log.Warn("backfill delivery failed", "sink", n, "id", ev.ID, "err", err)
			}
		}
		done(failed)
	}()
	return true
}

func (t *directTarget) liveQueued([]string, int64) int64 { return 0 }

func (t *directTarget) mark(string) any { return nil }

func (t *directTarget) sendAfter(ctx context.Context, sink string, ev *event.Event, _ any, done func(bool)) (bool, bool) {
	return t.send(ctx, sink, ev, done), false
}

// Backfill runs one backfill from the command line: it sends the documents
// of req.Source matching req.Filter to req.Sink (or every matching sink)
// with the sinks' retry policy, throttled by req.Rate, holding the sinks'
// backfill locks (so no other backfill of them runs meanwhile, in any
// process). progress, when not nil, is called about twice a second and
// once at the end. Cancelling ctx stops reading; what was sent is
// finished first. It returns the final status; an error wrapping
// ErrBackfillInput or ErrBackfillBusy means nothing started.
//
// The backfill is recorded in the state database (as the gateway's, marked
// as the command line's, which gateways do not resume): when the process
// stops or dies before the end, ResumeBackfill continues it with the same
// id, after the last document acknowledged.
func Backfill(ctx context.Context, cfg *config.Config, client *mongo.Client, req BackfillRequest, log *slog.Logger, progress func(BackfillStatus)) (BackfillStatus, error) {
	return backfillCLI(ctx, cfg, client, req, "", log, progress)
}

// ResumeBackfill resumes the command line's backfill id, left running by a
// stop (SIGINT), a kill or a crash: with its request, its id (so its event
// ids) and after the last document it saw acknowledged. A backfill of the
// gateway, or one that ended, is refused (ErrBackfillInput). The sinks'
// locks of a process that died are taken once they expire (at most
// backfillLeaseTTL, which ResumeBackfill waits); a live process's are not
// (ErrBackfillBusy).
func ResumeBackfill(ctx context.Context, cfg *config.Config, client *mongo.Client, id string, log *slog.Logger, progress func(BackfillStatus)) (BackfillStatus, error) {
	if id == "" {
		return BackfillStatus{}, fmt.Errorf("%w: no backfill id", ErrBackfillInput)
	}
	return backfillCLI(ctx, cfg, client, BackfillRequest{}, id, log, progress)
}

// backfillCLI runs req, or resumes the recorded backfill resumeID.
func backfillCLI(ctx context.Context, cfg *config.Config, client *mongo.Client, req BackfillRequest, resumeID string, log *slog.Logger, progress func(BackfillStatus)) (BackfillStatus, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, dls := Stores(cfg, client)
	rules, err := CompileRules(cfg)
	if err != nil {
		return BackfillStatus{}, err
	}
	specs, err := BuildSinks(cfg, log)
	if err != nil {
		return BackfillStatus{}, err
	}
	engine, err := router.NewEngine(rules, specs, dls, nil, log)
	if err != nil {
		return BackfillStatus{}, err
	}
	defer engine.Stop()
	host := cfg.Cluster.Instance
	if host == "" {
		host = "cli"
	}
	// One lock owner per process: a resume must wait for a dead
	// process's locks to expire, and must not share a live one's.
	var tok [4]byte
	_, _ = rand.Read(tok[:])
	stateDB := client.Database(cfg.Mongo.StateDatabase)
	b := newBackfiller(client, stateDB, host+"/cli-"+hex.EncodeToString(tok[:]), &directTarget{engine: engine, sem: make(chan struct{}, 8), log: log}, engine.SinksOf, nil, log)
	b.records, b.origin = stateDB.Collection(backfillRecordsCollection), backfillOriginCLI
	sizing, err := MemorySizing(cfg)
	if err != nil {
		return BackfillStatus{}, err
	}
	b.budget = memory.NewBudget(sizing.Budget, log, nil)
	engine.SetBudget(b.budget)
	var r *backfillRun
	if resumeID == "" {
		r, err = b.start(ctx, cfg, req)
	} else {
		r, err = b.resumeCLI(ctx, cfg, resumeID)
	}
	if err != nil {
		return BackfillStatus{}, err
	}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			st := r.status()
			if progress != nil {
				progress(st)
			}
			if st.State == "failed" {
				return st, errors.New(st.Error)
			}
			return st, nil
		case <-t.C:
			if progress != nil {
				progress(r.status())
			}
		}
	}
}

// resumeCLI resumes the command line's recorded backfill id, waiting up
// to the lock's lifetime for the locks of the process that ran it.
func (b *backfiller) resumeCLI(ctx context.Context, cfg *config.Config, id string) (*backfillRun, error) {
	var rec backfillRecord
	err := b.records.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&rec)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, fmt.Errorf("%w: no backfill %q", ErrBackfillInput, id)
	case err != nil:
		return nil, fmt.Errorf("backfill: read %s: %w", id, err)
	case rec.Origin != backfillOriginCLI:
		return nil, fmt.Errorf("%w: backfill %s was started by a gateway, which resumes it itself", ErrBackfillInput, id)
	case rec.State != "running":
		return nil, fmt.Errorf("%w: backfill %s is %s: nothing to resume", ErrBackfillInput, id, rec.State)
	}
	req, rs := rec.resume()
	deadline := time.Now().Add(backfillLeaseTTL + 5*time.Second)
	for {
		r, err := b.startRun(ctx, cfg, req, rs)
		if !errors.Is(err, ErrBackfillBusy) || time.Now().After(deadline) {
			return r, err
		}
		b.log.Info("waiting for the backfill's sink lock (held until it expires when its process died)", "backfill", id)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// unitSources returns the sources of src's units running in this process,
// by unit name, and src's partition count.
func (g *gateway) unitSources(src string) (map[string]*source.Source, int) {
	n := 1
	for _, d := range g.defs {
		if d.source == src {
			n = max(n, d.spec.Partitions)
		}
	}
	out := map[string]*source.Source{}
	for _, u := range g.units.snapshot() {
		if u.def.source == src {
			out[u.def.name] = u.src
		}
	}
	return out, n
}
