package router

import (
	"context"
	"slices"
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
