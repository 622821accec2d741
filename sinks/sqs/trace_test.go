package sqs

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// A traced Send gives each message its delivery's traceparent as a String
// message attribute; untraced, or with trace_context = false, none.
func TestMessageTraceparent(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, nil)
	evs := events(t, 3, 0)
	tr := sinktest.TracedSend(3, true)
	for _, ctx := range []context.Context{tr.Ctx, context.Background(), sinktest.TracedSend(3, false).Ctx} {
		if err := s.Send(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	// The call is recorded on the attempt's span as the AWS SDK
	// conventions name it.
	attrs := tr.Attempt()
	for k, want := range map[string]string{"rpc.system.name": "aws-api", "rpc.method": "SQS/SendMessageBatch", "http.response.status_code": "200"} {
		if attrs[k] != want {
			t.Errorf("attempt span %s = %q, want %q (%v)", k, attrs[k], want, attrs)
		}
	}
	calls := f.snapshot()
	if len(calls) != 3 {
		t.Fatalf("%d calls", len(calls))
	}
	for i, m := range calls[0].Entries {
		if a := m.MessageAttributes["traceparent"]; a.DataType != "String" || a.StringValue == "" || a.StringValue != tr.Entries[i] {
			t.Errorf("message %d: traceparent %+v, want %q", i, a, tr.Entries[i])
		}
		if len(m.MessageAttributes) > 10 {
			t.Errorf("message %d: %d attributes", i, len(m.MessageAttributes))
		}
	}
	for c := 1; c < 3; c++ {
		for i, m := range calls[c].Entries {
			if _, ok := m.MessageAttributes["traceparent"]; ok {
				t.Errorf("untraced call %d message %d has a traceparent", c, i)
			}
		}
	}
}
