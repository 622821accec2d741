package sns

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// A traced Send gives each message its delivery's traceparent as a String
// message attribute (the test server refuses more than 10); untraced, or
// with trace_context = false, none.
func TestMessageTraceparent(t *testing.T) {
	srv := newServer(t, 0)
	s := newSink(t, srv, "changes", nil)
	evs := sinktest.Changes(t, 3, 10)
	tr := sinktest.TracedSend(3, true)
	for _, ctx := range []context.Context{tr.Ctx, context.Background(), sinktest.TracedSend(3, false).Ctx} {
		if err := s.Send(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	msgs := srv.Messages("changes")
	if len(msgs) != 9 {
		t.Fatalf("%d messages", len(msgs))
	}
	for i, m := range msgs {
		a, ok := m.Attributes["traceparent"]
		switch {
		case i < 3 && (a.DataType != "String" || a.StringValue != tr.Entries[i] || a.StringValue == ""):
			t.Errorf("message %d: traceparent %+v, want %q", i, a, tr.Entries[i])
		case i >= 3 && ok:
			t.Errorf("untraced message %d has a traceparent", i)
		}
	}
}
