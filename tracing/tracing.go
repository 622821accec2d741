// Package tracing is changegate's OpenTelemetry tracing: one trace per
// change, from its read to its acknowledgement, with a subtree per sink
// delivery (attempts, park, dead letter), and the trace context each sink
// carries to its receiver.
//
// It is configured only from the standard OTEL_* environment variables
// (FromEnv). When none enables it, FromEnv returns a nil *Tracer: every
// method of a nil *Tracer, *Change, *Delivery and *Attempt is a no-op that
// allocates nothing, and the helpers sinks call (InjectHTTP, Entry,
// XRayHeader, SetHTTPStatus) find nothing in their context, so the
// delivery path pays a nil check per hook.
//
// On, the sampler decides once per change, when its root span starts: an
// unsampled change makes no other span and builds no attribute, but its
// trace context (sampled flag off) is still propagated. The router starts
// the root before its source's dispatch lock and makes the spans it
// records under the lock after it (Change.HoldSpans, ReleaseSpans).
//
// Attributes are ids, namespaces, sizes and outcomes only, never document
// data.
package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of changegate's spans.
const ScopeName = "github.com/changegate/changegate"

// Tracer makes changegate's spans. A nil *Tracer is tracing turned off.
// It is safe for concurrent use.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	sinks  sync.Map // sinkKey → *sinkSpans
	roots  sync.Map // sinkKey{db, coll} → the root span's name
}

// Environment variables that turn tracing on (any one, set and not
// empty), unless OTEL_SDK_DISABLED is "true" or OTEL_TRACES_EXPORTER is
// "none".
var enablingEnv = []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}

// FromEnv returns the Tracer the OTEL_* environment variables configure,
// or nil (tracing off) when none of OTEL_TRACES_EXPORTER,
// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// set, OTEL_TRACES_EXPORTER is "none" or OTEL_SDK_DISABLED is "true".
//
//   - OTEL_TRACES_EXPORTER: "otlp" (the default), "console" (JSON spans on
//     console, one a line) or "none"; a comma-separated list sends to each.
//   - OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL: "http/protobuf" (default),
//     "http/json" or "grpc"; OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT,
//     _HEADERS, _TIMEOUT, _COMPRESSION, _INSECURE and the TLS files are
//     read by the OTLP exporters themselves.
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES: the resource
//     (service.name defaults to "changegate").
//   - OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG: read by the SDK
//     (default parentbased_always_on).
//
// The caller must call Shutdown, which flushes what is buffered.
func FromEnv(ctx context.Context, version string, console io.Writer) (*Tracer, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	on := false
	for _, k := range enablingEnv {
		if strings.TrimSpace(os.Getenv(k)) != "" {
			on = true
		}
	}
	if !on {
		return nil, nil
	}
	names := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if names == "" {
		names = "otlp"
	}
	var exps []sdktrace.SpanExporter
	for _, name := range strings.Split(names, ",") {
		switch name = strings.TrimSpace(name); name {
		case "none":
			if names == "none" {
				return nil, nil
			}
		case "otlp":
			e, err := otlpFromEnv(ctx)
			if err != nil {
				return nil, err
			}
			exps = append(exps, e)
		case "console":
			e, err := stdouttrace.New(stdouttrace.WithWriter(console))
			if err != nil {
				return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: console: %w", err)
			}
			exps = append(exps, e)
		default:
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: unsupported exporter %q (otlp, console or none)", name)
		}
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName("changegate"), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: last, they win
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	bsp, err := batchOptions()
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, e := range exps {
		opts = append(opts, sdktrace.WithBatcher(e, bsp...))
	}
	return New(sdktrace.NewTracerProvider(opts...)), nil
}

// MaxQueueSize is the most ended spans the batch span processor holds for
// export (per exporter): OTEL_BSP_MAX_QUEUE_SIZE (default 2048) is capped
// to it. When the queue is full, spans are dropped, never waited for, so
// the spans waiting for an exporter that is slow or down take at most the
// queue plus the batch being exported (OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
// default 512, at most the queue).
const MaxQueueSize = 1 << 16

// batchOptions returns the batch span processor's queue and batch sizes:
// the OTEL_BSP_* values, bounded (MaxQueueSize). The schedule delay and
// the export timeout are the SDK's reading of OTEL_BSP_SCHEDULE_DELAY and
// OTEL_BSP_EXPORT_TIMEOUT.
func batchOptions() ([]sdktrace.BatchSpanProcessorOption, error) {
	size := func(key string, def int) (int, error) {
		v := strings.TrimSpace(os.Getenv(key))
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s: %q is not a positive number", key, v)
		}
		return n, nil
	}
	queue, err := size("OTEL_BSP_MAX_QUEUE_SIZE", sdktrace.DefaultMaxQueueSize)
	if err != nil {
		return nil, err
	}
	batch, err := size("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", sdktrace.DefaultMaxExportBatchSize)
	if err != nil {
		return nil, err
	}
	queue = min(queue, MaxQueueSize)
	return []sdktrace.BatchSpanProcessorOption{
		sdktrace.WithMaxQueueSize(queue), sdktrace.WithMaxExportBatchSize(min(batch, queue)),
	}, nil
}

