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

// txnEvent is posEvent in collection coll, as an event of transaction id
// (index i, last when last).
func txnEvent(t testing.TB, seq, doc int, coll, id string, i int, last bool) *event.Event {
	t.Helper()
	ct := bson.Timestamp{T: ctBase, I: uint32(seq)}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X2B0229296E04", ct.T, ct.I)}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ct},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: coll}}},
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
	if id != "" {
		ev.Txn = &event.Txn{ID: id, Index: i, Last: last, Unit: "orders"}
	}
	return ev
}

// callSink records every Send: its events, whether it was marked as a
// transaction group, and when it started and ended (a global counter).
type callSink struct {
	name  string
	max   int
	clock atomic.Int64
	// hold, when set, is called at the start of each Send (to slow a
	// call down) and may fail it.
	hold func(batch []*event.Event, group bool) error

	mu    sync.Mutex
	calls []call
}

type call struct {
	evs        []*event.Event
	group      bool
	part       *sinks.TxnPart // a copy of the Send's TxnPart (nil: none)
	start, end int64
	err        error
}

func (s *callSink) Name() string  { return s.name }
func (s *callSink) MaxBatch() int { return s.max }
func (s *callSink) Close() error  { return nil }
func (s *callSink) Send(ctx context.Context, batch []*event.Event) error {
	c := call{evs: append([]*event.Event(nil), batch...), group: sinks.TxnGroup(ctx), start: s.clock.Add(1)}
	if tp := sinks.TxnPartOf(ctx); tp != nil {
		tp.Used = 1 // one request per part, as a webhook within its size limit
		cp := *tp
		c.part = &cp
	}
	var err error
	if s.hold != nil {
		err = s.hold(batch, c.group)
	}
	c.end, c.err = s.clock.Add(1), err
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return err
}

func (s *callSink) all() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]call(nil), s.calls...)
}

// delivered returns the successful calls.
func (s *callSink) delivered() []call {
	var out []call
	for _, c := range s.all() {
		if c.err == nil {
			out = append(out, c)
		}
	}
	return out
}

// A transaction's events go out in one Send marked as a group, in order,
// whatever batch_size says; the later changes of its documents are sent
// only after it was delivered, and the earlier ones before it, although
// they sit in other partitions (the group is slow, the later changes would
// overtake it without the barriers; the earlier change of doc 3 needs a
// retry, the group would overtake it without them).
func TestTxnGroupOneSendAndHoldBack(t *testing.T) {
	var failedOnce atomic.Bool
	s := &callSink{name: "s", max: 1}
	s.hold = func(batch []*event.Event, group bool) error {
		if group {
			time.Sleep(100 * time.Millisecond)
		}
		if !group && seqOf(batch[0]) == 2 && !failedOnce.Swap(true) {
			time.Sleep(50 * time.Millisecond)
			return sinks.Retryable("throttled", 0, errors.New("throttled"))
		}
		return nil
	}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 8, BatchSize: 1, Group: true})
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	seq := 0
	next := func() int { seq++; return seq }
	// Earlier single changes of docs 0..4.
	for d := range 5 {
		eng.Dispatch(txnEvent(t, next(), d, "orders", "", 0, false), ack)
	}
	// The transaction: docs 0..4 and doc 0 again.
	docs := []int{0, 1, 2, 3, 4, 0}
	for i, d := range docs {
		eng.Dispatch(txnEvent(t, next(), d, "orders", "tx1", i, i == len(docs)-1), ack)
	}
	// Later single changes of the same documents, and of others.
	for d := range 8 {
		eng.Dispatch(txnEvent(t, next(), d, "orders", "", 0, false), ack)
	}
	total := int64(seq)
	waitUntil(t, "all acked", func() bool { return acked.Load() == total })

	var grp *call
	for _, c := range s.delivered() {
		if c.group {
			if grp != nil {
				t.Fatalf("two group calls")
			}
			c := c
			grp = &c
		}
	}
	if grp == nil || len(grp.evs) != len(docs) {
		t.Fatalf("group call = %+v, want one with %d events", grp, len(docs))
	}
	for i, e := range grp.evs {
		if e.Txn == nil || e.Txn.Index != i || e.Txn.ID != "tx1" {
			t.Fatalf("group event %d: txn %+v", i, e.Txn)
		}
	}
	for _, c := range s.delivered() {
		if c.group {
			continue
		}
		e := c.evs[0]
		d := int(e.Raw.Lookup("documentKey", "_id").Int32())
		if d > 4 {
			continue
		}
		if sq := seqOf(e); sq <= 5 && c.end > grp.start {
			t.Errorf("earlier change seq %d of doc %d ended at %d, after the group started at %d", sq, d, c.end, grp.start)
		} else if sq > 11 && c.start < grp.end {
			t.Errorf("later change seq %d of doc %d started at %d, before the group ended at %d", sq, d, c.start, grp.end)
		}
	}
}

