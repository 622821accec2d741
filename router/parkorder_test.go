package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/test/mongotest"
)

// These tests drive one lane through the interleavings of parking,
// re-reading and re-driving that once reordered a document's changes
// (issue "Parked events are re-driven out of order after a restart"). They
// use the real dead-letter store (on test/mongowire, or a real MongoDB with
// CHANGEGATE_TEST_MONGODB_URI), a scripted sink and a fake clock: every step
// happens when the test says, no sleeps.

const ctBase = 1_800_000_000

// posEvent returns the change of document doc at stream position seq: its
// resume token and cluster time grow with seq, as MongoDB's do.
func posEvent(t testing.TB, seq, doc int) *event.Event {
	t.Helper()
	ct := bson.Timestamp{T: ctBase, I: uint32(seq)}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X2B0229296E04", ct.T, ct.I)}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ct},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: doc}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: doc}, {Key: "seq", Value: seq}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.FromChange("orders", uint64(seq), raw)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func seqOf(e *event.Event) int { return int(e.Raw.Lookup("fullDocument", "seq").Int32()) }

// scriptSink answers each Send with reply (nil: accept) and records the
// accepted events and the fake time of every call.
type scriptSink struct {
	clk   *fakeClock
	reply atomic.Pointer[func(evs []*event.Event) error]
	mu    sync.Mutex
	got   []int       // seqs accepted, in order
	calls []time.Time // fake time of every Send
}

func (s *scriptSink) Name() string  { return "parking" }
func (s *scriptSink) MaxBatch() int { return 1 }
func (s *scriptSink) Close() error  { return nil }
func (s *scriptSink) Send(ctx context.Context, evs []*event.Event) error {
	var err error
	if r := s.reply.Load(); r != nil && *r != nil {
		err = (*r)(evs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, s.clk.Now())
	if err == nil {
		for _, e := range evs {
			s.got = append(s.got, seqOf(e))
		}
	}
	return err
}
func (s *scriptSink) set(f func(evs []*event.Event) error) { s.reply.Store(&f) }
func (s *scriptSink) delivered() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}
func (s *scriptSink) callTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func down(evs []*event.Event) error {
	return sinks.Retryable("http_503", 0, errors.New("503 unavailable"))
}

// parkingLane returns a started lane on a real dead-letter store with a fake
// clock. Retries back off 1s, 2s, 4s... (no jitter).
func parkingLane(t *testing.T, dl DeadLetters, s *scriptSink, parkAfter time.Duration) *Lane {
	t.Helper()
	l, err := newLaneClock(SinkSpec{
		Sink: s, MaxInFlight: 4, ParkAfter: parkAfter,
		Retry: sinks.RetryPolicy{MaxAttempts: 100, InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2},
	}, dl, metrics.New(nil), slog.New(slog.DiscardHandler), s.clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	t.Cleanup(func() { cancel(); l.stop() })
	return l
}

func realStore(t *testing.T) *deadletter.Store {
	t.Helper()
	s := deadletter.NewStore(mongotest.Database(t, "router"), "deadletters")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// parkDirect writes events as parked entries, as an earlier run did.
func parkDirect(t *testing.T, dl *deadletter.Store, evs ...*event.Event) {
	t.Helper()
	for _, ev := range evs {
		e, err := deadletter.EntryFor(ev, "parking", deadletter.KindParked)
		if err != nil {
			t.Fatal(err)
		}
		e.Reason = "parked"
		if err := dl.Put(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

func parkedSeqs(t *testing.T, dl *deadletter.Store) (seqs []int, versions map[int]int64) {
	t.Helper()
	es, err := dl.List(context.Background(), deadletter.Filter{Kind: deadletter.KindParked, Sink: "parking"})
	if err != nil {
		t.Fatal(err)
	}
	versions = map[int]int64{}
	for _, e := range es {
		ev, err := e.Event()
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seqOf(ev))
		versions[seqOf(ev)] = e.Version
	}
	return seqs, versions
}

// enqueueAcked enqueues evs (a re-read of the stream) and waits until the
// lane has finished them (parked, as the lane is parked).
func enqueueAcked(t *testing.T, l *Lane, evs ...*event.Event) {
	t.Helper()
	var acked atomic.Int64
	for _, ev := range evs {
		l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Add(1) })
	}
	waitUntil(t, "re-read events parked", func() bool { return acked.Load() == int64(len(evs)) })
}

// checkFirstDeliveriesInOrder fails when a change is delivered for the first
// time after a later change of its document (a re-delivery of an earlier
// change after a rewind is allowed), or when the last delivery is not the
// document's last change.
func checkFirstDeliveriesInOrder(t *testing.T, got []int, last int) {
	t.Helper()
	seen := map[int]bool{}
	maxFirst := 0
	for _, s := range got {
		if !seen[s] {
			if s < maxFirst {
				t.Fatalf("delivered %v: change %d first delivered after change %d", got, s, maxFirst)
			}
			seen[s], maxFirst = true, s
		}
	}
	if len(got) == 0 || got[len(got)-1] != last {
		t.Fatalf("delivered %v: the document must end at change %d", got, last)
	}
}

// After a restart with a held-back checkpoint, the re-read changes of a
// document are parked again while its parked entries wait for the re-drive:
// they keep their places (stream order, not write time), the re-drive
// delivers the changes first in order, and a re-park written while an entry
// was being re-driven is not deleted with it: the re-drive goes over it
// again, so the re-read is replayed in full and the document ends at its
// last change.
func TestParkRereadAfterRestartKeepsPlaces(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	s.set(down)
	a1, a2, a3 := posEvent(t, 1, 7), posEvent(t, 2, 7), posEvent(t, 3, 7)
	parkDirect(t, dl, a1, a2, a3) // by the run before the restart
	_, before := parkedSeqs(t, dl)

	l := parkingLane(t, dl, s, 0)
	if !l.Status().Parked {
		t.Fatal("lane with a parked backlog must start parked")
	}
	// The re-drive listed the backlog and is backing off after its first
	// attempt (change 1, sink down): the next attempt waits 1s.
	waitUntil(t, "first re-drive attempt", func() bool { return len(s.callTimes()) == 1 })
	s.clk.waitTimer(t, "re-drive backoff", s.clk.Now().Add(time.Second))

	// The stream is re-read from the checkpoint: changes 1 and 2 first.
	enqueueAcked(t, l, posEvent(t, 1, 7), posEvent(t, 2, 7))
	seqs, after := parkedSeqs(t, dl)
	if !slices.Equal(seqs, []int{1, 2, 3}) {
		t.Fatalf("parked order after re-parking 1 and 2 = %v, want [1 2 3] (a re-park must not move an entry)", seqs)
	}
	for _, s := range []int{1, 2} {
		if after[s] == before[s] {
			t.Fatalf("re-park of change %d kept version %d", s, after[s])
		}
	}
	enqueueAcked(t, l, posEvent(t, 3, 7))

	s.set(nil) // the receiver recovers
	s.clk.Advance(time.Second)
	waitUntil(t, "lane live again", func() bool { return !l.Status().Parked })
	got := s.delivered()
	// The re-drive's first pass had read versions the re-read replaced:
	// it delivers 1 2 3, deletes nothing, and the second pass delivers
	// the re-read 1 2 3 and deletes them.
	if want := []int{1, 2, 3, 1, 2, 3}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	checkFirstDeliveriesInOrder(t, got, 3)
	if seqs, _ := parkedSeqs(t, dl); len(seqs) != 0 {
		t.Fatalf("parked entries left: %v", seqs)
	}
}

// A re-read change whose parked entry the re-drive already delivered and
// deleted is parked anew at its stream position, before later parked
// changes of its document that still wait, so it never overtakes them.
func TestParkRereadAfterRedriveSortsByPosition(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	a1, a2 := posEvent(t, 1, 7), posEvent(t, 2, 7)
	parkDirect(t, dl, a1, a2)
	// Change 1 goes through; change 2 fails until the test says.
	var release atomic.Bool
	s.set(func(evs []*event.Event) error {
		if seqOf(evs[0]) == 2 && !release.Load() {
			return down(evs)
		}
		return nil
	})
	l := parkingLane(t, dl, s, 0)
	waitUntil(t, "change 2 attempted", func() bool { return len(s.callTimes()) == 2 })
	s.clk.waitTimer(t, "re-drive backoff", s.clk.Now().Add(time.Second))
	if seqs, _ := parkedSeqs(t, dl); !slices.Equal(seqs, []int{2}) {
		t.Fatalf("parked after change 1 was re-driven = %v, want [2]", seqs)
	}
	// Change 1 is re-read (its entry is gone) and parked anew, then the
	// re-read goes on with change 2 and a new change 3.
	enqueueAcked(t, l, posEvent(t, 1, 7))
	if seqs, _ := parkedSeqs(t, dl); !slices.Equal(seqs, []int{1, 2}) {
		t.Fatalf("parked = %v, want [1 2]: the re-read change sorts by its position", seqs)
	}
	enqueueAcked(t, l, posEvent(t, 2, 7), posEvent(t, 3, 7))
	release.Store(true)
	s.clk.Advance(time.Second)
	waitUntil(t, "lane live again", func() bool { return !l.Status().Parked })
	got := s.delivered()
	checkFirstDeliveriesInOrder(t, got, 3)
	if want := []int{1, 2, 1, 2, 3}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// While the lane is parked, a newer change of a document that is still in
// memory is parked behind the document's parked entries, never delivered
// ahead of them; and the lane goes live only once both are delivered.
func TestParkNewerChangeInMemoryWaitsForRedrive(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	s.set(down)
	parkDirect(t, dl, posEvent(t, 1, 7))
	l := parkingLane(t, dl, s, 0)
	waitUntil(t, "first re-drive attempt", func() bool { return len(s.callTimes()) == 1 })
	s.clk.waitTimer(t, "re-drive backoff", s.clk.Now().Add(time.Second))
	enqueueAcked(t, l, posEvent(t, 2, 7))
	if got := s.delivered(); len(got) != 0 {
		t.Fatalf("delivered %v while the re-drive of change 1 is backing off", got)
	}
	s.set(nil)
	s.clk.Advance(time.Second)
	waitUntil(t, "lane live again", func() bool { return !l.Status().Parked })
	if got := s.delivered(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("delivered %v, want [1 2]", got)
	}
	// Live: the next change goes straight through.
	var acked atomic.Bool
	ev := posEvent(t, 3, 7)
	l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Store(true) })
	waitUntil(t, "live delivery", func() bool { return acked.Load() })
	if got := s.delivered(); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("delivered %v, want [1 2 3]", got)
	}
}

// A 503 with Retry-After: 1 holds the sink's next request back for 1s,
// also when the lane is parked during that wait: the parked entry carries
// the time, and the re-drive waits for it instead of resending at once.
func TestParkKeepsRetryAfter(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	var calls atomic.Int64
	s.set(func(evs []*event.Event) error {
		if calls.Add(1) == 1 {
			return sinks.Retryable("http_503", time.Second, errors.New("503 unavailable"))
		}
		return nil
	})
	l := parkingLane(t, dl, s, 0)
	t0 := s.clk.Now()
	var acked atomic.Bool
	ev := posEvent(t, 1, 7)
	l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Store(true) })
	waitUntil(t, "first attempt", func() bool { return len(s.callTimes()) == 1 })
	s.clk.waitTimer(t, "Retry-After wait", t0.Add(time.Second))
	if st := l.Status(); !st.PausedUntil.Equal(t0.Add(time.Second)) {
		t.Fatalf("status paused until %v, want %v", st.PausedUntil, t0.Add(time.Second))
	}

	l.parkLane() // the sink was failing for too long
	waitUntil(t, "event parked", func() bool { return acked.Load() })
	es, err := dl.List(context.Background(), deadletter.Filter{Kind: deadletter.KindParked})
	if err != nil || len(es) != 1 || !es[0].RetryAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("parked entries %+v, %v; want one with RetryAt %v", es, err, t0.Add(time.Second))
	}
	// The re-drive waits for the Retry-After: nothing is sent before it.
	// (It may have looked before the entry was written and be idling for
	// 20ms: let that pass.)
	waitUntil(t, "re-drive waiting for Retry-After", func() bool {
		if s.clk.hasTimer(t0.Add(time.Second)) && len(s.callTimes()) == 1 && !s.clk.hasTimer(s.clk.Now().Add(20*time.Millisecond)) {
			return true
		}
		if s.clk.hasTimer(s.clk.Now().Add(20 * time.Millisecond)) {
			s.clk.Advance(20 * time.Millisecond)
		}
		return false
	})
	s.clk.Advance(t0.Add(999 * time.Millisecond).Sub(s.clk.Now()))
	s.clk.waitTimer(t, "re-drive still waiting", t0.Add(time.Second))
	if n := len(s.callTimes()); n != 1 {
		t.Fatalf("%d requests before Retry-After elapsed, want 1", n)
	}
	s.clk.Advance(time.Millisecond)
	waitUntil(t, "lane live again", func() bool { return !l.Status().Parked })
	calls2 := s.callTimes()
	if len(calls2) != 2 || calls2[1].Sub(calls2[0]) < time.Second {
		t.Fatalf("requests at %v: the second must come ≥ 1s after the first", calls2)
	}
}

