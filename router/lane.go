package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Lane drives one sink. It is a pipeline of small stages, in the spirit of
// Alertmanager's notify pipeline:
//
//   - the queue stage (keyQueue, queue.go): partitions that keep per-key
//     order and hand batches of distinct keys to one worker each;
//   - the delivery stage (deliverer, deliver.go): wait for the sink's pause
//     and the items' backoff, pass the limiter, attempt, classify, back off;
//   - dead-lettering (below) for what fails for good, and the parking
//     stage (park.go): the backlog of a sink that keeps failing is parked
//     in the dead-letter store and re-driven in order once it recovers.
//
// Every event handed to a lane is finished exactly once for it: delivered,
// durably dead-lettered or durably parked; only then is its done called.
type Lane struct {
	name string
	spec SinkSpec
	dl   DeadLetters
	log  *slog.Logger
	clk  clock

	q   *keyQueue
	d   *deliverer
	own *ownership // the engine's; every unit when the lane runs alone
	// budget is the process's byte budget (nil: none), set before start:
	// the re-drive admits the entries it reads against it, and against
	// redriveBudget, the engine's share of it for every lane's re-drive.
	budget, redriveBudget *memory.Budget

	auto    bool // max_in_flight = "auto": the pool follows the limiter
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started chan struct{} // closed by start

	successor *Lane // the lane of this name to start once this one retired; guarded by Engine.mu

	mode       sync.RWMutex // enqueue holds it shared; going live holds it exclusively
	parked     atomic.Bool
	liveMu     sync.Mutex
	baseCtx    context.Context // the engine's: cancelled when the engine stops
	liveCtx    context.Context // cancelled also when the lane is parked
	liveCancel context.CancelFunc
	redrive    chan struct{}

	mDelivered, mDead, mParked, mRedriven prometheus.Counter
	mOversize, mDropped                   prometheus.Counter
	mParkedGauge                          prometheus.Gauge

	// Transactions (txn.go): the open groups of a grouped lane by
	// txnKey, and whether a reload retires the lane.
	groupMu      sync.Mutex
	open         map[string]*txnGroup
	retiring     bool
	mGroups      prometheus.Counter
	mGroupEvents prometheus.Observer
}

var _ finisher = (*Lane)(nil)

func newLane(sp SinkSpec, dl DeadLetters, m *metrics.Metrics, log *slog.Logger) (*Lane, error) {
	return newLaneClock(sp, dl, m, log, realClock{})
}

