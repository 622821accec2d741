package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
)

// item is one event waiting for one sink.
type item struct {
	ev       *event.Event
	done     func() // nil for replays
	key      uint64 // ev.OrderingKeyHash()
	order    int64
	attempts int
	first    time.Time
	firstErr string
	lastErr  string
	reason   string
}

// partition is a FIFO of items delivered one batch at a time, in order.
type partition struct {
	mu   sync.Mutex
	q    []*item
	wake chan struct{}
	seen map[uint64]int // distinctKeys' scratch space, guarded by mu
}

// Lane drives one sink: partitions that keep per-key order, retries, dead
// letters, and parking of the backlog while the sink is failing.
type Lane struct {
	name string
	spec SinkSpec
	dl   DeadLetters
	log  *slog.Logger

	parts []*partition
	rr    atomic.Uint64

	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started chan struct{} // closed by start

	successor *Lane // the lane of this name to start once this one retired; guarded by Engine.mu

	queued atomic.Int64 // in partitions
	held   atomic.Int64 // taken by a worker, not finished

	orderMu   sync.Mutex
	lastOrder int64

	mode       sync.RWMutex // enqueue holds it shared; going live holds it exclusively
	parked     atomic.Bool
	liveMu     sync.Mutex
	baseCtx    context.Context // the engine's: cancelled when the engine stops
	liveCtx    context.Context // cancelled also when the lane is parked
	liveCancel context.CancelFunc
	redrive    chan struct{}

	failingSince atomic.Int64 // unix nanos of the first failure since the last success; 0 when healthy
	lastSuccess  atomic.Int64
	lastErr      atomic.Pointer[string]

	mDelivered, mRetried, mDead, mParked, mRedriven prometheus.Counter
	mOversize                                       prometheus.Counter
	mFailures                                       *prometheus.CounterVec // sink, reason
	mAttempts                                       prometheus.Counter
	mDuration, mLag                                 prometheus.Observer
	mQueue, mParkedGauge                            prometheus.Gauge
}

func newLane(sp SinkSpec, dl DeadLetters, m *metrics.Metrics, log *slog.Logger) (*Lane, error) {
	name := sp.Sink.Name()
	if sp.MaxInFlight < 1 {
		sp.MaxInFlight = 1
	}
	if sp.BatchSize < 1 {
		sp.BatchSize = 1
	}
	if mb := sp.Sink.MaxBatch(); mb > 0 && sp.BatchSize > mb {
		sp.BatchSize = mb
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
		name: name, spec: sp, dl: dl, log: log,
		redrive:      make(chan struct{}, 1),
		started:      make(chan struct{}),
		mDelivered:   m.Deliveries.WithLabelValues(name, metrics.OutcomeDelivered),
		mRetried:     m.Deliveries.WithLabelValues(name, metrics.OutcomeRetried),
		mDead:        m.Deliveries.WithLabelValues(name, metrics.OutcomeDeadLettered),
		mParked:      m.Deliveries.WithLabelValues(name, metrics.OutcomeParked),
		mRedriven:    m.Deliveries.WithLabelValues(name, metrics.OutcomeRedriven),
		mOversize:    m.Deliveries.WithLabelValues(name, metrics.OutcomeDroppedOversz),
		mFailures:    m.DeliveryFailures,
		mAttempts:    m.Attempts.WithLabelValues(name),
		mDuration:    m.DeliveryDuration.WithLabelValues(name),
		mLag:         m.EndToEndLag.WithLabelValues(name),
		mQueue:       m.QueueDepth.WithLabelValues(name),
		mParkedGauge: m.SinkParked.WithLabelValues(name),
	}
	for i := 0; i < n; i++ {
		l.parts = append(l.parts, &partition{wake: make(chan struct{}, 1)})
	}
	return l, nil
}

// Name returns the sink's name.
func (l *Lane) Name() string { return l.name }

// LaneStatus is a snapshot of a lane for status reports.
type LaneStatus struct {
	Name        string
	Queued      int64
	InProgress  int64
	Parked      bool
	Failing     bool
	LastError   string
	LastSuccess time.Time
}

// Status returns a snapshot of the lane.
func (l *Lane) Status() LaneStatus {
	s := LaneStatus{
		Name: l.name, Queued: l.queued.Load(), InProgress: l.held.Load(),
		Parked: l.parked.Load(), Failing: l.failingSince.Load() != 0,
	}
	if p := l.lastErr.Load(); p != nil {
		s.LastError = *p
	}
	if t := l.lastSuccess.Load(); t != 0 {
		s.LastSuccess = time.Unix(0, t)
	}
	return s
}