// otlpFromEnv returns the OTLP exporter of the protocol the environment
// names; its endpoint and options are the exporter's own reading of the
// OTEL_EXPORTER_OTLP_* variables.
func otlpFromEnv(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	key := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if proto == "" {
		proto, key = strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch proto {
	case "", "http/protobuf", "http/json":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	}
	return nil, fmt.Errorf("%s: unsupported protocol %q (http/protobuf, http/json or grpc)", key, proto)
}

// New returns a Tracer making spans with tp (tests pass one with their own
// exporter). Shutdown shuts tp down.
func New(tp *sdktrace.TracerProvider) *Tracer {
	return &Tracer{tp: tp, tracer: tp.Tracer(ScopeName)}
}

// Shutdown flushes the spans still buffered and stops the exporters; a nil
// Tracer has nothing to do.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// ChangeInfo is what a change's spans say about it: ids, namespace, sizes
// and times, never document data.
type ChangeInfo struct {
	ID, Source, DB, Coll, Operation string
	// Size is the change's BSON size in bytes.
	Size int
	// ClusterTime is the change's oplog time (seconds, increment).
	ClusterT, ClusterI uint32
	// WallTime is the server's wall clock time of the change (zero: unknown).
	WallTime time.Time
	// Kind is "change" (read from a stream), "snapshot" or "backfill".
	Kind string
}

// Attribute keys of changegate's own attributes (no semantic convention
// covers them).
const (
	attrSource      = attribute.Key("changegate.source")
	attrOperation   = attribute.Key("changegate.change.operation_type")
	attrClusterTime = attribute.Key("changegate.change.cluster_time")
	attrReadLag     = attribute.Key("changegate.change.read_lag_s")
	attrKind        = attribute.Key("changegate.change.kind")
	attrRules       = attribute.Key("changegate.rules")
	attrSinks       = attribute.Key("changegate.sinks")
	attrSink        = attribute.Key("changegate.sink")
	attrAttempt     = attribute.Key("changegate.attempt")
	attrLimiterWait = attribute.Key("changegate.limiter.wait_s")
	attrRetryAfter  = attribute.Key("changegate.retry_after_s")
	attrOutcome     = attribute.Key("changegate.outcome")
	attrReason      = attribute.Key("changegate.reason")
	attrPermanent   = attribute.Key("changegate.permanent")
	attrRedelivery  = attribute.Key("changegate.redelivery")
	attrLink        = attribute.Key("changegate.link")
)

// maxChangeAttrs is the most attributes ChangeInfo.attributes makes.
const maxChangeAttrs = 11

// attributes appends the change's attributes to as (a recording span's:
// they are made for no other).
func (c ChangeInfo) attributes(as []attribute.KeyValue, now time.Time) []attribute.KeyValue {
	var ct [21]byte // "4294967295.4294967295"
	b := strconv.AppendUint(ct[:0], uint64(c.ClusterT), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(c.ClusterI), 10)
	as = append(as,
		semconv.MessagingMessageID(c.ID),
		attrSource.String(c.Source),
		semconv.DBSystemNameMongoDB,
		semconv.DBNamespace(c.DB),
		semconv.MessagingMessageBodySize(c.Size),
		attrOperation.String(c.Operation),
		attrClusterTime.String(string(b)),
	)
	if c.Coll != "" {
		as = append(as, semconv.DBCollectionName(c.Coll), semconv.MessagingDestinationName(c.DB+"."+c.Coll))
	}
	if !c.WallTime.IsZero() {
		as = append(as, attrReadLag.Float64(now.Sub(c.WallTime).Seconds()))
	}
	if c.Kind != "" {
		as = append(as, attrKind.String(c.Kind))
	}
	return as
}

// Attributes every span of a kind has: made once.
var (
	opReceive = semconv.MessagingOperationName("receive")
	opPublish = semconv.MessagingOperationName("publish")
	opSend    = semconv.MessagingOperationName("send")

	rootOpts  = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot()}
	sendKind  = trace.WithSpanKind(trace.SpanKindClient)
	linkAttrs = attrLink.String("event")
)

