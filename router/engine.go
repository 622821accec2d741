package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
)

// Ordering says which deliveries of one sink must happen in stream order.
type Ordering string

// Orderings.
const (
	// OrderKey delivers events for the same document (namespace and
	// documentKey) in stream order; different documents go in parallel.
	OrderKey Ordering = "key"
	// OrderNone lets every event go in parallel.
	OrderNone Ordering = "none"
	// OrderStrict delivers one batch at a time, in stream order.
	OrderStrict Ordering = "strict"
)

// SinkSpec is a sink and how the engine drives it.
type SinkSpec struct {
	Sink        sinks.Sink
	Retry       sinks.RetryPolicy
	Ordering    Ordering
	MaxInFlight int           // concurrent deliveries (partitions), >= 1
	BatchSize   int           // events per Send, 1..Sink.MaxBatch()
	BatchWait   time.Duration // how long to wait to fill a batch
	// ParkAfter is how long a sink may keep failing before its backlog is
	// parked in the dead-letter store (kind "parked") and acknowledged, so
	// the source is not held back by it; parked events are re-driven in
	// order once the sink recovers. Zero disables parking.
	ParkAfter time.Duration
	// ParkBacklog parks earlier when the sink is failing and this many
	// events are queued for it (0: only ParkAfter applies).
	ParkBacklog int
}

// DeadLetters is the part of the dead-letter store the engine uses.
type DeadLetters interface {
	Put(ctx context.Context, e deadletter.Entry) error
	PutMany(ctx context.Context, es []deadletter.Entry) error
	List(ctx context.Context, f deadletter.Filter) ([]deadletter.Entry, error)
	Count(ctx context.Context, f deadletter.Filter) (int64, error)
	Delete(ctx context.Context, id string) (bool, error)
	Convert(ctx context.Context, id string, to deadletter.Kind, reason, lastErr string) error
}

// Engine routes events to sink lanes. Dispatch is called by sources; the
// engine calls each event's ack once every sink it was routed to has
// delivered or durably dead-lettered (or parked) it.
type Engine struct {
	rules   atomic.Pointer[Rules]
	lanes   []*Lane
	dl      DeadLetters
	metrics *metrics.Metrics
	log     *slog.Logger
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

// NewEngine builds the lanes. rules' sink indexes refer to specs in order.
func NewEngine(rules *Rules, specs []SinkSpec, dl DeadLetters, m *metrics.Metrics, log *slog.Logger) (*Engine, error) {
	if m == nil {
		m = metrics.New(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{dl: dl, metrics: m, log: log}
	e.rules.Store(rules)
	for _, sp := range specs {
		l, err := newLane(sp, dl, m, log.With("sink", sp.Sink.Name()))
		if err != nil {
			return nil, err
		}
		e.lanes = append(e.lanes, l)
	}
	return e, nil
}

// Start starts the lanes' workers; they run until ctx is cancelled or Stop.
// Parked backlogs left by a previous run are re-driven.
func (e *Engine) Start(ctx context.Context) {
	ctx, e.cancel = context.WithCancel(ctx)
	for _, l := range e.lanes {
		l.start(ctx, &e.wg)
	}
}

// Stop cancels every delivery in progress and waits for the workers to exit.
// Events not yet acknowledged stay unacknowledged (and so are re-read after a
// restart): call Stop after draining.
func (e *Engine) Stop() {
	if e.cancel != nil {
		e.cancel()
	}
	e.wg.Wait()
	for _, l := range e.lanes {
		_ = l.spec.Sink.Close()
	}
}

// Lanes returns the engine's sink lanes, in spec order.
func (e *Engine) Lanes() []*Lane { return e.lanes }

// Lane returns the lane of the named sink, or nil.
func (e *Engine) Lane(name string) *Lane {
	for _, l := range e.lanes {
		if l.name == name {
			return l
		}
	}
	return nil
}

// Rules returns the routing table in use.
func (e *Engine) Rules() *Rules { return e.rules.Load() }

// Dispatch routes ev and hands it to its sinks' lanes. ack is called exactly
// once, when every sink finished with the event — at once when no rule
// matched. Dispatch does not block on slow sinks (the source's in-flight cap
// bounds memory).
func (e *Engine) Dispatch(ev *event.Event, ack func()) {
	m := e.rules.Load().Route(ev)
	for _, r := range m.Rules {
		e.metrics.EventsMatched.WithLabelValues(ev.Source, r).Inc()
	}
	if len(m.Sinks) == 0 {
		e.metrics.EventsUnmatched.WithLabelValues(ev.Source).Inc()
		ack()
		return
	}
	ev.Rules = m.Rules
	var done func()
	if len(m.Sinks) == 1 {
		done = ack
	} else {
		var remaining atomic.Int32
		remaining.Store(int32(len(m.Sinks)))
		done = func() {
			if remaining.Add(-1) == 0 {
				ack()
			}
		}
	}
	for _, s := range m.Sinks {
		e.lanes[s].enqueue(ev, done)
	}
}

// ErrParked is returned by DeliverNow when the sink is parked: the event must
// be re-driven after the parked backlog to keep order.
var ErrParked = errors.New("sink is parked")

// DeliverNow delivers one event through the named sink with the sink's retry
// policy, synchronously, bypassing the lanes. It is used to replay dead
// letters; it returns the last error when the event could not be delivered.
func (e *Engine) DeliverNow(ctx context.Context, sink string, ev *event.Event) error {
	l := e.Lane(sink)
	if l == nil {
		return fmt.Errorf("unknown sink %q", sink)
	}
	_, err := l.deliver(ctx, []*item{{ev: ev}}, modeReplay)
	return err
}
