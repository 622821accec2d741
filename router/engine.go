package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/limit"
)

// Ordering says which deliveries of one sink must happen in stream order.
type Ordering string

// Orderings.
const (
	// OrderKey delivers events for the same document (namespace and
	// documentKey) in stream order; different documents go in parallel.
	OrderKey Ordering = "key"
	// OrderNone lets every event go in parallel.
	OrderNone Ordering = "none"
	// OrderStrict delivers one batch at a time, in stream order.
	OrderStrict Ordering = "strict"
)

// SinkSpec is a sink and how the engine drives it.
type SinkSpec struct {
	Sink     sinks.Sink
	Retry    sinks.RetryPolicy
	Ordering Ordering
	// MaxInFlight is the number of concurrent deliveries (partitions, one
	// worker each) with a fixed limit; 0 (max_in_flight = "auto") adapts
	// the limit within Limit.Min..Limit.Max and runs Limit.Max workers.
	MaxInFlight int
	BatchSize   int           // events per Send, 1..Sink.MaxBatch()
	BatchWait   time.Duration // how long to wait to fill a batch
	// ParkAfter is how long a sink may keep failing before its backlog is
	// parked in the dead-letter store (kind "parked") and acknowledged, so
	// the source is not held back by it; parked events are re-driven in
	// order once the sink recovers. Zero disables parking.
	ParkAfter time.Duration
	// ParkBacklog parks earlier when the sink is failing and this many
	// events are queued for it (0: only ParkAfter applies).
	ParkBacklog int
	// Limit configures the lane's limiter stage (sinks/limit: adaptive or
	// fixed concurrency, rate limit, circuit breaker); its Fixed is taken
	// from MaxInFlight. Without UseLimit the lane has no limiter stage
	// beyond its MaxInFlight workers.
	Limit    limit.Config
	UseLimit bool
	// Group (transactions = "group") delivers the events of one
	// transaction routed to the sink together (router/txn.go).
	Group bool
	// Limiter, when set, replaces the limiter stage built from Limit
	// (tests).
	Limiter Limiter
	// Kind is the sink's type (webhook, sqs, ...): the messaging.system of
	// its spans.
	Kind string
	// NoTraceContext leaves the trace context out of the sink's requests
	// and messages (trace_context = false).
	NoTraceContext bool
	// Held keeps the sink from receiving anything (a paused
	// subscription): the lane starts parked and does not re-drive, so every
	// event routed to it is parked in the dead-letter store and acked. A
	// lane of the same sink without Held (a reload: the subscription
	// resumed) re-drives them in stream order, then goes live. It needs the
	// dead-letter store.
	Held bool

	// reshape shapes an event rebuilt from a parked entry with the
	// engine's current shaping for this sink (set by the engine).
	reshape func(*event.Event) (*event.Event, bool, error)
}

// DeadLetters is the part of the dead-letter store the engine uses.
type DeadLetters interface {
	Put(ctx context.Context, e deadletter.Entry) error
	PutMany(ctx context.Context, es []deadletter.Entry) error
	// Summaries walks the entries of f in List order without their change
	// and envelope; Get reads one entry whole.
	Summaries(ctx context.Context, f deadletter.Filter, ready func(), fn func(deadletter.Entry) error) error
	Get(ctx context.Context, id string) (deadletter.Entry, bool, error)
	Count(ctx context.Context, f deadletter.Filter) (int64, error)
	DeleteVersion(ctx context.Context, id string, ver int64) (bool, error)
	Convert(ctx context.Context, id string, to deadletter.Kind, reason, lastErr string) error
}

