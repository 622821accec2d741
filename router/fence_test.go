package router

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/limit"
)

// These tests hold a unit's work in each wait of the delivery stage (the
// limiter, a backoff, the re-drive's retries, a request in progress), end
// the unit's tenure there (a lease loss, or a handover) and check that
// nothing of the unit is sent afterwards: the tenure is a cancellation, and
// it is checked immediately before each request.

// gateSink blocks every Send until its context ends or the gate opens, and
// records every call with the seq of its events and whether it started
// after "released" was set.
type gateSink struct {
	gate     chan struct{}
	released *atomic.Bool
	mu       sync.Mutex
	started  []int // seqs of every Send, accepted or not
	late     []int // seqs of Sends started after released
	inFlight atomic.Int64
}

func (s *gateSink) Name() string  { return "fenced" }
func (s *gateSink) MaxBatch() int { return 1 }
func (s *gateSink) Close() error  { return nil }
func (s *gateSink) Send(ctx context.Context, evs []*event.Event) error {
	if err := sinks.CheckFence(ctx); err != nil {
		return err // as the webhook sink does right before its request
	}
	s.mu.Lock()
	for _, e := range evs {
		s.started = append(s.started, seqOf(e))
		if s.released != nil && s.released.Load() {
			s.late = append(s.late, seqOf(e))
		}
	}
	s.mu.Unlock()
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	select {
	case <-s.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *gateSink) sent() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.started)
}

// fencedLane returns a started lane over sink whose limiter admits one
// request at a time (as the adaptive limit does during an outage), on clk.
func fencedLane(t *testing.T, sink sinks.Sink, clk *fakeClock) *Lane {
	t.Helper()
	lim := newAdaptive(limit.Config{Fixed: 1, Clock: limitClock{clk}}, metrics.New(nil).SinkConcurrency.WithLabelValues("x"), slog.New(slog.DiscardHandler))
	l, err := newLaneClock(SinkSpec{
		Sink: sink, MaxInFlight: 4, Limiter: lim,
		Retry: sinks.RetryPolicy{MaxAttempts: 100, InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2},
	}, nil, metrics.New(nil), slog.New(slog.DiscardHandler), clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	t.Cleanup(func() { cancel(); l.stop() })
	return l
}

// limitClock adapts the fake clock to sinks/limit's Clock.
type limitClock struct{ c *fakeClock }

func (c limitClock) Now() time.Time { return c.c.Now() }
func (c limitClock) After(d time.Duration) <-chan time.Time {
	ch, _ := c.c.After(d)
	return ch
}

func waiting(l *Lane) int { return l.d.limit.(adaptive).l.Status().Waiting }

// A worker waiting in the limiter (the limit at 1, the slot held by another
// unit's request) when its unit's lease is lost sends nothing, and the event
// stays unacknowledged for the next owner; the other unit is unaffected.
func TestFenceLimiterWaiterAcrossLeaseLoss(t *testing.T) {
	clk := newFakeClock()
	s := &gateSink{gate: make(chan struct{})}
	l := fencedLane(t, s, clk)
	tenA := event.NewTenure("orders#0/2", 1, time.Time{})
	tenB := event.NewTenure("orders#1/2", 1, time.Time{})
	var ackedA, ackedB atomic.Int64
	b := posEvent(t, 1, 1)
	b.Tenure = tenB
	l.enqueue(b, b.OrderingKeyHash(), func() { ackedB.Add(1) })
	waitUntil(t, "unit B's request in flight", func() bool { return s.inFlight.Load() == 1 })
	a := posEvent(t, 2, 2)
	a.Tenure = tenA
	l.enqueue(a, a.OrderingKeyHash(), func() { ackedA.Add(1) })
	waitUntil(t, "unit A waiting in the limiter", func() bool { return waiting(l) == 1 })

	tenA.End() // the lease of unit A is lost
	waitUntil(t, "unit A's event dropped", func() bool { return waiting(l) == 0 && l.q.held.Load() == 1 })
	close(s.gate) // unit B's request completes: the slot is free
	waitUntil(t, "lane idle", func() bool { return l.q.empty() })
	if got := s.sent(); !slices.Equal(got, []int{1}) {
		t.Fatalf("sent %v, want only unit B's event [1]: a unit's event was sent after its lease was lost", got)
	}
	if ackedA.Load() != 0 || ackedB.Load() != 1 {
		t.Fatalf("acked A %d (want 0: dropped unacknowledged), B %d (want 1)", ackedA.Load(), ackedB.Load())
	}
}

// An event backing off after a failure when its unit's lease is lost is
// dropped at once: the wait ends with the tenure, and nothing more is sent.
func TestFenceBackoffAcrossLeaseLoss(t *testing.T) {
	clk := newFakeClock()
	s := &scriptSink{clk: clk}
	s.set(down)
	l := fencedLane(t, s, clk)
	ten := event.NewTenure("orders#0/2", 1, time.Time{})
	ev := posEvent(t, 1, 1)
	ev.Tenure = ten
	var acked atomic.Int64
	l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Add(1) })
	clk.waitTimer(t, "the first backoff", clk.Now().Add(time.Second))
	ten.End()
	waitUntil(t, "the event dropped without the clock moving", func() bool { return l.q.empty() })
	s.set(nil)
	clk.Advance(time.Minute)
	if n := len(s.callTimes()); n != 1 {
		t.Fatalf("%d sends, want the 1 before the loss", n)
	}
	if acked.Load() != 0 {
		t.Fatal("an event of a lost tenure was acknowledged")
	}
}