// newLaneClock is newLane with a chosen clock (tests use a fake one).
func newLaneClock(sp SinkSpec, dl DeadLetters, m *metrics.Metrics, log *slog.Logger, clk clock) (*Lane, error) {
	name := sp.Sink.Name()
	if sp.BatchSize < 1 {
		sp.BatchSize = 1
	}
	if mb := sp.Sink.MaxBatch(); mb > 0 && sp.BatchSize > mb {
		sp.BatchSize = mb
	}
	auto := sp.UseLimit && sp.MaxInFlight < 1
	if auto {
		if sp.Limit.Max < 1 {
			sp.Limit.Max = limit.DefaultMax
		}
		if sp.Limit.Cap > 0 && sp.Limit.Cap < sp.Limit.Max {
			sp.Limit.Max = sp.Limit.Cap
		}
		// Workers (one partition each) bound the requests the limiter can
		// admit. A batching sink gets fewer, so that the events in flight
		// (at most Cap) still fill its batches: Cap/BatchSize of them,
		// at least 16 (the fixed default of earlier releases).
		sp.MaxInFlight = sp.Limit.Max
		if sp.BatchSize > 1 && sp.Limit.Cap > 0 {
			sp.MaxInFlight = min(sp.Limit.Max, max(16, sp.Limit.Min, sp.Limit.Cap/sp.BatchSize))
		}
	}
	if sp.MaxInFlight < 1 {
		sp.MaxInFlight = 1
	}
	if sp.Held && dl == nil {
		return nil, fmt.Errorf("sink %s: a held sink parks its events: it needs the dead-letter store", name)
	}
	if sp.Ordering == "" {
		sp.Ordering = OrderKey
	}
	if sp.Retry.MaxAttempts < 1 {
		sp.Retry = sinks.DefaultRetryPolicy()
	}
	n := sp.MaxInFlight
	if sp.Ordering == OrderStrict {
		n = 1
	}
	l := &Lane{
		name: name, spec: sp, dl: dl, log: log, clk: clk, auto: auto,
		q:            newKeyQueue(sp.Ordering, n, clk, m.QueueDepth.WithLabelValues(name)),
		redrive:      make(chan struct{}, 1),
		started:      make(chan struct{}),
		mDelivered:   m.Deliveries.WithLabelValues(name, metrics.OutcomeDelivered),
		mDead:        m.Deliveries.WithLabelValues(name, metrics.OutcomeDeadLettered),
		mParked:      m.Deliveries.WithLabelValues(name, metrics.OutcomeParked),
		mRedriven:    m.Deliveries.WithLabelValues(name, metrics.OutcomeRedriven),
		mOversize:    m.Deliveries.WithLabelValues(name, metrics.OutcomeDroppedOversz),
		mDropped:     m.Deliveries.WithLabelValues(name, metrics.OutcomeDroppedLeaseLost),
		own:          &ownership{},
		mParkedGauge: m.SinkParked.WithLabelValues(name),
		mGroups:      m.TxnGroups.WithLabelValues(name),
		mGroupEvents: m.TxnGroupEvents.WithLabelValues(name),
	}
	l.q.win = newWindow()
	// A lane that sends one event per request keeps no more workers
	// active than the limiter admits (keyQueue.follow).
	l.q.follow = sp.BatchSize == 1
	// A batching lane fills a batch from the ready partitions
	// (keyQueue.gather).
	l.q.gather = sp.BatchSize > 1
	if sp.Limiter == nil && sp.UseLimit {
		cfg := sp.Limit
		if !auto {
			cfg.Fixed = n
		}
		if cfg.MaxPause <= 0 {
			// The deliverer caps a Retry-After at the policy's
			// max_interval; without the same cap here the limiter held
			// every request of the sink for the whole Retry-After (up to
			// 5m), and its back-pressure hold for ten times that.
			cfg.MaxPause = sp.Retry.MaxPause()
		}
		sp.Limiter = newAdaptive(cfg, m.SinkConcurrency.WithLabelValues(name), log)
		l.spec.Limiter = sp.Limiter
	} else {
		m.SinkConcurrency.WithLabelValues(name).Set(float64(n))
	}
	notifyOverload(sp.Sink, l.spec.Limiter)
	l.d = &deliverer{
		name: name, sink: sp.Sink, policy: sp.Retry, clk: clk, log: log, limit: sp.Limiter,
		mAttempts: m.Attempts.WithLabelValues(name),
		mRetried:  m.Deliveries.WithLabelValues(name, metrics.OutcomeRetried),
		mFailures: m.DeliveryFailures,
		mDuration: m.DeliveryDuration.WithLabelValues(name),
		mLag:      m.EndToEndLag.WithLabelValues(name),
	}
	return l, nil
}

// Name returns the sink's name.
func (l *Lane) Name() string { return l.name }

func (l *Lane) setBudget(b, redrive *memory.Budget) {
	l.budget, l.redriveBudget = b, redrive
	l.d.budget = b
}

// LaneStatus is a snapshot of a lane for status reports.
type LaneStatus struct {
	Name       string
	Queued     int64
	InProgress int64
	Parked     bool
	// Held is set for a held sink (SinkSpec.Held: a paused
	// subscription), which is parked until a reload releases it.
	Held    bool
	Failing bool
	// FailingSince is when the sink's current run of failures began
	// (zero while it is not failing): its last success is before it.
	FailingSince time.Time
	LastError    string
	LastSuccess  time.Time
	// PausedUntil is set while the destination's Retry-After holds the
	// sink's requests back.
	PausedUntil time.Time
	// Limit is the limiter stage's state (zero without one): the current
	// concurrency limit, requests in flight, the smoothed latency and the
	// circuit breaker's state.
	Limit limit.Status
}