// Engine routes events to sink lanes. Dispatch is called by sources; the
// engine calls each event's ack once every sink it was routed to has
// delivered or durably dead-lettered (or parked) it.
type Engine struct {
	state   atomic.Pointer[engineState]
	dl      DeadLetters
	own     *ownership
	budget  *memory.Budget // set by SetBudget before Start
	redrive *memory.Budget // the re-drives' share of budget (RedriveSharePercent)
	metrics *metrics.Metrics
	log     *slog.Logger
	obs     observe.Observer // set by SetObserver before Start; nil: none
	hooks   observe.Hooks    // obs's, if it has them

	mu      sync.Mutex // guards ctx, retired and reloads
	ctx     context.Context
	cancel  context.CancelFunc
	retired []*Lane // lanes replaced or removed by a reload, finishing their work
	bg      sync.WaitGroup

	// unmatched caches EventsUnmatched's counter per source (copy on
	// write under unmatchedMu).
	unmatched   atomic.Pointer[map[string]prometheus.Counter]
	unmatchedMu sync.Mutex
}

// engineState is what Dispatch routes with: the rules and the lanes their
// sink indexes refer to. It is replaced as a whole by Reload.
type engineState struct {
	rules *Rules
	lanes []*Lane
	// matched caches EventsMatched's counter of each rule (by rule.idx),
	// created on the rule's first match as WithLabelValues would.
	matched []atomic.Pointer[prometheus.Counter]
	// sinks are the lanes as the observers see them (observe.Dispatch).
	sinks []observe.Sink
	// sourceLanes: per source, the lanes its rules route to (ReadAhead).
	sourceLanes map[string][]int
}

// endTxn tells every grouped lane that ev's transaction ended.
func (st *engineState) endTxn(ev *event.Event) {
	for _, l := range st.lanes {
		if l.spec.Group {
			l.endTxn(ev)
		}
	}
}

// FlushTxn implements source.TxnFlusher: every grouped lane queues what it
// collected of unit's open transaction id as a part of it, and keeps its
// newest event of it (router/txn.go). It returns the bytes and the number
// of the distinct events kept.
func (e *Engine) FlushTxn(unit, id string) (keptBytes int64, kept int) {
	st := e.state.Load()
	k := txnKeyOf(unit, id)
	var seen []*event.Event
	for _, l := range st.lanes {
		if !l.spec.Group {
			continue
		}
		if ev := l.flushTxn(k); ev != nil && !slices.Contains(seen, ev) {
			seen = append(seen, ev)
			keptBytes += ev.Mem.Bytes()
		}
	}
	return keptBytes, len(seen)
}

func newEngineState(rules *Rules) *engineState {
	return &engineState{rules: rules, matched: make([]atomic.Pointer[prometheus.Counter], len(rules.rules)), sourceLanes: sourceLanes(rules)}
}

// countMatch counts an event matched by rule idx.
func (e *Engine) countMatch(st *engineState, idx int) {
	p := st.matched[idx].Load()
	if p == nil {
		r := st.rules.rules[idx]
		c := e.metrics.EventsMatched.WithLabelValues(r.source, r.name)
		p = &c
		st.matched[idx].Store(p)
	}
	(*p).Inc()
}

// countUnmatched counts an event of source that matched no rule.
func (e *Engine) countUnmatched(source string) {
	if c, ok := (*e.unmatched.Load())[source]; ok {
		c.Inc()
		return
	}
	e.unmatchedMu.Lock()
	defer e.unmatchedMu.Unlock()
	old := *e.unmatched.Load()
	c, ok := old[source]
	if !ok {
		c = e.metrics.EventsUnmatched.WithLabelValues(source)
		next := make(map[string]prometheus.Counter, len(old)+1)
		for k, v := range old {
			next[k] = v
		}
		next[source] = c
		e.unmatched.Store(&next)
	}
	c.Inc()
}

