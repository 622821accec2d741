package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/sinks"
)

// admit charges ev to b as a source does: Acquire before dispatch, the
// source's own reference released once Dispatch returned.
func admit(t *testing.T, b *memory.Budget, e *Engine, ev *event.Event, ack func()) *memory.Charge {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.Acquire(ctx, int64(len(ev.Raw)), "test")
	if err != nil {
		t.Fatalf("admission: %v (%d bytes held in %d charges)", err, b.InUse(), b.Charges())
	}
	ev.Mem = c
	e.Dispatch(ev, ack)
	c.Release()
	return c
}

func waitBudgetEmpty(t *testing.T, b *memory.Budget, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.InUse() != 0 || b.Charges() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the byte budget still holds %d bytes in %d charges: a leak", what, b.InUse(), b.Charges())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Delivered and dead-lettered events, their encodings included, return
// every byte to the budget; while they are held the bytes are counted.
func TestBudgetReleasedDeliveredAndDeadLettered(t *testing.T) {
	b := memory.NewBudget(1<<30, nil, nil)
	dl := newMemDL()
	good, bad := &fakeSink{name: "good"}, &fakeSink{name: "bad"}
	var peak atomic.Int64
	good.setFail(func(e *event.Event) error {
		env, err := e.Envelope(false) // an encoding: charged to the event
		if err != nil {
			return err
		}
		if e.Mem.Bytes() < int64(len(e.Raw)+len(env)) {
			return sinks.Permanent("test", errors.New("encoding not charged"))
		}
		peak.Store(max(peak.Load(), b.InUse()))
		return nil
	})
	bad.setFail(func(e *event.Event) error {
		if e.Seq%2 == 0 {
			return sinks.Permanent("http_400", errors.New("400"))
		}
		return nil
	})
	eng := newTestEngine(t, dl,
		SinkSpec{Sink: good, Retry: fastRetry(2), MaxInFlight: 4},
		SinkSpec{Sink: bad, Retry: fastRetry(2), MaxInFlight: 4})
	const n = 200
	var acked atomic.Int64
	for i := 0; i < n; i++ {
		admit(t, b, eng, posEvent(t, i, i%7), func() { acked.Add(1) })
	}
	waitUntil(t, "acks", func() bool { return acked.Load() == n })
	waitBudgetEmpty(t, b, "delivered and dead-lettered")
	if len(good.received()) != n || len(dl.entries) != n/2 {
		t.Fatalf("good got %d, dead letters %d", len(good.received()), len(dl.entries))
	}
	if peak.Load() == 0 {
		t.Fatal("nothing was counted while events were held")
	}
}

// An event skipped by shaping for one sink is released by that sink at
// once and by the other when it delivers; a shaped view is charged.
func TestBudgetReleasedSkippedByShaping(t *testing.T) {
	b := memory.NewBudget(1<<30, nil, nil)
	status, all := &fakeSink{name: "status"}, &fakeSink{name: "all"}
	onlyStatus := shapeOf(t, event.ShapeSpec{Fields: []event.Field{{Path: "fullDocument.status", Include: true}}, SkipEmptyUpdates: true})
	var viewCharged atomic.Bool
	status.setFail(func(e *event.Event) error {
		if e.Mem.Bytes() > int64(len(e.Unshaped().Raw)) {
			viewCharged.Store(true)
		}
		return nil
	})
	e, _ := shapedEngine(t,
		[]RuleSpec{{Name: "r", Source: "users", Sinks: []string{"status", "all"}}},
		[]SinkSpec{{Sink: status, Retry: fastRetry(1), MaxInFlight: 4}, {Sink: all, Retry: fastRetry(1), MaxInFlight: 4}},
		[]*event.Shape{onlyStatus, nil})
	const n = 100
	var acked atomic.Int64
	for i := 0; i < n; i++ {
		upd := bson.D{{Key: "note", Value: i}}
		if i%4 == 0 {
			upd = append(upd, bson.E{Key: "status", Value: "x"})
		}
		admit(t, b, e, userEvent(t, i, "a@b.c", upd), func() { acked.Add(1) })
	}
	waitUntil(t, "acks", func() bool { return acked.Load() == n })
	waitBudgetEmpty(t, b, "skipped by shaping")
	if !viewCharged.Load() {
		t.Fatal("the shaped view was not charged to its event")
	}
}

// bigEvent is posEvent with a fullDocument padded to size bytes.
func bigEvent(t *testing.T, seq, doc, size int) *event.Event {
	t.Helper()
	ct := bson.Timestamp{T: ctBase, I: uint32(seq)}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X2B0229296E04", ct.T, ct.I)}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ct},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: doc}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: doc}, {Key: "seq", Value: seq}, {Key: "pad", Value: strings.Repeat("x", size)}}},
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

// Parking returns the bytes of what it parked while the sink is still
// down; the re-drive then reads parked entries only as the budget admits
// them (each reserves deadletter.MaxEntryBytes before it is read, then
// counts what it holds), and returns every byte.
func TestBudgetParkedAndRedrive(t *testing.T) {
	// The re-drives' share is one whole-entry reservation (the budget's
	// 25% is less): once an entry is read, the next reservation does not
	// fit beside it, so one entry at a time, two at most while one
	// finishes. (The entries are small: what is reserved before a read is
	// a whole entry whatever its size.)
	const size = 256 << 10
	b := memory.NewBudget(4*deadletter.MaxEntryBytes, nil, nil)
	dl := newMemDL()
	s := &fakeSink{name: "sick"}
	var down atomic.Bool
	down.Store(true)
	var inSend, maxInSend atomic.Int64
	s.setFail(func(e *event.Event) error {
		if down.Load() {
			return sinks.Retryable("http_503", 0, errors.New("503"))
		}
		cur := inSend.Add(1)
		defer inSend.Add(-1)
		for {
			m := maxInSend.Load()
			if cur <= m || maxInSend.CompareAndSwap(m, cur) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond) // let the re-drive's keys overlap
		return nil
	})
	eng, err := NewEngine(mustRules(t, "sick"), []SinkSpec{{
		Sink: s, Retry: sinks.RetryPolicy{MaxAttempts: 1000, InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, Multiplier: 2},
		MaxInFlight: 8, ParkAfter: 50 * time.Millisecond,
	}}, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.SetBudget(b)
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })
	const n = 10
	var acked atomic.Int64
	var charges []*memory.Charge
	for i := 0; i < n; i++ {
		charges = append(charges, admit(t, b, eng, bigEvent(t, i, i%8, size), func() { acked.Add(1) }))
	}
	waitUntil(t, "events parked and acked while the sink is down", func() bool { return acked.Load() == n })
	waitUntil(t, "the parked events' bytes returned", func() bool {
		for _, c := range charges {
			if c.Bytes() != 0 {
				return false
			}
		}
		return true
	})
	down.Store(false)
	waitUntil(t, "re-drive delivers everything", func() bool { return len(s.received()) >= n })
	waitUntil(t, "lane live again", func() bool { return !eng.Lane("sick").Status().Parked })
	checkPerDocOrder(t, s.received())
	waitBudgetEmpty(t, b, "re-driven")
	if m := maxInSend.Load(); m > 2 {
		t.Fatalf("the re-drive delivered %d entries at once in a share of one whole entry", m)
	}
	if m := maxInSend.Load(); m < 1 {
		t.Fatal("nothing re-driven")
	}
}

// Events of a lost tenure are dropped, unacknowledged, and their bytes
// returned; so are events still queued when the engine stops.
func TestBudgetReleasedLostTenureAndShutdown(t *testing.T) {
	b := memory.NewBudget(1<<30, nil, nil)
	block := make(chan struct{})
	entered := make(chan struct{}, 100)
	s := &fakeSink{name: "s"}
	s.setFail(func(e *event.Event) error {
		entered <- struct{}{}
		<-block
		return nil
	})
	eng, err := NewEngine(mustRules(t, "s"), []SinkSpec{{Sink: s, Retry: fastRetry(1), MaxInFlight: 1, Ordering: OrderStrict}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	ten := event.NewTenure("orders", 1, time.Time{})
	eng.SetOwnedTenures([]*event.Tenure{ten})
	var acked atomic.Int64
	for i := 0; i < 10; i++ {
		ev := posEvent(t, i, i)
		ev.Tenure = ten
		admit(t, b, eng, ev, func() { acked.Add(1) })
	}
	<-entered // the first is on the wire
	ten.End()
	close(block)
	waitUntil(t, "lane idle", func() bool { return eng.Lane("s").q.empty() })
	waitBudgetEmpty(t, b, "lost tenure")
	if acked.Load() != 1 {
		t.Fatalf("acked %d, want 1: the events of a lost tenure are dropped unacknowledged", acked.Load())
	}

	// Shutdown with events queued behind one that never finishes.
	block2 := make(chan struct{})
	s.setFail(func(e *event.Event) error {
		select {
		case <-block2:
		case <-ctx.Done():
		}
		return nil
	})
	ten2 := event.NewTenure("orders", 2, time.Time{})
	eng.SetOwnedTenures([]*event.Tenure{ten2})
	for i := 10; i < 20; i++ {
		ev := posEvent(t, i, i)
		ev.Tenure = ten2
		admit(t, b, eng, ev, func() { acked.Add(1) })
	}
	if b.InUse() == 0 {
		t.Fatal("queued events not counted")
	}
	cancel()
	eng.Stop()
	waitBudgetEmpty(t, b, "shutdown")
}

// A re-drive retrying entries of a sink that is still down holds at most
// the re-drives' share of the budget (RedriveSharePercent), so the live
// stream keeps the rest: here one whole-entry reservation, so one entry
// at a time, and room for a live event meanwhile.
func TestBudgetRedriveShare(t *testing.T) {
	const size = 256 << 10
	b := memory.NewBudget(4*deadletter.MaxEntryBytes, nil, nil) // share: one reservation
	dl := newMemDL()
	for i := 0; i < 12; i++ {
		e, err := deadletter.EntryFor(bigEvent(t, i, i, size), "sick", deadletter.KindParked)
		if err != nil {
			t.Fatal(err)
		}
		if err := dl.Put(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	s := &fakeSink{name: "sick"}
	var inSend, maxInSend, attempts atomic.Int64
	var down atomic.Bool
	down.Store(true)
	s.setFail(func(e *event.Event) error {
		cur := inSend.Add(1)
		defer inSend.Add(-1)
		for {
			m := maxInSend.Load()
			if cur <= m || maxInSend.CompareAndSwap(m, cur) {
				break
			}
		}
		attempts.Add(1)
		time.Sleep(2 * time.Millisecond)
		if down.Load() {
			return sinks.Retryable("http_503", 0, errors.New("503"))
		}
		return nil
	})
	eng, err := NewEngine(mustRules(t, "sick"), []SinkSpec{{
		Sink: s, Retry: sinks.RetryPolicy{MaxAttempts: 1000, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, Multiplier: 2},
		MaxInFlight: 8, ParkAfter: time.Hour,
	}}, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.SetBudget(b)
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })
	waitUntil(t, "the re-drive retrying", func() bool { return attempts.Load() > 20 })
	if m := maxInSend.Load(); m > 1 {
		t.Fatalf("%d parked entries re-driven at once against a sink that is down, in a share of one entry", m)
	}
	live, ok := b.TryAcquire(deadletter.MaxEntryBytes)
	if !ok {
		t.Fatalf("no room for a live event while the re-drive retries: %d of %d bytes held", b.InUse(), b.Limit())
	}
	live.Release()
	down.Store(false)
	waitUntil(t, "everything re-driven", func() bool { return len(s.received()) == 12 })
	checkPerDocOrder(t, s.received())
	waitBudgetEmpty(t, b, "re-driven")
}

// A batching lane whose sink accepts part of each batch and fails the rest
// (retryable, once per event): every event is acked exactly once, the
// changes of each document reach the sink in order, and the budget is
// empty at the end. The accepted part of a batch is released by the pass
// that acks it (Lane.delivered), the rest after its retry: a release
// missed or made twice (Charge.Release panics then) fails the test.
func TestBudgetReleasedPartialBatches(t *testing.T) {
	b := memory.NewBudget(1<<30, nil, nil)
	s := &fakeSink{name: "batch", max: 10}
	var failedOnce sync.Map
	s.setFail(func(e *event.Event) error {
		if e.Seq%3 == 0 {
			if _, again := failedOnce.LoadOrStore(e.Seq, true); !again {
				return sinks.Retryable("http_503", 0, errors.New("503"))
			}
		}
		return nil
	})
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 4, BatchSize: 10})
	const n, docs = 300, 13
	var mu sync.Mutex
	acks := map[uint64]int{}
	for i := 0; i < n; i++ {
		ev := posEvent(t, i, i%docs)
		seq := ev.Seq
		admit(t, b, eng, ev, func() {
			mu.Lock()
			acks[seq]++
			mu.Unlock()
		})
	}
	waitUntil(t, "acks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acks) == n
	})
	waitBudgetEmpty(t, b, "partial batches")
	mu.Lock()
	for seq, c := range acks {
		if c != 1 {
			t.Errorf("event %d acked %d times", seq, c)
		}
	}
	mu.Unlock()
	last := map[string]uint64{}
	for _, e := range s.received() {
		k := e.OrderingKey()
		if prev, ok := last[k]; ok && e.Seq < prev {
			t.Fatalf("document %q: change %d after %d", k, e.Seq, prev)
		}
		last[k] = e.Seq
	}
}

// A parked transaction larger than the re-drives' share of the budget is
// re-driven in parts (issue 39), each delivered before the next entry is
// read: in order, numbered on (TxnPart), the last marked, every event
// once, and the budget never holds the whole transaction; the entries are
// deleted once the last part is delivered. Before, its later entries were
// charged without waiting and the group held all of them (24 MiB here,
// against a 16 MiB share).
func TestBudgetRedriveTxnInParts(t *testing.T) {
	const size, n = 2 << 20, 12
	b := memory.NewBudget(4*deadletter.MaxEntryBytes, nil, nil) // share: one reservation
	dl := newMemDL()
	for i := range n {
		ev := bigEvent(t, i+1, i, size)
		ev.Txn = &event.Txn{ID: "tx", Index: i, Last: i == n-1, Unit: "orders"}
		e, err := deadletter.EntryFor(ev, "grouped", deadletter.KindParked)
		if err != nil {
			t.Fatal(err)
		}
		if err := dl.Put(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	var peak atomic.Int64
	s := &callSink{name: "grouped", max: 1}
	s.hold = func(batch []*event.Event, group bool) error {
		peak.Store(max(peak.Load(), b.InUse()))
		return nil
	}
	eng, err := NewEngine(mustRules(t, "grouped"), []SinkSpec{{
		Sink: s, Retry: fastRetry(5), MaxInFlight: 8, ParkAfter: time.Hour, Group: true,
	}}, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.SetBudget(b)
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })
	waitUntil(t, "every entry re-driven and deleted", func() bool {
		es, _ := dl.List(context.Background(), deadletter.Filter{})
		return len(es) == 0
	})
	calls := s.delivered()
	idx := 0
	for k, c := range calls {
		if !c.group || c.part == nil || c.part.First != k+1 || c.part.Final != (k == len(calls)-1) {
			t.Fatalf("send %d: group %v part %+v", k+1, c.group, c.part)
		}
		for _, ev := range c.evs {
			if ev.Txn.Index != idx {
				t.Fatalf("send %d holds event %d, want %d", k+1, ev.Txn.Index, idx)
			}
			idx++
		}
	}
	if idx != n || len(calls) < 2 {
		t.Fatalf("%d events in %d sends, want %d in parts", idx, len(calls), n)
	}
	if share := b.Limit() * RedriveSharePercent / 100; peak.Load() > share {
		t.Fatalf("the budget held %d bytes during a send, more than the re-drives' share (%d)", peak.Load(), share)
	}
	waitBudgetEmpty(t, b, "re-drive")
}
