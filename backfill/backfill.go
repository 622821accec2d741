// Package backfill owns on-demand backfills: a scan of a source's
// collections, in _id order and filtered, whose documents are sent again as
// "snapshot" events, to one sink or every sink the rules route them to. It
// owns their runs (at most one per sink, locked by a lease document, in any
// process), their throttling (a rate, a bounded number unfinished, live
// changes first), their order against the live stream of the units running
// here, their progress, and their store (backfill_runs: the request and the
// last acknowledged _id, from which a stopped, killed or crashed backfill
// resumes with the same id).
//
// A Runner sends through a Target: the running gateway's lanes (Lanes) or,
// for the command line, direct deliveries (RunCommandLine). The admin API
// starts, lists and cancels the gateway's backfills through a Runner.
package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/lease"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/metrics"
)

// Backfill limits and defaults.
const (
	// DefaultRate is the documents per second of a backfill that
	// names no rate.
	DefaultRate = 1000
	// MaxRate bounds the rate a backfill may ask for.
	MaxRate = 1_000_000
	// maxFilter bounds the filter's JSON.
	maxFilter = 16 << 10
	// maxInFlight caps the backfill events handed on but not finished.
	maxInFlight = 1000
	// leaseTTL is the lifetime of a sink's backfill lock, renewed
	// every third of it while the backfill runs.
	leaseTTL = 30 * time.Second
	// locksCollection holds the per-sink backfill locks (lease
	// documents "backfill:<sink>") in the state database.
	locksCollection = "backfills"
	// history is how many finished backfills the API lists (the
	// newest); running ones are listed besides, at most one per sink.
	history = 20
	// keptFilter bounds the filter text a finished backfill keeps
	// for the listing (a longer one is cut, marked with "…").
	keptFilter = 512
)

// ErrInput wraps every reason a backfill request was refused
// before anything started (unknown source or sink, invalid filter or
// rate); ErrBusy a sink that runs another backfill.
var (
	ErrInput = errors.New("invalid backfill request")
	ErrBusy  = errors.New("sink busy with another backfill")
	// ErrNotFound: no backfill of that id in this process.
	ErrNotFound = errors.New("no such backfill")
)

// Request asks for the documents of Source that match Filter to be
// sent again, to Sink (a sink the source's rules route to) or, when Sink is
// empty, to every sink whose rules match them.
type Request struct {
	Source string `json:"source"`
	Sink   string `json:"sink,omitempty"`
	// Filter is a MongoDB query filter over the documents, as (relaxed or
	// canonical) Extended JSON; empty: every document.
	Filter string `json:"filter,omitempty"`
	// Rate is the most documents per second the backfill reads (default
	// DefaultRate).
	Rate float64 `json:"rate,omitempty"`
	// Kind is KindRedelivery for a redelivery from the oplog: the changes
	// of Source from Since to Until (excluded) that Filter matches (in the
	// rules' query syntax, over the change event) are read again from the
	// oplog and sent to Sink alone. Empty: a backfill of the documents.
	Kind  string    `json:"kind,omitempty"`
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
}

// KindRedelivery is the Kind of a redelivery from the oplog.
const KindRedelivery = "redelivery"

