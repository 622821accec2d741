package otlp

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
)

// export sends n spans of one trace to r through the SDK's OTLP/HTTP
// exporter, as changegate does.
func export(t *testing.T, r *Receiver, n int) {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(r.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, root := tp.Tracer("test").Start(context.Background(), "root")
	for i := 1; i < n; i++ {
		_, s := tp.Tracer("test").Start(ctx, "child")
		s.End()
	}
	root.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestReceiverKeepsSpans(t *testing.T) {
	r := NewReceiver()
	defer r.Close()
	export(t, r, 3)
	spans := r.Spans()
	if len(spans) != 3 || r.SpanCount() != 3 || len(Find(spans, "child")) != 2 || len(r.Errors()) != 0 {
		t.Fatalf("spans %+v, count %d, errors %v", spans, r.SpanCount(), r.Errors())
	}
	root := Find(spans, "root")[0]
	if got := r.Trace(root.TraceID); len(got) != 3 {
		t.Errorf("trace %s: %d spans, want 3", root.TraceID, len(got))
	}
}

func TestCounterCountsOnly(t *testing.T) {
	r := NewCounter()
	defer r.Close()
	export(t, r, 5)
	if r.SpanCount() != 5 || len(r.Spans()) != 0 || len(r.Errors()) != 0 || r.Requests() == 0 {
		t.Fatalf("count %d, kept %d, errors %v, requests %d", r.SpanCount(), len(r.Spans()), r.Errors(), r.Requests())
	}
}