// A graceful handover: the tenure ends while one request of the unit is in
// progress, one waits in the limiter and one backs off. Ending the tenure
// cancels them; Quiesce returns once the request in progress returned; the
// lease is released then, and nothing of the unit is sent after it.
func TestFenceHandoverWithQueuedWaiters(t *testing.T) {
	clk := newFakeClock()
	var released atomic.Bool
	var failFirst atomic.Bool
	failFirst.Store(true)
	gs := &gateSink{gate: make(chan struct{}), released: &released}
	// seq 3 fails once and backs off; the others block in Send.
	sink := sinkFunc{gateSink: gs, before: func(evs []*event.Event) error {
		if seqOf(evs[0]) == 3 && failFirst.CompareAndSwap(true, false) {
			return sinks.Retryable("http_503", 0, errors.New("503"))
		}
		return nil
	}}
	l := fencedLane(t, sink, clk)
	ten := event.NewTenure("orders#0/2", 1, time.Time{})
	var acked atomic.Int64
	push := func(seq, doc int) {
		ev := posEvent(t, seq, doc)
		ev.Tenure = ten
		l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Add(1) })
	}
	push(3, 3)
	clk.waitTimer(t, "seq 3 backing off", clk.Now().Add(time.Second))
	push(1, 1)
	waitUntil(t, "seq 1 in flight", func() bool { return gs.inFlight.Load() == 1 })
	push(2, 2)
	waitUntil(t, "seq 2 waiting in the limiter", func() bool { return waiting(l) == 1 })

	// The handover (app/cluster.go endAndRelease): end, quiesce, release.
	ten.End()
	qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ten.Quiesce(qctx); err != nil {
		t.Fatalf("quiesce: %v (a request of the ended tenure did not return)", err)
	}
	if gs.inFlight.Load() != 0 {
		t.Fatal("quiesce returned with a request of the unit in progress")
	}
	released.Store(true)

	close(gs.gate)
	clk.Advance(time.Minute)
	waitUntil(t, "lane idle", func() bool { return l.q.empty() })
	gs.mu.Lock()
	late := slices.Clone(gs.late)
	gs.mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("sent %v after the lease was released", late)
	}
	if acked.Load() != 0 {
		t.Fatalf("%d events of the ended tenure acknowledged", acked.Load())
	}
}

// sinkFunc is gateSink with a reply decided before the request.
type sinkFunc struct {
	*gateSink
	before func(evs []*event.Event) error
}

func (s sinkFunc) Send(ctx context.Context, evs []*event.Event) error {
	if err := s.before(evs); err != nil {
		return err
	}
	return s.gateSink.Send(ctx, evs)
}

