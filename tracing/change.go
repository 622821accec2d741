package tracing

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/changegate/changegate/observe"
)

// Change is the trace of one change: its root span runs from the read
// (routing) to the acknowledgement, when every sink is done with it. A nil
// *Change is tracing turned off.
//
// Whether the change is sampled is decided when its root starts
// (StartChange): the spans of an unsampled change's route and deliveries
// are not made (its trace context is still propagated, with the sampled
// flag off, so that the receiver does not sample it either).
type Change struct {
	observe.Slot // kept on the change's event (observer.go)
	t            *Tracer
	ctx          context.Context
	span         trace.Span
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
	// ds are the deliveries to sinks (Dispatched, observer.go), and
	// pending the number of them not finished yet.
	ds      []Delivery
	pending atomic.Int32
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
