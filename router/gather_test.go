package router

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks/limit"
)

// A batching lane's batch takes from the next ready partitions when its
// own does not fill it: they become busy for the worker (at most one batch
// in flight per partition), a partition whose head is a transaction group
// or a barrier is left for a batch of its own, and the batch says whether a
// partition kept items (the lane had more than it took).
func TestTakeGathersFromReadyPartitions(t *testing.T) {
	q := newKeyQueue(OrderKey, 4, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
	q.gather = true
	push := func(key uint64, doc int) *item {
		it := newItem(posEvent(t, int(key)*100+doc+1, doc))
		it.key = key
		q.push(it)
		return it
	}
	// Partitions 0, 1 and 2 get two events each (documents 0..5), in the
	// ready order 0, 1, 2 (the order of their heads); partition 3 a
	// transaction group behind them.
	var want []*item
	for k := range uint64(3) {
		want = append(want, push(k, int(2*k)), push(k+4, int(2*k+1)))
	}
	g := &txnGroup{arrived: make(chan struct{})} // pushGroup closes it: no barriers
	git := newItem(posEvent(t, 999, 99))
	git.key = 3
	g.items = []*item{git}
	q.pushGroup(g)

	ctx := t.Context()
	p := q.next(ctx)
	if p != q.parts[0] {
		t.Fatal("first ready partition is not partition 0")
	}
	var extra []*partition
	batch, more := q.take(ctx, p, 5, 0, &extra)
	if !slices.Equal(batch, want[:5]) {
		t.Fatalf("batch of %d items, want the first 5 of partitions 0, 1 and 2 in ready order", len(batch))
	}
	if !more {
		t.Error("partition 2 kept an item, but more is false")
	}
	if !slices.Equal(extra, []*partition{q.parts[1], q.parts[2]}) {
		t.Fatalf("extra partitions %v, want partitions 1 and 2", extra)
	}
	for _, o := range extra {
		if o.state != partBusy {
			t.Error("a partition the batch took from is not busy")
		}
	}
	if len(q.ready) != 1 || q.ready[0].p != q.parts[3] {
		t.Fatal("the group's partition is not the only one left ready")
	}

	// Partitions are served oldest head first: what partition 2 kept was
	// handed to the lane before the group, and its batch, which it fills
	// alone, leaves the group for a batch of its own (and reports no more).
	q.done(p)
	for _, o := range extra {
		q.done(o)
	}
	p = q.next(ctx)
	if p != q.parts[2] {
		t.Fatal("partition 2, whose head is older than the group, is not next")
	}
	extra = extra[:0]
	batch, more = q.take(ctx, p, 5, 0, &extra)
	if !slices.Equal(batch, want[5:]) || more || len(extra) != 0 {
		t.Fatalf("batch: %d items, more %v, %d extra; want partition 2's last item", len(batch), more, len(extra))
	}
	q.done(p)
	later := push(2, 7) // newer than the group

	// The next batch of a busy worker takes the group alone, though it
	// does not fill the batch and partition 2 is ready.
	p = q.next(ctx)
	if p != q.parts[3] {
		t.Fatal("the group's partition is not next")
	}
	batch, more = q.take(ctx, p, 5, 0, &extra)
	if len(batch) != 1 || batch[0] != git || len(extra) != 0 || more {
		t.Fatalf("group batch: %d items, %d extra partitions, more %v; want the group alone", len(batch), len(extra), more)
	}
	q.done(p)
	p = q.next(ctx)
	batch, _ = q.take(ctx, p, 5, 0, &extra)
	if len(batch) != 1 || batch[0] != later {
		t.Fatalf("last batch: %d items; want the event queued after the group", len(batch))
	}
}

// Two events of one document never share a gathered batch, and without
// gather a batch takes from its own partition only.
func TestTakeGatherKeepsOneEventPerDocument(t *testing.T) {
	for _, gather := range []bool{true, false} {
		q := newKeyQueue(OrderKey, 2, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
		q.gather = gather
		for i, k := range []uint64{0, 1, 1, 0} { // each partition holds its document twice
			it := newItem(posEvent(t, i+1, int(k)))
			it.key = k
			q.push(it)
		}
		p := q.next(t.Context())
		var extra []*partition
		batch, more := q.take(t.Context(), p, 10, 0, &extra)
		want := 2 // document 0 once, document 1 once: each partition stops at its repeat
		if !gather {
			want = 1
		}
		if len(batch) != want || !more {
			t.Errorf("gather %v: batch of %d (more %v), want %d (more true)", gather, len(batch), more, want)
		}
	}
}

// A batching lane tells its limiter how full its requests are: against a
// receiver with a steady latency (which alone would leave the limit where
// it is), events that trickle in, a request or a few each, are not held
// back by the limit, and the limit comes down instead of keeping many
// requests of one event in flight.
func TestLaneSparseBatchesShrinkTheLimit(t *testing.T) {
	s := &slowSink{fakeSink: fakeSink{name: "s", max: 100}, latency: 5 * time.Millisecond}
	l, err := newLaneClock(SinkSpec{
		Sink: s, UseLimit: true, BatchSize: 100,
		Limit: limit.Config{Min: 1, Initial: 16, Max: 64, Cap: 10000},
	}, nil, metrics.New(nil), slog.New(slog.DiscardHandler), realClock{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l.start(ctx)
	defer l.stop()
	lim := l.d.limit.(adaptive).l
	var acked atomic.Int64
	seq := 0
	for lim.Current() > 2 {
		if seq == 2000 {
			t.Fatalf("limit %d after %d events sent one at a time, want it down to 2 or less", lim.Current(), seq)
		}
		seq++
		ev := posEvent(t, seq, seq)
		l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Add(1) })
		time.Sleep(time.Millisecond)
	}
	waitUntil(t, "all delivered", func() bool { return acked.Load() == int64(seq) })
	t.Logf("limit %d after %d events", lim.Current(), seq)
}

// slowSink is a fakeSink that takes latency per request.
type slowSink struct {
	fakeSink
	latency time.Duration
}

func (s *slowSink) Send(ctx context.Context, batch []*event.Event) error {
	time.Sleep(s.latency)
	return s.fakeSink.Send(ctx, batch)
}

// A gathering batch does not wait batch_wait for its own partition to fill
// when the ready partitions hold enough to fill it.
func TestTakeGatherSkipsTheWaitWhenTheLaneHoldsABatch(t *testing.T) {
	q := newKeyQueue(OrderKey, 4, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
	q.gather = true
	for i := range 12 { // 3 events in each of the 4 partitions
		it := newItem(posEvent(t, i+1, i))
		it.key = uint64(i)
		q.push(it)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	p := q.next(ctx)
	var extra []*partition
	start := time.Now()
	batch, _ := q.take(ctx, p, 10, time.Hour, &extra)
	if len(batch) != 10 {
		t.Fatalf("batch of %d after %s, want 10 at once", len(batch), time.Since(start).Round(time.Millisecond))
	}
	// With fewer ready than a batch, it waits (here until ctx ends).
	q2 := newKeyQueue(OrderKey, 4, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
	q2.gather = true
	for i := range 3 {
		it := newItem(posEvent(t, i+1, i))
		it.key = uint64(i)
		q2.push(it)
	}
	short, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel2()
	p = q2.next(short)
	if batch, _ := q2.take(short, p, 10, time.Hour, &extra); batch != nil {
		t.Fatalf("batch of %d without waiting, want the wait (nil when it is cut)", len(batch))
	}
}