// The last event of a transaction need not be routed to the grouped sink:
// the group of what was routed there goes out when Dispatch sees it, and
// only the events routed to the sink are in it.
func TestTxnGroupLastNotRouted(t *testing.T) {
	s := &callSink{name: "s", max: 10}
	names := []string{"s"}
	rules, err := CompileRules([]RuleSpec{{Name: "orders", Source: "orders", Namespaces: []string{"shop.orders"}, Sinks: names}}, names)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := NewEngine(rules, []SinkSpec{{Sink: s, Retry: fastRetry(3), MaxInFlight: 2, BatchSize: 10, Group: true}}, newMemDL(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	eng.Dispatch(txnEvent(t, 1, 1, "orders", "tx", 0, false), ack)
	eng.Dispatch(txnEvent(t, 2, 2, "items", "tx", 1, false), ack)
	eng.Dispatch(txnEvent(t, 3, 3, "orders", "tx", 2, false), ack)
	eng.Dispatch(txnEvent(t, 4, 4, "items", "tx", 3, true), ack)
	waitUntil(t, "all acked", func() bool { return acked.Load() == 4 })
	calls := s.delivered()
	if len(calls) != 1 || !calls[0].group || len(calls[0].evs) != 2 || seqOf(calls[0].evs[0]) != 1 || seqOf(calls[0].evs[1]) != 3 {
		t.Fatalf("calls = %+v, want one group of seq 1 and 3", calls)
	}
}

// A group whose Send fails on one entry (retryable) is sent again whole, in
// order; one that fails for good is dead-lettered whole, every event acked.
func TestTxnGroupRetriedAndDeadLetteredWhole(t *testing.T) {
	t.Run("retry", func(t *testing.T) {
		var n atomic.Int32
		s := &callSink{name: "s", max: 1}
		s.hold = func(batch []*event.Event, group bool) error {
			if group && n.Add(1) == 1 {
				return &sinks.BatchError{Failed: map[int]error{1: sinks.Retryable("throttled", 0, errors.New("throttled"))}}
			}
			return nil
		}
		eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 4, BatchSize: 1, Group: true})
		var acked atomic.Int64
		for i := range 3 {
			eng.Dispatch(txnEvent(t, i+1, i, "orders", "tx", i, i == 2), func() { acked.Add(1) })
		}
		waitUntil(t, "all acked", func() bool { return acked.Load() == 3 })
		calls := s.all()
		if len(calls) != 2 {
			t.Fatalf("%d calls, want 2", len(calls))
		}
		for _, c := range calls {
			if !c.group || len(c.evs) != 3 {
				t.Fatalf("call %+v: want the whole group", c)
			}
		}
	})
	t.Run("deadletter", func(t *testing.T) {
		s := &callSink{name: "s", max: 1}
		s.hold = func(batch []*event.Event, group bool) error {
			return sinks.Permanent("http_400", errors.New("bad request"))
		}
		dl := newMemDL()
		eng := newTestEngine(t, dl, SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 4, BatchSize: 1, Group: true})
		var acked atomic.Int64
		for i := range 3 {
			eng.Dispatch(txnEvent(t, i+1, i, "orders", "tx", i, i == 2), func() { acked.Add(1) })
		}
		waitUntil(t, "all acked", func() bool { return acked.Load() == 3 })
		dl.mu.Lock()
		n := len(dl.entries)
		var txns []int
		for _, e := range dl.entries {
			if e.Txn != nil {
				txns = append(txns, e.Txn.Index)
			}
		}
		dl.mu.Unlock()
		if n != 3 || len(txns) != 3 {
			t.Fatalf("%d dead letters (%d with txn), want 3", n, len(txns))
		}
	})
}

