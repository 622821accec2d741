package subscription

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// DefaultPurgeCollection holds the purges that deletions schedule: what a
// deleted subscription parked or dead-lettered is removed once its grace
// period (delete_grace) is over.
const DefaultPurgeCollection = "subscriptions_purges"

// PurgeFormatVersion is the "version" of the purge documents this release
// writes.
const PurgeFormatVersion = 1

// Purge is the removal of a deleted subscription's parked and dead-lettered
// entries (those of its sink, named after it), due at PurgeAt.
type Purge struct {
	ID        bson.ObjectID
	Sink      string
	Revision  int64 // the subscription's last revision, when it was deleted
	DeletedAt time.Time
	PurgeAt   time.Time
}

type purgeRecord struct {
	ID        bson.ObjectID `bson:"_id"`
	Version   int           `bson:"version"`
	Sink      string        `bson:"sink"`
	Revision  int64         `bson:"rev"`
	DeletedAt time.Time     `bson:"deletedAt"`
	PurgeAt   time.Time     `bson:"purgeAt"`
}

// DuePurges returns the purges due at now, oldest first (at most 100).
func (s *Store) DuePurges(ctx context.Context, now time.Time) ([]Purge, error) {
	cur, err := s.purges.Find(ctx, bson.D{{Key: "purgeAt", Value: bson.D{{Key: "$lte", Value: now}}}},
		options.Find().SetSort(bson.D{{Key: "purgeAt", Value: 1}}).SetLimit(100))
	if err != nil {
		return nil, fmt.Errorf("subscriptions: purges: %w", err)
	}
	var recs []purgeRecord
	if err := cur.All(ctx, &recs); err != nil {
		return nil, fmt.Errorf("subscriptions: purges: %w", err)
	}
	out := make([]Purge, 0, len(recs))
	for _, r := range recs {
		if r.Version > PurgeFormatVersion {
			// Written by a newer release: left to it.
			continue
		}
		out = append(out, Purge{ID: r.ID, Sink: r.Sink, Revision: r.Revision, DeletedAt: r.DeletedAt, PurgeAt: r.PurgeAt})
	}
	return out, nil
}

// PurgeDone removes the purge id once it is done (or given up).
func (s *Store) PurgeDone(ctx context.Context, id bson.ObjectID) error {
	if _, err := s.purges.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		return fmt.Errorf("subscriptions: purge %s: %w", id.Hex(), err)
	}
	return nil
}

// PurgeSink removes the parked and dead-lettered entries of sink and
// returns how many (the dead-letter store's Purge with a sink filter).
type PurgeSink func(ctx context.Context, sink string) (int64, error)

// RunPurges carries out the due purges every interval until ctx ends: the
// entries of the deleted subscription's sink are removed, unless its name
// was taken again meanwhile (taken: a new subscription of that name, or a
// sink of the operator's file), whose entries they now are to it; then
// the purge is done. Every replica runs it: the removal is idempotent.
func (s *Store) RunPurges(ctx context.Context, every time.Duration, purge PurgeSink, taken func(name string) bool, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.purgeDue(ctx, purge, taken, log); err != nil && ctx.Err() == nil {
			log.Warn("subscriptions: purging what deleted subscriptions left failed; retried later", "err", err)
		}
	}
}

func (s *Store) purgeDue(ctx context.Context, purge PurgeSink, taken func(string) bool, log *slog.Logger) error {
	due, err := s.DuePurges(ctx, s.now())
	if err != nil {
		return err
	}
	for _, p := range due {
		if _, err := s.Get(ctx, p.Sink); err == nil || taken(p.Sink) {
			log.Info("subscriptions: the name of a deleted subscription is taken again: its parked and dead-lettered entries are kept (its new owner's now)",
				"subscription", p.Sink, "deleted_at", p.DeletedAt)
		} else if !errors.Is(err, ErrNotFound) {
			return err
		} else {
			n, err := purge(ctx, p.Sink)
			if err != nil {
				return err
			}
			log.Info("subscriptions: removed what a deleted subscription parked or dead-lettered", "subscription", p.Sink,
				"entries", n, "deleted_at", p.DeletedAt)
		}
		if err := s.PurgeDone(ctx, p.ID); err != nil {
			return err
		}
	}
	return nil
}

// insertPurge schedules the purge of name's entries at purgeAt (in a
// Delete's transaction).
func (s *Store) insertPurge(ctx context.Context, name string, rev int64, deletedAt, purgeAt time.Time) error {
	_, err := s.purges.InsertOne(ctx, purgeRecord{ID: bson.NewObjectID(), Version: PurgeFormatVersion, Sink: name,
		Revision: rev, DeletedAt: deletedAt, PurgeAt: purgeAt})
	return err
}