// Status is the progress of one backfill.
type Status struct {
	ID string `json:"id"`
	// Kind, Since and Until are the request's (a redelivery from the
	// oplog); At is the cluster time up to which every change it read was
	// finished (the position it resumes after).
	Kind   string    `json:"kind,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	Until  time.Time `json:"until,omitzero"`
	At     time.Time `json:"at,omitzero"`
	Source string    `json:"source"`
	Sink   string    `json:"sink,omitempty"`
	Filter string    `json:"filter,omitempty"`
	Rate   float64   `json:"rate"`
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
	// maxRereads re-reads without the ordering guarantee.
	Reread     int64     `json:"reread,omitempty"`
	Unordered  int64     `json:"unordered,omitempty"`
	Estimated  int64     `json:"estimated"`
	Percent    float64   `json:"percent"`
	DocsPerSec float64   `json:"docsPerSecond"`
	ETASeconds float64   `json:"etaSeconds"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

// Runner runs backfills: at most one per sink at a time (a lease
// document per sink in the state database, so also across processes).
type Runner struct {
	client   *mongo.Client
	stateDB  string // never read by a cluster-level backfill
	locks    *lease.Store
	instance string
	target   Target
	sinksOf  func(source string) []string
	streams  Streams
	metrics  *metrics.Metrics
	log      *slog.Logger
	// budget is the process's byte budget (nil: none): each document
	// read is admitted against it before it is handed on.
	budget *memory.Budget

	// records, when set, keeps each backfill's request and acknowledged
	// progress, so that a restart resumes it (same id) from the last
	// acknowledged _id: the gateway's at its next start, the command
	// line's with RunCommandLine.
	records *mongo.Collection
	// origin is written into the records: originCLI for the
	// command line's, "" (none) for the gateway's. A gateway resumes only
	// records without it; the command line resumes its own with -resume.
	origin string

	mu    sync.Mutex
	runs  map[string]*run
	order []string // ids, oldest first
}

// Options configure a Runner.
type Options struct {
	Client *mongo.Client
	// StateDB is changegate's state database: the sinks' backfill locks
	// (and the records, with Record) live there, and a cluster-level
	// backfill never reads it.
	StateDB *mongo.Database
	// Instance names the process in the locks' owner.
	Instance string
	// Target is where the events go.
	Target Target
	// SinksOf returns the sinks the rules of a source route to.
	SinksOf func(source string) []string
	// Streams returns a source's change stream, for redeliveries from
	// the oplog (nil: none of the configuration's sources can be read
	// again).
	Streams Streams
	// Metrics receives the backfill counters; nil: unregistered ones.
	Metrics *metrics.Metrics
	// Log receives the runs' log lines; nil discards.
	Log *slog.Logger
	// Budget is the process's byte budget (nil: none).
	Budget *memory.Budget
	// Record keeps each backfill in the state database's backfill_runs,
	// so that it resumes after a stop, a kill or a crash.
	Record bool
	// CLI marks the records as the command line's: gateways do not
	// resume them (RunCommandLine does, given the id).
	CLI bool
}

// New returns a Runner with no backfill running.
func New(o Options) *Runner {
	m, log := o.Metrics, o.Log
	if m == nil {
		m = metrics.New(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Runner{
		client: o.Client, stateDB: o.StateDB.Name(), locks: lease.NewStore(o.StateDB, locksCollection, leaseTTL),
		instance: o.Instance, target: o.Target, sinksOf: o.SinksOf, streams: o.Streams, metrics: m, log: log, budget: o.Budget,
		runs: map[string]*run{},
	}
	if o.Record {
		b.records = o.StateDB.Collection(recordsCollection)
	}
	if o.CLI {
		b.origin = originCLI
	}
	return b
}

// run is one backfill.
type run struct {
	id     string
	req    Request
	filter bson.Raw
	sinks  []string // sinks locked
	cancel context.CancelFunc
	done   chan struct{}

	inFlight atomic.Int64
	mu       sync.Mutex
	st       Status

	resume        *resumePoint // nil: from the start
	userCancelled atomic.Bool  // cancelled by Cancel, not by a stop
	acked         *checkpoint.Tracker
}

func (r *run) status() Status {
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
	case st.Kind == KindRedelivery:
		if span := st.Until.Sub(st.Since); span > 0 && !st.At.IsZero() {
			st.Percent = min(100, max(0, float64(st.At.Sub(st.Since))*100/float64(span)))
		}
	case st.Estimated > 0:
		st.Percent = min(100, float64(st.Scanned)*100/float64(st.Estimated))
	}
	return st
}

// Get returns the status of backfill id, false when this process has
// none of that id.
func (b *Runner) Get(id string) (Status, bool) {
	b.mu.Lock()
	r := b.runs[id]
	b.mu.Unlock()
	if r == nil {
		return Status{}, false
	}
	return r.status(), true
}

// List returns the backfills of this process (the running ones and the
// last finished), oldest first.
func (b *Runner) List() []Status {
	b.mu.Lock()
	runs := make([]*run, 0, len(b.order))
	for _, id := range b.order {
		runs = append(runs, b.runs[id])
	}
	b.mu.Unlock()
	out := make([]Status, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.status())
	}
	return out
}

// Cancel stops backfill id: nothing more is read; what was sent is still
// delivered. It returns the status once the backfill ended, or when ctx ends
// first; an error wrapping ErrNotFound when there is no such backfill.
func (b *Runner) Cancel(ctx context.Context, id string) (Status, error) {
	b.mu.Lock()
	r := b.runs[id]
	b.mu.Unlock()
	if r == nil {
		return Status{}, fmt.Errorf("%w %q", ErrNotFound, id)
	}
	r.userCancelled.Store(true)
	r.cancel()
	select {
	case <-r.done:
	case <-ctx.Done():
	}
	return r.status(), nil
}

// StopAll cancels every running backfill and waits (a bounded time) for
// them to end: the gateway is stopping.
func (b *Runner) StopAll() {
	b.mu.Lock()
	var runs []*run
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

// pruneLocked forgets all but the newest history finished
// backfills, whatever runs (a long-running old backfill does not keep
// later finished ones listed). b.mu must be held.
func (b *Runner) pruneLocked() {
	finished := 0
	keep := b.order[:0:0]
	for i := len(b.order) - 1; i >= 0; i-- {
		id := b.order[i]
		if b.runs[id].status().State != "running" {
			finished++
			if finished > history {
				delete(b.runs, id)
				continue
			}
		}
		keep = append(keep, id)
	}
	slices.Reverse(keep)
	b.order = keep
}

// cutFilter returns a backfill filter's text cut to keptFilter
// bytes (on a rune boundary, marked with "…").
func cutFilter(s string) string {
	if len(s) <= keptFilter {
		return s
	}
	n := keptFilter
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