// Many transactions over few documents and many partitions, interleaved
// with single changes: every group is one Send, and no document's change
// overtakes another (the barriers cannot deadlock).
func TestTxnGroupManyNoDeadlockPerDocOrder(t *testing.T) {
	s := &callSink{name: "s", max: 10}
	s.hold = func(batch []*event.Event, group bool) error {
		if len(batch)%3 == 0 {
			time.Sleep(time.Millisecond)
		}
		return nil
	}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 16, BatchSize: 10, Group: true})
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	seq := 0
	want := map[string]int{}
	for tx := range 200 {
		id := fmt.Sprint("tx", tx)
		size := 1 + tx%7
		for i := range size {
			seq++
			eng.Dispatch(txnEvent(t, seq, (tx*3+i*5)%23, "orders", id, i, i == size-1), ack)
		}
		want[id] = size
		seq++
		eng.Dispatch(txnEvent(t, seq, tx%23, "orders", "", 0, false), ack)
	}
	total := int64(seq)
	waitUntil(t, "all acked", func() bool { return acked.Load() == total })
	var evs []*event.Event
	for _, c := range s.delivered() {
		if c.group {
			id := c.evs[0].Txn.ID
			if len(c.evs) != want[id] {
				t.Fatalf("group %s has %d events, want %d", id, len(c.evs), want[id])
			}
			delete(want, id)
		}
		for _, e := range c.evs {
			if (e.Txn != nil) != c.group {
				t.Fatalf("event seq %d (txn %v) in a call with group=%v", seqOf(e), e.Txn, c.group)
			}
		}
	}
	if len(want) != 0 {
		t.Fatalf("%d transactions never sent as a group", len(want))
	}
	// Per-document order by the calls' start order.
	calls := s.delivered()
	last := map[int]int{}
	byStart := make([]call, len(calls))
	copy(byStart, calls)
	for i := 1; i < len(byStart); i++ {
		for j := i; j > 0 && byStart[j].start < byStart[j-1].start; j-- {
			byStart[j], byStart[j-1] = byStart[j-1], byStart[j]
		}
	}
	for _, c := range byStart {
		for _, e := range c.evs {
			evs = append(evs, e)
			d := int(e.Raw.Lookup("documentKey", "_id").Int32())
			if sq := seqOf(e); sq < last[d] {
				t.Fatalf("doc %d: seq %d sent after %d", d, sq, last[d])
			}
			last[d] = seqOf(e)
		}
	}
	if len(evs) != seq {
		t.Fatalf("%d events delivered, want %d", len(evs), seq)
	}
}

