package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/test/otlp"
	"github.com/changegate/changegate/tracing"
)

// traceSink answers its calls in turn with replies (then nil) and records
// the trace context each call's first entry carries.
type traceSink struct {
	name    string
	mu      sync.Mutex
	replies []error
	parents []string // tracing.Entry(ctx, 0) of each call
}

func (s *traceSink) Name() string  { return s.name }
func (s *traceSink) MaxBatch() int { return 1 }
func (s *traceSink) Close() error  { return nil }
func (s *traceSink) Send(ctx context.Context, batch []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tp, _ := tracing.Entry(ctx, 0)
	s.parents = append(s.parents, tp)
	if len(s.replies) == 0 {
		return nil
	}
	err := s.replies[0]
	s.replies = s.replies[1:]
	return err
}

func (s *traceSink) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.parents...)
}

// otelEnv points the OTEL_* variables at rcv (and clears the others).
func otelEnv(t *testing.T, rcv *otlp.Receiver) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "changegate-test")
}

// tracedEngine starts an engine with tracing from the environment; stop
// stops it and flushes the spans.
func tracedEngine(t *testing.T, dl DeadLetters, m *metrics.Metrics, specs ...SinkSpec) (e *Engine, stop func()) {
	t.Helper()
	tr, err := tracing.FromEnv(context.Background(), "test", nil)
	if err != nil || tr == nil {
		t.Fatalf("tracing.FromEnv = %v, %v; want a tracer", tr, err)
	}
	var names []string
	for _, s := range specs {
		names = append(names, s.Sink.Name())
	}
	rules, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: names}}, names)
	if err != nil {
		t.Fatal(err)
	}
	e, err = NewEngine(rules, specs, dl, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.SetObserver(tr)
	ctx, cancel := context.WithCancel(context.Background())
	e.Start(ctx)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			e.Stop()
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Errorf("tracer shutdown: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return e, stop
}

// One change through a retry (503 with Retry-After) and a dead letter
// (400): its trace has the read, the route, the delivery, both attempts
// with their outcome and retry number, the dead letter and the ack; each
// request carried the attempt's traceparent; no attribute holds document
// data; the delivery latency histogram has the trace as exemplar.
func TestTraceOfChangeThroughRetryAndDeadLetter(t *testing.T) {
	rcv := otlp.NewReceiver()
	defer rcv.Close()
	otelEnv(t, rcv)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	sink := &traceSink{name: "hook", replies: []error{
		sinks.Retryable("http_503", 20*time.Millisecond, errors.New("HTTP 503")),
		sinks.Permanent("http_400", errors.New("HTTP 400")),
	}}
	dl := newMemDL()
	eng, stop := tracedEngine(t, dl, m, SinkSpec{Sink: sink, Kind: "webhook", Retry: fastRetry(5)})
	ev := posEvent(t, 7, 3)
	acked := make(chan struct{})
	eng.Dispatch(ev, func() { close(acked) })
	select {
	case <-acked:
	case <-time.After(10 * time.Second):
		t.Fatal("event never acknowledged")
	}
	if l, _ := dl.List(t.Context(), deadletter.Filter{Kind: deadletter.KindFailed}); len(l) != 1 {
		t.Fatalf("dead letters: %d, want 1", len(l))
	}

	// The exemplar, before the engine stops (the registry is the engine's).
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	stop()
	spans := rcv.Spans()
	if errs := rcv.Errors(); len(errs) > 0 {
		t.Fatalf("receiver: %v", errs)
	}
	roots := otlp.Find(spans, "receive shop.orders")
	if len(roots) != 1 {
		t.Fatalf("%d receive spans, want 1: %+v", len(roots), spans)
	}
	root := roots[0]
	tr := rcv.Trace(root.TraceID)
	byName := map[string][]otlp.Span{}
	for _, s := range tr {
		byName[s.Name] = append(byName[s.Name], s)
	}
	if root.ParentID != "" || root.Kind != 5 || root.Service != "changegate-test" {
		t.Errorf("root span: %+v", root)
	}
	for k, want := range map[string]string{
		"messaging.message.id": ev.ID, "db.namespace": "shop", "db.collection.name": "orders",
		"changegate.change.operation_type": "update", "changegate.change.cluster_time": "1800000000.7",
	} {
		if got := root.Attrs[k]; got != want {
			t.Errorf("root %s = %q, want %q", k, got, want)
		}
	}
	if root.Attrs["changegate.change.read_lag_s"] == "" || root.Attrs["messaging.message.body.size"] == "" {
		t.Errorf("root lacks read lag or size: %v", root.Attrs)
	}
	if len(root.Events) != 1 || root.Events[0] != "ack" {
		t.Errorf("root events %v, want [ack]", root.Events)
	}
	if len(root.Links) != 1 || root.Links[0] != linkOf(ev.ID) {
		t.Errorf("root links %v, want the event's link %s", root.Links, linkOf(ev.ID))
	}
	route := byName["route"]
	if len(route) != 1 || route[0].ParentID != root.SpanID || route[0].Attrs["changegate.rules"] != "all" || route[0].Attrs["changegate.sinks"] != "hook" {
		t.Errorf("route spans: %+v", route)
	}
	pub := byName["publish hook"]
	if len(pub) != 1 || pub[0].ParentID != root.SpanID || pub[0].Attrs["changegate.outcome"] != "dead_lettered" || !pub[0].Error {
		t.Fatalf("publish spans: %+v", pub)
	}
	sends := byName["send hook"]
	if len(sends) != 2 {
		t.Fatalf("%d send spans, want 2: %+v", len(sends), tr)
	}
	for i, want := range []struct{ attempt, resend, reason, permanent, retryAfter string }{
		{"1", "0", "http_503", "false", "0.02"},
		{"2", "1", "http_400", "true", ""},
	} {
		s := sends[i]
		if s.ParentID != pub[0].SpanID || s.Kind != 3 || !s.Error {
			t.Errorf("send %d: %+v", i, s)
		}
		for k, v := range map[string]string{"changegate.attempt": want.attempt, "http.request.resend_count": want.resend,
			"error.type": want.reason, "changegate.permanent": want.permanent, "changegate.retry_after_s": want.retryAfter} {
			if s.Attrs[k] != v {
				t.Errorf("send %d: %s = %q, want %q", i, k, s.Attrs[k], v)
			}
		}
	}
	dead := byName["dead_letter hook"]
	if len(dead) != 1 || dead[0].ParentID != pub[0].SpanID || dead[0].Attrs["changegate.reason"] != "http_400" {
		t.Errorf("dead_letter spans: %+v", dead)
	}
	if len(pub[0].Events) != 1 || pub[0].Events[0] != "backoff" {
		t.Errorf("publish events %v, want one backoff", pub[0].Events)
	}
	// Each request carried its attempt's context.
	calls := sink.calls()
	if len(calls) != 2 {
		t.Fatalf("%d calls", len(calls))
	}
	for i, tp := range calls {
		if want := "00-" + root.TraceID + "-" + sends[i].SpanID + "-01"; tp != want {
			t.Errorf("call %d traceparent %q, want %q", i, tp, want)
		}
	}
	// No document data in any attribute (the document holds "seq": 7 and
	// the _id 3; ids and sizes only).
	for _, s := range tr {
		for k, v := range s.Attrs {
			if strings.Contains(v, "fullDocument") || strings.Contains(v, `"seq"`) {
				t.Errorf("span %s attribute %s holds document data: %q", s.Name, k, v)
			}
		}
	}
	// The delivery duration histogram's exemplars are the attempts' trace.
	if !strings.Contains(string(body), `changegate_delivery_duration_seconds_bucket{sink="hook"`) ||
		!strings.Contains(string(body), `# {trace_id="`+root.TraceID+`"}`) {
		t.Errorf("no exemplar with trace %s in the OpenMetrics exposition:\n%s", root.TraceID, grepLines(string(body), "delivery_duration"))
	}
}

func linkOf(id string) string {
	sc := tracing.EventLink(id).SpanContext
	return sc.TraceID().String() + "-" + sc.SpanID().String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// With trace_context = false the spans are recorded but the sink gets no
// trace context to send.
func TestTraceContextOff(t *testing.T) {
	rcv := otlp.NewReceiver()
	defer rcv.Close()
	otelEnv(t, rcv)
	sink := &traceSink{name: "quiet"}
	eng, stop := tracedEngine(t, newMemDL(), nil, SinkSpec{Sink: sink, Kind: "sqs", NoTraceContext: true, Retry: fastRetry(2)})
	acked := make(chan struct{})
	eng.Dispatch(posEvent(t, 1, 1), func() { close(acked) })
	select {
	case <-acked:
	case <-time.After(10 * time.Second):
		t.Fatal("event never acknowledged")
	}
	stop()
	if calls := sink.calls(); len(calls) != 1 || calls[0] != "" {
		t.Errorf("calls' trace context %q, want none", calls)
	}
	sends := otlp.Find(rcv.Spans(), "send quiet")
	if len(sends) != 1 || sends[0].Attrs["messaging.system"] != "aws_sqs" {
		t.Errorf("send spans %+v, want one with messaging.system aws_sqs", sends)
	}
}

// A parked change re-driven later gets a new trace whose root links to the
// event, as the first trace's root does.
func TestTraceOfRedriveLinksToEvent(t *testing.T) {
	rcv := otlp.NewReceiver()
	defer rcv.Close()
	otelEnv(t, rcv)
	dl := newMemDL()
	sink := &fakeSink{name: "sick"}
	var down sync.Mutex
	isDown := true
	sink.setFail(func(*event.Event) error {
		down.Lock()
		defer down.Unlock()
		if isDown {
			return sinks.Retryable("http_503", 0, errors.New("503"))
		}
		return nil
	})
	eng, stop := tracedEngine(t, dl, nil, SinkSpec{Sink: sink, Kind: "webhook",
		Retry:     sinks.RetryPolicy{MaxAttempts: 1000, InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, Multiplier: 2},
		ParkAfter: 50 * time.Millisecond})
	ev := posEvent(t, 2, 1)
	acked := make(chan struct{})
	eng.Dispatch(ev, func() { close(acked) })
	select {
	case <-acked:
	case <-time.After(10 * time.Second):
		t.Fatal("event never parked and acknowledged")
	}
	down.Lock()
	isDown = false
	down.Unlock()
	waitUntil(t, "re-drive", func() bool { return len(sink.received()) == 1 })
	waitUntil(t, "lane live", func() bool { return !eng.Lane("sick").Status().Parked })
	stop()
	spans := rcv.Spans()
	live := otlp.Find(spans, "receive shop.orders")
	redrive := otlp.Find(spans, "redrive sick")
	if len(live) != 1 || len(redrive) != 1 {
		t.Fatalf("receive spans %d, redrive spans %d; want 1 each", len(live), len(redrive))
	}
	if redrive[0].TraceID == live[0].TraceID || redrive[0].ParentID != "" {
		t.Errorf("re-drive is not a new trace: %+v", redrive[0])
	}
	if len(redrive[0].Links) != 1 || redrive[0].Links[0] != linkOf(ev.ID) || redrive[0].Attrs["messaging.message.id"] != ev.ID {
		t.Errorf("re-drive root %+v, want a link to %s", redrive[0], linkOf(ev.ID))
	}
	if o := redrive[0].Attrs["changegate.outcome"]; o != "delivered" {
		t.Errorf("re-drive outcome %q", o)
	}
	if p := otlp.Find(rcv.Trace(live[0].TraceID), "park sick"); len(p) != 1 {
		t.Errorf("park spans in the live trace: %d, want 1", len(p))
	}
	// The re-drive may start before the sink is up again (a loaded machine
	// flips isDown late): its failed tries are send spans of the same trace.
	// Every one hangs off the re-drive's root, and the last one succeeded.
	s := otlp.Find(rcv.Trace(redrive[0].TraceID), "send sick")
	last := -1
	for i := range s {
		if last < 0 || s[i].Start > s[last].Start {
			last = i
		}
	}
	if last < 0 || s[last].Error {
		t.Errorf("re-drive's send spans: %+v, want the last one without error", s)
	}
	for _, sp := range s {
		if sp.ParentID != redrive[0].SpanID {
			t.Errorf("re-drive's send span %+v is not a child of its root %s", sp, redrive[0].SpanID)
		}
	}
}

// goid returns the calling goroutine's id (from its stack header).
func goid() string {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	f := strings.Fields(string(buf[:n]))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// lockWatch is a span processor that counts the spans started or ended
// by the goroutine named in g (the one holding the "dispatch lock").
type lockWatch struct {
	mu         sync.Mutex
	g          string
	start, end []string
}

func (w *lockWatch) hold(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.g = ""
	if on {
		w.g = goid()
	}
}

func (w *lockWatch) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.g != "" && goid() == w.g {
		w.start = append(w.start, s.Name())
	}
}

func (w *lockWatch) OnEnd(s sdktrace.ReadOnlySpan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.g != "" && goid() == w.g {
		w.end = append(w.end, s.Name())
	}
}
func (*lockWatch) Shutdown(context.Context) error   { return nil }
func (*lockWatch) ForceFlush(context.Context) error { return nil }

// A Source dispatches under its dispatch lock, with the engine's
// BeginDispatch before and EndDispatch after: no span is started or ended
// under the lock, for a change routed to a sink or one no rule routes
// (acknowledged in Dispatch), and the traces are whole: root, route,
// publish and send, in that tree.
func TestDispatchSpansOutsideLock(t *testing.T) {
	watch := &lockWatch{}
	exp := tracetest.NewInMemoryExporter()
	tr := tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(watch), sdktrace.WithSyncer(exp)))
	sink := &traceSink{name: "hook"}
	rules, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: []string{"hook"}}}, []string{"hook"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := NewEngine(rules, []SinkSpec{{Sink: sink, Kind: "webhook", Retry: fastRetry(2)}}, newMemDL(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng.SetObserver(tr)
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	defer func() { cancel(); eng.Stop() }()
	hooks, ok := any(eng).(dispatchHooks)
	if !ok {
		t.Fatal("the engine has no dispatch hooks: its spans are made under the source's lock")
	}
	routed := posEvent(t, 1, 1)
	unrouted := posEvent(t, 2, 2)
	unrouted.Source = "inventory" // no rule
	var wg sync.WaitGroup
	for _, ev := range []*event.Event{routed, unrouted} {
		wg.Add(1)
		hooks.BeginDispatch(ev)
		watch.hold(true)
		eng.Dispatch(ev, wg.Done)
		watch.hold(false)
		hooks.EndDispatch(ev)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("events never acknowledged")
	}
	if len(watch.start) > 0 || len(watch.end) > 0 {
		t.Errorf("under the dispatch lock: spans started %v, ended %v", watch.start, watch.end)
	}
	waitUntil(t, "the routed change's trace", func() bool { return len(exp.GetSpans()) == 6 })
	byName := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		byName[s.Name] = append(byName[s.Name], s)
	}
	roots, routes := byName["receive shop.orders"], byName["route"]
	pub, send := byName["publish hook"], byName["send hook"]
	if len(roots) != 2 || len(routes) != 2 || len(pub) != 1 || len(send) != 1 {
		t.Fatalf("spans: %v", byName)
	}
	parent := func(s tracetest.SpanStub) string { return s.Parent.SpanID().String() }
	rootOf := map[string]bool{}
	for _, r := range roots {
		rootOf[r.SpanContext.SpanID().String()] = true
		if len(r.Events) != 1 || r.Events[0].Name != "ack" {
			t.Errorf("root %v: events %v", r.SpanContext.TraceID(), r.Events)
		}
	}
	for _, r := range routes {
		if !rootOf[parent(r)] {
			t.Errorf("route's parent %s is no root", parent(r))
		}
	}
	if !rootOf[parent(pub[0])] || parent(send[0]) != pub[0].SpanContext.SpanID().String() {
		t.Errorf("publish's parent %s, send's %s", parent(pub[0]), parent(send[0]))
	}
	if calls := sink.calls(); len(calls) != 1 || calls[0] != tracing.Traceparent(send[0].SpanContext) {
		t.Errorf("request's traceparent %v, want the send span's %s", calls, tracing.Traceparent(send[0].SpanContext))
	}
}