// NewEngine builds the lanes. rules' sink indexes refer to specs in order.
func NewEngine(rules *Rules, specs []SinkSpec, dl DeadLetters, m *metrics.Metrics, log *slog.Logger) (*Engine, error) {
	if m == nil {
		m = metrics.New(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{dl: dl, metrics: m, log: log, own: &ownership{}}
	e.unmatched.Store(&map[string]prometheus.Counter{})
	st := newEngineState(rules)
	for _, sp := range specs {
		sp.reshape = e.reshaper(sp.Sink.Name())
		l, err := newLane(sp, dl, m, log.With("sink", sp.Sink.Name()))
		if err != nil {
			return nil, err
		}
		l.own = e.own
		st.lanes = append(st.lanes, l)
	}
	st.sinks = sinksOf(st.lanes)
	e.state.Store(st)
	return e, nil
}

// SetBudget sets the process's byte budget (max_in_flight_bytes): the
// lanes' re-drives admit the parked entries they read against it, and
// requests bodies built by the sinks are charged to it while they are sent.
// Call it before Start. A nil budget counts nothing.
func (e *Engine) SetBudget(b *memory.Budget) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.budget = b
	e.redrive = nil
	if b != nil {
		e.redrive = memory.NewBudget(max(b.Limit()*RedriveSharePercent/100, deadletter.MaxEntryBytes), nil, nil)
	}
	for _, l := range e.state.Load().lanes {
		l.setBudget(b, e.redrive)
	}
}

// RedriveSharePercent is the share of the byte budget that the re-drives
// of every parked lane together may hold (at least one whole entry): a
// re-drive retries its entries until the sink takes them, so the live
// stream keeps the rest.
const RedriveSharePercent = 25

// Budget returns the byte budget set by SetBudget (nil: none).
func (e *Engine) Budget() *memory.Budget {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.budget
}

// Start starts the lanes' workers; they run until ctx is cancelled or Stop.
// Parked backlogs left by a previous run are re-driven.
func (e *Engine) Start(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ctx, e.cancel = context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range e.state.Load().lanes {
		wg.Add(1)
		go func() { // each lane's start reads the store: in parallel
			defer wg.Done()
			l.start(e.ctx)
		}()
	}
	wg.Wait()
}

// Stop cancels every delivery in progress and waits for the workers to exit.
// Events not yet acknowledged stay unacknowledged (and so are re-read after a
// restart): call Stop after draining.
func (e *Engine) Stop() {
	e.mu.Lock()
	if e.cancel != nil {
		e.cancel()
	}
	e.mu.Unlock()
	e.bg.Wait() // hand-overs in progress retire their lanes
	e.mu.Lock()
	lanes := append(append([]*Lane(nil), e.state.Load().lanes...), e.retired...)
	e.mu.Unlock()
	for _, l := range lanes {
		l.stop()
		_ = l.spec.Sink.Close()
	}
}

// LaneUpdate is one sink of a reloaded configuration: either a new SinkSpec
// (a new or changed sink) or, with Keep set, the existing lane of that name
// unchanged.
type LaneUpdate struct {
	Name string
	Keep bool
	Spec SinkSpec // when !Keep
}

// Reload switches to new rules and sinks without losing events: lanes that
// are kept go on as they are; events already queued for a removed or changed
// sink are still delivered by its old lane, and a changed sink's new lane
// starts delivering only once the old one has drained, so per-document order
// holds across the switch. rules' sink indexes refer to updates in order.
func (e *Engine) Reload(rules *Rules, updates []LaneUpdate) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.state.Load()
	byName := map[string]*Lane{}
	for _, l := range old.lanes {
		byName[l.name] = l
	}
	st := newEngineState(rules)
	var fresh []*Lane
	for _, u := range updates {
		if u.Keep {
			l := byName[u.Name]
			if l == nil {
				return fmt.Errorf("reload: no running sink %q to keep", u.Name)
			}
			st.lanes = append(st.lanes, l)
			delete(byName, u.Name)
			continue
		}
		u.Spec.reshape = e.reshaper(u.Spec.Sink.Name())
		l, err := newLane(u.Spec, e.dl, e.metrics, e.log.With("sink", u.Spec.Sink.Name()))
		if err != nil {
			for _, f := range fresh {
				_ = f.spec.Sink.Close()
			}
			return err
		}
		l.own = e.own
		l.setBudget(e.budget, e.redrive)
		l.setObserver(e.obs)
		fresh = append(fresh, l)
		st.lanes = append(st.lanes, l)
	}
	st.sinks = sinksOf(st.lanes)
	e.state.Store(st)
	// Lanes left in byName are replaced or removed: they finish what they
	// hold, then stop; a replacement starts after its predecessor.
	for _, l := range fresh {
		prev := byName[l.name]
		delete(byName, l.name)
		e.handOver(prev, l)
	}
	for _, prev := range byName {
		e.handOver(prev, nil)
	}
	return nil
}