// Retry-After pauses the whole sink: another document's event waits too.
func TestRetryAfterPausesWholeSink(t *testing.T) {
	s := &scriptSink{clk: newFakeClock()}
	var calls atomic.Int64
	s.set(func(evs []*event.Event) error {
		if calls.Add(1) == 1 {
			return sinks.Retryable("http_429", 2*time.Second, errors.New("429 too many requests"))
		}
		return nil
	})
	l := parkingLane(t, nil, s, 0)
	t0 := s.clk.Now()
	var acked atomic.Int64
	e1 := posEvent(t, 1, 1)
	l.enqueue(e1, e1.OrderingKeyHash(), func() { acked.Add(1) })
	waitUntil(t, "first attempt", func() bool { return len(s.callTimes()) == 1 })
	s.clk.waitTimer(t, "Retry-After wait", t0.Add(2*time.Second))
	for doc := 2; doc <= 5; doc++ {
		e := posEvent(t, doc, doc)
		l.enqueue(e, e.OrderingKeyHash(), func() { acked.Add(1) })
	}
	// Give the other workers their chance to (wrongly) send: each must
	// block on the pause, so all of them end up waiting for t0+2s.
	waitUntil(t, "other documents waiting for the pause", func() bool {
		s.clk.mu.Lock()
		defer s.clk.mu.Unlock()
		n := 0
		for tm := range s.clk.timers {
			if tm.at.Equal(t0.Add(2 * time.Second)) {
				n++
			}
		}
		return n >= 2
	})
	if n := len(s.callTimes()); n != 1 {
		t.Fatalf("%d requests during the Retry-After pause, want 1", n)
	}
	s.clk.Advance(2 * time.Second)
	// A worker that read the clock just before the advance sleeps from
	// just after it: nudge the fake clock on until every event is in (the
	// check below only bounds requests from below).
	waitUntil(t, "all delivered", func() bool {
		if acked.Load() == 5 {
			return true
		}
		s.clk.Advance(10 * time.Millisecond)
		return false
	})
	for i, c := range s.callTimes()[1:] {
		if c.Before(t0.Add(2 * time.Second)) {
			t.Fatalf("request %d at %v, before the pause ended", i+2, c)
		}
	}
}

