package kafka

import (
	"context"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// A traced Send gives each record its delivery's traceparent header;
// untraced, or with trace_context = false, none.
func TestRecordTraceparent(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, nil)
	var evs []*event.Event
	for i := range 3 {
		evs = append(evs, change(t, i, i, "insert", "orders", 10))
	}
	tr := sinktest.TracedSend(3, true)
	if err := k.Send(tr.Ctx, evs); err != nil {
		t.Fatal(err)
	}
	var later []*event.Event
	for i := 3; i < 5; i++ {
		later = append(later, change(t, i, i, "insert", "orders", 10))
	}
	if err := k.Send(context.Background(), later[:1]); err != nil {
		t.Fatal(err)
	}
	if err := k.Send(sinktest.TracedSend(1, false).Ctx, later[1:]); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i, e := range evs {
		want[e.ID] = tr.Entries[i]
	}
	for _, r := range consume(t, c, 5, topic) {
		id, _ := header(r, HeaderID)
		tp, ok := header(r, HeaderTraceparent)
		if w, traced := want[id]; traced {
			if tp == "" || tp != w {
				t.Errorf("record %s: traceparent %q, want %q", id, tp, w)
			}
		} else if ok {
			t.Errorf("untraced record %s has traceparent %q", id, tp)
		}
	}
}