// handOver retires prev (if any) once it has drained and then starts next
// (if any). A next without prev follows the latest retired lane of its name,
// if one is still finishing (a sink removed and added back). Must be called
// with e.mu held.
func (e *Engine) handOver(prev, next *Lane) {
	if prev == nil {
		for _, r := range e.retired {
			if r.name == next.name {
				prev = r
			}
		}
		if prev != nil {
			prev.successor = next // started by prev's retirement
			return
		}
		if e.ctx != nil {
			next.start(e.ctx)
		}
		return
	}
	prev.successor = next
	e.retired = append(e.retired, prev)
	ctx := e.ctx
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		// prev may itself wait for its predecessor (two reloads in a
		// row): it has to run and drain before next may start.
		prev.waitStarted(ctx)
		prev.retire()
		prev.waitIdle(ctx)
		prev.stop()
		_ = prev.spec.Sink.Close()
		e.mu.Lock()
		for i, r := range e.retired {
			if r == prev {
				e.retired = append(e.retired[:i], e.retired[i+1:]...)
				break
			}
		}
		if next := prev.successor; next != nil && ctx != nil && ctx.Err() == nil {
			next.start(ctx)
		}
		e.mu.Unlock()
	}()
}

// Lanes returns the engine's sink lanes, in spec order.
func (e *Engine) Lanes() []*Lane { return e.state.Load().lanes }

// Lane returns the lane of the named sink, or nil.
func (e *Engine) Lane(name string) *Lane {
	for _, l := range e.state.Load().lanes {
		if l.name == name {
			return l
		}
	}
	return nil
}

// Rules returns the routing table in use.
func (e *Engine) Rules() *Rules { return e.state.Load().rules }

// Dispatch routes ev and hands it to its sinks' lanes. ack is called exactly
// once, when every sink finished with the event — at once when no rule
// matched. Dispatch does not block on slow sinks (the source's in-flight cap
// bounds memory).
func (e *Engine) Dispatch(ev *event.Event, ack func()) { e.dispatch(ev, 0, false, ack) }

// DispatchKeyed is Dispatch for a caller that computed key =
// ev.OrderingKeyHash() already (a source, which records it for
// backfills): the engine does not compute it again.
func (e *Engine) DispatchKeyed(ev *event.Event, key uint64, ack func()) {
	e.dispatch(ev, key, true, ack)
}

// dispatch is Dispatch; keyed: key is ev.OrderingKeyHash().
func (e *Engine) dispatch(ev *event.Event, key uint64, keyed bool, ack func()) {
	st := e.state.Load()
	var ruleIdxs []int // matched rules, when payloads are shaped
	hit := func(idx int) { e.countMatch(st, idx) }
	if st.rules.shaped {
		var buf [8]int
		ruleIdxs = buf[:0]
		hit = func(idx int) {
			e.countMatch(st, idx)
			ruleIdxs = append(ruleIdxs, idx)
		}
	}
	m := st.rules.route(ev, hit)
	if e.obs != nil {
		e.dispatched(st, ev, m.Rules, m.Sinks)
	}
	if ev.Txn != nil && ev.Txn.Last {
		// Grouped lanes queue the transaction once its last event was
		// handed to them (or not, when it is not routed there).
		defer st.endTxn(ev)
	}
	if len(m.Sinks) == 0 {
		e.countUnmatched(ev.Source)
		ack()
		return
	}
	ev.Rules = m.Rules
	// One sink alone reads the payload: it may encode it into its request
	// rather than cache it on the event (event.Event.AppendRecord).
	ev.Exclusive = len(m.Sinks) == 1
	var done func()
	if len(m.Sinks) == 1 {
		done = ack
	} else {
		var remaining atomic.Int32
		remaining.Store(int32(len(m.Sinks)))
		done = func() {
			if remaining.Add(-1) == 0 {
				ack()
			}
		}
	}
	if !keyed {
		key = ev.OrderingKeyHash()
	}
	if !st.rules.shaped {
		for _, s := range m.Sinks {
			st.lanes[s].enqueue(ev, key, done)
		}
		return
	}
	for _, s := range m.Sinks {
		// Shaped after routing (the rules matched the raw change), once
		// per distinct shape: sinks of one shape share the view.
		v, skip := ev.Shaped(st.rules.shapeFor(ruleIdxs, s))
		if skip {
			// skip_empty_updates: nothing for this sink, which is done
			// with the event (it is acknowledged with the others).
			e.metrics.Deliveries.WithLabelValues(st.lanes[s].name, metrics.OutcomeSkippedEmpty).Inc()
			st.lanes[s].skipped(v)
			done()
			continue
		}
		st.lanes[s].enqueue(v, key, done)
	}
}

