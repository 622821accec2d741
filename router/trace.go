package router

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/tracing"
)

// This file holds the router's tracing hooks (package tracing): each is
// called behind a nil check of the engine's or the deliverer's tracer, so
// that with tracing off the delivery path pays one comparison per hook
// and allocates nothing.

// SetTracer turns tracing on with t (nil: off): every change dispatched
// from then on gets a trace, every delivery, attempt, park and dead letter
// a span. Call it before Start.
func (e *Engine) SetTracer(t *tracing.Tracer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tracer = t
	for _, l := range e.state.Load().lanes {
		l.setTracer(t)
	}
}

func (l *Lane) setTracer(t *tracing.Tracer) {
	l.d.tracer = t
}

// changeInfo returns what the spans of ev say about it.
func changeInfo(ev *event.Event) tracing.ChangeInfo {
	return tracing.ChangeInfo{
		ID: ev.ID, Source: ev.Source, DB: ev.DB, Coll: ev.Coll, Operation: ev.OperationType,
		Size: len(ev.Raw), ClusterT: ev.ClusterTime.T, ClusterI: ev.ClusterTime.I, WallTime: ev.WallTime,
	}
}

// BeginDispatch starts ev's trace (its root span, where the sampler
// decides) before a Source takes the dispatch lock to Dispatch it;
// EndDispatch, once the lock is released, makes the spans Dispatch only
// recorded (the route; the root's end when it was acknowledged at once).
// With them a dispatch does no span work under the lock; without them
// Dispatch and DispatchTo do it all. Both do nothing with tracing off.
func (e *Engine) BeginDispatch(ev *event.Event) {
	if e.tracer == nil || ev.Trace != nil {
		return
	}
	ch := e.tracer.StartChange(changeInfo(ev))
	ch.HoldSpans()
	ev.Trace = ch
}

// EndDispatch makes the spans of ev's dispatch: see BeginDispatch.
func (e *Engine) EndDispatch(ev *event.Event) {
	ev.Trace.ReleaseSpans()
}

// traceChange starts ev's trace unless BeginDispatch did (own: the caller
// calls EndDispatch when done) and returns ack, which now also ends it.
func (e *Engine) traceChange(ev *event.Event, ack func()) (_ func(), own bool) {
	if ev.Trace == nil {
		e.BeginDispatch(ev)
		own = true
	}
	ch := ev.Trace
	if !ch.Recording() {
		return ack, own // nothing to end
	}
	return func() {
		ch.Ack()
		ack()
	}, own
}

// traceRoute records the rules that matched ev and the sinks it goes to.
func (e *Engine) traceRoute(st *engineState, ev *event.Event, rules []string, targets []int) {
	if !ev.Trace.Recording() {
		return
	}
	names := make([]string, len(targets))
	for i, s := range targets {
		names[i] = st.lanes[s].name
	}
	ev.Trace.Route(rules, names)
}

// startAttempt starts the span of an attempt for items and returns the
// context Send gets (with the trace context the sink propagates unless
// trace_context = false).
func (d *deliverer) startAttempt(ctx context.Context, items []*item) (context.Context, *tracing.Attempt) {
	ds := make([]*tracing.Delivery, len(items))
	for i, it := range items {
		ds[i] = it.trace
	}
	return d.tracer.StartAttempt(ctx, ds, tracing.AttemptInfo{
		Sink: d.name, Kind: d.kind, Number: int(items[0].attempts), Propagate: !d.noTraceContext,
	})
}

// endAttempt ends an attempt's span with Send's outcome.
func endAttempt(a *tracing.Attempt, err error) {
	if a == nil {
		return
	}
	if err == nil {
		a.End(nil)
		return
	}
	f := &tracing.Failure{Reason: "error"}
	var be *sinks.BatchError
	switch {
	case errors.Is(err, errTenureEnded):
		f.Reason = "tenure_ended"
	case errors.As(err, &be):
		f.Reason, f.Entries = "partial", len(be.Failed)
	default:
		if de, ok := sinks.Classify(err); ok {
			f.Reason, f.Permanent, f.RetryAfter = de.Reason, de.Permanent, de.RetryAfter
		} else {
			f.Reason = "canceled"
		}
	}
	a.End(f)
}

// observeDuration observes one request's duration, with the attempt's
// trace id as the exemplar when it is sampled.
func observeDuration(o prometheus.Observer, seconds float64, a *tracing.Attempt) {
	if id, ok := a.TraceID(); ok {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(seconds, prometheus.Labels{"trace_id": id})
			return
		}
	}
	o.Observe(seconds)
}

// tracingReason is a dead letter's reason as a span attribute.
func tracingReason(reason string) attribute.KeyValue {
	return attribute.String("changegate.reason", reason)
}

// persistErr is the error a store step's span ends with.
func persistErr(ok bool) error {
	if ok {
		return nil
	}
	return errStoreWrite
}

var errStoreWrite = errors.New("store write not completed (stopping, or refused: fenced)")
