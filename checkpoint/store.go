package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/changegate/changegate/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// ErrNoToken is returned by Store.Save for a checkpoint without a resume token.
var ErrNoToken = errors.New("checkpoint has no resume token")

// ErrFenced is returned (wrapped) by a fenced Store.Save or Store.Fence
// when a newer owner of the unit (a higher lease epoch) has claimed the
// checkpoint: the caller lost its lease and must stop working on the unit.
var ErrFenced = errors.New("checkpoint claimed by a newer lease epoch")

// ErrBackwards is returned (wrapped) by a fenced Store.Save whose token is
// older than the saved one: the checkpoint never moves backwards.
var ErrBackwards = errors.New("checkpoint would move backwards")

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
	// Epoch is the lease epoch of the writer in cluster mode; 0 (the
	// default, and always outside cluster mode) means an unfenced write.
	// See Store.Save and Store.Fence.
	Epoch int64
	// Snapshot is the progress of an initial snapshot that has not finished
	// (nil when none runs): Token is then the change stream position taken
	// before the scan, where the stream starts once the scan is done.
	Snapshot *Snapshot
}

// Snapshot is the persisted progress of a source's initial snapshot: every
// document of the namespaces before Namespace (in sorted order), and of
// Namespace up to and including the _id After, has been delivered (or
// dead-lettered).
type Snapshot struct {
	// ID names the snapshot in its events' ids; it stays the same across
	// restarts.
	ID string `bson:"id"`
	// Namespace is "<db>.<coll>" of the collection being scanned; empty
	// before the first document was acknowledged.
	Namespace string `bson:"ns,omitempty"`
	// After is a document {_id: <value>} holding the last _id below which
	// every document of Namespace was acknowledged; nil when none yet.
	After bson.Raw `bson:"after,omitempty"`
	// Scanned counts the documents covered so far (all partitions' shares
	// of them, as the scan reads them).
	Scanned int64 `bson:"scanned"`
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
	// Epoch and Pos exist only in fenced checkpoints: the writer's lease
	// epoch and the token's _data (a hex KeyString: MongoDB documents that
	// _data values of one stream sort in stream order, DOCS-11616), to
	// refuse writes from older epochs and writes that go backwards.
	Epoch int64  `bson:"epoch,omitempty"`
	Pos   string `bson:"pos,omitempty"`
	// Snapshot is set while an initial snapshot runs.
	Snapshot *Snapshot `bson:"snapshot,omitempty"`
}

func (r record) checkpoint() Checkpoint {
	cp := Checkpoint{
		Source:      r.Source,
		Token:       r.Token,
		ClusterTime: r.ClusterTime,
		UpdatedAt:   r.UpdatedAt.UTC(),
		Epoch:       r.Epoch,
		Snapshot:    r.Snapshot,
	}
	if !r.WallTime.IsZero() {
		cp.WallTime = r.WallTime.UTC()
	}
	return cp
}

// Store persists one checkpoint document per source in a MongoDB collection
// (by default "checkpoints" in the state database).
//
// Outside cluster mode each source has a single writer (the running
// gateway) and Save does not guard against a concurrent writer moving a
// checkpoint backwards. In cluster mode a unit's owner claims its
// checkpoint with Fence after acquiring the lease and saves with its lease
// epoch in Checkpoint.Epoch: writes of an older epoch are refused with
// ErrFenced and writes that would move the checkpoint backwards with
// ErrBackwards (see package lease for the protocol). A Store is safe for
// concurrent use.
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
// has been saved or it was reset. A document that Fence created before any
// Save holds no position and also reads as none.
func (s *Store) Load(ctx context.Context, source string) (Checkpoint, bool, error) {
	var r record
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: source}}).Decode(&r)
	if errors.Is(err, mongo.ErrNoDocuments) || err == nil && len(r.Token) == 0 {
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
//
// With cp.Epoch > 0 the write is fenced: it is applied only if the saved
// checkpoint's epoch is not higher (else ErrFenced) and, when both tokens
// have a _data string, the saved token is not after cp.Token (else
// ErrBackwards); either way the saved checkpoint is left as it was. With
// cp.Epoch == 0 the write is unconditional, as outside cluster mode.
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
		Snapshot:    cp.Snapshot,
	}
	if cp.Epoch > 0 {
		return s.saveFenced(ctx, cp, r)
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
		if len(r.Token) == 0 {
			continue // claimed by Fence, never saved
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
// running source saves its position again at its next checkpoint. In
// cluster mode the deleted document also takes the recorded lease epoch
// with it, so a unit should be reset only while no replica runs it.
func (s *Store) Reset(ctx context.Context, source string) (bool, error) {
	res, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: source}})
	if err != nil {
		return false, fmt.Errorf("checkpoint %s: reset: %w", source, err)
	}
	return res.DeletedCount > 0, nil
}