// ErrParked is returned by DeliverNow when the sink is parked: the event must
// be re-driven after the parked backlog to keep order.
var ErrParked = errors.New("sink is parked")

// DeliverNow delivers one event through the named sink with the sink's retry
// policy, synchronously, bypassing the lanes. The event (rebuilt from a dead
// letter's raw change) is routed and shaped as the current configuration
// routes and shapes it arriving live (Rules.ReshapeStored); one that no
// current rule routes to the sink is not delivered (an error wrapping
// deadletter.ErrNotRouted; see DeliverUnrouted), one that the sink skips
// (skip_empty_updates) counts as delivered. It is used to replay dead
// letters; it returns the last error when the event could not be delivered.
func (e *Engine) DeliverNow(ctx context.Context, sink string, ev *event.Event) error {
	return e.deliverNow(ctx, sink, []*event.Event{ev}, false, false)
}

// DeliverUnrouted is DeliverNow for an operator who asked for changes that
// no current rule routes to their sink to be delivered all the same
// (deliver_unrouted): such a change is shaped with the strictest shape of
// the sink's current rules. A change a current rule routes there is shaped
// as by DeliverNow.
func (e *Engine) DeliverUnrouted(ctx context.Context, sink string, ev *event.Event) error {
	return e.deliverNow(ctx, sink, []*event.Event{ev}, true, false)
}

// Grouped reports whether the named sink delivers the events of one
// transaction together (transactions = "group").
func (e *Engine) Grouped(sink string) bool {
	l := e.Lane(sink)
	return l != nil && l.spec.Group
}

// DeliverGroupNow is DeliverNow for the events of one transaction (in
// txn.index order) replayed to a grouped sink: they are delivered in one
// request marked as a group (sinks.WithTxnGroup), all or none.
func (e *Engine) DeliverGroupNow(ctx context.Context, sink string, evs []*event.Event) error {
	return e.deliverNow(ctx, sink, evs, false, true)
}

// DeliverGroupUnrouted is DeliverGroupNow with DeliverUnrouted's shaping.
func (e *Engine) DeliverGroupUnrouted(ctx context.Context, sink string, evs []*event.Event) error {
	return e.deliverNow(ctx, sink, evs, true, true)
}

func (e *Engine) deliverNow(ctx context.Context, sink string, evs []*event.Event, unrouted, group bool) error {
	l := e.Lane(sink)
	if l == nil {
		return fmt.Errorf("unknown sink %q", sink)
	}
	if l.parked.Load() {
		// Delivering now would overtake the parked backlog of this sink.
		return fmt.Errorf("sink %s: %w: its parked backlog is being re-driven; replay once it is live again", sink, ErrParked)
	}
	var items []*item
	for _, ev := range evs {
		ev, skip, err := e.state.Load().rules.ReshapeStored(ev, sink, unrouted)
		if err != nil {
			return err
		}
		if skip {
			continue // skip_empty_updates: nothing to deliver
		}
		it := newItem(ev)
		it.obs = l.d.obs.replay()
		items = append(items, it)
	}
	if len(items) == 0 {
		return nil
	}
	if group {
		ctx = sinks.WithTxnGroup(ctx)
	}
	_, err := l.d.deliver(ctx, items, modeReplay, nil, 0)
	if x := l.d.obs.replay(); x != nil {
		o := observe.Outcome{Kind: observe.Delivered}
		if err != nil {
			o = observe.Outcome{Kind: observe.Failed, Reason: "error", Failure: failureOf(err)}
			if de, ok := sinks.Classify(err); ok {
				o.Reason = de.Reason
			}
		}
		for _, it := range items {
			x.outcome(it, o)
		}
	}
	return err
}