// Status returns a snapshot of the lane.
func (l *Lane) Status() LaneStatus {
	s := LaneStatus{
		Name: l.name, Queued: l.q.queued.Load(), InProgress: l.q.held.Load(),
		Parked: l.parked.Load(), Held: l.spec.Held, Failing: !l.d.failing().IsZero(),
	}
	s.FailingSince = l.d.failing()
	if p := l.d.lastErr.Load(); p != nil {
		s.LastError = *p
	}
	if t := l.d.lastSuccess.Load(); t != 0 {
		s.LastSuccess = time.Unix(0, t)
	}
	if p := l.d.pausedUntil.Load(); p != 0 && time.Unix(0, p).After(l.clk.Now()) {
		s.PausedUntil = time.Unix(0, p)
	}
	if a, ok := l.d.limit.(adaptive); ok {
		s.Limit = a.l.Status()
		if s.Limit.PausedUntil.After(s.PausedUntil) {
			s.PausedUntil = s.Limit.PausedUntil
		}
	}
	return s
}

// start starts the lane's goroutines under ctx.
func (l *Lane) start(ctx context.Context) {
	ctx, l.cancel = context.WithCancel(ctx)
	// The byte budget the sinks charge request bodies to: in the context
	// every attempt derives from, rather than added to each attempt's.
	ctx = memory.WithBudget(ctx, l.budget)
	wg := &l.wg
	l.liveMu.Lock()
	l.baseCtx = ctx
	l.liveCtx, l.liveCancel = context.WithCancel(ctx)
	l.liveMu.Unlock()
	// A backlog parked by an earlier run must be re-driven before anything
	// new is delivered, so the lane starts parked when one may exist.
	switch {
	case l.spec.Held:
		l.setParked(true)
		l.log.Info("sink held (paused): its events are parked until it is resumed")
	case l.dl != nil:
		// Bounded: with MongoDB unreachable the lane starts parked (safe)
		// instead of holding up the start, or a stop, for the driver's
		// server-selection timeout.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := l.dl.Count(cctx, l.own.parkedFilter(l.name, 0))
		cancel()
		if err != nil || n > 0 {
			l.setParked(true)
			if err != nil {
				l.log.Warn("cannot count parked events; starting parked until the re-drive finds none", "err", err)
			} else {
				l.log.Info("re-driving events parked by an earlier run", "parked", n)
			}
		}
	}
	// The pool of workers: an auto lane keeps as many active as its
	// limiter admits requests; a fixed one up to one per partition. A
	// parked lane writes its backlog to the store, which the limiter does
	// not pace: one worker per partition then, so that what is re-read
	// after a restart is parked before the re-drive lists the entries
	// parked earlier (and the replay stays in order and in full).
	var target func() int
	if a, ok := l.d.limit.(adaptive); ok && l.auto {
		target = func() int {
			if l.parked.Load() {
				return 0
			}
			return a.current()
		}
	}
	context.AfterFunc(ctx, l.q.close)
	l.q.run(target, func() {
		wg.Add(1) // under the queue's lock, never after close: see stop
		go func() {
			defer wg.Done()
			l.work(ctx)
		}()
	})
	if l.dl != nil && l.spec.ParkAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.watch(ctx)
		}()
	}
	if l.dl != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.redriveLoop(ctx)
		}()
	}
	close(l.started)
}

// waitStarted returns once start has run (or ctx is done; at once for a nil
// ctx).
func (l *Lane) waitStarted(ctx context.Context) {
	if ctx == nil {
		return
	}
	select {
	case <-l.started:
	case <-ctx.Done():
	}
}

// stop cancels the lane's goroutines and waits for them. Items still queued
// stay unacknowledged. The queue is closed before the wait, so no worker
// is added to the wait group while it is waited on.
func (l *Lane) stop() {
	if l.cancel != nil {
		l.cancel()
	}
	l.q.close()
	l.wg.Wait()
	// What is still queued stays unacknowledged; the memory it held is
	// returned to the byte budget.
	for _, it := range l.q.discard() {
		it.release()
	}
	l.releaseOpen()
}

// waitIdle returns once nothing is queued or in progress in the lane (or ctx
// is done).
func (l *Lane) waitIdle(ctx context.Context) {
	for !l.q.empty() {
		if ctx == nil || ctx.Err() != nil {
			return
		}
		sleep(ctx, l.clk, 10*time.Millisecond)
	}
}

