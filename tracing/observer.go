package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
)

// This file is the Tracer as the router's observer (observe.Observer and
// observe.Hooks): the router's edges become spans here.

var (
	_ observe.Observer = (*Tracer)(nil)
	_ observe.Hooks    = (*Tracer)(nil)
)

// stateKey is the key of the tracer's state on a change: its *Change, or
// a re-delivery's *redelivery.
var stateKey = observe.NewKey("tracing")

var (
	_ observe.Traced = (*Change)(nil)
	_ observe.Traced = (*redelivery)(nil)
)

// redelivery is the tracer's state on a re-delivered event: its trace.
type redelivery struct {
	observe.Slot
	d *Delivery
}

// Trace returns the change's trace id.
func (c *Change) Trace() (observe.TraceID, bool) {
	sc := c.span.SpanContext()
	return observe.TraceID(sc.TraceID()), sc.IsSampled()
}

// Trace returns the re-delivery's trace id.
func (r *redelivery) Trace() (observe.TraceID, bool) {
	return observe.TraceID(r.d.sc.TraceID()), r.d.sc.IsSampled()
}

// delivery returns the change's delivery to sink (nil: none).
func (c *Change) delivery(sink string) *Delivery {
	if c.rec == nil {
		return &c.unsampled
	}
	for i, n := range c.rec.sinks {
		if n == sink {
			return &c.rec.ds[i]
		}
	}
	return nil
}

// finish counts a sink done with the change: once every one is, the
// change is acknowledged (its root ends).
func (c *Change) finish() {
	if c.Recording() && c.rec.pending.Add(-1) == 0 {
		c.Ack()
	}
}

// changeOf returns ev's change (nil: none).
func changeOf(ev *event.Event) *Change {
	c, _ := stateKey.Get(ev).(*Change)
	return c
}

// changeInfo returns what the spans of ev say about it.
func changeInfo(ev *event.Event) ChangeInfo {
	return ChangeInfo{
		ID: ev.ID, Source: ev.Source, DB: ev.DB, Coll: ev.Coll, Operation: ev.OperationType,
		Size: len(ev.Raw), ClusterT: ev.ClusterTime.T, ClusterI: ev.ClusterTime.I, WallTime: ev.WallTime,
	}
}

// BeforeDispatch starts ev's trace (its root span, where the sampler
// decides) before a Source takes its dispatch lock; what Dispatched and
// the outcomes under the lock record is made into spans by AfterDispatch.
func (t *Tracer) BeforeDispatch(ev *event.Event) {
	if t == nil || stateKey.Get(ev) != nil {
		return
	}
	c := t.StartChange(changeInfo(ev))
	c.HoldSpans()
	stateKey.Set(ev, c)
}

// AfterDispatch makes the spans held since BeforeDispatch.
func (t *Tracer) AfterDispatch(ev *event.Event) {
	changeOf(ev).ReleaseSpans()
}

// Dispatched records the route of a change (its trace starts here when
// BeforeDispatch did not start it) and makes its deliveries; a change
// routed nowhere is acknowledged.
func (t *Tracer) Dispatched(d observe.Dispatch) {
	if t == nil {
		return
	}
	c := changeOf(d.Event)
	if c == nil {
		c = t.StartChange(changeInfo(d.Event))
		stateKey.Set(d.Event, c)
	}
	if !c.Recording() {
		return
	}
	names := make([]string, len(d.Targets))
	ds := make([]Delivery, len(d.Targets))
	now := time.Now()
	for i, s := range d.Targets {
		names[i] = d.Sinks[s].Name
		dl := &ds[i]
		dl.c, dl.ss, dl.created = c, t.sinkSpans(d.Sinks[s].Name, d.Sinks[s].Kind), now
	}
	c.rec.mu.Lock()
	c.rec.ds = ds
	c.rec.mu.Unlock()
	c.rec.pending.Store(int32(len(d.Targets)))
	c.Route(d.Rules, names) // sets rec.sinks
	if len(d.Targets) == 0 {
		c.Ack()
	}
}