// A transaction whose events are routed to a grouped lane that a reload
// retires before its last event: what the old lane collected is queued
// (not held forever), so every event is acknowledged.
func TestTxnGroupRetireQueuesOpenGroup(t *testing.T) {
	s := &callSink{name: "s", max: 10}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(3), MaxInFlight: 2, BatchSize: 10, Group: true})
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	eng.Dispatch(txnEvent(t, 1, 1, "orders", "tx", 0, false), ack)
	eng.Dispatch(txnEvent(t, 2, 2, "orders", "tx", 1, false), ack)
	s2 := &callSink{name: "s", max: 10}
	rules, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: []string{"s"}}}, []string{"s"})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Reload(rules, []LaneUpdate{{Name: "s", Spec: SinkSpec{Sink: s2, Retry: fastRetry(3), MaxInFlight: 2, BatchSize: 10, Group: true}}}); err != nil {
		t.Fatal(err)
	}
	eng.Dispatch(txnEvent(t, 3, 3, "orders", "tx", 2, true), ack)
	waitUntil(t, "all acked", func() bool { return acked.Load() == 3 })
}

// A grouped sink that keeps failing parks its transactions; the re-drive
// delivers each transaction again as one group, with the single changes
// between them in their places.
//
// Gated (Engine.SetAcked, which the gateway always sets), the re-drive is in
// stream order across documents: an entry is re-driven only once its unit
// acknowledged every change up to it, so everything before it was parked
// before the listing. Ungated (tools, tests), the workers of the lane's
// partitions park their items concurrently and the first listing may come
// while an earlier change of another document is still being parked: its
// transaction or change is then re-driven on the next pass, after later
// changes of other documents. Per-document order and whole transactions
// hold either way.
func TestTxnGroupParkedRedrivenWhole(t *testing.T) {
	t.Run("gated", func(t *testing.T) { testTxnGroupParkedRedriven(t, true) })
	t.Run("ungated", func(t *testing.T) { testTxnGroupParkedRedriven(t, false) })
}

func testTxnGroupParkedRedriven(t *testing.T, gated bool) {
	dl := newMemDL()
	var down atomic.Bool
	down.Store(true)
	s := &callSink{name: "sick", max: 1}
	s.hold = func(batch []*event.Event, group bool) error {
		if down.Load() {
			return sinks.Retryable("http_503", 0, errors.New("503 unavailable"))
		}
		return nil
	}
	eng := newTestEngine(t, dl, SinkSpec{
		Sink: s, Retry: sinks.RetryPolicy{MaxAttempts: 1000, InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, Multiplier: 2},
		MaxInFlight: 4, ParkAfter: 100 * time.Millisecond, Group: true,
	})
	// Acknowledgements as the source's checkpoint tracker counts them:
	// the unit's position is the last change every earlier one of which
	// was acknowledged too.
	var acked atomic.Int64
	var ackMu sync.Mutex
	ackedSeqs := map[int]bool{}
	upTo := 0
	if gated {
		eng.SetAcked(func(string) (bson.Timestamp, bool) {
			ackMu.Lock()
			defer ackMu.Unlock()
			return bson.Timestamp{T: ctBase, I: uint32(upTo)}, true
		})
	}
	ackOf := func(seq int) func() {
		return func() {
			ackMu.Lock()
			ackedSeqs[seq] = true
			for ackedSeqs[upTo+1] {
				upTo++
			}
			ackMu.Unlock()
			acked.Add(1)
		}
	}
	seq := 0
	sizes := map[string]int{}
	for tx := range 30 {
		id := fmt.Sprint("tx", tx)
		size := 1 + tx%5
		sizes[id] = size
		for i := range size {
			seq++
			eng.Dispatch(txnEvent(t, seq, (tx+i)%7, "orders", id, i, i == size-1), ackOf(seq))
		}
		seq++
		eng.Dispatch(txnEvent(t, seq, tx%7, "orders", "", 0, false), ackOf(seq))
	}
	total := int64(seq)
	waitUntil(t, "everything parked and acked", func() bool { return acked.Load() == total })
	if !eng.Lane("sick").Status().Parked {
		t.Fatal("lane not parked")
	}
	down.Store(false)
	waitUntil(t, "lane live again", func() bool { return !eng.Lane("sick").Status().Parked })
	last := 0
	lastOf := map[int]int{} // by document
	seen := map[int]bool{}
	for _, c := range s.delivered() {
		if c.group {
			id := c.evs[0].Txn.ID
			if len(c.evs) != sizes[id] {
				t.Fatalf("group %s re-driven with %d events, want %d", id, len(c.evs), sizes[id])
			}
		} else if c.evs[0].Txn != nil {
			t.Fatalf("event of %s re-driven alone", c.evs[0].Txn.ID)
		}
		for i, e := range c.evs {
			if c.group && (e.Txn == nil || e.Txn.Index != i) {
				t.Fatalf("group element %d: txn %+v", i, e.Txn)
			}
			sq := seqOf(e)
			d := int(e.Raw.Lookup("documentKey", "_id").Int32())
			if sq <= lastOf[d] {
				t.Fatalf("doc %d: seq %d re-driven after %d", d, sq, lastOf[d])
			}
			if gated && sq <= last {
				t.Fatalf("seq %d re-driven after %d", sq, last)
			}
			last, lastOf[d] = sq, sq
			seen[sq] = true
		}
	}
	if len(seen) != seq {
		t.Fatalf("%d events re-driven, want %d", len(seen), seq)
	}
}