// EventLink returns the span context every trace of the event id links to:
// its trace and span ids are derived from the id (SHA-256), so the first
// delivery's trace and those of its re-deliveries (re-drive of a parked
// entry, replay of a dead letter, a re-read after a crash) share one link
// target, in this process and the next (the derivation is fixed). It is
// never sampled or exported itself. Only recording spans link to it: an
// unsampled change does not hash its id.
func EventLink(id string) trace.Link {
	var buf [128]byte
	sum := sha256.Sum256(append(buf[:0], id...))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], sum[:16])
	copy(sid[:], sum[16:24])
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, Remote: true})
	return trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{linkAttrs, semconv.MessagingMessageID(id)}}
}

// sinkSpans is what the spans of one sink share: their names and
// attributes, made once per sink (Tracer.sinkSpans).
type sinkSpans struct {
	publish, send     string
	publishOpts       []trace.SpanStartOption
	sendAttrs         []attribute.KeyValue // without the attempt's number
	redrive, replay   string
	redriveA, replayA []attribute.KeyValue
}

type sinkKey struct{ sink, kind string }

// sinkSpans returns the names and attributes of sink's spans.
func (t *Tracer) sinkSpans(sink, kind string) *sinkSpans {
	k := sinkKey{sink, kind}
	if s, ok := t.sinks.Load(k); ok {
		return s.(*sinkSpans)
	}
	base := []attribute.KeyValue{attrSink.String(sink), messagingSystem(kind)}
	with := func(as ...attribute.KeyValue) []attribute.KeyValue {
		return append(append([]attribute.KeyValue(nil), base...), as...)
	}
	s := &sinkSpans{
		publish: "publish " + sink, send: "send " + sink,
		publishOpts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(with(semconv.MessagingOperationTypeSend, opPublish)...)},
		sendAttrs: with(semconv.MessagingOperationTypeSend, opSend),
		redrive:   "redrive " + sink, replay: "replay " + sink,
		redriveA: with(attrRedelivery.String("redrive"), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("redrive")),
		replayA:  with(attrRedelivery.String("replay"), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("replay")),
	}
	v, _ := t.sinks.LoadOrStore(k, s)
	return v.(*sinkSpans)
}

// rootName returns the name of a change's root span, "receive <db>.<coll>",
// made once per namespace.
func (t *Tracer) rootName(db, coll string) string {
	k := sinkKey{db, coll}
	if s, ok := t.roots.Load(k); ok {
		return s.(string)
	}
	name := "receive " + db
	if coll != "" {
		name += "." + coll
	}
	v, _ := t.roots.LoadOrStore(k, name)
	return v.(string)
}

