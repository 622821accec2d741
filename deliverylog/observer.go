package deliverylog

import (
	"context"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
)

// Observer turns the router's edges into records for a Writer: one per
// request at AttemptEnd (a success only in mode "all"; a failure as
// OutcomeFailed with its status, code, class, answer and duration), and
// one per event at the outcome edges that follow a failure or need no
// request: retrying, parked, dead_lettered, skipped, abandoned (a lost
// lease or a stop) and a replay that failed. Delivered edges make no
// record: the successful attempt is the record. A nil Writer (mode "off")
// makes none; in mode "failures" a success costs one comparison.
type Observer struct {
	w *Writer
}

var _ observe.Observer = (*Observer)(nil)

// NewObserver returns an Observer writing to w, or nil when w is nil (an
// observer the router need not call).
func NewObserver(w *Writer) observe.Observer {
	if w == nil {
		return nil
	}
	return &Observer{w: w}
}

// Dispatched records nothing: a change's routing is not an attempt.
func (o *Observer) Dispatched(observe.Dispatch) {}

// AttemptStart returns ctx: the log propagates nothing.
func (o *Observer) AttemptStart(ctx context.Context, _ observe.Attempt) context.Context { return ctx }

// AttemptEnd records the request: delivered, or failed.
func (o *Observer) AttemptEnd(_ context.Context, a observe.Attempt) {
	outcome := OutcomeDelivered
	if a.Err != nil {
		outcome = OutcomeFailed
	}
	if !o.w.Wants(outcome) || len(a.Events) == 0 {
		return
	}
	r := FromBatch(a.Events, a.Sink.Name)
	r.Attempt, r.Outcome, r.Duration, r.Redelivery = a.Number, outcome, a.Duration, string(a.Redelivery)
	if a.Err != nil {
		r.Error = a.Err.Error()
		failure(&r, a.Failure)
	}
	trace(&r, a.Events[0])
	o.w.Enqueue(r)
}

// Outcome records the edges a request's record does not tell.
func (o *Observer) Outcome(oc observe.Outcome) {
	var outcome Outcome
	switch oc.Kind {
	case observe.Retrying:
		outcome = OutcomeRetrying
	case observe.Parked:
		outcome = OutcomeParked
	case observe.DeadLettered:
		outcome = OutcomeDeadLettered
	case observe.Skipped:
		outcome = OutcomeSkipped
	case observe.Dropped, observe.Abandoned:
		outcome = OutcomeAbandoned
	case observe.Failed:
		outcome = OutcomeFailed
	default: // Delivered: its attempt's record
		return
	}
	if !o.w.Wants(outcome) || oc.Event == nil {
		return
	}
	r := FromEvent(oc.Event, oc.Sink.Name)
	r.Attempt, r.Outcome, r.Redelivery = oc.Attempts, outcome, string(oc.Redelivery)
	failure(&r, oc.Failure)
	if oc.Reason != "" {
		r.ErrorClass = oc.Reason
	}
	trace(&r, oc.Event)
	o.w.Enqueue(r)
}

func failure(r *Record, f observe.Failure) {
	r.Status, r.Code, r.ErrorClass, r.Response = f.Status, f.Code, f.Reason, f.Answer
}

// trace sets the record's trace id when its (first) event is traced and
// the trace is recorded.
func trace(r *Record, ev *event.Event) {
	if id, sampled, ok := observe.TraceOf(ev); ok && sampled {
		r.TraceID = id.String()
	}
}
