package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// ErrNoToken is returned by Store.Save for a checkpoint without a resume token.
var ErrNoToken = errors.New("checkpoint has no resume token")

// Checkpoint is the persisted position of one source.
type Checkpoint struct {
	// Source is the name of the [[sources]] entry; it is the document _id.
	Source string
	// Token is the resume token to start after. It may be a post-batch
	// resume token rather than the _id of a change event.
	Token bson.Raw
	// ClusterTime is the cluster time of the newest acknowledged change, zero
	// if unknown (for example when only a post-batch token has been seen).
	ClusterTime bson.Timestamp
	// WallTime is the wall clock time of the newest acknowledged change, zero
	// if unknown.
	WallTime time.Time
	// UpdatedAt is when the checkpoint was saved. Save fills it with the
	// current time when it is zero.
	UpdatedAt time.Time
}

// record is the stored form of a Checkpoint.
type record struct {
	Source string   `bson:"_id"`
	Token  bson.Raw `bson:"token"`
	// ClusterTime is omitted when zero: MongoDB replaces an empty timestamp
	// in a top-level field of an inserted document with the current time.
	ClusterTime bson.Timestamp `bson:"clusterTime,omitempty"`
	WallTime    time.Time      `bson:"wallTime,omitempty"`
	UpdatedAt   time.Time      `bson:"updatedAt"`
}

func (r record) checkpoint() Checkpoint {
	cp := Checkpoint{
		Source:      r.Source,
		Token:       r.Token,
		ClusterTime: r.ClusterTime,
		UpdatedAt:   r.UpdatedAt.UTC(),
	}
	if !r.WallTime.IsZero() {
		cp.WallTime = r.WallTime.UTC()
	}
	return cp
}

// Store persists one checkpoint document per source in a MongoDB collection
// (by default "checkpoints" in the state database).
//
// Each source must have a single writer (the running gateway); Save does not
// guard against a concurrent writer moving a checkpoint backwards. A Store is
// safe for concurrent use.
type Store struct {
	coll *mongo.Collection
}

// NewStore returns a Store keeping checkpoints in db.collection. Writes use
// majority write concern so a saved checkpoint survives a replica set
// failover.
func NewStore(db *mongo.Database, collection string) *Store {
	return &Store{
		coll: db.Collection(collection, options.Collection().SetWriteConcern(writeconcern.Majority())),
	}
}

// Load returns the checkpoint of source, and false (with no error) when none
// has been saved or it was reset.
func (s *Store) Load(ctx context.Context, source string) (Checkpoint, bool, error) {
	var r record
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: source}}).Decode(&r)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("checkpoint %s: load: %w", source, err)
	}
	return r.checkpoint(), true, nil
}

// Save writes cp, replacing the previous checkpoint of cp.Source, with
// majority write concern. It returns ErrNoToken (wrapped) when cp has no
// token. A zero UpdatedAt is set to the current time.
func (s *Store) Save(ctx context.Context, cp Checkpoint) error {
	if cp.Source == "" {
		return errors.New("checkpoint: save: empty source name")
	}
	if len(cp.Token) == 0 {
		return fmt.Errorf("checkpoint %s: save: %w", cp.Source, ErrNoToken)
	}
	if err := cp.Token.Validate(); err != nil {
		return fmt.Errorf("checkpoint %s: save: invalid token: %w", cp.Source, err)
	}
	if cp.UpdatedAt.IsZero() {
		cp.UpdatedAt = time.Now()
	}
	r := record{
		Source:      cp.Source,
		Token:       cp.Token,
		ClusterTime: cp.ClusterTime,
		WallTime:    cp.WallTime.UTC(),
		UpdatedAt:   cp.UpdatedAt.UTC(),
	}
	_, err := s.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: cp.Source}}, r, options.Replace().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("checkpoint %s: save: %w", cp.Source, err)
	}
	return nil
}

// List returns every saved checkpoint, ordered by source name.
func (s *Store) List(ctx context.Context) ([]Checkpoint, error) {
	cur, err := s.coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("checkpoints: list: %w", err)
	}
	defer cur.Close(ctx)
	var out []Checkpoint
	for cur.Next(ctx) {
		var r record
		if err := cur.Decode(&r); err != nil {
			return nil, fmt.Errorf("checkpoints: list: decode: %w", err)
		}
		out = append(out, r.checkpoint())
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("checkpoints: list: %w", err)
	}
	return out, nil
}

// Reset deletes the checkpoint of source, so that its next start begins at
// "now" (or at the source's start_at). It reports whether a checkpoint
// existed. Resetting a source while the gateway runs it is pointless: the
// running source saves its position again at its next checkpoint.
func (s *Store) Reset(ctx context.Context, source string) (bool, error) {
	res, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: source}})
	if err != nil {
		return false, fmt.Errorf("checkpoint %s: reset: %w", source, err)
	}
	return res.DeletedCount > 0, nil
}