// The re-drive of a unit's parked entry, retrying a sink that keeps failing,
// stops when the unit's tenure ends: no request after the end, and the entry
// stays parked (not dead-lettered) for the unit's next owner.
func TestFenceRedriveRetriesAcrossLeaseLoss(t *testing.T) {
	dl := realStore(t)
	clk := newFakeClock()
	s := &scriptSink{clk: clk}
	s.set(down)
	ev := posEvent(t, 1, 1)
	e, err := deadletter.EntryFor(ev, "parking", deadletter.KindParked)
	if err != nil {
		t.Fatal(err)
	}
	e.Unit = "orders#0/2"
	if err := dl.Put(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	eng, err := NewEngine(mustRules(t, "parking"), []SinkSpec{{Sink: s, MaxInFlight: 2,
		Retry: sinks.RetryPolicy{MaxAttempts: 100, InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2}}}, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := eng.Lanes()[0]
	l.clk, l.d.clk, l.q.clk = clk, clk, clk
	ten := event.NewTenure("orders#0/2", 1, time.Time{})
	eng.SetOwnedTenures([]*event.Tenure{ten})
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })
	t0 := clk.Now()
	clk.waitTimer(t, "the re-drive backing off", t0.Add(time.Second))
	ten.End() // lost; the lease loop has not noticed yet (still "owned")
	// The re-drive gives up at once (its backoff ends with the tenure) and
	// idles, without the clock moving.
	clk.waitTimer(t, "the re-drive idle", t0.Add(20*time.Millisecond))
	before := len(s.callTimes())
	s.set(nil)
	for range 5 {
		clk.Advance(10 * time.Second)
		// The re-drive lists again and must not pick the entry up.
		clk.waitTimer(t, "the re-drive idle", clk.Now().Add(20*time.Millisecond))
	}
	if n := len(s.callTimes()); n != before {
		t.Fatalf("%d re-drive requests after the tenure ended", n-before)
	}
	got, found, err := dl.Get(context.Background(), e.ID)
	if err != nil || !found || got.Kind != deadletter.KindParked {
		t.Fatalf("entry after the loss: found %v kind %q err %v; want it still parked", found, got.Kind, err)
	}
}

// hookStore delays PutMany until the test lets it through: a parked write
// blocked on a cut connection.
type hookStore struct {
	*deadletter.Store
	entered chan struct{}
	proceed chan struct{}
	err     chan error
}

func (h *hookStore) PutMany(ctx context.Context, es []deadletter.Entry) error {
	h.entered <- struct{}{}
	<-h.proceed
	// Already on the wire: it reaches MongoDB whatever the writer's
	// context became meanwhile (the tenure's end cancels it).
	err := h.Store.PutMany(context.WithoutCancel(ctx), es)
	h.err <- err
	return err
}