// start starts the lane's goroutines under ctx.
func (l *Lane) start(ctx context.Context) {
	ctx, l.cancel = context.WithCancel(ctx)
	wg := &l.wg
	l.liveMu.Lock()
	l.baseCtx = ctx
	l.liveCtx, l.liveCancel = context.WithCancel(ctx)
	l.liveMu.Unlock()
	// A backlog parked by an earlier run must be re-driven before anything
	// new is delivered, so the lane starts parked when one may exist.
	if l.dl != nil {
		// Bounded: with MongoDB unreachable the lane starts parked (safe)
		// instead of holding up the start, or a stop, for the driver's
		// server-selection timeout.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := l.dl.Count(cctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: l.name})
		cancel()
		if err != nil || n > 0 {
			l.setParked(true)
			if err != nil {
				l.log.Warn("cannot count parked events; starting parked until the re-drive finds none", "err", err)
			} else {
				l.log.Info("re-driving events parked by an earlier run", "parked", n)
				// Park new events after those, even if the clock went back.
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				last, err := l.dl.LastOrder(cctx, l.name)
				cancel()
				if err == nil {
					l.orderMu.Lock()
					l.lastOrder = max(l.lastOrder, last)
					l.orderMu.Unlock()
				} else {
					l.log.Warn("cannot read the order of parked events", "err", err)
				}
			}
		}
	}
	for _, p := range l.parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.work(ctx, p)
		}()
	}
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
// stay unacknowledged.
func (l *Lane) stop() {
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
}

