package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/changegate/changegate/observe"
)

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
		c.att, c.span, c.sc = a, a.span, a.span.SpanContext()
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

// Failure is an attempt's classified failure (its reason, not its text):
// the router's (observe.Failure).
type Failure = observe.Failure

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
