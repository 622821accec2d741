// Package lease gives a unit of work (a source, or one partition of it) a
// single owner among changegate replicas, using nothing but MongoDB.
//
// # Leases
//
// A lease is a document {_id: unit, owner, epoch, expires} in a collection
// of the state database. Acquire and Renew are each one conditional
// findOneAndUpdate whose update is a pipeline, so that expires is computed
// from the server's clock ($$NOW + ttl) and never from a replica's:
//
//   - Acquire matches when the unit has no lease document (the upsert
//     creates it), when the lease has expired ({$expr: {$lt: ["$expires",
//     "$$NOW"]}}, which also covers a released lease), or when it is this
//     owner's. Every acquisition increments the epoch, also when the owner
//     already held the lease: a process that restarts under the same
//     instance name, or that considered its lease lost by its own deadline
//     while the server's expiry had not yet passed, starts a new tenure
//     and fences off whatever the previous one may still write. When
//     another owner holds a live lease the
//     filter does not match, the upsert tries to insert a second document
//     with the same _id and fails with a duplicate key error (E11000);
//     Acquire reports that as "not acquired". MongoDB retries such an
//     upsert by itself only when the filter is equality on _id alone
//     (manual: db.collection.update "Upsert with Duplicate Values"), which
//     this one is not.
//   - Renew matches only the live lease of the same owner and epoch, and
//     keeps the epoch. A lease that has lapsed cannot be renewed, only
//     acquired again (with a new epoch).
//   - Release sets expires to the server's $$NOW minus 1 ms when owner and
//     epoch match, so that any replica can acquire at once; owner and
//     epoch stay, so the next acquisition increments the epoch.
//
// Lease documents must never be deleted: the epoch is the fencing token
// of every write a unit makes, and it must only grow.
//
// # Local deadline
//
// A process must never believe it owns a lease longer than the server
// does. The server sets expires to its own time of execution plus ttl,
// which is no earlier than the moment the request was sent. So the
// process reads its clock before sending the command and considers the
// lease lost at that instant + ttl - safety margin ([Lease.Deadline]). Only
// a local duration is used, measured with Go's monotonic clock, so the
// clock offset between replicas and the server plays no part; the margin
// covers clock rate differences and the time a process needs to stop.
//
// # Fencing
//
// A replica that was paused (SIGSTOP, a long GC, a network partition) may
// wake up after its lease was taken over and still try to write. Every
// write that moves a unit forward therefore carries the owner's epoch and
// is conditional on it, without transactions: the document written (for
// example a checkpoint) stores the epoch of its last writer, and a write
// is filtered with [EpochGuard], so it only applies while the stored epoch
// is not higher than the writer's. The new owner, right after acquiring,
// raises the stored epoch to its own (checkpoint.Store.Fence) and only
// then reads the position to start from; from that moment the old owner's
// writes are refused (checkpoint.ErrFenced), and anything it wrote before
// is already included in what the new owner read, so the checkpoint never
// moves backwards or skips. A stale owner can only cause duplicates.
//
// The alternative, a transaction that reads the lease and writes the
// checkpoint, needs a replica set with transactions and retries on every
// write conflict with the renewals; the epoch in the written document
// needs neither and costs no extra round trip.
package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// Lease is one owner's tenure of a unit.
type Lease struct {
	// Unit is the unit of work, the lease document's _id.
	Unit string
	// Owner is the instance that holds (or last held) the lease.
	Owner string
	// Epoch is the fencing token: it grows with every acquisition.
	Epoch int64
	// Expires is when the lease expires, in the server's clock.
	Expires time.Time
	// Deadline is when this process must consider the lease lost, in its
	// own (monotonic) clock: the time read before the acquire or renew
	// command was sent, plus the ttl, minus the safety margin. It is zero
	// in leases returned by List.
	Deadline time.Time
}

// Held reports whether the process that obtained l may still act as its
// owner at local time now.
func (l Lease) Held(now time.Time) bool {
	return !l.Deadline.IsZero() && now.Before(l.Deadline)
}

// record is the stored form of a lease.
type record struct {
	Unit    string    `bson:"_id"`
	Owner   string    `bson:"owner"`
	Epoch   int64     `bson:"epoch"`
	Expires time.Time `bson:"expires"`
}

// DefaultSafetyMargin is the part of the ttl a process gives up, by
// default, to cover clock rate differences and the time it takes to stop
// work on a lost unit.
const DefaultSafetyMargin = time.Second

// Store acquires, renews and releases leases kept in one collection. A
// Store is safe for concurrent use.
type Store struct {
	coll   *mongo.Collection
	ttl    time.Duration
	margin time.Duration
	now    func() time.Time
}

// Option configures a Store.
type Option func(*Store)

// WithSafetyMargin sets the safety margin (default DefaultSafetyMargin,
// capped at half the ttl).
func WithSafetyMargin(d time.Duration) Option { return func(s *Store) { s.margin = d } }

// WithClock replaces the local clock (default time.Now). Tests use it to
// give owners skewed clocks; production code should not.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// NewStore returns a Store keeping leases of the given ttl in
// db.collection. Writes use majority write concern and reads majority read
// concern, so that a lease survives a replica-set failover. It panics if
// ttl is not positive.
func NewStore(db *mongo.Database, collection string, ttl time.Duration, opts ...Option) *Store {
	if ttl <= 0 {
		panic("lease: ttl must be positive")
	}
	s := &Store{
		coll: db.Collection(collection, options.Collection().
			SetWriteConcern(writeconcern.Majority()).
			SetReadConcern(readconcern.Majority())),
		ttl:    ttl,
		margin: DefaultSafetyMargin,
		now:    time.Now,
	}
	for _, o := range opts {
		o(s)
	}
	s.margin = min(max(s.margin, 0), ttl/2)
	return s
}