// Change is the trace of one change: its root span runs from the read
// (routing) to the acknowledgement, when every sink is done with it. A nil
// *Change is tracing turned off.
//
// Whether the change is sampled is decided when its root starts
// (StartChange): the spans of an unsampled change's route and deliveries
// are not made (its trace context is still propagated, with the sampled
// flag off, so that the receiver does not sample it either).
type Change struct {
	t    *Tracer
	ctx  context.Context
	span trace.Span
	// rec is the state of a recording (sampled) change; nil: unsampled.
	rec *recording
	// unsampled is the delivery of every sink of an unsampled change: no
	// span, the root's context to propagate; read only.
	unsampled Delivery
}

// recording is what a sampled change holds between HoldSpans and
// ReleaseSpans, and its root's attributes.
type recording struct {
	mu     sync.Mutex
	held   bool // HoldSpans: Route and Ack only record until ReleaseSpans
	routed bool
	rules  []string
	sinks  []string
	routeT time.Time
	acked  bool
	ackT   time.Time
	attrs  [maxChangeAttrs + 2]attribute.KeyValue
}

// StartChange starts the trace of a change read from a stream (or a
// snapshot or backfill document): the root span, which the sampler
// decides on. Its attributes and link are made only when it is sampled.
func (t *Tracer) StartChange(info ChangeInfo) *Change {
	if t == nil {
		return nil
	}
	ctx, span := t.tracer.Start(context.Background(), t.rootName(info.DB, info.Coll), rootOpts...)
	c := &Change{t: t, ctx: ctx, span: span}
	if !span.IsRecording() {
		c.unsampled = Delivery{sc: span.SpanContext()}
		return c
	}
	r := &recording{}
	c.rec = r
	as := append(r.attrs[:0], semconv.MessagingOperationTypeReceive, opReceive)
	span.SetAttributes(info.attributes(as, time.Now())...)
	span.AddLink(EventLink(info.ID))
	return c
}

// Recording reports whether the change's spans are recorded (sampled).
func (c *Change) Recording() bool { return c != nil && c.rec != nil }

// HoldSpans makes Route and Ack record what they are told without making
// or ending a span until ReleaseSpans: the router calls them under its
// source's dispatch lock, and span work (the span processor's queue, the
// exporter's memory) has no place there.
func (c *Change) HoldSpans() {
	if !c.Recording() {
		return
	}
	c.rec.mu.Lock()
	c.rec.held = true
	c.rec.mu.Unlock()
}

// ReleaseSpans makes the spans held since HoldSpans: the route, and the
// root's end if the change was acknowledged meanwhile.
func (c *Change) ReleaseSpans() {
	if !c.Recording() {
		return
	}
	r := c.rec
	r.mu.Lock()
	wasHeld := r.held
	r.held = false
	routed, acked, ackT := r.routed && wasHeld, r.acked && wasHeld, r.ackT
	r.mu.Unlock()
	if routed {
		c.route()
	}
	if acked {
		c.end(ackT)
	}
}

