package sinktest

import (
	"context"
	"net/http"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/changegate/changegate/tracing"
)

// Traced is the trace context of a traced Send of n events (as the
// engine's delivery stage makes it): Ctx is Send's context, Entries the
// traceparent each entry must carry, Request the request's (the attempt's
// span), and XRay the same in X-Ray's format.
type Traced struct {
	Ctx                  context.Context
	Request, RequestXRay string
	Entries, EntriesXRay []string

	attempt *tracing.Attempt
	rec     *tracetest.SpanRecorder
}

// Attempt ends the attempt's span and returns its attributes (what the
// sink recorded on it: HTTP status, AWS call), values as text.
func (t Traced) Attempt() map[string]string {
	t.attempt.End(nil)
	out := map[string]string{}
	for _, s := range t.rec.Ended() {
		if strings.HasPrefix(s.Name(), "send ") {
			for _, kv := range s.Attributes() {
				out[string(kv.Key)] = kv.Value.String()
			}
		}
	}
	return out
}

// TracedSend returns the context of a traced Send of n events, with the
// trace context propagated (trace_context = true) or not.
func TracedSend(n int, propagate bool) Traced {
	rec := tracetest.NewSpanRecorder()
	tr := tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	ds := make([]*tracing.Delivery, n)
	for i := range ds {
		ds[i] = tr.StartChange(tracing.ChangeInfo{ID: "orders:x"}).Delivery("s", "test")
	}
	ctx, a := tr.StartAttempt(context.Background(), ds, tracing.AttemptInfo{Sink: "s", Number: 1, Propagate: propagate})
	t := Traced{Ctx: ctx, Entries: make([]string, n), EntriesXRay: make([]string, n), attempt: a, rec: rec}
	if propagate {
		for i := range n {
			t.Entries[i], _ = tracing.Entry(ctx, i)
			t.EntriesXRay[i] = tracing.XRayHeader(ctx, i)
		}
		t.RequestXRay = tracing.XRayHeader(ctx, -1)
		h := http.Header{}
		tracing.InjectHTTP(ctx, h)
		t.Request = h.Get("traceparent")
	}
	return t
}
