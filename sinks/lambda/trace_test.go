package lambda

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// A traced Invoke carries the attempt's X-Ray trace header
// (X-Amzn-Trace-Id); without tracing, or with trace_context = false, none.
func TestInvokeTraceHeader(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	s := newSink(t, srv, nil)
	evs := events(t, 1, 0)
	tr := sinktest.TracedSend(1, true)
	if tr.RequestXRay == "" {
		t.Fatal("no X-Ray header to expect")
	}
	for _, ctx := range []context.Context{tr.Ctx, context.Background(), sinktest.TracedSend(1, false).Ctx} {
		if err := s.Send(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	invs := srv.Invocations()
	if len(invs) != 3 {
		t.Fatalf("%d invocations", len(invs))
	}
	if invs[0].TraceHeader != tr.RequestXRay {
		t.Errorf("trace header %q, want %q", invs[0].TraceHeader, tr.RequestXRay)
	}
	for _, inv := range invs[1:] {
		if inv.TraceHeader != "" {
			t.Errorf("untraced invocation with trace header %q", inv.TraceHeader)
		}
	}
}