// Route records the routing of the change: the rules that matched it and
// the sinks it goes to (none: it is acknowledged at once). The slices are
// kept (held): they must not change.
func (c *Change) Route(rules, sinks []string) {
	if !c.Recording() {
		return
	}
	now := time.Now()
	r := c.rec
	r.mu.Lock()
	r.rules, r.sinks, r.routeT = rules, sinks, now
	if r.held {
		r.routed = true
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	c.route()
}

// route makes the route span, at the time Route was called.
func (c *Change) route() {
	r := c.rec
	_, span := c.t.tracer.Start(c.ctx, "route", trace.WithTimestamp(r.routeT),
		trace.WithAttributes(attrRules.StringSlice(r.rules), attrSinks.StringSlice(r.sinks)))
	span.End(trace.WithTimestamp(r.routeT))
}

// Ack ends the change's trace: every sink is done with it (delivered,
// dead-lettered or parked) and it is acknowledged to its source's
// checkpoint tracker.
func (c *Change) Ack() {
	if !c.Recording() {
		return
	}
	now := time.Now()
	r := c.rec
	r.mu.Lock()
	if r.held {
		r.acked, r.ackT = true, now
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	c.end(now)
}

func (c *Change) end(at time.Time) {
	c.span.AddEvent("ack", trace.WithTimestamp(at))
	c.span.End(trace.WithTimestamp(at))
}

// Delivery is one sink's delivery of a change (kind producer): its
// attempts, park and dead letter are its children. A nil *Delivery is
// tracing turned off.
//
// Its span starts on its first use (at the time the delivery was made),
// so that Change.Delivery, which the router calls under its source's
// dispatch lock, does no span work. The delivery of an unsampled change
// has no span, only the context to propagate.
type Delivery struct {
	c       *Change
	ss      *sinkSpans
	created time.Time
	once    sync.Once
	ctx     context.Context
	span    trace.Span
	sc      trace.SpanContext // the span's (set by begin), or an unsampled change's root's
	outcome string
}

// Delivery starts the delivery of the change to sink, whose type is kind
// (webhook, sqs, ...).
func (c *Change) Delivery(sink, kind string) *Delivery {
	if c == nil {
		return nil
	}
	if c.rec == nil {
		return &c.unsampled
	}
	return &Delivery{c: c, ss: c.t.sinkSpans(sink, kind), created: time.Now()}
}

// recording reports whether d has a span (started or not).
func (d *Delivery) recording() bool { return d != nil && d.ss != nil }

// begin starts d's span, once.
func (d *Delivery) begin() {
	d.once.Do(func() {
		if d.span != nil { // Redelivery started it
			return
		}
		opts := append(d.ss.publishOpts[:len(d.ss.publishOpts):len(d.ss.publishOpts)], trace.WithTimestamp(d.created))
		d.ctx, d.span = d.c.t.tracer.Start(d.c.ctx, d.ss.publish, opts...)
		d.sc = d.span.SpanContext()
	})
}

// Redelivery starts a new trace for a re-delivery of a stored change to
// sink: why is "redrive" (a parked entry) or "replay" (a dead letter). Its
// root links to the event's link target (EventLink), as the change's first
// trace does.
func (t *Tracer) Redelivery(info ChangeInfo, sink, kind, why string) *Delivery {
	if t == nil {
		return nil
	}
	ss := t.sinkSpans(sink, kind)
	name, as := ss.redrive, ss.redriveA
	if why == "replay" {
		name, as = ss.replay, ss.replayA
	} else if why != "redrive" {
		name = why + " " + sink
		as = []attribute.KeyValue{attrSink.String(sink), messagingSystem(kind), attrRedelivery.String(why),
			semconv.MessagingOperationTypeSend, semconv.MessagingOperationName(why)}
	}
	ctx, span := t.tracer.Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithNewRoot())
	if !span.IsRecording() {
		return &Delivery{sc: span.SpanContext()}
	}
	d := &Delivery{ss: ss, ctx: ctx, span: span, sc: span.SpanContext()}
	d.once.Do(func() {})
	var buf [maxChangeAttrs + 6]attribute.KeyValue
	all := append(buf[:0], as...)
	span.SetAttributes(info.attributes(all, time.Now())...)
	span.AddLink(EventLink(info.ID))
	return d
}

// messagingSystem returns the messaging.system of a sink type: the
// convention's values where it has one.
func messagingSystem(kind string) attribute.KeyValue {
	switch kind {
	case "sqs":
		return semconv.MessagingSystemAWSSQS
	case "sns":
		return semconv.MessagingSystemAWSSNS
	case "kafka":
		return semconv.MessagingSystemKafka
	case "eventbridge", "lambda", "kinesis":
		return semconv.MessagingSystemKey.String("aws." + kind)
	case "":
		return semconv.MessagingSystemKey.String("changegate")
	}
	return semconv.MessagingSystemKey.String(kind)
}

func noStep(error) {}

// Step starts a child span of the delivery (park, dead_letter) and returns
// the function that ends it with the store write's error.
func (d *Delivery) Step(name string, attrs ...attribute.KeyValue) func(error) {
	if !d.recording() {
		return noStep
	}
	d.begin()
	_, span := d.c.t.tracer.Start(d.ctx, name, trace.WithAttributes(attrs...))
	return func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, "store write not completed")
		}
		span.End()
	}
}

