// Package observe is the seam between the router and what watches it
// deliver: tracing (package tracing), and whatever else records what
// happened to a change (a delivery log, ...). The router calls an Observer
// at the edges of a change's way through it, and nowhere else:
//
//   - Dispatched, once per change entering dispatch, with the rules that
//     matched it and the sinks it is handed to;
//   - AttemptStart and AttemptEnd around each request to a sink (one
//     event, or a batch): the context AttemptStart returns is the one the
//     request is sent with (the trace context goes into it there), and
//     AttemptEnd has the request's result;
//   - Outcome, once per event and sink at each outcome edge: delivered, a
//     retry scheduled, parked, dead-lettered, skipped by shaping, dropped
//     with a lost lease, abandoned (shutdown), and the outcomes of
//     re-deliveries (re-drives of parked entries, replays of dead
//     letters).
//
// An Observer is called on the delivery path, from the source's dispatch
// lock (Dispatched) and the lanes' workers: its methods must return
// quickly and never block (one that writes somewhere hands its records to
// a goroutine through a bounded queue, and drops and counts what does not
// fit). Records are passed by value, and the slices and events they refer
// to are the router's: valid during the call only, never to be modified;
// copy what is kept. With no observer the router calls nothing and
// allocates nothing for them.
//
// Several observers are combined with Fanout. An observer that keeps state
// per change (a trace) keeps it on the event with a Key.
package observe