// A parked write delayed past a lease loss is refused by the store: the new
// owner fenced the unit, parked the same change and re-drove it (deleted);
// the old owner's write then reaches MongoDB and must neither re-create that
// entry nor create another; its events stay unacknowledged.
func TestFenceParkedWriteDelayedPastLeaseLoss(t *testing.T) {
	dl := realStore(t)
	ctx := context.Background()
	const unit = "orders#0/2"
	if err := dl.Fence(ctx, unit, 1); err != nil {
		t.Fatal(err)
	}
	h := &hookStore{Store: dl, entered: make(chan struct{}, 1), proceed: make(chan struct{}), err: make(chan error, 1)}
	clk := newFakeClock()
	s := &scriptSink{clk: clk}
	l, err := newLaneClock(SinkSpec{Sink: s, MaxInFlight: 2}, h, metrics.New(nil), slog.New(slog.DiscardHandler), clk)
	if err != nil {
		t.Fatal(err)
	}
	// The lane stays parked: another unit's entry waits for its source
	// (which never reads here), so the lane cannot go live meanwhile.
	other := posEvent(t, 9, 9)
	oe, err := deadletter.EntryFor(other, "parking", deadletter.KindParked)
	if err != nil {
		t.Fatal(err)
	}
	oe.Unit = "orders#1/2"
	if err := dl.Put(ctx, oe); err != nil {
		t.Fatal(err)
	}
	never := AckedFunc(func(string) (bson.Timestamp, bool) { return bson.Timestamp{}, false })
	l.own.acked.Store(&never)
	lctx, cancel := context.WithCancel(ctx)
	l.start(lctx)
	t.Cleanup(func() { cancel(); close(h.proceed); l.stop() })
	l.parkLane() // the sink kept failing: every event is parked
	ten := event.NewTenure(unit, 1, time.Time{})
	ev1 := posEvent(t, 1, 1)
	ev1.Tenure = ten
	var acked atomic.Int64
	l.enqueue(ev1, ev1.OrderingKeyHash(), func() { acked.Add(1) })
	select {
	case <-h.entered: // the write is on its way
	case <-time.After(10 * time.Second):
		t.Fatal("no parked write")
	}

	// Meanwhile the lease moves: the new owner (epoch 2) fences the unit,
	// re-reads ev1, parks it and re-drives it (deletes it), then delivers
	// later changes live.
	ten.End()
	if err := dl.Fence(ctx, unit, 2); err != nil {
		t.Fatal(err)
	}
	e, err := deadletter.EntryFor(ev1, "parking", deadletter.KindParked)
	if err != nil {
		t.Fatal(err)
	}
	e.Unit, e.Epoch = unit, 2
	if err := dl.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	if _, err := dl.Delete(ctx, e.ID); err != nil {
		t.Fatal(err)
	}

	h.proceed <- struct{}{} // the old owner's write reaches MongoDB
	if err := <-h.err; !errors.Is(err, deadletter.ErrFenced) {
		t.Fatalf("delayed write of epoch 1: %v, want refused (ErrFenced)", err)
	}
	waitUntil(t, "lane idle", func() bool { return l.q.empty() })
	n, err := dl.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked, Units: []string{unit}})
	if err != nil || n != 0 {
		t.Fatalf("%d parked entries of the unit after the fenced write (err %v), want 0", n, err)
	}
	if acked.Load() != 0 {
		t.Fatal("an event whose parked write was refused was acknowledged")
	}
}

// getHookStore holds the re-drive's read of an entry until the test lets it
// through: a store read blocked on a cut connection.
type getHookStore struct {
	*deadletter.Store
	entered chan struct{}
	proceed chan struct{}
}

func (h *getHookStore) Get(ctx context.Context, id string) (deadletter.Entry, bool, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	select {
	case <-h.proceed:
	case <-ctx.Done():
		return deadletter.Entry{}, false, ctx.Err()
	}
	return h.Store.Get(context.WithoutCancel(ctx), id)
}

