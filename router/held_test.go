package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/deadletter"
)

// A held sink (a paused subscription) receives nothing: every event routed
// to it is parked and acked. Released by a reload, the new lane re-drives
// the parked events in stream order before anything newer, so nothing is
// lost or reordered across the pause.
func TestHeldSinkParksUntilReleased(t *testing.T) {
	log := &orderLog{}
	dl := newMemDL()
	eng := newTestEngine(t, dl, SinkSpec{Sink: &loggingSink{name: "s", log: log}, Retry: fastRetry(3), Held: true})
	rules := eng.Rules()
	if st := eng.Lane("s").Status(); !st.Held || !st.Parked {
		t.Fatalf("held lane status %+v", st)
	}

	acked := make(chan string, 16)
	doc := map[string]int{} // event id -> document
	var want []string
	for seq := 1; seq <= 6; seq++ {
		ev := posEvent(t, seq, seq%2) // two documents, interleaved
		want = append(want, ev.ID)
		doc[ev.ID] = seq % 2
		eng.Dispatch(ev, func() { acked <- ev.ID })
	}
	for range 6 {
		select {
		case <-acked:
		case <-time.After(10 * time.Second):
			t.Fatal("a held sink's events are not acked (parked)")
		}
	}
	if n, _ := dl.Count(context.Background(), deadletter.Filter{Kind: deadletter.KindParked, Sink: "s"}); n != 6 {
		t.Fatalf("parked entries = %d, want 6", n)
	}
	time.Sleep(100 * time.Millisecond) // a wrong re-drive would deliver meanwhile
	if got := log.list(); len(got) != 0 {
		t.Fatalf("a held sink received %v", got)
	}

	// Released: the parked events first, in order, then the new ones.
	if err := eng.Reload(rules, []LaneUpdate{{Name: "s", Spec: SinkSpec{Sink: &loggingSink{name: "s", log: log}, Retry: fastRetry(3)}}}); err != nil {
		t.Fatal(err)
	}
	ev := posEvent(t, 7, 1)
	want = append(want, ev.ID)
	doc[ev.ID] = 1
	eng.Dispatch(ev, func() { acked <- ev.ID })
	waitUntil(t, "everything delivered after the release", func() bool { return len(log.list()) >= 7 })
	select {
	case <-acked:
	case <-time.After(10 * time.Second):
		t.Fatal("the event after the release is not acked")
	}
	// Each document's events in stream order (documents go in parallel).
	got := log.list()
	for d := range 2 {
		var g, w []string
		for _, id := range got {
			if doc[id] == d {
				g = append(g, id)
			}
		}
		for _, id := range want {
			if doc[id] == d {
				w = append(w, id)
			}
		}
		if strings.Join(g, " ") != strings.Join(w, " ") {
			t.Errorf("document %d: delivered\n%v\nwant\n%v", d, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("delivered %d events, want %d", len(got), len(want))
	}
	if n, _ := dl.Count(context.Background(), deadletter.Filter{Kind: deadletter.KindParked, Sink: "s"}); n != 0 {
		t.Errorf("parked entries left = %d", n)
	}
	waitUntil(t, "lane live again", func() bool { return !eng.Lane("s").Status().Parked })

	if _, err := NewEngine(rules, []SinkSpec{{Sink: &loggingSink{name: "s", log: log}, Held: true}}, nil, nil, nil); err == nil {
		t.Error("a held sink without a dead-letter store was accepted")
	}
}
