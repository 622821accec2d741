package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/changegate/changegate/event"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// ErrHeldBack is reported (wrapped, in ReplayResult.Errors) for an entry that
// Replay did not deliver because an earlier entry of the same document and
// sink failed during the same replay: delivering it would break
// per-document order.
var ErrHeldBack = errors.New("held back behind a failed entry of the same document")

// ReplayResult reports what Replay did.
type ReplayResult struct {
	// Replayed entries were delivered and deleted.
	Replayed int
	// Failed entries could not be delivered; they stay in the store with
	// their attempts, lastError and lastFailedAt updated.
	Failed int
	// Skipped entries were not attempted: gaps, entries stored without their
	// change (ErrNotReplayable) and entries held back behind a failed entry
	// of the same document and sink (ErrHeldBack). They stay in the store.
	Skipped int
	// Errors holds one error per failed entry, and per skipped entry except
	// gaps, each naming the entry.
	Errors []error
}

// Replay re-delivers the failed entries matching f through deliver and
// deletes each entry only after deliver returned nil for it; an entry whose
// delivery fails again stays, with attempts, lastError and lastFailedAt
// updated (attempts grows by one, or by the n of an error that has an
// Attempts() int method).
//
// deliver performs the whole sink delivery, retries included; it receives
// the entry's sink name and the event rebuilt from the stored change (with
// the entry's rules). Entries are replayed one at a time in stream order
// (ClusterTime, then Order, then ID), at most f.Limit of them; once an
// entry fails, later entries of the same document and sink are held back
// so that per-document order is kept.
//
// f.Kind selects what is replayed: failed entries when it is empty or
// KindFailed (an empty Kind also counts the matching gaps as skipped);
// KindGap only counts gaps as skipped. Parked entries belong to the running
// gateway's automatic re-drive: asking for KindParked is an error. AfterID
// is ignored.
//
// Two replays of the same entries at once may both deliver an entry (still
// at least once); callers serialize replays if that matters.
//
// Replay returns a non-nil error, with the result so far, only when it had
// to stop: ctx ended or the store failed. Delivery failures are reported in
// the result.
func (s *Store) Replay(ctx context.Context, f Filter, deliver func(ctx context.Context, sink string, e *event.Event) error) (ReplayResult, error) {
	var res ReplayResult
	kinds := bson.A{KindFailed}
	switch f.Kind {
	case "":
		kinds = bson.A{KindFailed, KindGap}
	case KindFailed:
	case KindGap:
		kinds = bson.A{KindGap}
	case KindParked:
		return res, errors.New("dead letters: replay: parked entries are re-driven by the running gateway, not replayed")
	default:
		return res, fmt.Errorf("dead letters: replay: invalid kind %q", f.Kind)
	}
	f.Kind = ""
	q, err := f.query()
	if err != nil {
		return res, fmt.Errorf("dead letters: replay: %w", err)
	}
	q = append(q, bson.E{Key: "kind", Value: bson.D{{Key: "$in", Value: kinds}}})

	// Collect the ids first: deliveries can take long, longer than a
	// server-side cursor may stay idle.
	opts := options.Find().
		SetSort(streamOrder).
		SetProjection(bson.D{{Key: "_id", Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := s.coll.Find(ctx, q, opts)
	if err != nil {
		return res, fmt.Errorf("dead letters: replay: %w", err)
	}
	var ids []string
	for cur.Next(ctx) {
		if id, ok := cur.Current.Lookup("_id").StringValueOK(); ok {
			ids = append(ids, id)
		}
	}
	err = cur.Err()
	_ = cur.Close(ctx)
	if err != nil {
		return res, fmt.Errorf("dead letters: replay: %w", err)
	}

	failedKeys := map[string]bool{}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
		e, ok, err := s.Get(ctx, id)
		if err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
		if !ok || (e.Kind != KindFailed && e.Kind != KindGap) {
			continue // deleted or converted since it was listed
		}
		if e.Kind == KindGap {
			res.Skipped++
			continue
		}
		key := e.Sink + "\x00" + e.Namespace + "\x00" + string(e.DocumentKey)
		if failedKeys[key] {
			res.Skipped++
			res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", id, ErrHeldBack))
			continue
		}
		ev, err := e.Event()
		if err != nil {
			res.Errors = append(res.Errors, err)
			if errors.Is(err, ErrNotReplayable) {
				res.Skipped++
			} else {
				res.Failed++
			}
			// Not held back: this entry can never be delivered.
			continue
		}
		derr := deliver(ctx, e.Sink, ev)
		if derr == nil {
			if _, err := s.Delete(ctx, id); err != nil {
				// Delivered but still stored: a later replay delivers it
				// again (at least once).
				return res, fmt.Errorf("dead letters: replay: %w", err)
			}
			res.Replayed++
			continue
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
		res.Failed++
		res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: sink %s: %w", id, e.Sink, derr))
		failedKeys[key] = true
		if err := s.recordFailure(ctx, id, derr); err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
	}
	return res, nil
}

// recordFailure updates a failed entry after another failed delivery.
func (s *Store) recordFailure(ctx context.Context, id string, derr error) error {
	n := 1
	var counted interface{ Attempts() int }
	if errors.As(derr, &counted) && counted.Attempts() > 0 {
		n = counted.Attempts()
	}
	_, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "lastError", Value: derr.Error()},
			{Key: "lastFailedAt", Value: time.Now().UTC()},
		}},
		{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int64(n)}}},
	})
	if err != nil {
		return fmt.Errorf("dead letter %s: record failure: %w", id, err)
	}
	return nil
}
