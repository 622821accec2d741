package tracing

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
)

// clearEnv unsets every OTEL_* variable for the test.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
		}
	}
}

// With no OTEL_* variable that names an exporter or an endpoint, tracing
// is off: no tracer, no exporter goroutine, and the hooks of the delivery
// path allocate nothing.
func TestOffWithoutEnv(t *testing.T) {
	clearEnv(t)
	// Variables that only describe traces do not turn them on.
	t.Setenv("OTEL_SERVICE_NAME", "svc")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	before := runtime.NumGoroutine()
	tr, err := FromEnv(context.Background(), "test", nil)
	if err != nil || tr != nil {
		t.Fatalf("FromEnv = %v, %v; want nil, nil", tr, err)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines %d -> %d: something was started", before, after)
	}
	for _, env := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
	} {
		for k, v := range env {
			t.Setenv(k, v)
		}
		if tr, err := FromEnv(context.Background(), "test", nil); err != nil || tr != nil {
			t.Errorf("%v: FromEnv = %v, %v; want off", env, tr, err)
		}
		for k := range env {
			t.Setenv(k, "")
		}
	}

	ctx := context.Background()
	h := http.Header{}
	ev := &event.Event{ID: "x"}
	evs := []*event.Event{ev}
	allocs := testing.AllocsPerRun(100, func() {
		// The router's edges, with a nil tracer as its observer.
		tr.BeforeDispatch(ev)
		tr.Dispatched(observe.Dispatch{Event: ev})
		tr.AfterDispatch(ev)
		octx := tr.AttemptStart(ctx, observe.Attempt{Events: evs})
		tr.AttemptEnd(octx, observe.Attempt{Events: evs})
		tr.Outcome(observe.Outcome{Kind: observe.Delivered, Event: ev})

		ch := tr.StartChange(ChangeInfo{ID: "x"})
		ch.Route(nil, nil)
		d := ch.Delivery("s", "webhook")
		actx, a := tr.StartAttempt(ctx, []*Delivery{d}, AttemptInfo{Sink: "s"})
		a.Admitted()
		InjectHTTP(actx, h)
		if tp, _ := Entry(actx, 0); tp != "" {
			t.Fatal("trace context without tracing")
		}
		if XRayHeader(actx, 0) != "" || Active(actx) {
			t.Fatal("trace header without tracing")
		}
		SetHTTPStatus(actx, 200)
		if _, ok := a.TraceID(); ok {
			t.Fatal("exemplar without tracing")
		}
		a.End(nil)
		d.Backoff(time.Second, 0)
		d.Step("park")(nil)
		d.Outcome("delivered", "")
		d.End()
		ch.Ack()
	})
	if allocs != 0 {
		t.Errorf("tracing off: %v allocations per change, want 0", allocs)
	}
	if len(h) != 0 {
		t.Errorf("headers set without tracing: %v", h)
	}
}

func TestFromEnvErrors(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	if _, err := FromEnv(context.Background(), "test", nil); err == nil || !strings.Contains(err.Error(), `OTEL_TRACES_EXPORTER: unsupported exporter "zipkin"`) {
		t.Errorf("zipkin: %v", err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
	if _, err := FromEnv(context.Background(), "test", nil); err == nil || !strings.Contains(err.Error(), `OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol "thrift"`) {
		t.Errorf("thrift: %v", err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	tr, err := FromEnv(context.Background(), "test", nil)
	if err != nil || tr == nil {
		t.Fatalf("grpc: %v, %v", tr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = tr.Shutdown(ctx)
}

// OTEL_TRACES_EXPORTER=console writes the spans (with the resource from
// OTEL_SERVICE_NAME) to the writer.
func TestConsoleExporter(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	t.Setenv("OTEL_SERVICE_NAME", "cg-console")
	var buf bytes.Buffer
	tr, err := FromEnv(context.Background(), "test", &buf)
	if err != nil || tr == nil {
		t.Fatalf("FromEnv = %v, %v", tr, err)
	}
	ch := tr.StartChange(ChangeInfo{ID: "src:1", DB: "shop", Coll: "orders"})
	ch.Ack()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"receive shop.orders"`) || !strings.Contains(buf.String(), "cg-console") {
		t.Errorf("console output:\n%s", buf.String())
	}
}

func TestXRayAndTraceparent(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("5759e988bd862e3fe1be46a994272793")
	sid, _ := trace.SpanIDFromHex("53995c3f42cd8ad8")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	if got, want := XRay(sc), "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"; got != want {
		t.Errorf("XRay = %q, want %q", got, want)
	}
	tp := Traceparent(sc)
	if tp != "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01" {
		t.Errorf("Traceparent = %q", tp)
	}
	back, err := ParseTraceparent(tp)
	if err != nil || back.TraceID() != tid || back.SpanID() != sid || !back.IsSampled() {
		t.Errorf("ParseTraceparent(%q) = %v, %v", tp, back, err)
	}
	for _, bad := range []string{"", "00-0000-1-01", "00-00000000000000000000000000000000-53995c3f42cd8ad8-01", "01-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"} {
		if _, err := ParseTraceparent(bad); err == nil {
			t.Errorf("ParseTraceparent(%q) accepted", bad)
		}
	}
	if XRay(trace.SpanContext{}) != "" {
		t.Error("XRay of an invalid context")
	}
}
