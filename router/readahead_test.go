package router

import (
	"context"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
)

// Ready partitions are served oldest head first: a partition whose head
// waited since before another partition's is taken first, whatever the
// order in which they became ready (a FIFO of partitions served c after d).
func TestReadyPartitionsOldestFirst(t *testing.T) {
	q := newKeyQueue(OrderKey, 4, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
	items := map[string]*item{}
	push := func(name string, key uint64) {
		it := newItem(posEvent(t, len(items)+1, int(key)))
		it.key = key
		items[name] = it
		q.push(it)
	}
	push("a", 0)
	push("b", 1)
	push("c", 0) // behind a in partition 0
	ctx := t.Context()
	p := q.next(ctx)
	if batch, _ := q.take(ctx, p, 1, 0, nil); batch[0] != items["a"] {
		t.Fatal("a is not first")
	}
	push("d", 2) // ready before partition 0 is ready again
	q.done(p)
	for _, want := range []string{"b", "c", "d"} {
		p := q.next(ctx)
		batch, _ := q.take(ctx, p, 1, 0, nil)
		if len(batch) != 1 || batch[0] != items[want] {
			t.Fatalf("want %s next, got seq %d", want, batch[0].seq)
		}
		q.done(p)
	}
}

// A source waits (Engine.ReadAhead) once a lane it routes to holds
// readAheadRounds × max_in_flight × batch_size items from its oldest
// unfinished one on: an event the receiver holds lets that many through
// behind it, not max_in_flight_events, and the source reads on once it is
// delivered. Another source's reading is not held.
func TestReadAheadHeldBySlowEvent(t *testing.T) {
	release := make(chan struct{})
	sink := &fakeSink{name: "s", max: 1}
	sink.setFail(func(e *event.Event) error {
		if e.Raw.Lookup("fullDocument", "seq").Int32() == 0 {
			<-release
		}
		return nil
	})
	const inFlight = 2
	eng := newTestEngine(t, nil, SinkSpec{Sink: sink, Retry: fastRetry(3), MaxInFlight: inFlight})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	gate := eng.ReadAhead("orders")
	want := readAheadRounds * inFlight
	read := 0
	for ; read < 10*want; read++ {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := gate(ctx)
		cancel()
		if err != nil {
			break
		}
		eng.Dispatch(posEvent(t, read, read), func() {})
	}
	if read != want {
		t.Fatalf("the source read %d events while the first was held, want %d", read, want)
	}
	if err := eng.ReadAhead("other")(t.Context()); err != nil {
		t.Fatalf("a source routed to no lane waited: %v", err)
	}
	close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := gate(ctx); err != nil {
		t.Fatalf("the source still waits once the held event was delivered: %v", err)
	}
}

// A window stalls when its oldest unfinished item has held it for longer
// than the given time; an empty window never does, and finishing the
// oldest item starts the count again.
func TestWindowStalled(t *testing.T) {
	w := newWindow()
	if w.stalled(0) {
		t.Fatal("an empty window stalled")
	}
	w.add(0)
	w.add(1)
	if w.stalled(time.Hour) {
		t.Fatal("stalled at once")
	}
	time.Sleep(5 * time.Millisecond)
	if !w.stalled(time.Millisecond) {
		t.Fatal("not stalled after its oldest item held it 5 ms")
	}
	w.finish(0)
	if w.stalled(time.Hour) {
		t.Fatal("stalled right after the oldest item finished")
	}
	w.finish(1)
	if w.stalled(0) {
		t.Fatal("an emptied window stalled")
	}
}