// Backoff records a wait before the next attempt (the policy's backoff,
// the receiver's Retry-After).
func (d *Delivery) Backoff(wait, retryAfter time.Duration) {
	if !d.recording() {
		return
	}
	d.begin()
	d.span.AddEvent("backoff", trace.WithAttributes(attribute.Float64("changegate.backoff_s", wait.Seconds()), attrRetryAfter.Float64(retryAfter.Seconds())))
}

// Outcome sets how the delivery ended: delivered, dead_lettered, parked,
// dropped (lease lost), abandoned (shutdown).
func (d *Delivery) Outcome(outcome, reason string) {
	if !d.recording() {
		return
	}
	d.begin()
	d.outcome = outcome
	if reason != "" {
		d.span.SetAttributes(attrReason.String(reason))
	}
	if outcome == "dead_lettered" || outcome == "failed" {
		d.span.SetStatus(codes.Error, reason)
	}
}

// End ends the delivery span (once the lane no longer holds the item).
func (d *Delivery) End() {
	if !d.recording() {
		return
	}
	d.begin()
	o := d.outcome
	if o == "" {
		o = "abandoned"
	}
	d.span.SetAttributes(attrOutcome.String(o))
	d.span.End()
}

// Attempt is one request to a sink (kind client), for one delivery or a
// batch of them. A nil *Attempt is tracing turned off, or an attempt of an
// unsampled change (no span).
type Attempt struct {
	span     trace.Span
	start    time.Time
	admitted bool
}

// AttemptInfo describes an attempt.
type AttemptInfo struct {
	Sink, Kind string
	// Number is the attempt's number for its first delivery (1: the first
	// try; retries count up).
	Number int
	// Propagate puts the trace context in the request (the sink's
	// trace_context option).
	Propagate bool
}

type carrierKey struct{}

// carrier is what a sink finds in its Send context: the attempt's span
// (nil: not recorded) and context (the request's), and each entry's
// context.
type carrier struct {
	span      trace.Span
	sc        trace.SpanContext
	propagate bool
	entries   []trace.SpanContext
	one       [1]trace.SpanContext // entries of a single delivery
}

