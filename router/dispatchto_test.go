package router

import (
	"strings"
	"sync/atomic"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// DispatchTo hands an event to the named sink only (when a rule routes it
// there) and to every matching sink without a name; an event that goes
// nowhere is not acked (false). SinksOf names the sinks a source's rules
// route to.
func TestDispatchToOneSink(t *testing.T) {
	a, b := &fakeSink{name: "a"}, &fakeSink{name: "b"}
	e := newTestEngine(t, newMemDL(), SinkSpec{Sink: a, Retry: fastRetry(1), MaxInFlight: 2}, SinkSpec{Sink: b, Retry: fastRetry(1), MaxInFlight: 2})
	if got := e.SinksOf("orders"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("SinksOf = %v", got)
	}
	if got := e.SinksOf("other"); len(got) != 0 {
		t.Fatalf("SinksOf(other) = %v", got)
	}
	var acks [3]atomic.Int32
	if !e.DispatchTo("b", posEvent(t, 1, 1), func() { acks[0].Add(1) }) {
		t.Fatal("DispatchTo(b) routed nothing")
	}
	if !e.DispatchTo("", posEvent(t, 2, 2), func() { acks[1].Add(1) }) {
		t.Fatal("DispatchTo(all) routed nothing")
	}
	if e.DispatchTo("nope", posEvent(t, 3, 3), func() { acks[2].Add(1) }) {
		t.Fatal("DispatchTo(unknown sink) routed the event")
	}
	waitUntil(t, "the acks", func() bool { return acks[0].Load() == 1 && acks[1].Load() == 1 })
	if got := len(a.received()); got != 1 {
		t.Fatalf("sink a got %d events, want 1 (the all-sinks one)", got)
	}
	if got := len(b.received()); got != 2 {
		t.Fatalf("sink b got %d events, want 2", got)
	}
	for i, want := range []int32{1, 1, 0} {
		if n := acks[i].Load(); n != want {
			t.Fatalf("event %d acked %d times, want %d", i, n, want)
		}
	}
}

// A backfill's event is shaped for its sink as Dispatch shapes it: a
// redacted field never leaves unredacted, and the id is the event's.
func TestDispatchToShapes(t *testing.T) {
	plain, masked := &fakeSink{name: "plain"}, &fakeSink{name: "masked"}
	e, _ := shapedEngine(t,
		[]RuleSpec{{Name: "all", Source: "users", Sinks: []string{"plain", "masked"}}},
		[]SinkSpec{{Sink: plain, Retry: fastRetry(1)}, {Sink: masked, Retry: fastRetry(1)}},
		[]*event.Shape{nil, shapeOf(t, event.ShapeSpec{Redact: []string{"fullDocument.email"}})})
	var acks atomic.Int32
	ev := userEvent(t, 1, "ann@x.org", bson.D{{Key: "email", Value: "ann@x.org"}})
	if !e.DispatchTo("masked", ev, func() { acks.Add(1) }) {
		t.Fatal("not routed")
	}
	waitUntil(t, "the delivery", func() bool { return acks.Load() == 1 && len(masked.received()) == 1 })
	got := masked.received()[0]
	b, err := got.Envelope(false)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != ev.ID || strings.Contains(string(b), "ann@x.org") || !strings.Contains(string(b), "[REDACTED]") {
		t.Fatalf("masked sink got %s: %s", got.ID, b)
	}
	if len(plain.received()) != 0 {
		t.Fatal("the other sink got the event")
	}
}

// Dispatch marks an event Exclusive when it hands it to one sink only
// (that sink may encode it into its request without caching it), never
// when several sinks share it.
func TestDispatchExclusive(t *testing.T) {
	one := &fakeSink{name: "one"}
	e := newTestEngine(t, newMemDL(), SinkSpec{Sink: one, Retry: fastRetry(1), MaxInFlight: 2})
	var acks atomic.Int32
	e.Dispatch(posEvent(t, 1, 1), func() { acks.Add(1) })
	a, b := &fakeSink{name: "a"}, &fakeSink{name: "b"}
	e2 := newTestEngine(t, newMemDL(), SinkSpec{Sink: a, Retry: fastRetry(1), MaxInFlight: 2}, SinkSpec{Sink: b, Retry: fastRetry(1), MaxInFlight: 2})
	e2.Dispatch(posEvent(t, 2, 2), func() { acks.Add(1) })
	waitUntil(t, "the acks", func() bool { return acks.Load() == 2 })
	if got := one.received(); len(got) != 1 || !got[0].Exclusive {
		t.Fatalf("the one sink got %d events, want 1 marked Exclusive", len(got))
	}
	for _, s := range []*fakeSink{a, b} {
		if got := s.received(); len(got) != 1 || got[0].Exclusive {
			t.Fatalf("sink %s got %d events, want 1 not marked Exclusive", s.name, len(got))
		}
	}
}