// waitIdle returns once nothing is queued or in progress in the lane (or ctx
// is done).
func (l *Lane) waitIdle(ctx context.Context) {
	for l.queued.Load()+l.held.Load() > 0 {
		if ctx == nil || ctx.Err() != nil {
			return
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

func (l *Lane) nextOrder() int64 {
	l.orderMu.Lock()
	defer l.orderMu.Unlock()
	v := time.Now().UnixNano()
	if v <= l.lastOrder {
		v = l.lastOrder + 1
	}
	l.lastOrder = v
	return v
}

func (l *Lane) partitionFor(key uint64) *partition {
	switch {
	case len(l.parts) == 1:
		return l.parts[0]
	case l.spec.Ordering == OrderNone:
		return l.parts[l.rr.Add(1)%uint64(len(l.parts))]
	default:
		return l.parts[key%uint64(len(l.parts))]
	}
}

// enqueue queues ev; key is ev.OrderingKeyHash() (computed once per event
// by Dispatch for all its sinks).
func (l *Lane) enqueue(ev *event.Event, key uint64, done func()) {
	it := &item{ev: ev, done: done, key: key, order: l.nextOrder()}
	p := l.partitionFor(key)
	l.mode.RLock()
	p.mu.Lock()
	p.q = append(p.q, it)
	l.queued.Add(1)
	p.mu.Unlock()
	l.mode.RUnlock()
	l.mQueue.Inc()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take removes up to max items from p, waiting up to wait to fill a batch.
// It returns nil when ctx is done.
func (l *Lane) take(ctx context.Context, p *partition, max int, wait time.Duration) []*item {
	waited := false
	for {
		p.mu.Lock()
		if n := len(p.q); n > 0 {
			if n < max && wait > 0 && !waited {
				p.mu.Unlock()
				waited = true
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return nil
				}
				continue
			}
			if n > max {
				n = max
			}
			if n > 1 && l.spec.Ordering != OrderNone {
				// A batch API may fail one entry and accept the next:
				// a document appears at most once per batch, so its
				// later events cannot overtake a failed one.
				n = p.distinctKeys(p.q[:n])
			}
			batch := make([]*item, n)
			copy(batch, p.q)
			clear(p.q[:n])
			p.q = p.q[n:]
			if len(p.q) == 0 {
				p.q = nil
			}
			l.held.Add(int64(n))
			l.queued.Add(-int64(n))
			p.mu.Unlock()
			l.mQueue.Sub(float64(n))
			return batch
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

// distinctKeys returns the length of the longest prefix of q in which no two
// events have the same ordering key (at least 1). Must be called with p.mu
// held.
func (p *partition) distinctKeys(q []*item) int {
	if len(q) <= 16 {
		for i := 1; i < len(q); i++ {
			for _, prev := range q[:i] {
				if prev.key == q[i].key && prev.ev.SameOrderingKey(q[i].ev) {
					return i
				}
			}
		}
		return len(q)
	}
	if p.seen == nil {
		p.seen = make(map[uint64]int, len(q))
	}
	defer clear(p.seen)
	for i, it := range q {
		if j, dup := p.seen[it.key]; dup {
			if q[j].ev.SameOrderingKey(it.ev) {
				return i
			}
			// Two keys with the same hash: compare the keys themselves.
			return distinctKeysSlow(q)
		}
		p.seen[it.key] = i
	}
	return len(q)
}

// distinctKeysSlow is distinctKeys comparing the ordering keys themselves.
func distinctKeysSlow(q []*item) int {
	seen := make(map[string]struct{}, len(q))
	for i, it := range q {
		k := it.ev.OrderingKey()
		if _, dup := seen[k]; dup {
			return i
		}
		seen[k] = struct{}{}
	}
	return len(q)
}

func (l *Lane) live() context.Context {
	l.liveMu.Lock()
	defer l.liveMu.Unlock()
	return l.liveCtx
}

func (l *Lane) work(ctx context.Context, p *partition) {
	for {
		batch := l.take(ctx, p, l.spec.BatchSize, l.spec.BatchWait)
		if batch == nil {
			return
		}
		if !l.parked.Load() {
			pending, err := l.deliver(l.live(), batch, modeLive)
			if err == nil || ctx.Err() != nil {
				l.held.Add(-int64(len(batch)))
				continue // delivered/dead-lettered, or shutting down unacked
			}
			// The lane was parked mid-delivery: park what is still pending.
			l.held.Add(-int64(len(batch) - len(pending)))
			batch = pending
		}
		l.park(ctx, batch)
		l.held.Add(-int64(len(batch)))
	}
}

type deliveryMode int

const (
	modeLive    deliveryMode = iota // ack on success, dead-letter on failure
	modeRedrive                     // retry until delivered; return permanent errors
	modeReplay                      // sink's retry policy; return the final error
)

// deliver sends items with retries. In modeLive it finishes every item
// (done after delivery or a durable dead letter) and returns nil, or returns
// ctx's error with the items still pending. In the other modes it returns
// nil on delivery or the error that ended the attempts.
func (l *Lane) deliver(ctx context.Context, items []*item, mode deliveryMode) ([]*item, error) {
	policy := l.spec.Retry
	if mode == modeRedrive {
		policy.MaxAttempts = 1 << 30
		policy.MaxElapsed = 0
	}
	pending := items
	evs := make([]*event.Event, 0, len(items))
	for {
		now := time.Now()
		evs = evs[:0]
		for _, it := range pending {
			if it.first.IsZero() {
				it.first = now
			}
			it.attempts++
			evs = append(evs, it.ev)
		}
		l.mAttempts.Inc()
		err := l.spec.Sink.Send(ctx, evs)
		l.mDuration.Observe(time.Since(now).Seconds())
		if err == nil {
			l.succeeded(pending, mode)
			return nil, nil
		}
		if ctx.Err() != nil {
			return pending, ctx.Err()
		}
		var decision *sinks.Error
		var be *sinks.BatchError
		if errors.As(err, &be) {
			var ok, retry []*item
			for i, it := range pending {
				ferr, failed := be.Failed[i]
				if !failed {
					ok = append(ok, it)
					continue
				}
				de, _ := sinks.Classify(ferr)
				if de == nil {
					de = &sinks.Error{Err: ferr, Reason: "error"}
				}
				it.noteErr(de)
				l.mFailures.WithLabelValues(l.name, de.Reason).Inc()
				if de.Permanent {
					if mode != modeLive {
						return []*item{it}, de
					}
					l.deadLetter(ctx, []*item{it}, de.Reason)
					continue
				}
				if decision == nil || de.RetryAfter > decision.RetryAfter {
					decision = de
				}
				retry = append(retry, it)
			}
			l.succeeded(ok, mode)
			pending = retry
			if len(pending) == 0 {
				return nil, nil
			}
		} else {
			de, ok := sinks.Classify(err)
			if !ok {
				// A cancellation the sink reports while our context is
				// live is the sink's own: retry it like a transport error.
				de = &sinks.Error{Err: err, Reason: "canceled"}
			}
			decision = de
			for _, it := range pending {
				it.noteErr(de)
			}
			l.mFailures.WithLabelValues(l.name, de.Reason).Add(float64(len(pending)))
			if de.Permanent {
				if mode != modeLive {
					return pending, de
				}
				l.deadLetter(ctx, pending, de.Reason)
				return nil, nil
			}
		}
		l.noteFailure(decision)
		wait, again := policy.Next(pending[0].attempts, pending[0].first, time.Now(), decision, rand.Float64)
		if !again {
			if mode != modeLive {
				return pending, decision
			}
			l.deadLetter(ctx, pending, "exhausted")
			return nil, nil
		}
		l.mRetried.Add(float64(len(pending)))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return pending, ctx.Err()
		}
	}
}

func (it *item) noteErr(de *sinks.Error) {
	msg := de.Error()
	if it.firstErr == "" {
		it.firstErr = msg
	}
	it.lastErr = msg
	it.reason = de.Reason
}

func (l *Lane) noteFailure(de *sinks.Error) {
	now := time.Now().UnixNano()
	l.failingSince.CompareAndSwap(0, now)
	msg := de.Error()
	if p := l.lastErr.Load(); p == nil || *p != msg {
		l.lastErr.Store(&msg)
		l.log.Warn("delivery failed", "err", msg, "reason", de.Reason)
	}
}

func (l *Lane) succeeded(items []*item, mode deliveryMode) {
	if len(items) == 0 {
		return
	}
	now := time.Now()
	l.lastSuccess.Store(now.UnixNano())
	if l.failingSince.Swap(0) != 0 {
		l.log.Info("sink delivering again")
	}
	for _, it := range items {
		if !it.ev.WallTime.IsZero() {
			l.mLag.Observe(now.Sub(it.ev.WallTime).Seconds())
		}
		if mode == modeLive {
			l.mDelivered.Inc()
			it.done()
		}
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
		l.log.Error("cannot write to the dead-letter store; retrying (events stay unacknowledged)", "op", what, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		if wait < 5*time.Second {
			wait *= 2
		}
	}
}

func (l *Lane) entry(it *item, kind deadletter.Kind, reason string) (deadletter.Entry, error) {
	e, err := deadletter.EntryFor(it.ev, l.name, kind)
	if err != nil {
		return e, err
	}
	e.Attempts = it.attempts
	e.Reason = reason
	e.FirstError, e.LastError = it.firstErr, it.lastErr
	e.FirstFailedAt, e.LastFailedAt = it.first, time.Now()
	e.Order = it.order
	return e, nil
}

// deadLetter writes items to the dead-letter store and acks them. The
// store write is retried until it succeeds; if the process is stopping
// first, the items stay unacknowledged and are re-read after a restart.
func (l *Lane) deadLetter(_ context.Context, items []*item, reason string) {
	for _, it := range items {
		e, err := l.entry(it, deadletter.KindFailed, reason)
		if err != nil {
			l.log.Error("cannot build dead letter", "event", it.ev.ID, "err", err)
			continue
		}
		// Dead-lettering must complete even when the lane's live context
		// was cancelled by parking; it stops only with the engine.
		if !l.persist(l.engineCtx(), "dead-letter", func(ctx context.Context) error { return l.dl.Put(ctx, e) }) {
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

// engineCtx is the context the lane's workers run under: cancelled only
// when the engine stops.
func (l *Lane) engineCtx() context.Context {
	l.liveMu.Lock()
	defer l.liveMu.Unlock()
	return l.baseCtx
}

// park writes items to the store as parked entries and acks them.
func (l *Lane) park(ctx context.Context, items []*item) {
	if len(items) == 0 {
		return
	}
	es := make([]deadletter.Entry, 0, len(items))
	for _, it := range items {
		e, err := l.entry(it, deadletter.KindParked, "parked")
		if err != nil {
			l.log.Error("cannot build parked entry", "event", it.ev.ID, "err", err)
			return
		}
		es = append(es, e)
	}
	if !l.persist(ctx, "park", func(ctx context.Context) error { return l.dl.PutMany(ctx, es) }) {
		return
	}
	l.mParked.Add(float64(len(items)))
	for _, it := range items {
		it.done()
	}
}

func (l *Lane) setParked(on bool) {
	l.parked.Store(on)
	if on {
		l.mParkedGauge.Set(1)
		select {
		case l.redrive <- struct{}{}:
		default:
		}
	} else {
		l.mParkedGauge.Set(0)
	}
}

// watch parks the lane when the sink has been failing for ParkAfter, or is
// failing with ParkBacklog events queued.
func (l *Lane) watch(ctx context.Context) {
	tick := l.spec.ParkAfter / 10
	if tick > time.Second {
		tick = time.Second
	}
	if tick < 10*time.Millisecond {
		tick = 10 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if l.parked.Load() {
			continue
		}
		fs := l.failingSince.Load()
		if fs == 0 {
			continue
		}
		failingFor := time.Since(time.Unix(0, fs))
		backlog := l.queued.Load() + l.held.Load()
		if failingFor >= l.spec.ParkAfter || (l.spec.ParkBacklog > 0 && backlog >= int64(l.spec.ParkBacklog)) {
			l.log.Warn("sink keeps failing: parking its backlog in the dead-letter store for an ordered re-drive",
				"failing_for", failingFor.Round(time.Millisecond), "backlog", backlog)
			l.parkLane()
		}
	}
}

// parkLane parks the lane: deliveries in progress are cancelled (and
// parked by their workers), and the re-drive takes over.
func (l *Lane) parkLane() {
	// Under liveMu, as tryGoLive: a lane going live concurrently must not
	// end up live with the cancelled context.
	l.liveMu.Lock()
	l.liveCancel()
	l.setParked(true)
	l.liveMu.Unlock()
	for _, p := range l.parts {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// redriveLoop delivers parked entries in order while the lane is parked, and
// turns the lane live again once nothing is parked or queued.
func (l *Lane) redriveLoop(ctx context.Context) {
	idle := 20 * time.Millisecond
	for {
		if !l.parked.Load() {
			select {
			case <-l.redrive:
				continue
			case <-ctx.Done():
				return
			}
		}
		entries, err := l.dl.List(ctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: l.name, Limit: 512})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.log.Error("re-drive: cannot list parked events", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		if len(entries) == 0 {
			if l.tryGoLive(ctx) {
				continue
			}
			sleepCtx(ctx, idle)
			continue
		}
		l.redriveEntries(ctx, entries)
	}
}

func (l *Lane) tryGoLive(ctx context.Context) bool {
	l.mode.Lock()
	defer l.mode.Unlock()
	if l.queued.Load() != 0 || l.held.Load() != 0 {
		return false
	}
	n, err := l.dl.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: l.name})
	if err != nil || n != 0 {
		return false
	}
	l.liveMu.Lock()
	l.liveCtx, l.liveCancel = context.WithCancel(l.baseCtx)
	l.failingSince.Store(0)
	l.setParked(false)
	l.liveMu.Unlock()
	l.log.Info("parked backlog re-driven; sink is live again")
	return true
}

// redriveEntries delivers entries (in stream order) keeping per-key order,
// with up to MaxInFlight keys in parallel.
func (l *Lane) redriveEntries(ctx context.Context, entries []deadletter.Entry) {
	type group struct{ entries []deadletter.Entry }
	var groups []*group
	byKey := map[string]*group{}
	for _, e := range entries {
		key := e.Namespace + "\x00" + string(e.DocumentKey)
		switch l.spec.Ordering {
		case OrderStrict:
			key = ""
		case OrderNone:
			key = e.ID
		}
		g := byKey[key]
		if g == nil {
			g = &group{}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.entries = append(g.entries, e)
	}
	sem := make(chan struct{}, len(l.parts))
	var wg sync.WaitGroup
	for _, g := range groups {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			for _, e := range g.entries {
				if !l.redriveOne(ctx, e) {
					return // stopping: the rest stay parked, in order
				}
			}
		}()
	}
	wg.Wait()
}

func (l *Lane) redriveOne(ctx context.Context, e deadletter.Entry) bool {
	ev, err := event.FromChange(e.Source, 0, e.Change)
	if err != nil {
		reason, msg := "corrupt", fmt.Sprintf("cannot rebuild parked event: %v", err)
		if e.ChangeDropped {
			reason, msg = "too_large_to_park", "the change was too large to store with its parked entry (over 16 MiB with its envelope); it cannot be re-driven"
		}
		// Loud: this event reaches the sink only if someone acts on it.
		l.log.Error("parked event cannot be re-driven; it stays in the dead-letter collection as failed", "event", e.EventID, "reason", reason, "err", msg)
		l.persist(ctx, "convert", func(ctx context.Context) error {
			return l.dl.Convert(ctx, e.ID, deadletter.KindFailed, reason, msg)
		})
		l.mDead.Inc()
		return true
	}
	ev.Rules = e.Rules
	it := &item{ev: ev, attempts: e.Attempts, first: e.FirstFailedAt, firstErr: e.FirstError}
	_, err = l.deliver(ctx, []*item{it}, modeRedrive)
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		var de *sinks.Error
		reason := "error"
		if errors.As(err, &de) {
			reason = de.Reason
		}
		l.persist(ctx, "convert", func(ctx context.Context) error {
			return l.dl.Convert(ctx, e.ID, deadletter.KindFailed, reason, err.Error())
		})
		l.mDead.Inc()
		return true
	}
	if l.persist(ctx, "delete", func(ctx context.Context) error { _, err := l.dl.Delete(ctx, e.ID); return err }) {
		l.mRedriven.Inc()
		l.mDelivered.Inc()
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
