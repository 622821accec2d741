package eventbridge

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// A traced PutEvents gives each entry its delivery's X-Ray trace header
// (TraceHeader); untraced, or with trace_context = false, none.
func TestEntryTraceHeader(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, nil)
	evs := events(t, 3, 10)
	tr := sinktest.TracedSend(3, true)
	for _, ctx := range []context.Context{tr.Ctx, context.Background(), sinktest.TracedSend(3, false).Ctx} {
		if err := b.Send(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	calls := f.snapshot()
	if len(calls) != 3 {
		t.Fatalf("%d calls", len(calls))
	}
	for i, e := range calls[0] {
		if e.TraceHeader == "" || e.TraceHeader != tr.EntriesXRay[i] {
			t.Errorf("entry %d: trace header %q, want %q", i, e.TraceHeader, tr.EntriesXRay[i])
		}
	}
	if calls[0][0].TraceHeader == calls[0][1].TraceHeader {
		t.Error("two entries share a trace header")
	}
	for c := 1; c < 3; c++ {
		for i, e := range calls[c] {
			if e.TraceHeader != "" {
				t.Errorf("untraced call %d entry %d: trace header %q", c, i, e.TraceHeader)
			}
		}
	}
}