// The restart re-drive race: before the restart change 2 of a document was
// parked while its change 1 was still in flight (unacknowledged, so the
// checkpoint is before it). The re-drive must not deliver change 2 before
// the source has re-read change 1 and the lane parked it in its place: a
// parked entry is re-driven only once its unit's source acknowledged up to
// the entry's position.
func TestRedriveWaitsForSourceToReadPast(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	c1, c2 := posEvent(t, 1, 7), posEvent(t, 2, 7)
	parkDirect(t, dl, c2) // by the run before the restart
	var acked atomic.Pointer[bson.Timestamp]
	acked.Store(&bson.Timestamp{T: ctBase, I: 0}) // the checkpoint, before change 1
	l, err := newLaneClock(SinkSpec{Sink: s, MaxInFlight: 4}, dl, metrics.New(nil), slog.New(slog.DiscardHandler), s.clk)
	if err != nil {
		t.Fatal(err)
	}
	f := AckedFunc(func(unit string) (bson.Timestamp, bool) {
		if unit != "orders" {
			t.Errorf("acked asked for unit %q", unit)
		}
		return *acked.Load(), true
	})
	l.own.acked.Store(&f)
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	t.Cleanup(func() { cancel(); l.stop() })
	if !l.Status().Parked {
		t.Fatal("lane with a parked backlog must start parked")
	}
	// The re-drive lists change 2 and waits for the source.
	t0 := s.clk.Now()
	s.clk.waitTimer(t, "the re-drive waiting for the source", t0.Add(20*time.Millisecond))
	if got := s.delivered(); len(got) != 0 {
		t.Fatalf("delivered %v before the source re-read the earlier change", got)
	}
	// The source re-reads change 1 (parked in its place), then change 2.
	enqueueAcked(t, l, c1)
	acked.Store(&c1.ClusterTime)
	s.clk.Advance(20 * time.Millisecond)
	s.clk.waitTimer(t, "the re-drive waiting for the source", s.clk.Now().Add(20*time.Millisecond))
	enqueueAcked(t, l, posEvent(t, 2, 7))
	acked.Store(&c2.ClusterTime)
	s.clk.Advance(20 * time.Millisecond)
	waitUntil(t, "lane live again", func() bool { return !l.Status().Parked })
	got := s.delivered()
	if !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("delivered %v, want [1 2]", got)
	}
}