// TTL returns the lease duration.
func (s *Store) TTL() time.Duration { return s.ttl }

func expiresExpr(ttl time.Duration) bson.D {
	return bson.D{{Key: "$add", Value: bson.A{"$$NOW", ttl.Milliseconds()}}}
}

// live is true for a lease document whose expiry has not passed.
var live = bson.D{{Key: "$gte", Value: bson.A{"$expires", "$$NOW"}}}

// Acquire takes the lease of unit for owner if it is free, expired or
// already owner's, with a new epoch (one more than the last). It returns
// the lease and true when owner holds it, false (and no error) when
// another owner holds a live lease. To extend a lease it holds, a process
// calls Renew, which keeps the epoch.
func (s *Store) Acquire(ctx context.Context, unit, owner string) (Lease, bool, error) {
	if unit == "" || owner == "" {
		return Lease{}, false, errors.New("lease: acquire: empty unit or owner")
	}
	filter := bson.D{{Key: "_id", Value: unit}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "owner", Value: owner}},
		bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$expires", "$$NOW"}}}}},
	}}}
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "epoch", Value: bson.D{{Key: "$add", Value: bson.A{
			bson.D{{Key: "$ifNull", Value: bson.A{"$epoch", int64(0)}}}, int64(1),
		}}}},
		{Key: "owner", Value: owner},
		{Key: "expires", Value: expiresExpr(s.ttl)},
	}}}}
	l, ok, err := s.write(ctx, filter, update, true)
	if err != nil {
		return Lease{}, false, fmt.Errorf("lease %s: acquire for %s: %w", unit, owner, err)
	}
	return l, ok, nil
}

// Renew extends l, which must be the live lease of l.Owner with epoch
// l.Epoch. It returns the renewed lease (same epoch, later Expires and
// Deadline) and true, or false when the lease lapsed or changed hands:
// the caller must then stop working on the unit.
func (s *Store) Renew(ctx context.Context, l Lease) (Lease, bool, error) {
	filter := bson.D{
		{Key: "_id", Value: l.Unit}, {Key: "owner", Value: l.Owner}, {Key: "epoch", Value: l.Epoch},
		{Key: "$expr", Value: live},
	}
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "expires", Value: expiresExpr(s.ttl)}}}}}
	nl, ok, err := s.write(ctx, filter, update, false)
	if err != nil {
		return Lease{}, false, fmt.Errorf("lease %s: renew for %s: %w", l.Unit, l.Owner, err)
	}
	return nl, ok, nil
}

// write runs one findOneAndUpdate and turns its outcome into a Lease.
func (s *Store) write(ctx context.Context, filter bson.D, update mongo.Pipeline, upsert bool) (Lease, bool, error) {
	start := s.now() // before the command is sent: see "Local deadline"
	var r record
	err := s.coll.FindOneAndUpdate(ctx, filter, update,
		options.FindOneAndUpdate().SetUpsert(upsert).SetReturnDocument(options.After)).Decode(&r)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return Lease{}, false, nil
	case upsert && mongo.IsDuplicateKeyError(err):
		return Lease{}, false, nil // another owner's live lease
	case err != nil:
		return Lease{}, false, err
	}
	return Lease{
		Unit: r.Unit, Owner: r.Owner, Epoch: r.Epoch, Expires: r.Expires.UTC(),
		Deadline: start.Add(s.ttl - s.margin),
	}, true, nil
}

// Release gives up owner's lease of unit with the given epoch, so that
// another replica can acquire it at once. It reports whether the lease was
// released (false: it had already changed hands).
func (s *Store) Release(ctx context.Context, unit, owner string, epoch int64) (bool, error) {
	filter := bson.D{{Key: "_id", Value: unit}, {Key: "owner", Value: owner}, {Key: "epoch", Value: epoch}}
	update := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "expires", Value: bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", int64(1)}}}},
	}}}}
	res, err := s.coll.UpdateOne(ctx, filter, update)
	if err != nil {
		return false, fmt.Errorf("lease %s: release for %s: %w", unit, owner, err)
	}
	return res.MatchedCount > 0, nil
}

// List returns every lease document, ordered by unit, for status pages.
// Whether a lease is live is for the caller to judge against Expires (a
// server time); Deadline is zero.
func (s *Store) List(ctx context.Context) ([]Lease, error) {
	cur, err := s.coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("leases: list: %w", err)
	}
	defer cur.Close(ctx)
	var out []Lease
	for cur.Next(ctx) {
		var r record
		if err := cur.Decode(&r); err != nil {
			return nil, fmt.Errorf("leases: list: decode: %w", err)
		}
		out = append(out, Lease{Unit: r.Unit, Owner: r.Owner, Epoch: r.Epoch, Expires: r.Expires.UTC()})
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("leases: list: %w", err)
	}
	return out, nil
}

// EpochGuard returns a filter clause that makes a write conditional on
// the document's field (holding the epoch of its last writer) being absent
// or not greater than epoch: {$or: [{field: {$exists: false}}, {field:
// {$lte: epoch}}]}. Combine it with the document's _id in an update filter;
// a write that matches nothing was fenced off by a newer owner (see the
// package documentation). The clause has a single $or, so an upsert seeds
// only the _id from it.
func EpochGuard(field string, epoch int64) bson.E {
	return bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: field, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: field, Value: bson.D{{Key: "$lte", Value: epoch}}}},
	}}
}
