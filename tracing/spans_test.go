package tracing

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// recorder returns a Tracer with sampler whose spans are exported at once
// to the returned exporter.
func recorder(t *testing.T, sampler sdktrace.Sampler) (*Tracer, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSyncer(exp)))
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr, exp
}

var testInfo = ChangeInfo{ID: "orders:826B086CD000000007", Source: "orders", DB: "shop", Coll: "orders",
	Operation: "insert", Size: 300, ClusterT: 1800000000, ClusterI: 7, WallTime: time.Now()}

// An unsampled change makes no span, builds no attribute, and still
// propagates its trace context (sampled flag off) so that the receiver
// does not sample it either; its hooks allocate a few times, not the
// dozens a recorded change does.
func TestUnsampledChange(t *testing.T) {
	tr, exp := recorder(t, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)))
	ctx := context.Background()
	h := http.Header{}
	var tp string
	run := func() {
		ch := tr.StartChange(testInfo)
		ch.HoldSpans()
		ch.Route([]string{"all"}, []string{"hook"})
		d := ch.Delivery("hook", "webhook")
		ch.ReleaseSpans()
		actx, a := tr.StartAttempt(ctx, []*Delivery{d}, AttemptInfo{Sink: "hook", Kind: "webhook", Number: 1, Propagate: true})
		a.Admitted()
		InjectHTTP(actx, h)
		tp, _ = Entry(actx, 0)
		if Active(actx) {
			t.Fatal("an unsampled attempt is active: AWS calls would be recorded")
		}
		SetHTTPStatus(actx, 200)
		if _, ok := a.TraceID(); ok {
			t.Fatal("an unsampled attempt has an exemplar")
		}
		a.End(nil)
		d.Backoff(time.Second, 0)
		d.Step("park hook")(nil)
		d.Outcome("delivered", "")
		d.End()
		ch.Ack()
	}
	allocs := testing.AllocsPerRun(100, run)
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans exported for unsampled changes", n)
	}
	sc, err := ParseTraceparent(h.Get("traceparent"))
	if err != nil || sc.IsSampled() || !sc.IsValid() {
		t.Errorf("traceparent %q (%v): want a valid unsampled context", h.Get("traceparent"), err)
	}
	if tp != h.Get("traceparent") {
		t.Errorf("entry's traceparent %q, request's %q", tp, h.Get("traceparent"))
	}
	// The SDK's non-recording root and its context, the change, the
	// attempt's carrier and context, the traceparents, the batch slice:
	// a dozen at most (a recorded change makes over 60).
	if allocs > 12 {
		t.Errorf("unsampled change: %v allocations, want at most 12", allocs)
	}
}

// spanCounter counts the spans started and ended while on is set.
type spanCounter struct {
	on         bool
	start, end int
}

