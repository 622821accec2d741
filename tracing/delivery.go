package tracing

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

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
