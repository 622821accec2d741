package deadletter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// ErrNotFound is returned (wrapped) when an entry named by id does not exist.
var ErrNotFound = errors.New("dead letter not found")

// MaxEntryBytes is the most an entry read from the store can hold: MongoDB's
// 16 MiB document limit. Readers of whole entries (re-drive, replay) admit
// this much of the byte budget before they read one.
const MaxEntryBytes = 16 * 1024 * 1024

// maxStoredSize bounds the size of the parts of an entry that can be large
// (change, envelope, keys), leaving room below MongoDB's 16 MiB document
// limit for the other fields.
const maxStoredSize = 16*1024*1024 - 64*1024

// Store is the dead-letter collection. Writes use majority write concern:
// an event counts as durably dead-lettered once Put returned. A Store is
// safe for concurrent use.
type Store struct {
	coll   *mongo.Collection
	fences *mongo.Collection // <collection>_fences: one epoch guard per unit

	// guardMu guards guards, a lock per unit held by a fenced write for its
	// whole transaction: every fenced write of a unit writes the unit's
	// guard document, so two at once from this process would conflict
	// (WriteConflict) and retry each other, without end under load.
	guardMu sync.Mutex
	guards  map[string]chan struct{}
}

// NewStore returns a Store on db.collection. Call EnsureIndexes once at
// startup.
func NewStore(db *mongo.Database, collection string) *Store {
	wc := options.Collection().SetWriteConcern(writeconcern.Majority())
	return &Store{
		coll:   db.Collection(collection, wc),
		fences: db.Collection(collection+"_fences", wc),
	}
}

// EnsureIndexes creates the indexes used by listing (by kind, sink or
// source, and time), re-drive (parked entries of a sink in stream order), replay
// (stream order) and document-key look-ups. It is idempotent.
func (s *Store) EnsureIndexes(ctx context.Context) error {
	idx := func(name string, keys bson.D) mongo.IndexModel {
		return mongo.IndexModel{Keys: keys, Options: options.Index().SetName(name)}
	}
	// Sorts end with _id (a unique tie-break for paging), so the indexes do.
	models := []mongo.IndexModel{
		idx("kind_sink_createdAt_id", bson.D{{Key: "kind", Value: 1}, {Key: "sink", Value: 1}, {Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}),
		idx("kind_source_createdAt_id", bson.D{{Key: "kind", Value: 1}, {Key: "source", Value: 1}, {Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}),
		idx("kind_sink_clusterTime_order_id", bson.D{{Key: "kind", Value: 1}, {Key: "sink", Value: 1}, {Key: "clusterTime", Value: 1}, {Key: "order", Value: 1}, {Key: "_id", Value: 1}}),
		idx("kind_clusterTime_order_id", bson.D{{Key: "kind", Value: 1}, {Key: "clusterTime", Value: 1}, {Key: "order", Value: 1}, {Key: "_id", Value: 1}}),
		idx("createdAt_id", bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}),
		idx("documentKey_id", bson.D{{Key: "documentKey._id", Value: 1}}),
	}
	if _, err := s.coll.Indexes().CreateMany(ctx, models); err != nil {
		return fmt.Errorf("dead letters: create indexes: %w", err)
	}
	return nil
}

// Get returns the entry with id, and false (with no error) when there is none.
func (s *Store) Get(ctx context.Context, id string) (Entry, bool, error) {
	var r record
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&r)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("dead letter %s: get: %w", id, err)
	}
	return r.entry(), true, nil
}

// DeleteVersion removes the parked entry id only if it is still at version
// ver (Entry.Version as read), and reports whether it did. A re-drive
// deletes what it delivered this way: an entry written again in between (a
// re-read change parked again) keeps its place and is re-driven again.
// Version 0 matches an entry written without a version.
func (s *Store) DeleteVersion(ctx context.Context, id string, ver int64) (bool, error) {
	q := bson.D{{Key: "_id", Value: id}, {Key: "kind", Value: KindParked}}
	if ver == 0 {
		q = append(q, bson.E{Key: "ver", Value: bson.D{{Key: "$exists", Value: false}}})
	} else {
		q = append(q, bson.E{Key: "ver", Value: ver})
	}
	res, err := s.coll.DeleteOne(ctx, q)
	if err != nil {
		return false, fmt.Errorf("dead letter %s: delete version %d: %w", id, ver, err)
	}
	return res.DeletedCount > 0, nil
}

// Delete removes the entry with id and reports whether it existed.
func (s *Store) Delete(ctx context.Context, id string) (bool, error) {
	res, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
	if err != nil {
		return false, fmt.Errorf("dead letter %s: delete: %w", id, err)
	}
	return res.DeletedCount > 0, nil
}

// Convert changes the kind of the failed or parked entry id to to (failed or
// parked), e.g. parked → failed when its re-drive exhausted its retries. A
// non-empty reason or lastErr replaces the stored one; lastFailedAt becomes
// now. It returns an error wrapping ErrNotFound when there is no such
// failed or parked entry.
func (s *Store) Convert(ctx context.Context, id string, to Kind, reason, lastErr string) error {
	if to != KindFailed && to != KindParked {
		return fmt.Errorf("dead letter %s: convert: cannot convert to %q", id, to)
	}
	set := bson.D{
		{Key: "kind", Value: to},
		{Key: "lastFailedAt", Value: time.Now().UTC()},
	}
	if reason != "" {
		set = append(set, bson.E{Key: "reason", Value: reason})
	}
	if lastErr != "" {
		set = append(set, bson.E{Key: "lastError", Value: lastErr})
	}
	res, err := s.coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: id}, {Key: "kind", Value: bson.D{{Key: "$in", Value: bson.A{KindFailed, KindParked}}}}},
		bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return fmt.Errorf("dead letter %s: convert to %s: %w", id, to, err)
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("dead letter %s: convert to %s: %w", id, to, ErrNotFound)
	}
	return nil
}