// tokenPos returns the _data string of a resume token, "" when it has none.
func tokenPos(token bson.Raw) string {
	s, _ := token.Lookup("_data").StringValueOK()
	return s
}

// saveFenced replaces the checkpoint only if the stored epoch and position
// allow it. The filter has no equality but _id, so when it does not match
// the upsert collides with the existing document (E11000) and nothing is
// written; MongoDB does not retry such an upsert (manual:
// db.collection.update, "Upsert with Duplicate Values").
func (s *Store) saveFenced(ctx context.Context, cp Checkpoint, r record) error {
	r.Epoch = cp.Epoch
	r.Pos = tokenPos(cp.Token)
	filter := bson.D{{Key: "_id", Value: cp.Source}, {Key: "$and", Value: bson.A{
		bson.D{lease.EpochGuard("epoch", cp.Epoch)},
		posGuard(r.Pos),
	}}}
	_, err := s.coll.ReplaceOne(ctx, filter, r, options.Replace().SetUpsert(true))
	if err == nil {
		return nil
	}
	if !mongo.IsDuplicateKeyError(err) {
		return fmt.Errorf("checkpoint %s: save: %w", cp.Source, err)
	}
	var cur record
	if err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: cp.Source}}).Decode(&cur); err != nil {
		return fmt.Errorf("checkpoint %s: save refused, then load: %w", cp.Source, err)
	}
	if cur.Epoch > cp.Epoch {
		return fmt.Errorf("checkpoint %s: save with epoch %d: %w (epoch %d)", cp.Source, cp.Epoch, ErrFenced, cur.Epoch)
	}
	return fmt.Errorf("checkpoint %s: save: %w (saved %s, new %s)", cp.Source, ErrBackwards, cur.Pos, r.Pos)
}

// posGuard allows a write at pos unless the stored position is after it.
// A token without _data (never seen from MongoDB) cannot be ordered and is
// not guarded.
func posGuard(pos string) bson.D {
	if pos == "" {
		return bson.D{}
	}
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "pos", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "pos", Value: bson.D{{Key: "$lte", Value: pos}}}},
	}}}
}

// Fence claims the checkpoint of source for lease epoch (> 0): it raises
// the stored epoch to epoch, creating a document without a position when
// none exists, so that from then on saves of older epochs are refused. A
// new owner calls it after acquiring the lease and before Load, so the
// position it loads includes every write the old owner could still make.
// It returns ErrFenced (wrapped) when the stored epoch is already higher.
func (s *Store) Fence(ctx context.Context, source string, epoch int64) error {
	if epoch <= 0 {
		return fmt.Errorf("checkpoint %s: fence: epoch %d is not positive", source, epoch)
	}
	filter := bson.D{{Key: "_id", Value: source}, lease.EpochGuard("epoch", epoch)}
	_, err := s.coll.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: bson.D{{Key: "epoch", Value: epoch}}}}, options.UpdateOne().SetUpsert(true))
	switch {
	case mongo.IsDuplicateKeyError(err):
		return fmt.Errorf("checkpoint %s: fence with epoch %d: %w", source, epoch, ErrFenced)
	case err != nil:
		return fmt.Errorf("checkpoint %s: fence: %w", source, err)
	}
	return nil
}