// DeliverNotice delivers ev, an operational notice (event.NewNotice), through
// the named sink with the sink's retry policy, synchronously and as it is:
// no rule routes it and no shape applies. It returns an error wrapping
// ErrParked when the sink is parked (the caller tries again later), or the
// last error when the sink did not accept it. Nothing of it is stored: a
// notice the sink refuses is the caller's to report.
func (e *Engine) DeliverNotice(ctx context.Context, sink string, ev *event.Event) error {
	l := e.Lane(sink)
	if l == nil {
		return fmt.Errorf("unknown sink %q", sink)
	}
	if l.parked.Load() {
		return fmt.Errorf("sink %s: %w", sink, ErrParked)
	}
	_, err := l.d.deliver(ctx, []*item{newItem(ev)}, modeReplay, nil, 0)
	return err
}

// DispatchTo is Dispatch for a backfill: ev is routed by the rules as
// Dispatch does, but handed only to the named sink's lane (to every
// matching sink when sink is empty). It returns false, without calling
// ack, when no rule routes ev there; otherwise ack is called once every
// sink it was handed to finished with it. It does not count the
// rule-match metrics (a backfill re-sends, it reads no change).
func (e *Engine) DispatchTo(sink string, ev *event.Event, ack func()) bool {
	st := e.state.Load()
	var ruleIdxs []int // matched rules, when payloads are shaped
	var hit func(int)
	if st.rules.shaped {
		hit = func(idx int) { ruleIdxs = append(ruleIdxs, idx) }
	}
	m := st.rules.route(ev, hit)
	targets := m.Sinks
	if sink != "" {
		targets = nil
		for _, s := range m.Sinks {
			if st.lanes[s].name == sink {
				targets = []int{s}
				break
			}
		}
	}
	if len(targets) == 0 {
		return false
	}
	if e.obs != nil {
		e.dispatched(st, ev, m.Rules, targets)
	}
	ev.Rules = m.Rules
	done := ack
	if len(targets) > 1 {
		var remaining atomic.Int32
		remaining.Store(int32(len(targets)))
		done = func() {
			if remaining.Add(-1) == 0 {
				ack()
			}
		}
	}
	key := ev.OrderingKeyHash()
	for _, s := range targets {
		if !st.rules.shaped {
			st.lanes[s].enqueue(ev, key, done)
			continue
		}
		// Shaped as Dispatch shapes: after routing, per sink and rules.
		v, skip := ev.Shaped(st.rules.shapeFor(ruleIdxs, s))
		if skip {
			e.metrics.Deliveries.WithLabelValues(st.lanes[s].name, metrics.OutcomeSkippedEmpty).Inc()
			st.lanes[s].skipped(v)
			done()
			continue
		}
		st.lanes[s].enqueue(v, key, done)
	}
	return true
}

// SinksOf returns the names of the sinks that the rules of source route
// to, in sink order, each once.
func (e *Engine) SinksOf(source string) []string {
	st := e.state.Load()
	seen := make([]bool, len(st.lanes))
	for _, r := range st.rules.bySource[source] {
		for _, s := range r.sinks {
			if s < len(seen) {
				seen[s] = true
			}
		}
	}
	var out []string
	for i, ok := range seen {
		if ok {
			out = append(out, st.lanes[i].name)
		}
	}
	return out
}
