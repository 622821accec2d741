package router

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/sinks"
)

// memDL is an in-memory DeadLetters.
type memDL struct {
	mu      sync.Mutex
	entries map[string]deadletter.Entry
	ver     int64
}

func newMemDL() *memDL { return &memDL{entries: map[string]deadletter.Entry{}} }

// Put writes e as deadletter.Store does: an existing entry keeps its Order
// (its place), and every write draws a new Version.
func (m *memDL) Put(_ context.Context, e deadletter.Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.entries[e.ID]; ok {
		e.Order = old.Order
	}
	m.ver++
	e.Version = m.ver
	m.entries[e.ID] = e
	return nil
}

func (m *memDL) PutMany(ctx context.Context, es []deadletter.Entry) error {
	for _, e := range es {
		m.Put(ctx, e)
	}
	return nil
}

func (m *memDL) match(e deadletter.Entry, f deadletter.Filter) bool {
	return (f.Kind == "" || e.Kind == f.Kind) && (f.Sink == "" || e.Sink == f.Sink)
}

func (m *memDL) List(_ context.Context, f deadletter.Filter) ([]deadletter.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []deadletter.Entry
	for _, e := range m.entries {
		if m.match(e, f) {
			out = append(out, e)
		}
	}
	// Stream order, as deadletter.Store lists parked entries.
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if c := a.ClusterTime.Compare(b.ClusterTime); c != 0 {
			return c < 0
		}
		if a.Order != b.Order {
			return a.Order < b.Order
		}
		return a.ID < b.ID
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

func (m *memDL) Summaries(ctx context.Context, f deadletter.Filter, ready func(), fn func(deadletter.Entry) error) error {
	es, err := m.List(ctx, f)
	if err != nil {
		return err
	}
	if ready != nil {
		ready()
	}
	for _, e := range es {
		if err := fn(e.Summary()); err != nil {
			return err
		}
	}
	return nil
}

func (m *memDL) Get(_ context.Context, id string) (deadletter.Entry, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	return e, ok, nil
}

func (m *memDL) Count(ctx context.Context, f deadletter.Filter) (int64, error) {
	l, _ := m.List(ctx, deadletter.Filter{Kind: f.Kind, Sink: f.Sink})
	return int64(len(l)), nil
}

func (m *memDL) DeleteVersion(_ context.Context, id string, ver int64) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok || e.Kind != deadletter.KindParked || e.Version != ver {
		return false, nil
	}
	delete(m.entries, id)
	return true, nil
}

func (m *memDL) Convert(_ context.Context, id string, to deadletter.Kind, reason, lastErr string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[id]
	e.Kind, e.Reason, e.LastError = to, reason, lastErr
	m.entries[id] = e
	return nil
}

// fakeSink records what it accepted; fail decides per event.
type fakeSink struct {
	name string
	max  int
	fail atomic.Pointer[func(e *event.Event) error]
	mu   sync.Mutex
	got  []*event.Event
	sent atomic.Int64
}

func (f *fakeSink) Name() string  { return f.name }
func (f *fakeSink) MaxBatch() int { return f.max }
func (f *fakeSink) Close() error  { return nil }
func (f *fakeSink) Send(ctx context.Context, batch []*event.Event) error {
	f.sent.Add(int64(len(batch)))
	failed := map[int]error{}
	if fp := f.fail.Load(); fp != nil {
		for i, e := range batch {
			if err := (*fp)(e); err != nil {
				failed[i] = err
			}
		}
	}
	f.mu.Lock()
	for i, e := range batch {
		if _, bad := failed[i]; !bad {
			f.got = append(f.got, e)
		}
	}
	f.mu.Unlock()
	switch {
	case len(failed) == 0:
		return nil
	case len(batch) == 1:
		return failed[0]
	default:
		return &sinks.BatchError{Failed: failed}
	}
}

func (f *fakeSink) setFail(fn func(e *event.Event) error) { f.fail.Store(&fn) }

func (f *fakeSink) received() []*event.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*event.Event(nil), f.got...)
}

func fastRetry(n int) sinks.RetryPolicy {
	return sinks.RetryPolicy{MaxAttempts: n, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, Multiplier: 2}
}

func newTestEngine(t *testing.T, dl DeadLetters, specs ...SinkSpec) *Engine {
	t.Helper()
	return startEngine(t, dl, nil, specs...)
}

