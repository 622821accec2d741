package source

import (
	"testing"

	"github.com/changegate/changegate/event"
)

// hookedDispatcher records, for each of its calls, whether the Source's
// dispatch lock was held.
type hookedDispatcher struct {
	s     *Source
	calls []string
}

func (d *hookedDispatcher) call(name string) {
	if d.s.order.mu.TryLock() {
		d.s.order.mu.Unlock()
		d.calls = append(d.calls, name+" unlocked")
		return
	}
	d.calls = append(d.calls, name+" locked")
}

func (d *hookedDispatcher) BeginDispatch(*event.Event)        { d.call("begin") }
func (d *hookedDispatcher) EndDispatch(*event.Event)          { d.call("end") }
func (d *hookedDispatcher) Dispatch(_ *event.Event, _ func()) { d.call("dispatch") }

// A Dispatcher with dispatch hooks (the router's tracing) gets them
// around every dispatch, outside the dispatch lock, Dispatch itself
// inside; for a backfill's DispatchIfUnchanged too, whether it sends or
// not.
func TestDispatchHooksOutsideLock(t *testing.T) {
	d := &hookedDispatcher{}
	s := &Source{out: d}
	d.s = s
	ev := &event.Event{DB: "shop", Coll: "orders", DocumentKey: []byte("k")}
	s.dispatch(ev, func() {})
	mark := s.DispatchMark()
	if !s.DispatchIfUnchanged(ev, mark, func() { s.out.Dispatch(ev, nil) }) {
		t.Fatal("unchanged document not sent")
	}
	if s.DispatchIfUnchanged(ev, mark-1, func() { t.Error("sent a changed document") }) {
		t.Fatal("changed document sent")
	}
	want := []string{"begin unlocked", "dispatch locked", "end unlocked", "begin unlocked", "dispatch locked", "end unlocked", "begin unlocked", "end unlocked"}
	if len(d.calls) != len(want) {
		t.Fatalf("calls %v, want %v", d.calls, want)
	}
	for i := range want {
		if d.calls[i] != want[i] {
			t.Errorf("calls %v, want %v", d.calls, want)
			break
		}
	}
}