// StartAttempt starts an attempt for the deliveries ds (the batch, in
// order; nil entries are untraced) and returns the context to send it
// with. With one delivery the attempt is its child and the request and its
// entry carry the attempt's context; with several the attempt is the
// first one's child and links to the others, the request carries the
// attempt's context and each entry its own delivery's. The attempt of an
// unsampled first delivery has no span: the request carries that
// delivery's (unsampled) context.
func (t *Tracer) StartAttempt(ctx context.Context, ds []*Delivery, info AttemptInfo) (context.Context, *Attempt) {
	if t == nil || len(ds) == 0 || ds[0] == nil {
		return ctx, nil
	}
	c := &carrier{propagate: info.Propagate}
	var a *Attempt
	if !ds[0].recording() {
		c.sc = ds[0].sc
	} else {
		for _, d := range ds {
			if d.recording() {
				d.begin()
			}
		}
		opts := []trace.SpanStartOption{sendKind}
		if len(ds) > 1 {
			links := make([]trace.Link, 0, len(ds)-1)
			for _, d := range ds[1:] {
				if d != nil {
					links = append(links, trace.Link{SpanContext: d.sc})
				}
			}
			opts = append(opts, trace.WithLinks(links...))
		}
		a = &Attempt{start: time.Now()}
		ctx, a.span = t.tracer.Start(trace.ContextWithSpan(ctx, ds[0].span), ds[0].ss.send, opts...)
		var buf [8]attribute.KeyValue
		as := append(append(buf[:0], ds[0].ss.sendAttrs...), attrAttempt.Int(info.Number))
		if info.Kind == "webhook" {
			as = append(as, semconv.HTTPRequestMethodPost, semconv.HTTPRequestResendCount(info.Number-1))
		}
		if len(ds) > 1 {
			as = append(as, semconv.MessagingBatchMessageCount(len(ds)))
		}
		a.span.SetAttributes(as...)
		c.span, c.sc = a.span, a.span.SpanContext()
	}
	if info.Propagate {
		if len(ds) == 1 {
			c.one[0] = c.sc
			c.entries = c.one[:]
		} else {
			c.entries = make([]trace.SpanContext, len(ds))
			for i, d := range ds {
				if d != nil {
					c.entries[i] = d.sc
				}
			}
		}
	}
	return context.WithValue(ctx, carrierKey{}, c), a
}

// Admitted records that the limiter admitted the attempt: the time since
// the attempt started is its limiter wait.
func (a *Attempt) Admitted() {
	if a == nil || a.admitted {
		return
	}
	a.admitted = true
	a.span.SetAttributes(attrLimiterWait.Float64(time.Since(a.start).Seconds()))
}

// Failure is an attempt's classified failure (its reason, not its text).
type Failure struct {
	Reason     string
	Permanent  bool
	RetryAfter time.Duration
	// Entries is the number of failed entries of a batch (0: the whole
	// request failed).
	Entries int
}

// End ends the attempt: f nil is a success.
func (a *Attempt) End(f *Failure) {
	if a == nil {
		return
	}
	if f != nil {
		a.span.SetAttributes(semconv.ErrorTypeKey.String(f.Reason), attrReason.String(f.Reason), attrPermanent.Bool(f.Permanent))
		if f.RetryAfter > 0 {
			a.span.SetAttributes(attrRetryAfter.Float64(f.RetryAfter.Seconds()))
		}
		if f.Entries > 0 {
			a.span.SetAttributes(attribute.Int("changegate.failed_entries", f.Entries))
		}
		// The error's text is not recorded: it may quote what the
		// receiver answered (a body that echoes the document).
		a.span.SetStatus(codes.Error, f.Reason)
	}
	a.span.End()
}

// TraceID returns the attempt's trace id (hex) when it is sampled: the
// exemplar of the delivery latency histogram.
func (a *Attempt) TraceID() (string, bool) {
	if a == nil {
		return "", false
	}
	sc := a.span.SpanContext()
	if !sc.IsSampled() {
		return "", false
	}
	return sc.TraceID().String(), true
}

func carrierOf(ctx context.Context) *carrier {
	c, _ := ctx.Value(carrierKey{}).(*carrier)
	return c
}

// Active reports whether ctx is the Send context of a recorded (sampled)
// attempt: SetAWSCall and SetHTTPStatus record something.
func Active(ctx context.Context) bool {
	c := carrierOf(ctx)
	return c != nil && c.span != nil
}

// InjectHTTP sets the W3C traceparent (and tracestate) headers of a
// request sent in ctx (a sink's Send context) to the attempt's context, as
// the W3C propagator does; nothing without tracing or with trace_context =
// false.
func InjectHTTP(ctx context.Context, h http.Header) {
	c := carrierOf(ctx)
	if c == nil || !c.propagate || !c.sc.IsValid() {
		return
	}
	if ts := c.sc.TraceState().String(); ts != "" {
		h["Tracestate"] = []string{ts}
	}
	// The propagator keeps only the flags the W3C defines: sampled and
	// random. The keys are canonical already (Header.Set's).
	h["Traceparent"] = []string{traceparent(c.sc, c.sc.TraceFlags()&(trace.FlagsSampled|trace.FlagsRandom))}
}