// startEngine starts an engine, told to obs, whose rule "all" routes
// source "orders" to every sink of specs.
func startEngine(t *testing.T, dl DeadLetters, obs observe.Observer, specs ...SinkSpec) *Engine {
	t.Helper()
	var names []string
	for _, s := range specs {
		names = append(names, s.Sink.Name())
	}
	rules, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: names}}, names)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(rules, specs, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.SetObserver(obs)
	ctx, cancel := context.WithCancel(context.Background())
	e.Start(ctx)
	t.Cleanup(func() { cancel(); e.Stop() })
	return e
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkPerDocOrder fails when a document's events arrived out of sequence.
func checkPerDocOrder(t *testing.T, evs []*event.Event) {
	t.Helper()
	// The sequence is read from the document: re-driven events are rebuilt
	// from the stored change and carry no in-memory Seq.
	last := map[string]int32{}
	for _, e := range evs {
		seq := e.Raw.Lookup("fullDocument", "seq").Int32()
		if prev, ok := last[e.OrderingKey()]; ok && seq <= prev {
			t.Fatalf("document %s: seq %d after %d", e.DocumentKey, seq, prev)
		}
		last[e.OrderingKey()] = seq
	}
}

// Every event is acked exactly once, only after every sink finished: a
// permanently failing event is dead-lettered (then acked), never dropped.
func TestEngineAcksOnceAfterEverySink(t *testing.T) {
	dl := newMemDL()
	good := &fakeSink{name: "good"}
	bad := &fakeSink{name: "bad"}
	bad.setFail(func(e *event.Event) error {
		if e.Seq%10 == 0 {
			return sinks.Permanent("http_400", errors.New("400 bad request"))
		}
		if e.Seq%7 == 0 && e.Seq%3 == 0 {
			return sinks.Retryable("http_503", 0, errors.New("503")) // retried until exhausted
		}
		return nil
	})
	eng := newTestEngine(t, dl,
		SinkSpec{Sink: good, Retry: fastRetry(3), MaxInFlight: 4},
		SinkSpec{Sink: bad, Retry: fastRetry(3), MaxInFlight: 4})
	const n = 500
	var acks [n]atomic.Int32
	for i := 0; i < n; i++ {
		i := i
		eng.Dispatch(posEvent(t, i, i%13), func() { acks[i].Add(1) })
	}
	waitUntil(t, "all acks", func() bool {
		for i := range acks {
			if acks[i].Load() == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(20 * time.Millisecond)
	dead := 0
	for i := 0; i < n; i++ {
		if got := acks[i].Load(); got != 1 {
			t.Fatalf("event %d acked %d times", i, got)
		}
		if i%10 == 0 || (i%7 == 0 && i%3 == 0) {
			dead++
		}
	}
	if len(good.received()) != n {
		t.Fatalf("good sink got %d of %d", len(good.received()), n)
	}
	if got := len(bad.received()) + len(dl.entries); got != n {
		t.Fatalf("bad sink delivered %d + dead-lettered %d, want %d in all", len(bad.received()), len(dl.entries), n)
	}
	if len(dl.entries) != dead {
		t.Fatalf("%d dead letters, want %d", len(dl.entries), dead)
	}
	for _, e := range dl.entries {
		if e.Kind != deadletter.KindFailed || e.Sink != "bad" {
			t.Fatalf("dead letter %+v", e)
		}
		if e.Reason == "exhausted" && e.Attempts != 3 {
			t.Fatalf("exhausted after %d attempts, want 3", e.Attempts)
		}
		if e.Reason == "http_400" && e.Attempts != 1 {
			t.Fatalf("permanent error retried: %d attempts", e.Attempts)
		}
	}
	checkPerDocOrder(t, good.received())
	checkPerDocOrder(t, bad.received())
}

// Retries keep per-document order: a document whose event keeps failing
// does not let its later events overtake it.
func TestEngineRetryKeepsPerKeyOrder(t *testing.T) {
	s := &fakeSink{name: "s"}
	var calls atomic.Int64
	s.setFail(func(e *event.Event) error {
		if calls.Add(1)%3 == 0 {
			return sinks.Retryable("http_503", 0, errors.New("flaky"))
		}
		return nil
	})
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(50), MaxInFlight: 8})
	const n = 2000
	var acked atomic.Int64
	for i := 0; i < n; i++ {
		eng.Dispatch(posEvent(t, i, i%17), func() { acked.Add(1) })
	}
	waitUntil(t, "all acked", func() bool { return acked.Load() == n })
	checkPerDocOrder(t, s.received())
	if len(s.received()) != n {
		t.Fatalf("delivered %d of %d", len(s.received()), n)
	}
}

// Only the failed entries of a batch are sent again.
func TestEngineBatchRetriesOnlyFailedEntries(t *testing.T) {
	s := &fakeSink{name: "s", max: 10}
	var failedOnce sync.Map
	s.setFail(func(e *event.Event) error {
		if e.Seq%2 == 1 {
			if _, done := failedOnce.LoadOrStore(e.Seq, true); !done {
				return sinks.Retryable("throttled", 0, errors.New("throttled"))
			}
		}
		return nil
	})
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 1, Ordering: OrderNone, BatchSize: 10, BatchWait: 20 * time.Millisecond})
	var acked atomic.Int64
	for i := 0; i < 100; i++ {
		eng.Dispatch(posEvent(t, i, i), func() { acked.Add(1) })
	}
	waitUntil(t, "all acked", func() bool { return acked.Load() == 100 })
	if got := s.sent.Load(); got != 150 {
		t.Fatalf("sink was sent %d entries, want 150 (100 + the 50 that failed once)", got)
	}
}

