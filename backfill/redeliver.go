package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// Redelivery from the oplog: a change read again from its source's change
// stream, opened at the change's cluster time (startAtOperationTime, which
// includes it: resumeAfter its token would skip it), matched by its event
// id, routed and shaped by today's rules, and delivered once more, with the
// same id, to one sink only. Nothing is checkpointed; no other sink sees it.

// Redelivery errors, each wrapped with the details.
var (
	// ErrUnknownSink: the configuration has no sink of that name.
	ErrUnknownSink = errors.New("unknown sink")
	// ErrGone: the change is older than the oldest change MongoDB keeps
	// in its oplog (it answered ChangeStreamHistoryLost); it wraps
	// source.ErrHistoryLost too.
	ErrGone = errors.New("the change is no longer in the oplog")
	// ErrNoChange: the oplog holds the change's cluster time but no
	// change of that id in the source's stream.
	ErrNoChange = errors.New("no such change in the oplog")
	// ErrDelivery: the sink did not take the change (its retry policy
	// exhausted or a permanent refusal); nothing was dead-lettered.
	ErrDelivery = errors.New("redelivery failed")
)

// Redelivered is what a redelivery of one change did.
type Redelivered struct {
	ID            string    `json:"id"`
	Source        string    `json:"source"`
	Sink          string    `json:"sink"`
	OperationType string    `json:"operationType"`
	Namespace     string    `json:"ns"`
	ClusterTime   time.Time `json:"clusterTime"`
	// Rules are today's rules that route the change to the sink.
	Rules []string `json:"rules"`
	// State is "delivered".
	State string `json:"state"`
}

// Streams returns the change stream of a source as its units open it
// (source.Spec, for the whole source: no partition), false for a source
// the configuration does not have.
type Streams func(source string) (source.Spec, bool)

// RedeliverEvent reads the change with event id again from its source's
// oplog and delivers it once more to sink, with the same id, routed and
// shaped by today's rules as a dead-letter replay is (router.Engine
// DeliverNow: synchronously, with the sink's retry policy, refused while
// the sink is parked, router.ErrParked, and for a change no current rule
// routes to the sink, deadletter.ErrNotRouted). Errors: ErrInput (an id
// that holds no stream position, an unknown source), ErrUnknownSink,
// ErrGone (no longer in the oplog), ErrNoChange, ErrDelivery.
func (b *Runner) RedeliverEvent(ctx context.Context, id, sink string) (Redelivered, error) {
	src, data, ok := event.SplitID(id)
	if !ok {
		return Redelivered{}, fmt.Errorf("%w: event id %q: expected <source>:<resume token>", ErrInput, id)
	}
	ct, ok := event.DataClusterTime(data)
	if !ok {
		return Redelivered{}, fmt.Errorf("%w: event id %q holds no position in the change stream (a snapshot or backfill event): only changes can be read again from the oplog", ErrInput, id)
	}
	if !b.target.hasSink(sink) {
		return Redelivered{}, fmt.Errorf("%w %q", ErrUnknownSink, sink)
	}
	var spec source.Spec
	if b.streams != nil {
		spec, ok = b.streams(src)
	}
	if !ok {
		return Redelivered{}, fmt.Errorf("%w: event id %q: unknown source %q", ErrInput, id, src)
	}
	spec.Budget = b.budget
	var found *event.Event
	err := source.Reread(ctx, b.client, spec, ct, func(ev *event.Event, at bson.Timestamp) (bool, error) {
		switch {
		case ev == nil:
			return false, nil // read everything there is: not found
		case ev.ID == id:
			ev.Mem.Retain(1)
			found = ev
			return false, nil
		default:
			// A transaction's changes share its cluster time.
			return !ev.ClusterTime.After(ct), nil
		}
	})
	if errors.Is(err, source.ErrHistoryLost) {
		return Redelivered{}, fmt.Errorf("%w: %s (cluster time %s): %w", ErrGone, id, formatCT(ct), err)
	}
	if err != nil {
		return Redelivered{}, fmt.Errorf("redeliver %s: read the oplog: %w", id, err)
	}
	if found == nil {
		return Redelivered{}, fmt.Errorf("%w: the oplog holds cluster time %s but the stream of source %s has no change %s there (filtered out by the source's pipeline?)", ErrNoChange, formatCT(ct), src, id)
	}
	defer found.Mem.Release()
	out := Redelivered{ID: id, Source: src, Sink: sink, OperationType: found.OperationType, Namespace: found.DB + "." + found.Coll,
		ClusterTime: time.Unix(int64(ct.T), 0).UTC()}
	if err := b.target.deliverNow(ctx, sink, found); err != nil {
		if isRefusal(err) {
			return out, err
		}
		return out, fmt.Errorf("%w: %s to sink %s: %w", ErrDelivery, id, sink, err)
	}
	out.Rules, out.State = found.Rules, "delivered"
	if out.Rules == nil {
		out.Rules = []string{}
	}
	b.log.Info("redelivered a change from the oplog", "id", id, "sink", sink, "rules", out.Rules)
	return out, nil
}

func formatCT(ct bson.Timestamp) string {
	return fmt.Sprintf("%d.%d, %s", ct.T, ct.I, time.Unix(int64(ct.T), 0).UTC().Format(time.RFC3339))
}

// isRefusal reports whether err is the engine's refusal to deliver a
// change now (not routed there by today's rules, or the sink parked)
// rather than a failed delivery.
func isRefusal(err error) bool {
	return errors.Is(err, deadletter.ErrNotRouted) || errors.Is(err, router.ErrParked)
}
