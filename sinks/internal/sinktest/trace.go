package sinktest

import (
	"context"
	"net/http"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

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
}

// TracedSend returns the context of a traced Send of n events, with the
// trace context propagated (trace_context = true) or not.
func TracedSend(n int, propagate bool) Traced {
	tr := tracing.New(sdktrace.NewTracerProvider())
	ds := make([]*tracing.Delivery, n)
	for i := range ds {
		ds[i] = tr.StartChange(tracing.ChangeInfo{ID: "orders:x"}).Delivery("s", "test")
	}
	ctx, a := tr.StartAttempt(context.Background(), ds, tracing.AttemptInfo{Sink: "s", Number: 1, Propagate: propagate})
	_ = a
	t := Traced{Ctx: ctx, Entries: make([]string, n), EntriesXRay: make([]string, n)}
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