// A re-drive whose read of a parked entry was held up (a cut connection)
// while its unit was handed over sends nothing once the read returns: the
// unit is no longer among the owned ones (the handover's order: removed
// from the owned set, then the tenure ended, then released), and the
// re-drive must not take "no tenure" for "no fence". Reported by the
// cluster chaos campaign as re-drive sends 206–391 ms after a release.
func TestFenceRedriveReadHeldPastRelease(t *testing.T) {
	for _, order := range []string{"handover", "loss"} {
		t.Run(order, func(t *testing.T) {
			dl := realStore(t)
			ev := posEvent(t, 1, 1)
			e, err := deadletter.EntryFor(ev, "parking", deadletter.KindParked)
			if err != nil {
				t.Fatal(err)
			}
			const unit = "orders#0/2"
			e.Unit = unit
			if err := dl.Put(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			h := &getHookStore{Store: dl, entered: make(chan struct{}, 1), proceed: make(chan struct{})}
			clk := newFakeClock()
			s := &scriptSink{clk: clk}
			eng, err := NewEngine(mustRules(t, "parking"), []SinkSpec{{Sink: s, MaxInFlight: 2,
				Retry: sinks.RetryPolicy{MaxAttempts: 100, InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2}}}, h, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := eng.Lanes()[0]
			l.clk, l.d.clk, l.q.clk = clk, clk, clk
			ten := event.NewTenure(unit, 1, time.Time{})
			eng.SetOwnedTenures([]*event.Tenure{ten})
			ctx, cancel := context.WithCancel(context.Background())
			eng.Start(ctx)
			t.Cleanup(func() { cancel(); eng.Stop() })
			select {
			case <-h.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the re-drive never read the entry")
			}
			// The read is held; the unit goes away meanwhile.
			if order == "handover" {
				eng.SetOwnedTenures(nil)
				ten.End()
			} else {
				ten.End()
				eng.SetOwnedTenures(nil)
			}
			close(h.proceed)
			// Once the entry's turn is over the re-drive lists no owned
			// unit's entries and the lane goes live.
			for deadline := time.Now().Add(10 * time.Second); l.parked.Load(); {
				if time.Now().After(deadline) {
					t.Fatal("the lane never went live")
				}
				clk.Advance(20 * time.Millisecond)
				time.Sleep(time.Millisecond)
			}
			if n := len(s.callTimes()); n != 0 {
				t.Fatalf("%d re-drive requests after the unit was released", n)
			}
			got, found, err := dl.Get(context.Background(), e.ID)
			if err != nil || !found || got.Kind != deadletter.KindParked {
				t.Fatalf("entry after the release: found %v kind %q err %v; want it still parked", found, got.Kind, err)
			}
		})
	}
}

// failStore fails every parked write as a transaction left open by a killed
// replica makes MongoDB fail it (WriteConflict until the transaction's
// lifetime limit).
type failStore struct {
	*deadletter.Store
	calls atomic.Int64
}

func (f *failStore) PutMany(ctx context.Context, es []deadletter.Entry) error {
	f.calls.Add(1)
	return errors.New("operation timed out: (WriteConflict) Write conflict during plan execution")
}

// A parked write that keeps failing is retried only while its events'
// tenure lasts: once the lease is lost the retries stop and the events are
// dropped unacknowledged (the next owner re-reads them), rather than the
// lane retrying a write of a unit it no longer owns.
func TestFenceParkWriteRetriesEndWithTenure(t *testing.T) {
	dl := realStore(t)
	f := &failStore{Store: dl}
	clk := newFakeClock()
	s := &scriptSink{clk: clk}
	l, err := newLaneClock(SinkSpec{Sink: s, MaxInFlight: 2}, f, metrics.New(nil), slog.New(slog.DiscardHandler), clk)
	if err != nil {
		t.Fatal(err)
	}
	// The lane stays parked: another unit's entry waits for its source
	// (which never reads here). Without it the re-drive loop could find
	// nothing parked or queued between parkLane and enqueue and turn the
	// lane live again, and the event would go to the sink instead of the
	// parked write this test waits for (it failed so 1–2 runs in 40).
	other := posEvent(t, 9, 9)
	oe, err := deadletter.EntryFor(other, "parking", deadletter.KindParked)
	if err != nil {
		t.Fatal(err)
	}
	oe.Unit = "orders#1/2"
	if err := dl.Put(context.Background(), oe); err != nil {
		t.Fatal(err)
	}
	never := AckedFunc(func(string) (bson.Timestamp, bool) { return bson.Timestamp{}, false })
	l.own.acked.Store(&never)
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	t.Cleanup(func() { cancel(); l.stop() })
	l.parkLane()
	ten := event.NewTenure("orders#0/2", 1, time.Time{})
	ev := posEvent(t, 1, 1)
	ev.Tenure = ten
	var acked atomic.Int64
	l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Add(1) })
	waitUntil(t, "a parked write", func() bool { return f.calls.Load() > 0 })
	ten.End()
	deadline := time.Now().Add(10 * time.Second)
	for !l.q.empty() {
		if time.Now().After(deadline) {
			t.Fatalf("the parked write still retried after the tenure ended (%d attempts)", f.calls.Load())
		}
		clk.Advance(time.Second)
		time.Sleep(time.Millisecond)
	}
	n := f.calls.Load()
	for range 5 {
		clk.Advance(10 * time.Second)
		time.Sleep(time.Millisecond)
	}
	if m := f.calls.Load(); m != n {
		t.Fatalf("%d parked writes after the tenure ended", m-n)
	}
	if acked.Load() != 0 {
		t.Fatal("an event of a lost tenure was acknowledged")
	}
}