import (
	"context"
	"encoding/hex"
	"errors"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// Observer is told what happens to changes at the router's stage edges
// (see the package documentation). Its methods are called concurrently.
type Observer interface {
	// Dispatched is called once for every change the router dispatches,
	// after routing and before the change is handed to any sink, under
	// the source's dispatch lock: record, do not work (see Hooks).
	Dispatched(d Dispatch)
	// AttemptStart is called before a request is made for a.Events and
	// returns the context the request is made with (ctx or one derived
	// from it: what the sink propagates, such as the trace context).
	AttemptStart(ctx context.Context, a Attempt) context.Context
	// AttemptEnd is called once the request of AttemptStart ended (or
	// was given up before it was sent), with ctx the context AttemptStart
	// returned and a's result fields set.
	AttemptEnd(ctx context.Context, a Attempt)
	// Outcome is called at each outcome edge of one event for one sink.
	Outcome(o Outcome)
}

// Hooks is implemented by an Observer with work to do for a change
// outside its source's dispatch lock (tracing starts the change's root
// span there, and makes the spans Dispatched only recorded): a Source
// calls BeforeDispatch before it takes the lock and AfterDispatch once it
// released it (through the router's Engine.BeginDispatch and
// EndDispatch), whether the change was dispatched or not. Changes
// dispatched without a Source (backfills, replays, tests) get neither:
// Dispatched is then the first call.
type Hooks interface {
	BeforeDispatch(ev *event.Event)
	AfterDispatch(ev *event.Event)
}

// Sink names a sink of the router and its type (webhook, sqs, kafka, ...).
type Sink struct {
	Name, Kind string
}

// Dispatch is a change entering dispatch, routed.
type Dispatch struct {
	// Event is the change as read (not shaped for any sink).
	Event *event.Event
	// Rules are the names of the rules that matched it, in config order.
	Rules []string
	// Targets are the indexes in Sinks of the sinks it is handed to, in
	// order; none: the change is acknowledged at once. A sink whose
	// shape skips the change is a target too (Outcome Skipped follows).
	Targets []int
	// Sinks are every sink of the router, in config order.
	Sinks []Sink
}

// Redelivery says why an event is delivered again from the store.
type Redelivery string

// Redeliveries.
const (
	Live    Redelivery = ""        // delivered from the stream (or a backfill)
	Redrive Redelivery = "redrive" // a parked entry re-driven
	Replay  Redelivery = "replay"  // a dead letter replayed by an operator
)

// Attempt is one request to a sink, for one event or a batch.
type Attempt struct {
	Sink Sink
	// Events are the events of the request as the sink gets them (shaped
	// for it), in request order.
	Events []*event.Event
	// Number is the attempt's number for Events[0] (1: the first try).
	// The events of a batch share their history (they are retried
	// together), but for re-driven entries, which each keep their own.
	Number     int
	Redelivery Redelivery
	// NoTraceContext: the sink's trace_context = false (nothing is
	// propagated to the receiver).
	NoTraceContext bool
	// Start is when the attempt started (before the limiter stage), by
	// the router's clock.
	Start time.Time

	// Set for AttemptEnd:

	// Admitted is when the limiter stage admitted the request (zero:
	// not admitted, or the sink has none).
	Admitted time.Time
	// Duration is how long the request took (zero: it was not sent).
	Duration time.Duration
	// Err is what the attempt ended with: nil when the sink accepted
	// every event, a *sinks.BatchError when some entries failed (one
	// *sinks.Error each, by index), else the whole request's error.
	// Failure is its classification.
	Err     error
	Failure Failure
}

// EntryFailure returns the failure of a.Events[i] in the attempt's
// result: its entry's of a batch that failed in part (ok false for an
// entry that was accepted), the request's otherwise (ok false when it
// succeeded).
func (a Attempt) EntryFailure(i int) (f Failure, ok bool) {
	var be *sinks.BatchError
	switch {
	case a.Err == nil:
		return Failure{}, false
	case errors.As(a.Err, &be):
		err, failed := be.Failed[i]
		if !failed {
			return Failure{}, false
		}
		if de, ok := sinks.Classify(err); ok {
			return ErrorFailure(de), true
		}
		return Failure{Reason: "canceled"}, true
	}
	return a.Failure, true
}

// ErrorFailure returns the Failure of a sink's error.
func ErrorFailure(de *sinks.Error) Failure {
	if de == nil {
		return Failure{}
	}
	return Failure{Reason: de.Reason, Permanent: de.Permanent, RetryAfter: de.RetryAfter,
		Status: de.Status, Code: de.Code, Answer: de.Answer}
}

// Failure is a failed attempt's classification: its reason and what the
// receiver answered, never the events' data.
type Failure struct {
	// Reason is the failure's class, as changegate_delivery_failures_total
	// labels it ("http_503", "transport", "throttled", ...), or "partial"
	// (some entries of a batch failed: Entries of them), "tenure_ended"
	// (cluster mode: the lease was lost), "canceled" (stopping).
	Reason     string
	Permanent  bool
	RetryAfter time.Duration
	// Entries is the number of failed entries of a batch (0: the whole
	// request failed).
	Entries int
	// Status is the HTTP status of the receiver's answer (0: none).
	Status int
	// Code is the error code of an AWS or Kafka answer ("" : none).
	Code string
	// Answer is a printable excerpt of the receiver's answer (at most
	// sinks.MaxAnswer bytes; "" when the sink has none).
	Answer string
}

// Kind is what happened to an event at an outcome edge.
type Kind string

// Outcomes. Delivered, Parked, DeadLettered and Skipped finish the
// event for the sink (once every sink finished it, it is acknowledged);
// Dropped and Abandoned leave it unacknowledged (delivered again by the
// next owner or after a restart); Retrying is not final.
const (
	Delivered    Kind = "delivered"
	Retrying     Kind = "retrying"      // a retry is scheduled: Wait, RetryAfter, Failure
	Parked       Kind = "parked"        // written to the store as a parked entry
	DeadLettered Kind = "dead_lettered" // written to the store as a failed dead letter (Reason)
	Skipped      Kind = "skipped"       // the sink's shape left nothing to send (skip_empty_updates)
	Dropped      Kind = "dropped"       // cluster mode: the lease of the event's unit was lost
	Abandoned    Kind = "abandoned"     // the lane let it go unfinished (shutdown, a store write not completed)
	Failed       Kind = "failed"        // a replay that did not deliver it (the error goes to the operator)
)

// Outcome is one event's outcome for one sink.
type Outcome struct {
	Kind Kind
	Sink Sink
	// Event is the event as the sink gets it (shaped for it). Its
	// DocumentKey is the key the sink sends: shapes never change a
	// documentKey (docs/shaping.md), and nothing redacted is in it.
	Event *event.Event
	// Attempts is the number of attempts made so far.
	Attempts   int
	Redelivery Redelivery
	// Reason is why: a dead letter's reason ("exhausted", "oversize",
	// the permanent failure's class), "lease_lost" for Dropped.
	Reason string
	// Failure is the failure that made the outcome (Retrying; Failed and
	// DeadLettered of a re-delivery): its reason, status, code and
	// answer. A live DeadLettered has its last attempt's in AttemptEnd.
	Failure Failure
	// Wait is the backoff before the next attempt (Retrying), and
	// RetryAfter the receiver's Retry-After within it.
	Wait, RetryAfter time.Duration
	// Store is the store write of a Parked or DeadLettered outcome, or of
	// an Abandoned one whose write did not complete.
	Store StoreWrite
}

// StoreWrite is a write to the dead-letter store an outcome made.
type StoreWrite struct {
	// Op is "park" or "dead_letter" ("": no write).
	Op string
	// Start is when the write started (real time).
	Start time.Time
	// Failed: the write did not complete (stopping, or fenced).
	Failed bool
}

// TraceID is a trace's id (W3C, 16 bytes).
type TraceID [16]byte

// String returns the id in hex, as W3C and OpenTelemetry write it.
func (t TraceID) String() string { return hex.EncodeToString(t[:]) }

// Traced is implemented by the state an observer keeps on a change (Key)
// when it traces it: Trace returns the change's trace id and whether the
// trace is sampled (recorded).
type Traced interface {
	Trace() (id TraceID, sampled bool)
}

// TraceOf returns the trace id of ev and whether it is sampled, from the
// state of the first observer that traces it; ok is false when none does.
// A batch's request belongs to the trace of its first event.
func TraceOf(ev *event.Event) (id TraceID, sampled, ok bool) {
	for o := ev.Observed; o != nil; o = o.Next {
		if t, is := o.State.(Traced); is {
			id, sampled = t.Trace()
			return id, sampled, true
		}
	}
	return TraceID{}, false, false
}