// enqueue queues ev; key is ev.OrderingKeyHash() (computed once per event
// by Dispatch for all its sinks).
func (l *Lane) enqueue(ev *event.Event, key uint64, done func()) {
	ev.Mem.Retain(1) // the item's reference, released once it is finished (item.release)
	it := newItem(ev)
	it.done, it.key, it.obs = done, key, l.d.obs.live()
	if l.spec.Group && ev.Txn != nil && l.collect(it) {
		return // queued with its transaction's other events (endTxn)
	}
	l.mode.RLock()
	l.q.push(it)
	l.mode.RUnlock()
}

func (l *Lane) live() context.Context {
	l.liveMu.Lock()
	defer l.liveMu.Unlock()
	return l.liveCtx
}

// engineCtx is the context the lane's workers run under: cancelled only
// when the engine stops.
func (l *Lane) engineCtx() context.Context {
	l.liveMu.Lock()
	defer l.liveMu.Unlock()
	return l.baseCtx
}

// work is a worker of the lane's pool: take the next ready partition and
// one batch from it, deliver the batch while the lane is live, park it while
// the lane is parked (or once it became parked during the delivery), and
// give the partition back.
func (l *Lane) work(ctx context.Context) {
	var extra []*partition
	for {
		p := l.q.next(ctx)
		if p == nil {
			return
		}
		extra = l.serve(ctx, p, extra[:0])
		l.q.done(p)
		for i, o := range extra {
			l.q.done(o)
			extra[i] = nil
		}
	}
}

// serve delivers (or parks) one batch of p, which the caller has busy, and
// of the partitions the batch also took from (keyQueue.take), which it
// appends to extra and returns: the caller gives them back too.
func (l *Lane) serve(ctx context.Context, p *partition, extra []*partition) []*partition {
	batch, more := l.q.take(ctx, p, l.spec.BatchSize, l.spec.BatchWait, &extra)
	if batch == nil {
		return extra
	}
	taken := len(batch)
	if batch[0].bar != nil {
		l.holdBarrier(ctx, batch[0])
		return extra
	}
	if g := batch[0].grp; g != nil {
		// The group's barriers hold the later changes of its
		// documents until it is finished, whatever the outcome (and a
		// transaction's next part waits behind it).
		defer g.finishPart()
		if !l.waitArrived(ctx, g) {
			releaseItems(batch)
			l.q.release(taken)
			return extra // stopping: unacknowledged
		}
	}
	// Whatever happens to them below — delivered, dead-lettered, parked,
	// dropped for a lost tenure, abandoned by a shutdown — the lane holds
	// none of these items once serve returns: their memory goes back to
	// the byte budget then.
	defer releaseItems(batch)
	if batch = l.dropLost(batch); len(batch) == 0 {
		l.q.release(taken)
		return extra
	}
	l.q.release(taken - len(batch))
	if r := refusedPart(batch); r != nil {
		// An earlier part of this transaction was dead-lettered: this one
		// is too, unsent, with that part's reason and answer.
		for _, it := range batch {
			if it.firstErr == "" {
				it.firstErr = r.err
			}
			it.lastErr = r.err
		}
		l.deadLetter(batch, r.reason)
		l.q.release(len(batch))
		return extra
	}
	if !l.parked.Load() {
		fill := 0.0 // a transaction group is a batch of its own, whatever its size
		if batch[0].grp == nil {
			fill = batchFill(l.spec.BatchSize, taken, more)
		}
		pending, err := l.d.deliver(groupCtx(l.live(), batch), batch, modeLive, l, fill)
		if err == nil || ctx.Err() != nil {
			l.q.release(len(batch))
			return extra // delivered/dead-lettered, or shutting down unacked
		}
		// The lane was parked mid-delivery: park what is still pending.
		l.q.release(len(batch) - len(pending))
		batch = pending
	}
	l.park(ctx, batch)
	l.q.release(len(batch))
	return extra
}

// batchFill returns how full a batch of taken events is for a lane of
// batchSize (limit.Outcome.Fill): 1 when its partition had more than the
// batch took, 0 (not measured) for a lane that sends one event per
// request.
func batchFill(batchSize, taken int, more bool) float64 {
	switch {
	case batchSize <= 1:
		return 0
	case more || taken >= batchSize:
		return 1
	}
	return float64(taken) / float64(batchSize)
}

