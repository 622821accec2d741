package deadletter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/event"
)

// This file writes entries: their stored form (record), the upsert that
// keeps an entry's first failure and counts its attempts, and Put and PutMany.

// record is the stored form of an Entry.
type record struct {
	ID            string         `bson:"_id"`
	Kind          Kind           `bson:"kind"`
	EventID       string         `bson:"eventId,omitempty"`
	Source        string         `bson:"source,omitempty"`
	Sink          string         `bson:"sink,omitempty"`
	Unit          string         `bson:"unit,omitempty"`
	Rules         []string       `bson:"rules,omitempty"`
	Operation     string         `bson:"operation,omitempty"`
	Namespace     string         `bson:"namespace,omitempty"`
	DocumentKey   bson.Raw       `bson:"documentKey,omitempty"`
	Change        bson.Raw       `bson:"change,omitempty"`
	Envelope      bson.Raw       `bson:"envelope,omitempty"`
	ChangeDropped bool           `bson:"changeDropped,omitempty"`
	Shaped        bool           `bson:"shaped,omitempty"`
	ClusterTime   bson.Timestamp `bson:"clusterTime,omitempty"`
	Attempts      int64          `bson:"attempts"`
	Reason        string         `bson:"reason,omitempty"`
	FirstError    string         `bson:"firstError,omitempty"`
	LastError     string         `bson:"lastError,omitempty"`
	FirstFailedAt time.Time      `bson:"firstFailedAt,omitempty"`
	LastFailedAt  time.Time      `bson:"lastFailedAt,omitempty"`
	CreatedAt     time.Time      `bson:"createdAt,omitempty"`
	Order         int64          `bson:"order"`
	Version       int64          `bson:"ver,omitempty"`
	RetryAt       time.Time      `bson:"retryAt,omitempty"`
	GapFrom       time.Time      `bson:"gapFrom,omitempty"`
	GapTo         time.Time      `bson:"gapTo,omitempty"`
	LastToken     bson.Raw       `bson:"lastToken,omitempty"`
	Epoch         int64          `bson:"epoch,omitempty"`
	Txn           *txnRecord     `bson:"txn,omitempty"`
}

// txnRecord is an entry's transaction metadata as stored (entries written
// before transaction support have none).
type txnRecord struct {
	ID    string `bson:"id"`
	Index int64  `bson:"index"`
	Last  bool   `bson:"last,omitempty"`
}

func (r *record) entry() Entry {
	return Entry{
		ID: r.ID, Kind: r.Kind, EventID: r.EventID, Source: r.Source, Sink: r.Sink, Unit: r.Unit,
		Rules: r.Rules, Operation: r.Operation, Namespace: r.Namespace,
		DocumentKey: r.DocumentKey, Change: r.Change, Envelope: r.Envelope, ChangeDropped: r.ChangeDropped, Shaped: r.Shaped,
		ClusterTime: r.ClusterTime, Attempts: int(r.Attempts), Reason: r.Reason,
		FirstError: r.FirstError, LastError: r.LastError,
		FirstFailedAt: utc(r.FirstFailedAt), LastFailedAt: utc(r.LastFailedAt), CreatedAt: utc(r.CreatedAt),
		Order: r.Order, Version: r.Version, RetryAt: utc(r.RetryAt), GapFrom: utc(r.GapFrom), GapTo: utc(r.GapTo), LastToken: r.LastToken,
		Epoch: r.Epoch, Txn: r.Txn.txn(),
	}
}

func (t *txnRecord) txn() *event.Txn {
	if t == nil {
		return nil
	}
	return &event.Txn{ID: t.ID, Index: int(t.Index), Last: t.Last}
}