func (c *spanCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {
	if c.on {
		c.start++
	}
}
func (c *spanCounter) OnEnd(sdktrace.ReadOnlySpan) {
	if c.on {
		c.end++
	}
}
func (*spanCounter) Shutdown(context.Context) error   { return nil }
func (*spanCounter) ForceFlush(context.Context) error { return nil }

// Between HoldSpans and ReleaseSpans (the router's dispatch lock) Route,
// Delivery and Ack start and end no span; ReleaseSpans makes the route
// and ends the root (acknowledged meanwhile) at the times they happened,
// in the same tree as without holding.
func TestHeldSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	cnt := &spanCounter{}
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(cnt), sdktrace.WithSyncer(exp)))
	defer tr.Shutdown(context.Background())

	ch := tr.StartChange(testInfo)
	ch.HoldSpans()
	cnt.on = true
	ch.Route([]string{"all"}, []string{"hook"})
	d := ch.Delivery("hook", "webhook")
	acked := time.Now()
	ch.Ack() // no sink: acknowledged in the dispatch
	cnt.on = false
	if cnt.start != 0 || cnt.end != 0 {
		t.Fatalf("under the hold: %d spans started, %d ended; want none", cnt.start, cnt.end)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans exported before ReleaseSpans", n)
	}
	ch.ReleaseSpans()
	d.Outcome("delivered", "")
	d.End()
	spans := exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	root, route, pub := byName["receive shop.orders"], byName["route"], byName["publish hook"]
	if len(spans) != 3 || !root.SpanContext.IsValid() || !route.SpanContext.IsValid() || !pub.SpanContext.IsValid() {
		t.Fatalf("spans %v, want receive, route and publish", names(spans))
	}
	if route.Parent.SpanID() != root.SpanContext.SpanID() || pub.Parent.SpanID() != root.SpanContext.SpanID() {
		t.Errorf("route's parent %s, publish's %s, want the root %s", route.Parent.SpanID(), pub.Parent.SpanID(), root.SpanContext.SpanID())
	}
	if root.EndTime.After(acked.Add(time.Second)) || root.EndTime.Before(acked) || route.StartTime.After(acked) {
		t.Errorf("root ends %v, route starts %v; acknowledged at %v", root.EndTime, route.StartTime, acked)
	}
	if len(root.Events) != 1 || root.Events[0].Name != "ack" || len(root.Links) != 1 || !root.Links[0].SpanContext.Equal(EventLink(testInfo.ID).SpanContext) {
		t.Errorf("root events %v, links %v", root.Events, root.Links)
	}
	attrs := map[string]string{}
	for _, kv := range root.Attributes {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	for k, v := range map[string]string{"messaging.message.id": testInfo.ID, "changegate.change.cluster_time": "1800000000.7",
		"messaging.destination.name": "shop.orders", "messaging.operation.type": "receive", "db.namespace": "shop"} {
		if attrs[k] != v {
			t.Errorf("root %s = %q, want %q", k, attrs[k], v)
		}
	}
	if pub.StartTime.After(acked) {
		t.Errorf("publish starts %v, after the dispatch (%v)", pub.StartTime, acked)
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// Re-deliveries keep their own name and operation (not the change's
// receive) and link to the event.
func TestRedeliveryAttributes(t *testing.T) {
	tr, exp := recorder(t, sdktrace.AlwaysSample())
	for _, why := range []string{"redrive", "replay"} {
		d := tr.Redelivery(testInfo, "hook", "sqs", why)
		d.Outcome("delivered", "")
		d.End()
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("spans %v", names(spans))
	}
	for i, why := range []string{"redrive", "replay"} {
		s := spans[i]
		attrs := map[string]string{}
		for _, kv := range s.Attributes {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if s.Name != why+" hook" || attrs["changegate.redelivery"] != why || attrs["messaging.operation.type"] != "send" ||
			attrs["messaging.operation.name"] != why || attrs["messaging.system"] != "aws_sqs" || attrs["messaging.message.id"] != testInfo.ID ||
			attrs["changegate.outcome"] != "delivered" || s.Parent.IsValid() || len(s.Links) != 1 {
			t.Errorf("%s: %s %v links %v", why, s.Name, attrs, s.Links)
		}
	}
}

// InjectHTTP writes what the W3C propagator writes.
func TestInjectHTTPAsPropagator(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("5759e988bd862e3fe1be46a994272793")
	sid, _ := trace.SpanIDFromHex("53995c3f42cd8ad8")
	ts, _ := trace.ParseTraceState("vendor=x")
	for _, sc := range []trace.SpanContext{
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled | trace.FlagsRandom | 0x80, TraceState: ts}),
	} {
		want := http.Header{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(want))
		got := http.Header{}
		ctx := context.WithValue(context.Background(), carrierKey{}, &carrier{sc: sc, propagate: true})
		InjectHTTP(ctx, got)
		if len(got) != len(want) || got.Get("traceparent") != want.Get("traceparent") || got.Get("tracestate") != want.Get("tracestate") {
			t.Errorf("%v: InjectHTTP %v, propagator %v", sc.TraceFlags(), got, want)
		}
	}
}

// The batch span processor's queue is bounded whatever
// OTEL_BSP_MAX_QUEUE_SIZE says; a malformed size stops the start.
func TestBatchOptions(t *testing.T) {
	clearEnv(t)
	read := func() sdktrace.BatchSpanProcessorOptions {
		opts, err := batchOptions()
		if err != nil {
			t.Fatal(err)
		}
		var o sdktrace.BatchSpanProcessorOptions
		for _, f := range opts {
			f(&o)
		}
		return o
	}
	if o := read(); o.MaxQueueSize != 2048 || o.MaxExportBatchSize != 512 {
		t.Errorf("defaults: %+v", o)
	}
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100000000")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100000000")
	if o := read(); o.MaxQueueSize != MaxQueueSize || o.MaxExportBatchSize != MaxQueueSize {
		t.Errorf("capped: %+v", o)
	}
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
	if o := read(); o.MaxQueueSize != 100 || o.MaxExportBatchSize != 100 {
		t.Errorf("small queue: %+v", o)
	}
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if _, err := FromEnv(context.Background(), "test", nil); err == nil || !strings.Contains(err.Error(), `OTEL_BSP_MAX_QUEUE_SIZE: "lots"`) {
		t.Errorf("malformed queue size: %v", err)
	}
}
