package router

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/sinks"
)

// This file holds the router's edges (package observe): the engine tells
// its observer about a change once when it is dispatched, twice per
// request (before, so that the trace context goes into it, and after),
// and once per outcome of each event for each sink. Each call is behind a
// nil check: with no observer the delivery path pays one comparison per
// edge and allocates nothing.

// SetObserver sets what the engine tells about the changes it dispatches
// and delivers (nil: nothing; observe.Fanout combines several: tracing,
// ...). Call it before Start.
func (e *Engine) SetObserver(o observe.Observer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.obs = o
	e.hooks, _ = o.(observe.Hooks)
	for _, l := range e.state.Load().lanes {
		l.setObserver(o)
	}
}

func (l *Lane) setObserver(o observe.Observer) {
	if o == nil {
		l.d.obs = nil
		return
	}
	sink := observe.Sink{Name: l.name, Kind: l.spec.Kind}
	x := &laneEdges{}
	for i, r := range [...]observe.Redelivery{observe.Live, observe.Redrive, observe.Replay} {
		x.e[i] = edges{o: o, sink: sink, redelivery: r, noTraceContext: l.spec.NoTraceContext}
	}
	l.d.obs = x
}

// BeginDispatch is called by a Source before it takes its dispatch lock to
// Dispatch ev, EndDispatch once it released it: they call the observer's
// observe.Hooks, if it has them (tracing makes its spans there, not under
// the lock). Both do nothing without.
func (e *Engine) BeginDispatch(ev *event.Event) {
	if e.hooks != nil {
		e.hooks.BeforeDispatch(ev)
	}
}

// EndDispatch: see BeginDispatch.
func (e *Engine) EndDispatch(ev *event.Event) {
	if e.hooks != nil {
		e.hooks.AfterDispatch(ev)
	}
}

// dispatched is the dispatch edge: ev was routed by rules to targets.
func (e *Engine) dispatched(st *engineState, ev *event.Event, rules []string, targets []int) {
	e.obs.Dispatched(observe.Dispatch{Event: ev, Rules: rules, Targets: targets, Sinks: st.sinks})
}

// sinksOf returns the observers' view of lanes.
func sinksOf(lanes []*Lane) []observe.Sink {
	out := make([]observe.Sink, len(lanes))
	for i, l := range lanes {
		out[i] = observe.Sink{Name: l.name, Kind: l.spec.Kind}
	}
	return out
}

// laneEdges are a lane's edges, one per kind of delivery (observe.Live,
// Redrive, Replay); nil: no observer.
type laneEdges struct{ e [3]edges }

func (x *laneEdges) live() *edges    { return x.edge(0) }
func (x *laneEdges) redrive() *edges { return x.edge(1) }
func (x *laneEdges) replay() *edges  { return x.edge(2) }

func (x *laneEdges) edge(i int) *edges {
	if x == nil {
		return nil
	}
	return &x.e[i]
}

// edges is what one sink tells its observer about one kind of delivery.
// An item keeps its own (item.obs: nil without an observer), so that its
// release can tell an outcome it never had (abandoned).
type edges struct {
	o              observe.Observer
	sink           observe.Sink
	redelivery     observe.Redelivery
	noTraceContext bool
}

// attemptStart is the edge before a request for items (evs): it returns
// the record for attemptEnd and the context to send with.
func (x *edges) attemptStart(ctx context.Context, items []*item, evs []*event.Event, now time.Time) (context.Context, observe.Attempt) {
	a := observe.Attempt{
		Sink: x.sink, Events: evs, Number: int(items[0].attempts), Redelivery: x.redelivery,
		NoTraceContext: x.noTraceContext, Start: now,
	}
	return x.o.AttemptStart(ctx, a), a
}

// attemptEnd is the edge after the request of a, which ended with err.
func (x *edges) attemptEnd(ctx context.Context, a *observe.Attempt, err error) {
	a.Err = err
	if err != nil {
		a.Failure = failureOf(err)
	}
	x.o.AttemptEnd(ctx, *a)
}

// failureOf classifies an attempt's error for the observers.
func failureOf(err error) observe.Failure {
	var be *sinks.BatchError
	switch {
	case errors.Is(err, errTenureEnded):
		return observe.Failure{Reason: "tenure_ended"}
	case errors.As(err, &be):
		return observe.Failure{Reason: "partial", Entries: len(be.Failed)}
	}
	if de, ok := sinks.Classify(err); ok {
		return observe.ErrorFailure(de)
	}
	return observe.Failure{Reason: "canceled"}
}

// outcome is the outcome edge of it: final outcomes mark it finished, so
// that its release does not report it abandoned.
func (x *edges) outcome(it *item, o observe.Outcome) {
	if o.Kind != observe.Retrying {
		it.finished = true
	}
	o.Sink, o.Event, o.Attempts, o.Redelivery = x.sink, it.ev, int(it.attempts), x.redelivery
	x.o.Outcome(o)
}

// retrying is the outcome edge of items whose next attempt is in wait.
func (x *edges) retrying(items []*item, wait time.Duration, de *sinks.Error) {
	f := observe.ErrorFailure(de)
	for _, it := range items {
		x.outcome(it, observe.Outcome{Kind: observe.Retrying, Wait: wait, RetryAfter: de.RetryAfter, Failure: f})
	}
}

// stored is the outcome edge of items whose write to the store (op, from
// start) made them kind (parked, dead-lettered: ok), or did not complete
// (abandoned).
func (x *edges) stored(items []*item, kind observe.Kind, reason, op string, start time.Time, ok bool) {
	w := observe.StoreWrite{Op: op, Start: start, Failed: !ok}
	if !ok {
		kind = observe.Abandoned
	}
	for _, it := range items {
		x.outcome(it, observe.Outcome{Kind: kind, Reason: reason, Store: w})
	}
}

// abandon reports it abandoned unless it had a final outcome (it is let go
// unfinished: shutdown, a lost tenure, a re-drive that stopped).
func (it *item) abandon() {
	if it.obs != nil && !it.finished {
		it.obs.outcome(it, observe.Outcome{Kind: observe.Abandoned})
	}
}

// skipped is the outcome edge of v, which the sink's shape skips.
func (l *Lane) skipped(v *event.Event) {
	if x := l.d.obs.live(); x != nil {
		x.o.Outcome(observe.Outcome{Kind: observe.Skipped, Sink: x.sink, Event: v, Reason: "skipped_empty"})
	}
}

// observeDuration observes one request's duration, with the trace id of
// its first event as the exemplar when it is sampled.
func observeDuration(o prometheus.Observer, seconds float64, x *edges, ev *event.Event) {
	if x != nil {
		if id, sampled, _ := observe.TraceOf(ev); sampled {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(seconds, prometheus.Labels{"trace_id": id.String()})
				return
			}
		}
	}
	o.Observe(seconds)
}