// upsert returns the filter and update that write e idempotently.
func upsert(e Entry, now time.Time) (bson.D, bson.D, error) {
	if e.ID == "" {
		switch {
		case e.Kind == KindGap && e.Source != "":
			e.ID = GapID(e.Source, e.GapFrom)
		case e.Kind != KindGap && e.EventID != "" && e.Sink != "":
			e.ID = EntryID(e.EventID, e.Sink)
		default:
			return nil, nil, errors.New("dead letter has no id")
		}
	}
	if !e.Kind.Valid() {
		return nil, nil, fmt.Errorf("dead letter %s: invalid kind %q", e.ID, e.Kind)
	}
	if e.LastFailedAt.IsZero() {
		e.LastFailedAt = now
	}
	if e.FirstFailedAt.IsZero() {
		e.FirstFailedAt = e.LastFailedAt
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = now
	}
	if e.FirstError == "" {
		e.FirstError = e.LastError
	}
	others := len(e.DocumentKey) + len(e.LastToken)
	if len(e.Change)+others > maxStoredSize {
		e.Change = nil
		e.ChangeDropped = true
	}
	if len(e.Change)+len(e.Envelope)+others > maxStoredSize {
		e.Envelope = nil
	}

	if e.Version == 0 {
		e.Version = newVersion()
	}

	// $setOnInsert, $set and $inc must not name the same field. The order
	// is fixed by the first write: a re-park never moves an entry.
	onInsert := bson.D{
		{Key: "createdAt", Value: e.CreatedAt.UTC()},
		{Key: "firstFailedAt", Value: e.FirstFailedAt.UTC()},
		{Key: "order", Value: e.Order},
	}
	if e.FirstError != "" {
		onInsert = append(onInsert, bson.E{Key: "firstError", Value: e.FirstError})
	}
	set := bson.D{
		{Key: "kind", Value: e.Kind},
		{Key: "lastFailedAt", Value: e.LastFailedAt.UTC()},
		{Key: "changeDropped", Value: e.ChangeDropped},
		{Key: "shaped", Value: e.Shaped},
	}
	var unset bson.D
	str := func(k, v string) {
		if v != "" {
			set = append(set, bson.E{Key: k, Value: v})
		}
	}
	raw := func(k string, v bson.Raw) {
		if len(v) > 0 {
			set = append(set, bson.E{Key: k, Value: v})
		}
	}
	tm := func(k string, v time.Time) {
		if !v.IsZero() {
			set = append(set, bson.E{Key: k, Value: v.UTC()})
		}
	}
	str("eventId", e.EventID)
	str("source", e.Source)
	str("sink", e.Sink)
	if e.Kind != KindGap {
		if e.Unit == "" {
			e.Unit = e.Source
		}
		str("unit", e.Unit)
	}
	if len(e.Rules) > 0 {
		set = append(set, bson.E{Key: "rules", Value: e.Rules})
	}
	str("operation", e.Operation)
	str("namespace", e.Namespace)
	raw("documentKey", e.DocumentKey)
	raw("change", e.Change)
	raw("envelope", e.Envelope)
	if len(e.Envelope) == 0 && e.Shaped {
		// No shaped envelope: an older one (unshaped) must not stay.
		unset = append(unset, bson.E{Key: "envelope", Value: ""})
	}
	if !e.ClusterTime.IsZero() {
		set = append(set, bson.E{Key: "clusterTime", Value: e.ClusterTime})
	}
	if e.Txn != nil {
		set = append(set, bson.E{Key: "txn", Value: txnRecord{ID: e.Txn.ID, Index: int64(e.Txn.Index), Last: e.Txn.Last}})
	}
	str("reason", e.Reason)
	str("lastError", e.LastError)
	set = append(set, bson.E{Key: "ver", Value: e.Version})
	if e.Epoch > 0 {
		set = append(set, bson.E{Key: "epoch", Value: e.Epoch})
	}
	if e.RetryAt.IsZero() {
		unset = append(unset, bson.E{Key: "retryAt", Value: ""})
	} else {
		set = append(set, bson.E{Key: "retryAt", Value: e.RetryAt.UTC()})
	}
	tm("gapFrom", e.GapFrom)
	tm("gapTo", e.GapTo)
	raw("lastToken", e.LastToken)

	update := bson.D{
		{Key: "$setOnInsert", Value: onInsert},
		{Key: "$set", Value: set},
		{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int64(e.Attempts)}}},
	}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	return bson.D{{Key: "_id", Value: e.ID}}, update, nil
}

// newVersion returns a random, non-zero entry version.
func newVersion() int64 { return rand.Int64N(1<<62) + 1 }

// Put writes e, idempotently on its _id (derived from EventID and Sink, or
// for a gap from Source and GapFrom, when ID is empty). Writing an entry that
// already exists (the same event and sink again after a crash, or a parked
// entry that failed) adds e.Attempts to the stored attempts, replaces kind,
// reason, lastError, lastFailedAt, retryAt and the event fields, draws a new
// Version (unless e.Version is set), and keeps createdAt, firstFailedAt,
// firstError and order. Zero times default to now; an empty FirstError to
// LastError.
//
// When the change alone is too large for a MongoDB document it is left out
// and the entry is marked ChangeDropped (it cannot be replayed, but the
// failure is durably recorded); when the change and the envelope together
// are too large the envelope is left out.
func (s *Store) Put(ctx context.Context, e Entry) error {
	q, u, err := upsert(e, time.Now())
	if err != nil {
		return err
	}
	if e.Epoch > 0 {
		err := s.fenced(ctx, []Entry{e}, func(ctx context.Context) error {
			_, err := s.coll.UpdateOne(ctx, q, u, options.UpdateOne().SetUpsert(true))
			return err
		})
		if err != nil {
			return fmt.Errorf("dead letter %s: put: %w", e.ID, err)
		}
		return nil
	}
	if _, err := s.coll.UpdateOne(ctx, q, u, options.UpdateOne().SetUpsert(true)); err != nil {
		return fmt.Errorf("dead letter %s: put: %w", e.ID, err)
	}
	return nil
}

// PutMany writes es like Put, as one ordered bulk write: on an error the
// entries before the failing one are written and the rest are not (with
// epochs, in one transaction: all or none).
func (s *Store) PutMany(ctx context.Context, es []Entry) error {
	if len(es) == 0 {
		return nil
	}
	now := time.Now()
	models := make([]mongo.WriteModel, 0, len(es))
	epochs := false
	for _, e := range es {
		q, u, err := upsert(e, now)
		if err != nil {
			return err
		}
		models = append(models, mongo.NewUpdateOneModel().SetFilter(q).SetUpdate(u).SetUpsert(true))
		epochs = epochs || e.Epoch > 0
	}
	write := func(ctx context.Context) error {
		_, err := s.coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
		return err
	}
	var err error
	if epochs {
		err = s.fenced(ctx, es, write)
	} else {
		err = write(ctx)
	}
	if err != nil {
		return fmt.Errorf("dead letters: put %d entries: %w", len(es), err)
	}
	return nil
}