// AttemptStart starts the span of a request (StartAttempt) and returns the
// context it is sent with, which carries the trace context to propagate.
// A re-delivery's trace starts with its first attempt.
func (t *Tracer) AttemptStart(ctx context.Context, a observe.Attempt) context.Context {
	if t == nil || len(a.Events) == 0 {
		return ctx
	}
	var one [1]*Delivery
	ds := one[:0]
	if len(a.Events) > 1 {
		ds = make([]*Delivery, 0, len(a.Events))
	}
	for _, ev := range a.Events {
		ds = append(ds, t.deliveryFor(ev, a))
	}
	ctx, _ = t.StartAttempt(ctx, ds, AttemptInfo{Sink: a.Sink.Name, Kind: a.Sink.Kind, Number: a.Number, Propagate: !a.NoTraceContext})
	return ctx
}

// deliveryFor returns the delivery of ev that attempt a is part of,
// starting a re-delivery's trace on its first attempt.
func (t *Tracer) deliveryFor(ev *event.Event, a observe.Attempt) *Delivery {
	switch st := stateKey.Get(ev).(type) {
	case *Change:
		return st.delivery(a.Sink.Name)
	case *redelivery:
		return st.d
	}
	if a.Redelivery == observe.Live {
		return nil // not traced
	}
	d := t.Redelivery(changeInfo(ev), a.Sink.Name, a.Sink.Kind, string(a.Redelivery))
	stateKey.Set(ev, &redelivery{d: d})
	return d
}

// AttemptEnd ends the request's span with its outcome and the time the
// limiter stage held it.
func (t *Tracer) AttemptEnd(ctx context.Context, a observe.Attempt) {
	c := carrierOf(ctx)
	if c == nil || c.att == nil {
		return
	}
	if !a.Admitted.IsZero() {
		c.att.admitted = true
		c.att.span.SetAttributes(attrLimiterWait.Float64(a.Admitted.Sub(a.Start).Seconds()))
	}
	if a.Err == nil {
		c.att.End(nil)
		return
	}
	f := a.Failure
	c.att.End(&f)
}

// Outcome records an outcome of a delivery: a backoff, or how it ended
// (with the store write that parked or dead-lettered it), and
// acknowledges the change once every sink is done with it.
func (t *Tracer) Outcome(o observe.Outcome) {
	if t == nil {
		return
	}
	var c *Change
	var d *Delivery
	switch st := stateKey.Get(o.Event).(type) {
	case *Change:
		c, d = st, st.delivery(o.Sink.Name)
	case *redelivery:
		d = st.d
	default:
		return
	}
	switch o.Kind {
	case observe.Retrying:
		d.Backoff(o.Wait, o.RetryAfter)
		return
	case observe.Skipped:
		c.finish()
		return
	}
	if o.Store.Op != "" {
		d.stored(o.Store, o.Reason)
	}
	if o.Kind != observe.Abandoned {
		d.Outcome(string(o.Kind), o.Reason)
	}
	d.End()
	if c != nil && (o.Kind == observe.Delivered || o.Kind == observe.Parked || o.Kind == observe.DeadLettered) {
		c.finish()
	}
}

// stored makes the span of the store write w (park, dead_letter) that
// ended now, a child of the delivery.
func (d *Delivery) stored(w observe.StoreWrite, reason string) {
	if !d.recording() || d.c == nil { // a re-delivery writes no entry
		return
	}
	d.begin()
	name := d.ss.park
	var opts []trace.SpanStartOption
	if w.Op != "park" {
		name = d.ss.deadLetter
		opts = append(opts, trace.WithAttributes(attrReason.String(reason)))
	}
	_, span := d.c.t.tracer.Start(d.ctx, name, append(opts, trace.WithTimestamp(w.Start))...)
	if w.Failed {
		span.SetStatus(codes.Error, "store write not completed")
	}
	span.End()
}
