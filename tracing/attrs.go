package tracing

import (
	"crypto/sha256"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

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
	park, deadLetter  string // the store writes' spans
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
		park: "park " + sink, deadLetter: "dead_letter " + sink,
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
