package router

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// In cluster mode a replica re-drives only the parked entries of the units
// it owns, parks its lane when it takes over a unit that another replica
// left parked entries for (so the unit's new changes wait behind them), and
// drops the queued events of a unit whose lease it lost (unacked: the next
// owner re-reads them).
func TestUnitsOwnershipAndTenure(t *testing.T) {
	dl := realStore(t)
	s := &scriptSink{clk: newFakeClock()}
	// Parked by another replica for units a and b.
	for i, unit := range []string{"orders#0/2", "orders#1/2"} {
		ev := posEvent(t, i+1, 10+i)
		e, err := deadletter.EntryFor(ev, "parking", deadletter.KindParked)
		if err != nil {
			t.Fatal(err)
		}
		e.Unit = unit
		if err := dl.Put(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	eng, err := NewEngine(mustRules(t, "parking"), []SinkSpec{{Sink: s, MaxInFlight: 2}}, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.Lanes()[0].clk, eng.Lanes()[0].d.clk, eng.Lanes()[0].q.clk = s.clk, s.clk, s.clk
	eng.SetOwnedUnits([]string{}) // owns nothing yet
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })
	l := eng.Lane("parking")
	if l.Status().Parked {
		t.Fatal("a lane that owns no unit must not start parked for other units' entries")
	}

	// Take over unit #0: its parked entry is re-driven before its new change.
	ten := event.NewTenure("orders#0/2", 1, time.Time{})
	eng.SetOwnedTenures([]*event.Tenure{ten})
	if err := eng.PrepareUnit(ctx, "orders#0/2"); err != nil {
		t.Fatal(err)
	}
	if !l.Status().Parked {
		t.Fatal("taking over a unit with parked entries must park the lane")
	}
	ev := posEvent(t, 3, 10)
	ev.Tenure = ten
	var acked atomic.Int64
	eng.Dispatch(ev, func() { acked.Add(1) })
	waitUntil(t, "lane live again", func() bool {
		if s.clk.hasTimer(s.clk.Now().Add(20 * time.Millisecond)) {
			s.clk.Advance(20 * time.Millisecond)
		}
		return !l.Status().Parked && acked.Load() == 1
	})
	if got := s.delivered(); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("delivered %v, want [1 3]: unit #1's entry is another replica's", got)
	}
	left, _ := dl.List(ctx, deadletter.Filter{Kind: deadletter.KindParked})
	if len(left) != 1 || left[0].Unit != "orders#1/2" {
		t.Fatalf("parked left %+v, want unit #1's entry only", left)
	}

	// The lease of unit #0 is lost: what is still queued for it is dropped.
	block, entered := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-block:
		default:
			close(block)
		}
	})
	s.set(func(evs []*event.Event) error {
		if seqOf(evs[0]) == 4 {
			close(entered)
			<-block
		}
		return nil
	})
	e4, e5 := posEvent(t, 4, 10), posEvent(t, 5, 10)
	e4.Tenure, e5.Tenure = ten, ten
	eng.Dispatch(e4, func() { acked.Add(1) })
	eng.Dispatch(e5, func() { acked.Add(1) })
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("change 4 never reached the sink")
	}
	ten.End()
	close(block)
	waitUntil(t, "lane idle", func() bool { return l.q.empty() })
	if got := s.delivered(); !slices.Equal(got, []int{1, 3, 4}) {
		t.Fatalf("delivered %v, want [1 3 4]: change 5 of a lost tenure must be dropped", got)
	}
	if acked.Load() != 2 {
		// 4 was acked (delivered before the loss was noticed); 5 was not.
		t.Fatalf("acked %d, want 2", acked.Load())
	}
	// An ended tenure's unit is not owned any more, even before the lease
	// loop updates the set: its parked entries are left to the next owner.
	if eng.own.owns("orders#0/2") {
		t.Fatal("a unit whose tenure ended still counts as owned")
	}
}

func mustRules(t *testing.T, sinks ...string) *Rules {
	t.Helper()
	r, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: sinks}}, sinks)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A unit taken over while a reload hands a sink over to a new lane (the
// old one still draining, the new one not started: a subscription paused
// or resumed at that moment) parks the new lane too: its start then finds
// the entries, and the unit's parked entry is re-driven before the unit's
// new change. It used to panic (the unstarted lane had no live context to
// cancel), killing the replica in the middle of the takeover.
func TestPrepareUnitDuringAHandOver(t *testing.T) {
	dl := realStore(t)
	old := &scriptSink{clk: newFakeClock()}
	eng, err := NewEngine(mustRules(t, "parking"), []SinkSpec{{Sink: old, MaxInFlight: 1}}, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.SetOwnedUnits([]string{})
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() { cancel(); eng.Stop() })

	// The old lane is busy with change 1 while the reload replaces it.
	block, entered := make(chan struct{}), make(chan struct{})
	var unblock sync.Once
	t.Cleanup(func() { unblock.Do(func() { close(block) }) })
	old.set(func(evs []*event.Event) error {
		if seqOf(evs[0]) == 1 {
			close(entered)
			<-block
		}
		return nil
	})
	var acked atomic.Int64
	eng.Dispatch(posEvent(t, 1, 20), func() { acked.Add(1) })
	<-entered
	next := &scriptSink{clk: newFakeClock()}
	if err := eng.Reload(mustRules(t, "parking"), []LaneUpdate{{Name: "parking", Spec: SinkSpec{Sink: next, MaxInFlight: 1}}}); err != nil {
		t.Fatal(err)
	}

	// Another replica parked an entry of unit #0, which this one takes
	// over now, before the new lane started.
	e, err := deadletter.EntryFor(posEvent(t, 2, 10), "parking", deadletter.KindParked)
	if err != nil {
		t.Fatal(err)
	}
	e.Unit = "orders#0/2"
	if err := dl.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	ten := event.NewTenure("orders#0/2", 1, time.Time{})
	eng.SetOwnedTenures([]*event.Tenure{ten})
	if err := eng.PrepareUnit(ctx, "orders#0/2"); err != nil {
		t.Fatal(err)
	}
	ev := posEvent(t, 3, 10)
	ev.Tenure = ten
	eng.Dispatch(ev, func() { acked.Add(1) })
	unblock.Do(func() { close(block) })
	waitUntil(t, "both changes acknowledged and the entry re-driven", func() bool {
		left, _ := dl.List(ctx, deadletter.Filter{Kind: deadletter.KindParked})
		return acked.Load() == 2 && len(left) == 0
	})
	if got := next.delivered(); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("the new lane delivered %v, want [2 3]: the parked change first", got)
	}
}