// A sink that keeps failing is parked: its events are written to the store
// and acked (the source is not held back); once it recovers they are
// re-driven in order and the lane goes live again.
func TestEngineParksAndRedrivesInOrder(t *testing.T) {
	// Batches of 10 over 8 partitions: a parked batch holds events of
	// several partitions (keyQueue.gather).
	for _, tc := range []struct{ inFlight, batch, docs int }{{4, 1, 5}, {8, 10, 40}} {
		t.Run(fmt.Sprintf("in_flight=%d,batch=%d", tc.inFlight, tc.batch), func(t *testing.T) {
			testParksAndRedrivesInOrder(t, tc.inFlight, tc.batch, tc.docs)
		})
	}
}

func testParksAndRedrivesInOrder(t *testing.T, inFlight, batch, docs int) {
	dl := newMemDL()
	s := &fakeSink{name: "sick"}
	var down atomic.Bool
	down.Store(true)
	s.setFail(func(e *event.Event) error {
		if down.Load() {
			return sinks.Retryable("http_503", 0, errors.New("503 unavailable"))
		}
		return nil
	})
	eng := newTestEngine(t, dl, SinkSpec{
		Sink: s, Retry: sinks.RetryPolicy{MaxAttempts: 1000, InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, Multiplier: 2},
		MaxInFlight: inFlight, BatchSize: batch, ParkAfter: 100 * time.Millisecond,
	})
	var acked atomic.Int64
	const n = 300
	for i := 0; i < n/2; i++ {
		eng.Dispatch(posEvent(t, i, i%docs), func() { acked.Add(1) })
	}
	waitUntil(t, "events parked and acked while the sink is down", func() bool { return acked.Load() == n/2 })
	if !eng.Lane("sick").Status().Parked {
		t.Fatal("lane not parked")
	}
	// A replay must not overtake the parked backlog.
	if err := eng.DeliverNow(context.Background(), "sick", posEvent(t, 10000, 1)); !errors.Is(err, ErrParked) {
		t.Fatalf("DeliverNow on a parked sink: %v, want ErrParked", err)
	}
	for i := n / 2; i < n; i++ {
		eng.Dispatch(posEvent(t, i, i%docs), func() { acked.Add(1) })
	}
	waitUntil(t, "later events acked while parked", func() bool { return acked.Load() == n })
	down.Store(false)
	waitUntil(t, "re-drive to deliver everything", func() bool { return len(s.received()) >= n })
	waitUntil(t, "lane live again", func() bool { return !eng.Lane("sick").Status().Parked })
	got := s.received()
	checkPerDocOrder(t, got)
	seen := map[string]bool{}
	for _, e := range got {
		seen[e.ID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct events delivered, want %d", len(seen), n)
	}
	if c, _ := dl.Count(context.Background(), deadletter.Filter{Kind: deadletter.KindParked}); c != 0 {
		t.Fatalf("%d parked entries left", c)
	}
	// Live again: new events go straight through.
	eng.Dispatch(posEvent(t, n, 1), func() { acked.Add(1) })
	waitUntil(t, "live delivery", func() bool { return acked.Load() == n+1 && len(s.received()) == n+1 })
}

func TestPushdown(t *testing.T) {
	rules, err := CompileRules([]RuleSpec{
		{Name: "a", Source: "s", Operations: []string{"insert"}, Filter: bson.D{{Key: "fullDocument.x", Value: 1}}, Sinks: []string{"k"}},
		{Name: "b", Source: "s", Namespaces: []string{"db.*"}, Sinks: []string{"k"}},
		{Name: "c", Source: "t", Sinks: []string{"k"}},
	}, []string{"k"})
	if err != nil {
		t.Fatal(err)
	}
	m, ok := rules.Pushdown("s")
	if !ok {
		t.Fatal("no pushdown for s")
	}
	want := `{"$match": {"$or": [{"operationType": {"$in": ["invalidate","drop","rename","dropDatabase"]}},{"$and": [{"operationType": {"$in": ["insert"]}},{"fullDocument.x": {"$numberInt":"1"}}]},{"$or": [{"ns.db": "db"}]}]}}`
	raw, _ := bson.Marshal(m)
	if got := bson.Raw(raw).String(); got != want {
		t.Fatalf("pushdown\n got %s\nwant %s", got, want)
	}
	if _, ok := rules.Pushdown("t"); ok {
		t.Fatal("a rule without conditions must disable pushdown")
	}
}

// A sink that returns context.Canceled on its own (its context is live) is
// retried, not mistaken for the lane being parked or stopped.
func TestEngineSinkSideCancellationIsRetried(t *testing.T) {
	s := &fakeSink{name: "s"}
	var calls atomic.Int64
	s.setFail(func(e *event.Event) error {
		if calls.Add(1) <= 2 {
			return fmt.Errorf("client gave up: %w", context.Canceled)
		}
		return nil
	})
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 1})
	var acked atomic.Int64
	eng.Dispatch(posEvent(t, 1, 1), func() { acked.Add(1) })
	waitUntil(t, "the event delivered after two sink-side cancellations", func() bool { return acked.Load() == 1 })
	if len(s.received()) != 1 {
		t.Fatalf("delivered %d times", len(s.received()))
	}
}
