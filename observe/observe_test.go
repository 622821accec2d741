package observe

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// calls records the calls an observer gets, in a log shared by several.
type calls struct {
	name string
	log  *[]string
}

type ctxKey string

func (c calls) Dispatched(Dispatch) { *c.log = append(*c.log, c.name+" dispatched") }
func (c calls) AttemptStart(ctx context.Context, _ Attempt) context.Context {
	*c.log = append(*c.log, c.name+" start")
	return context.WithValue(ctx, ctxKey(c.name), true)
}
func (c calls) AttemptEnd(ctx context.Context, _ Attempt) {
	// The context is the last AttemptStart's: every observer's value.
	n := 0
	for _, k := range []string{"a", "b", "h"} {
		if ctx.Value(ctxKey(k)) != nil {
			n++
		}
	}
	*c.log = append(*c.log, c.name+" end "+string(rune('0'+n)))
}
func (c calls) Outcome(o Outcome) { *c.log = append(*c.log, c.name+" "+string(o.Kind)) }

type hooked struct{ calls }

func (h hooked) BeforeDispatch(*event.Event) { *h.log = append(*h.log, h.name+" before") }
func (h hooked) AfterDispatch(*event.Event)  { *h.log = append(*h.log, h.name+" after") }

// Fanout calls each observer in turn, passes the context along, leaves
// nil ones out, flattens nested fan-outs, and has Hooks only when one of
// its observers has them.
func TestFanout(t *testing.T) {
	if Fanout() != nil || Fanout(nil, nil) != nil {
		t.Fatal("a fan-out of nothing is not nil")
	}
	var log []string
	a := calls{"a", &log}
	if o := Fanout(nil, a); o != Observer(a) {
		t.Fatalf("a fan-out of one observer is %T, want it", o)
	}
	plain := Fanout(a, calls{"b", &log})
	if _, ok := plain.(Hooks); ok {
		t.Error("a fan-out without hooked observers has Hooks: the router would call them for nothing")
	}
	o := Fanout(plain, nil, hooked{calls{"h", &log}})
	h, ok := o.(Hooks)
	if !ok {
		t.Fatal("a fan-out with a hooked observer has no Hooks")
	}
	ev := &event.Event{ID: "x"}
	h.BeforeDispatch(ev)
	o.Dispatched(Dispatch{Event: ev})
	h.AfterDispatch(ev)
	ctx := o.AttemptStart(context.Background(), Attempt{})
	o.AttemptEnd(ctx, Attempt{})
	o.Outcome(Outcome{Kind: Delivered, Event: ev})
	want := []string{"h before", "a dispatched", "b dispatched", "h dispatched", "h after",
		"a start", "b start", "h start", "a end 3", "b end 3", "h end 3", "a delivered", "b delivered", "h delivered"}
	if !slices.Equal(log, want) {
		t.Errorf("calls:\n got %q\nwant %q", log, want)
	}
}

type testState struct {
	Slot
	v  string
	id TraceID
}

func (s *testState) Trace() (TraceID, bool) { return s.id, true }

// Each key finds its own state on an event (and on its shaped views,
// which share it), setting one allocates nothing, and TraceOf finds the
// state that traces.
func TestKeys(t *testing.T) {
	k1, k2 := NewKey("one"), NewKey("two")
	ev := &event.Event{ID: "x"}
	if k1.Get(ev) != nil {
		t.Fatal("state on a new event")
	}
	if _, _, ok := TraceOf(ev); ok {
		t.Fatal("a new event is traced")
	}
	s1 := &testState{v: "one", id: TraceID{1, 2}}
	s2 := &plainState{v: "two"}
	if n := testing.AllocsPerRun(10, func() { ev.Observed = nil; k1.Set(ev, s1); k2.Set(ev, s2) }); n != 0 {
		t.Errorf("Set: %v allocations, want 0", n)
	}
	if got := k1.Get(ev); got != State(s1) {
		t.Errorf("key one: %v", got)
	}
	if got := k2.Get(ev); got != State(s2) {
		t.Errorf("key two: %v", got)
	}
	if NewKey("three").Get(ev) != nil {
		t.Error("a third key finds a state")
	}
	id, sampled, ok := TraceOf(ev)
	if !ok || !sampled || id != s1.id || id.String() != "01020000000000000000000000000000" {
		t.Errorf("TraceOf = %v %v %v", id, sampled, ok)
	}
}

type plainState struct {
	Slot
	v string
}

// An attempt's failure per event: a batch's failed entry has its own, an
// accepted one none; a request that failed whole gives every event its
// failure.
func TestEntryFailure(t *testing.T) {
	refused := sinks.Permanent("http_400", errors.New("HTTP 400"))
	refused.Status, refused.Answer = 400, "no"
	a := Attempt{Err: &sinks.BatchError{Failed: map[int]error{1: refused}}, Failure: Failure{Reason: "partial", Entries: 1}}
	if _, ok := a.EntryFailure(0); ok {
		t.Error("an accepted entry has a failure")
	}
	if f, ok := a.EntryFailure(1); !ok || f.Reason != "http_400" || !f.Permanent || f.Status != 400 || f.Answer != "no" {
		t.Errorf("entry 1: %+v %v", f, ok)
	}
	whole := Attempt{Err: refused, Failure: ErrorFailure(refused)}
	if f, ok := whole.EntryFailure(3); !ok || f != whole.Failure {
		t.Errorf("whole request: %+v %v", f, ok)
	}
	if _, ok := (Attempt{}).EntryFailure(0); ok {
		t.Error("a success has a failure")
	}
}