// Entry returns the W3C traceparent and tracestate of entry i of the batch
// sent in ctx ("" without tracing or with trace_context = false).
func Entry(ctx context.Context, i int) (traceparent, tracestate string) {
	c := carrierOf(ctx)
	if c == nil || i < 0 || i >= len(c.entries) || !c.entries[i].IsValid() {
		return "", ""
	}
	sc := c.entries[i]
	return Traceparent(sc), sc.TraceState().String()
}

// Traceparent formats sc as a W3C traceparent (version 00).
func Traceparent(sc trace.SpanContext) string {
	return traceparent(sc, sc.TraceFlags())
}

// traceparent formats sc with flags as a W3C traceparent, in one
// allocation.
func traceparent(sc trace.SpanContext, flags trace.TraceFlags) string {
	var b [55]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(flags)})
	return string(b[:])
}

// XRayHeader returns the AWS X-Ray trace header (X-Amzn-Trace-Id, an
// EventBridge entry's TraceHeader) of entry i of the batch sent in ctx, or
// of the request for i < 0; "" without tracing or with trace_context =
// false. The W3C trace id's first 8 hex digits are X-Ray's epoch part, as
// in the OpenTelemetry X-Ray propagator.
func XRayHeader(ctx context.Context, i int) string {
	c := carrierOf(ctx)
	if c == nil || !c.propagate {
		return ""
	}
	sc := c.sc
	if i >= 0 {
		if i >= len(c.entries) {
			return ""
		}
		sc = c.entries[i]
	}
	return XRay(sc)
}

// XRay formats sc as an X-Ray trace header:
// Root=1-xxxxxxxx-xxxxxxxxxxxxxxxxxxxxxxxx;Parent=xxxxxxxxxxxxxxxx;Sampled=1.
func XRay(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	tid := sc.TraceID().String()
	sampled := "0"
	if sc.IsSampled() {
		sampled = "1"
	}
	return "Root=1-" + tid[:8] + "-" + tid[8:] + ";Parent=" + sc.SpanID().String() + ";Sampled=" + sampled
}

// SetHTTPStatus records the HTTP status of the attempt sent in ctx.
func SetHTTPStatus(ctx context.Context, code int) {
	if c := carrierOf(ctx); c != nil && c.span != nil {
		c.span.SetAttributes(semconv.HTTPResponseStatusCode(code))
	}
}

// SetAWSCall records the AWS API call of the attempt sent in ctx (service,
// operation, request id and HTTP status, as the AWS SDK conventions name
// them).
func SetAWSCall(ctx context.Context, service, operation, requestID string, status int) {
	c := carrierOf(ctx)
	if c == nil || c.span == nil {
		return
	}
	as := []attribute.KeyValue{attribute.String("rpc.system.name", "aws-api"), semconv.RPCMethod(service + "/" + operation)}
	if requestID != "" {
		as = append(as, semconv.AWSRequestID(requestID))
	}
	if status > 0 {
		as = append(as, semconv.HTTPResponseStatusCode(status))
	}
	c.span.SetAttributes(as...)
}

// ParseTraceparent parses a W3C traceparent header (version 00); tests and
// receivers use it.
func ParseTraceparent(s string) (trace.SpanContext, error) {
	parts := strings.Split(s, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return trace.SpanContext{}, fmt.Errorf("malformed traceparent %q", s)
	}
	tid, err := trace.TraceIDFromHex(parts[1])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: %w", s, err)
	}
	sid, err := trace.SpanIDFromHex(parts[2])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: %w", s, err)
	}
	flags, err := hex.DecodeString(parts[3])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: %w", s, err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
	if !sc.IsValid() {
		return sc, errors.New("traceparent with a zero trace or span id")
	}
	return sc, nil
}