// waiting brackets a timed wait of the delivery stage (finisher): the
// worker does not count as active meanwhile.
func (l *Lane) waiting() func() { return l.q.wait() }

// dropLost returns items without those read under a tenure that is over
// (cluster mode: the unit's lease was lost); those are dropped, neither
// delivered nor acked: the unit's next owner re-reads them.
func (l *Lane) dropLost(items []*item) []*item {
	var keep []*item // nil until an item is dropped: no copy in the common case
	for i, it := range items {
		if it.tenure.Held() {
			if keep != nil {
				keep = append(keep, it)
			}
			continue
		}
		if keep == nil {
			keep = append(make([]*item, 0, len(items)), items[:i]...)
		}
		l.mDropped.Inc()
		if it.obs != nil {
			it.obs.outcome(it, observe.Outcome{Kind: observe.Dropped, Reason: "lease_lost"})
		}
	}
	if keep == nil {
		return items
	}
	return keep
}

// delivered acks items the sink accepted, and releases them (finisher):
// one pass over them, each item's cache line read once after the request.
func (l *Lane) delivered(items []*item, now time.Time, lag prometheus.Observer) {
	l.mDelivered.Add(float64(len(items))) // one atomic update per batch, not per event
	nowNanos := now.UnixNano()
	for _, it := range items {
		observeLag(lag, it, nowNanos)
		if it.obs != nil {
			it.obs.outcome(it, observe.Outcome{Kind: observe.Delivered})
		}
		it.done()
		it.release() // serve's releaseItems finds it released
	}
}

// persist retries a store write until it succeeds or ctx is done.
func (l *Lane) persist(ctx context.Context, what string, f func(context.Context) error) bool {
	wait := 100 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, deadletter.ErrFenced) {
			// A newer owner of the unit fenced it in the store: the
			// write was refused, and retrying cannot help.
			l.log.Warn("dead-letter store refused a write of a unit another replica took over; dropped unacknowledged", "op", what, "err", err)
			return false
		}
		l.log.Error("cannot write to the dead-letter store; retrying (events stay unacknowledged)", "op", what, "err", err)
		if !sleep(ctx, l.clk, wait) {
			return false
		}
		if wait < 5*time.Second {
			wait *= 2
		}
	}
}

// fencedWrite returns err, first ending the tenures of items when the store
// refused the write because a newer owner fenced their unit: the lease is
// lost, whatever the lease loop knows yet.
func fencedWrite(err error, items ...*item) error {
	if errors.Is(err, deadletter.ErrFenced) {
		for _, it := range items {
			it.ev.Tenure.End()
		}
	}
	return err
}

// deadLetter writes items to the dead-letter store and acks them
// (finisher). The store write is retried until it succeeds; if the process
// is stopping first, the items stay unacknowledged and are re-read after a
// restart.
func (l *Lane) deadLetter(items []*item, reason string) {
	refuse(items, reason)
	for _, it := range l.dropLost(items) {
		e, err := l.entry(it, deadletter.KindFailed, reason)
		if err != nil {
			l.log.Error("cannot build dead letter", "event", it.ev.ID, "err", err)
			continue
		}
		// Dead-lettering must complete even when the lane's live context
		// was cancelled by parking; it stops only with the engine.
		mem := l.budget.Force(writeBytes(e))
		start := time.Now()
		wctx, cancel := tenureCtx(l.engineCtx(), []*item{it}) // as park's
		ok := l.persist(wctx, "dead-letter", func(ctx context.Context) error { return fencedWrite(l.dl.Put(ctx, e), it) })
		cancel()
		mem.Release()
		if it.obs != nil {
			it.obs.stored([]*item{it}, observe.DeadLettered, reason, "dead_letter", start, ok)
		}
		if !ok {
			continue
		}
		l.log.Warn("event dead-lettered", "event", it.ev.ID, "reason", reason, "attempts", it.attempts, "err", it.lastErr)
		if reason == "oversize" {
			l.mOversize.Inc()
		} else {
			l.mDead.Inc()
		}
		it.done()
	}
}