// A parked change that no current rule routes to its sink any more (the
// configuration changed while it was parked) is not delivered by the
// re-drive: its entry turns into a failed one (reason not_routed), kept
// for an operator, and the re-drive goes on with the others, in order.
func TestRedriveOfUnroutedChangeKeepsIt(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	rules, err := CompileRules([]RuleSpec{{Name: "not-2", Source: "orders", Sinks: []string{"parking"},
		Filter: bson.D{{Key: "fullDocument.seq", Value: bson.D{{Key: "$ne", Value: 2}}}}}}, []string{"parking"})
	if err != nil {
		t.Fatal(err)
	}
	parkDirect(t, dl, posEvent(t, 1, 7), posEvent(t, 2, 7), posEvent(t, 3, 7))
	l, err := newLaneClock(SinkSpec{
		Sink: s, MaxInFlight: 4,
		Retry:   sinks.RetryPolicy{MaxAttempts: 100, InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2},
		reshape: func(ev *event.Event) (*event.Event, bool, error) { return rules.ReshapeStored(ev, "parking", false) },
	}, dl, metrics.New(nil), slog.New(slog.DiscardHandler), s.clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	t.Cleanup(func() { cancel(); l.stop() })
	waitUntil(t, "lane live again", func() bool { return !l.Status().Parked })
	if got := s.delivered(); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("re-driven %v, want [1 3]", got)
	}
	if seqs, _ := parkedSeqs(t, dl); len(seqs) != 0 {
		t.Fatalf("parked entries left: %v", seqs)
	}
	failed, err := dl.List(context.Background(), deadletter.Filter{Kind: deadletter.KindFailed, Sink: "parking"})
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].Reason != "not_routed" || !strings.Contains(failed[0].LastError, "no current rule routes") {
		t.Fatalf("failed entries %+v, want change 2's, not_routed", failed)
	}
	if ev, err := failed[0].Event(); err != nil || seqOf(ev) != 2 {
		t.Fatalf("failed entry is not change 2's: %v", err)
	}
}