// In cluster mode, the events a grouped lane collected for a transaction
// whose tenure ended (lease lost: its last event never comes here) return
// their bytes when the tenure ends, not when the lane's next transaction
// starts, which may never come on this replica; they are never sent.
func TestTxnGroupAbandonedOnTenureEnd(t *testing.T) {
	b := memory.NewBudget(1<<30, nil, nil)
	s := &callSink{name: "s", max: 10}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(3), MaxInFlight: 4, BatchSize: 10, Group: true})
	ten := event.NewTenure("orders", 1, time.Now().Add(time.Hour))
	for i := range 3 {
		ev := txnEvent(t, i+1, i+1, "orders", "tx", i, false)
		ev.Tenure = ten
		admit(t, b, eng, ev, func() { t.Error("an event of an abandoned transaction was acknowledged") })
	}
	if b.InUse() == 0 {
		t.Fatal("the collected events hold no bytes")
	}
	ten.End()
	waitBudgetEmpty(t, b, "abandoned transaction")
	if n := len(s.all()); n != 0 {
		t.Fatalf("%d sends of an abandoned transaction", n)
	}
}

// A transaction sent in parts (Engine.FlushTxn, issue 39) reaches the sink
// as one Send per part, in order although the first part is slow and the
// parts' documents sit in other partitions, numbered on (TxnPart.First
// from 1, Final on the last only), with every event once; the later changes
// of its documents — also those only in an earlier part — are sent only
// after the last part; each flush keeps the lane's newest event, so the
// last part is not empty.
func TestTxnPartsInOrderAndHoldBack(t *testing.T) {
	s := &callSink{name: "s", max: 1}
	s.hold = func(batch []*event.Event, group bool) error {
		if group && batch[0].Txn.Index == 0 {
			time.Sleep(150 * time.Millisecond) // the first part is slow
		}
		return nil
	}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 8, BatchSize: 1, Group: true})
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	seq := 0
	next := func() int { seq++; return seq }
	const n = 10
	for i := range n {
		eng.Dispatch(txnEvent(t, next(), i, "orders", "tx1", i, i == n-1), ack)
		if i%3 == 2 && i < n-1 {
			kb, kept := eng.FlushTxn("orders", "tx1")
			if kept != 1 || kb < 0 {
				t.Fatalf("flush after event %d kept %d events (%d bytes), want 1", i, kept, kb)
			}
		}
	}
	for d := range n {
		eng.Dispatch(txnEvent(t, next(), d, "orders", "", 0, false), ack)
	}
	total := int64(seq)
	waitUntil(t, "all acked", func() bool { return acked.Load() == total })

	var parts []call
	var lastEnd int64
	for _, c := range s.delivered() {
		if c.group {
			parts = append(parts, c)
			lastEnd = max(lastEnd, c.end)
		}
	}
	idx := 0
	for k, c := range parts {
		if c.part == nil || c.part.First != k+1 || c.part.Final != (k == len(parts)-1) {
			t.Fatalf("part %d: TxnPart %+v", k+1, c.part)
		}
		for _, ev := range c.evs {
			if ev.Txn.Index != idx {
				t.Fatalf("part %d holds event %d, want %d (parts reordered or an event lost)", k+1, ev.Txn.Index, idx)
			}
			idx++
		}
	}
	if idx != n || len(parts) != 4 {
		t.Fatalf("%d events in %d parts, want %d in 4", idx, len(parts), n)
	}
	for _, c := range s.delivered() {
		if !c.group && c.start < lastEnd {
			t.Fatalf("the later change of doc %v was sent before the transaction's last part was delivered", c.evs[0].DocumentKey)
		}
	}
}