// listHookStore runs after's callback once, right after the n-th listing of
// parked entries returned: what happens between a re-drive's listing and
// its check of the source's position.
type listHookStore struct {
	*deadletter.Store
	calls atomic.Int64
	n     int64
	after func()
}

func (h *listHookStore) Summaries(ctx context.Context, f deadletter.Filter, ready func(), fn func(deadletter.Entry) error) error {
	err := h.Store.Summaries(ctx, f, ready, fn)
	if h.calls.Add(1) == h.n {
		h.after()
	}
	return err
}

// A change the source re-reads (after a restart) and parks again while a
// re-drive pass has already listed its entry is delivered once, not twice:
// the pass checks the source's position as it was before the listing, so it
// leaves the entry to the next pass, which lists the re-parked version and
// deletes it after the delivery. Checked after the listing, the position
// let the pass deliver the old version, whose delete then failed (the
// version changed) and the next pass delivered it again: the parking sink's
// duplicates without a crash in between of issue 25, item 6.
func TestRedriveRereadDuringListingDeliveredOnce(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	c1 := posEvent(t, 1, 7)
	parkDirect(t, dl, c1) // by the run before the restart
	var acked atomic.Pointer[bson.Timestamp]
	acked.Store(&bson.Timestamp{T: ctBase, I: 0}) // the checkpoint, before change 1
	h := &listHookStore{Store: dl, n: 2, after: func() {
		// The source re-reads change 1 and the lane parks it again (a
		// new version), then acknowledges it.
		parkDirect(t, dl, posEvent(t, 1, 7))
		acked.Store(&c1.ClusterTime)
	}}
	l, err := newLaneClock(SinkSpec{Sink: s, MaxInFlight: 4}, h, metrics.New(nil), slog.New(slog.DiscardHandler), s.clk)
	if err != nil {
		t.Fatal(err)
	}
	f := AckedFunc(func(string) (bson.Timestamp, bool) { return *acked.Load(), true })
	l.own.acked.Store(&f)
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx)
	t.Cleanup(func() { cancel(); l.stop() })
	for deadline := time.Now().Add(10 * time.Second); l.Status().Parked; {
		if time.Now().After(deadline) {
			t.Fatalf("lane still parked; delivered %v", s.delivered())
		}
		s.clk.Advance(20 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	if got := s.delivered(); !slices.Equal(got, []int{1}) {
		t.Fatalf("delivered %v, want [1]", got)
	}
	if seqs, _ := parkedSeqs(t, dl); len(seqs) != 0 {
		t.Fatalf("parked entries left: %v", seqs)
	}
}