// A part of a transaction sent in parts as it is read (FlushTxn) that the
// receiver refuses for good dead-letters the transaction from that part on:
// the parts queued after it are dead-lettered with its reason, never sent,
// and the sink is neither retried nor parked (issue 39, item 3, for the
// parts streamed after the refusal).
func TestTxnStreamedPartRefusedDeadLettersLaterParts(t *testing.T) {
	s := &callSink{name: "s", max: 1}
	s.hold = func(batch []*event.Event, group bool) error {
		if group && batch[0].Txn.Index == 2 { // the second part (a flush keeps the newest event for the next part: parts 0-1, 2-4, 5-7, 8-9)
			return sinks.Permanent("http_400", errors.New("400 refused: no such account"))
		}
		return nil
	}
	dl := newMemDL()
	eng := newTestEngine(t, dl, SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 8, BatchSize: 1, Group: true, ParkAfter: time.Hour})
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	seq := 0
	next := func() int { seq++; return seq }
	const n = 10
	for i := range n {
		eng.Dispatch(txnEvent(t, next(), i, "orders", "tx1", i, i == n-1), ack)
		if i%3 == 2 && i < n-1 {
			eng.FlushTxn("orders", "tx1")
		}
	}
	for d := range 3 {
		eng.Dispatch(txnEvent(t, next(), 100+d, "orders", "", 0, false), ack)
	}
	total := int64(seq)
	waitUntil(t, "all acked", func() bool { return acked.Load() == total })

	sent := map[int]bool{}
	singles := 0
	for _, c := range s.delivered() {
		if !c.group {
			singles++
			continue
		}
		for _, ev := range c.evs {
			sent[ev.Txn.Index] = true
		}
	}
	for i := range 2 {
		if !sent[i] {
			t.Errorf("event %d of the first part was not sent", i)
		}
	}
	for i := 5; i < n; i++ {
		if sent[i] {
			t.Errorf("event %d, of a part after the refused one, was sent", i)
		}
	}
	if singles != 3 {
		t.Errorf("%d later changes delivered, want 3", singles)
	}
	es, _ := dl.List(context.Background(), deadletter.Filter{})
	dead := map[int]bool{}
	for _, e := range es {
		if e.Kind != deadletter.KindFailed || e.Reason != "http_400" || !strings.Contains(e.LastError, "no such account") {
			t.Errorf("dead letter %s: kind %s, reason %q, last error %q; want failed, http_400 with the receiver's answer", e.ID, e.Kind, e.Reason, e.LastError)
		}
		ev, err := e.Event()
		if err != nil {
			t.Fatal(err)
		}
		dead[ev.Txn.Index] = true
	}
	for i := 2; i < n; i++ {
		if !dead[i] {
			t.Errorf("event %d of the refused part or a later one is not dead-lettered", i)
		}
	}
	if len(dead) != n-2 {
		t.Errorf("%d dead letters, want %d", len(dead), n-2)
	}
	if eng.Lane("s").Status().Parked {
		t.Error("the sink parked")
	}
}
