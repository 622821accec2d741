package deadletter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/lease"
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

// Filter selects entries. Zero fields do not filter; an invalid Kind or
// DocumentKey makes every method that takes the Filter fail.
type Filter struct {
	// Kind selects one kind of entry. Replay treats an empty Kind as
	// "failed" (counting matching gaps as skipped).
	Kind Kind
	// Sink and Source select entries by sink and source name.
	Sink, Source string
	// Since (inclusive) and Until (exclusive) bound CreatedAt.
	Since, Until time.Time
	// DocumentKey selects entries whose documentKey has these fields with
	// these values (a subset match, so {_id: X} also finds the events of a
	// sharded collection whose key holds more fields). A non-nil DocumentKey
	// that is not a valid, non-empty document is an error.
	DocumentKey bson.Raw
	// ExactDocumentKey selects entries whose documentKey is this document,
	// byte for byte (field order, types and invalid UTF-8 included): the
	// lossless look-up for a key whose JSON form is ambiguous
	// (Entry.DocumentKeyLossy). A non-nil ExactDocumentKey that is not a
	// valid, non-empty document without "$" field names is an error.
	ExactDocumentKey bson.Raw
	// IDs selects entries by _id; a non-nil empty IDs selects nothing.
	IDs []string
	// Units selects entries by unit of work (Entry.Unit); a non-nil empty
	// Units selects nothing.
	Units []string
	// Limit caps the number of entries listed, counted, purged or replayed;
	// 0 means no limit.
	Limit int
	// AfterID pages: only entries after the entry with this id in List order.
	// That entry must still exist (an error wrapping ErrNotFound otherwise).
	// Replay ignores AfterID.
	AfterID string
}

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

// ErrFenced is returned (wrapped) by Put and PutMany when an entry's Epoch
// is below its unit's fence (a newer owner of the unit took it over), and by
// Fence when the unit is fenced by a higher epoch already. Nothing is
// written then.
var ErrFenced = errors.New("unit claimed by a newer lease epoch")

// Fence claims unit for lease epoch (> 0) in the store: from then on, writes
// of entries of unit with an older Epoch are refused (ErrFenced) by the
// store itself. The new owner of a unit fences it before it re-drives or
// writes anything of it, as it fences the unit's checkpoint.
func (s *Store) Fence(ctx context.Context, unit string, epoch int64) error {
	if epoch <= 0 {
		return fmt.Errorf("dead letters: fence %s: epoch %d is not positive", unit, epoch)
	}
	if err := s.raiseFence(ctx, unit, epoch); err != nil {
		return fmt.Errorf("dead letters: fence %s with epoch %d: %w", unit, epoch, err)
	}
	return nil
}

// raiseFence sets unit's fence to epoch unless it is higher (ErrFenced). It
// always writes the guard document (a counter), so that in a transaction it
// conflicts with a concurrent Fence.
func (s *Store) raiseFence(ctx context.Context, unit string, epoch int64) error {
	_, err := s.fences.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: unit}, lease.EpochGuard("epoch", epoch)},
		bson.D{{Key: "$set", Value: bson.D{{Key: "epoch", Value: epoch}}}, {Key: "$inc", Value: bson.D{{Key: "writes", Value: int64(1)}}}},
		options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return ErrFenced // the guard holds a higher epoch: the upsert collided
	}
	return err
}

// FencedWriteAttempt bounds one attempt of a fenced write (Put, PutMany of
// entries with an Epoch): its transaction, retries of transient errors
// included. Past it the write fails with the context's error (nothing is
// written) and may be retried.
var FencedWriteAttempt = 30 * time.Second

// fenced runs write in a transaction that first checks (and writes) the
// fence of every unit of es: if one holds a higher epoch than its entries',
// the transaction is aborted and nothing is written. A concurrent Fence
// conflicts with the transaction's write of the guard, so a refused write
// is refused by MongoDB at the moment it would apply, however long the
// request was delayed on its way.
func (s *Store) fenced(ctx context.Context, es []Entry, write func(context.Context) error) error {
	type guard struct {
		unit  string
		epoch int64
	}
	var guards []guard
	for _, e := range es {
		if e.Epoch <= 0 {
			continue
		}
		unit := e.Unit
		if unit == "" {
			unit = e.Source
		}
		g := guard{unit, e.Epoch}
		if !slices.Contains(guards, g) {
			guards = append(guards, g)
		}
	}
	// One fenced write per unit at a time in this process, units locked
	// in order (a write of several units cannot deadlock with another).
	// The wait for the lock is not part of the attempt's bound below: it
	// ends with ctx (the caller's: its tenure, a stop), however many
	// writes of the unit queue before this one.
	slices.SortFunc(guards, func(a, b guard) int { return strings.Compare(a.unit, b.unit) })
	for i, g := range guards {
		if i > 0 && guards[i-1].unit == g.unit {
			continue
		}
		unlock, err := s.lockUnit(ctx, g.unit)
		if err != nil {
			return err
		}
		defer unlock()
	}
	// The attempt (its transaction) is bounded: a transaction left open
	// by a replica that was killed, paused or cut off mid-write holds the
	// unit's guard document until MongoDB aborts it
	// (transactionLifetimeLimitSeconds, 60 s by default), and every
	// attempt meanwhile fails with WriteConflict, which the driver's
	// WithTransaction retries for up to 120 s. The caller retries (and
	// logs) instead, with a new session.
	ctx, cancel := context.WithTimeout(ctx, FencedWriteAttempt)
	defer cancel()
	sess, err := s.coll.Database().Client().StartSession()
	if err != nil {
		return err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		for _, g := range guards {
			if err := s.raiseFence(ctx, g.unit, g.epoch); err != nil {
				return nil, err
			}
		}
		return nil, write(ctx)
	}, options.Transaction().SetWriteConcern(writeconcern.Majority()))
	return err
}

// lockUnit takes unit's fenced-write lock, or returns ctx's error.
func (s *Store) lockUnit(ctx context.Context, unit string) (func(), error) {
	s.guardMu.Lock()
	if s.guards == nil {
		s.guards = map[string]chan struct{}{}
	}
	l, ok := s.guards[unit]
	if !ok {
		l = make(chan struct{}, 1)
		s.guards[unit] = l
	}
	s.guardMu.Unlock()
	select {
	case l <- struct{}{}:
		return func() { <-l }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
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

// query translates f, without Limit and AfterID, into a MongoDB filter. It
// refuses an invalid Kind or DocumentKey rather than ignore it (and, say,
// purge more than asked).
func (f Filter) query() (bson.D, error) {
	if f.Kind != "" && !f.Kind.Valid() {
		return nil, fmt.Errorf("filter: invalid kind %q", f.Kind)
	}
	q := bson.D{}
	if f.Kind != "" {
		q = append(q, bson.E{Key: "kind", Value: f.Kind})
	}
	if f.Sink != "" {
		q = append(q, bson.E{Key: "sink", Value: f.Sink})
	}
	if f.Source != "" {
		q = append(q, bson.E{Key: "source", Value: f.Source})
	}
	if !f.Since.IsZero() || !f.Until.IsZero() {
		r := bson.D{}
		if !f.Since.IsZero() {
			r = append(r, bson.E{Key: "$gte", Value: f.Since.UTC()})
		}
		if !f.Until.IsZero() {
			r = append(r, bson.E{Key: "$lt", Value: f.Until.UTC()})
		}
		q = append(q, bson.E{Key: "createdAt", Value: r})
	}
	if f.DocumentKey != nil {
		elems, err := f.DocumentKey.Elements()
		if err == nil && len(elems) == 0 {
			err = errors.New("empty document")
		}
		if err != nil {
			return nil, fmt.Errorf("filter: invalid document key: %w", err)
		}
		if path := bsonraw.DollarPath(f.DocumentKey); path != "" {
			return nil, fmt.Errorf("filter: invalid document key: %w", &OperatorError{Path: path})
		}
		// $eq: the key's values are matched literally, whatever they hold.
		for _, el := range elems {
			q = append(q, bson.E{Key: "documentKey." + el.Key(), Value: bson.D{{Key: "$eq", Value: el.Value()}}})
		}
	}
	if f.ExactDocumentKey != nil {
		elems, err := f.ExactDocumentKey.Elements()
		if err == nil && len(elems) == 0 {
			err = errors.New("empty document")
		}
		if err == nil {
			err = CheckDocumentKey(f.ExactDocumentKey)
		}
		if err != nil {
			return nil, fmt.Errorf("filter: invalid exact document key: %w", err)
		}
		q = append(q, bson.E{Key: "documentKey", Value: bson.D{{Key: "$eq", Value: f.ExactDocumentKey}}})
	}
	if f.IDs != nil {
		q = append(q, bson.E{Key: "_id", Value: bson.D{{Key: "$in", Value: f.IDs}}})
	}
	if f.Units != nil {
		q = append(q, bson.E{Key: "unit", Value: bson.D{{Key: "$in", Value: f.Units}}})
	}
	return q, nil
}

// OperatorError is the error for a document key (Filter.DocumentKey) that
// holds a field name starting with "$": a key is matched literally, and such
// a name would be read by MongoDB as a query operator ({"_id": {"$ne":
// null}} would select every entry).
type OperatorError struct {
	// Path is the dotted path of the offending field, e.g. "_id.$ne".
	Path string
}

func (e *OperatorError) Error() string {
	return fmt.Sprintf("field %q is a query operator: a document key is matched literally, write its value as (Extended) JSON, e.g. {\"_id\": {\"$oid\": \"...\"}}", e.Path)
}

// CheckDocumentKey returns an *OperatorError when key holds a field name
// starting with "$" (once Extended JSON wrappers such as {"$oid": ...} were
// parsed into their types), and nil otherwise. Every Filter method refuses
// such a key; callers parsing user input call it to report it early.
func CheckDocumentKey(key bson.Raw) error {
	if path := bsonraw.DollarPath(key); path != "" {
		return &OperatorError{Path: path}
	}
	return nil
}

// byOrder reports whether entries matching f are listed in stream order.
func (f Filter) byOrder() bool { return f.Kind == KindParked }

// streamOrder is the order of parked entries (re-drive) and of replays: the
// change's cluster time, then the legacy order, then _id (whose resume token
// sorts in stream order within a source).
var streamOrder = bson.D{{Key: "clusterTime", Value: 1}, {Key: "order", Value: 1}, {Key: "_id", Value: 1}}

// sort returns the List order of f.
func (f Filter) sort() bson.D {
	if f.byOrder() {
		return streamOrder
	}
	return bson.D{{Key: "createdAt", Value: -1}, {Key: "_id", Value: -1}}
}

// pageQuery returns f's filter restricted to the entries after f.AfterID in
// List order.
func (s *Store) pageQuery(ctx context.Context, f Filter) (bson.D, error) {
	q, err := f.query()
	if err != nil || f.AfterID == "" {
		return q, err
	}
	var after record
	err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: f.AfterID}},
		options.FindOne().SetProjection(bson.D{{Key: "createdAt", Value: 1}, {Key: "clusterTime", Value: 1}, {Key: "order", Value: 1}})).Decode(&after)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("page after %q: %w", f.AfterID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("page after %q: %w", f.AfterID, err)
	}
	var or bson.A
	if f.byOrder() {
		// A missing clusterTime sorts first (as null); ClusterTime's zero
		// value stands for it.
		var ct any = after.ClusterTime
		if after.ClusterTime.IsZero() {
			ct = nil
		}
		or = bson.A{
			bson.D{{Key: "clusterTime", Value: bson.D{{Key: "$gt", Value: ct}}}},
			bson.D{{Key: "clusterTime", Value: ct}, {Key: "order", Value: bson.D{{Key: "$gt", Value: after.Order}}}},
			bson.D{{Key: "clusterTime", Value: ct}, {Key: "order", Value: after.Order}, {Key: "_id", Value: bson.D{{Key: "$gt", Value: f.AfterID}}}},
		}
	} else {
		or = bson.A{
			bson.D{{Key: "createdAt", Value: bson.D{{Key: "$lt", Value: after.CreatedAt}}}},
			bson.D{{Key: "createdAt", Value: after.CreatedAt}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: f.AfterID}}}},
		}
	}
	return append(q, bson.E{Key: "$or", Value: or}), nil
}

// List returns the entries matching f, at most f.Limit of them. Parked
// entries (Kind == KindParked) are listed in re-drive order, which is stream
// order: ClusterTime, then Order, then _id, ascending. Every other filter lists newest first: CreatedAt
// descending, then _id descending. Page with f.AfterID set to the ID of the
// last entry of the previous page.
func (s *Store) List(ctx context.Context, f Filter) ([]Entry, error) {
	q, err := s.pageQuery(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("dead letters: list: %w", err)
	}
	opts := options.Find().SetSort(f.sort())
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := s.coll.Find(ctx, q, opts)
	if err != nil {
		return nil, fmt.Errorf("dead letters: list: %w", err)
	}
	defer cur.Close(ctx)
	var out []Entry
	for cur.Next(ctx) {
		var r record
		if err := cur.Decode(&r); err != nil {
			return nil, fmt.Errorf("dead letters: list: decode: %w", err)
		}
		out = append(out, r.entry())
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("dead letters: list: %w", err)
	}
	return out, nil
}

// summaryProjection leaves out of a listed entry the parts that can be
// large (the stored change and its envelope, up to 16 MiB each).
var summaryProjection = bson.D{{Key: "change", Value: 0}, {Key: "envelope", Value: 0}}

// Summaries calls fn, one entry at a time and in List order, with the
// summary (Entry.Summary: no Change, no Envelope) of each entry List(f)
// would return. The large fields are never read from the server, and no
// more than one cursor batch of summaries is held at once, so memory does
// not grow with the size or number of the entries. fn's error stops the
// walk and is returned as is; ready, if non-nil, is called once the query
// was accepted and before the first fn call, so a caller can tell an
// invalid filter (an error before ready) from a failure half way.
func (s *Store) Summaries(ctx context.Context, f Filter, ready func(), fn func(Entry) error) error {
	q, err := s.pageQuery(ctx, f)
	if err != nil {
		return fmt.Errorf("dead letters: list: %w", err)
	}
	opts := options.Find().SetSort(f.sort()).SetProjection(summaryProjection).SetBatchSize(100)
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := s.coll.Find(ctx, q, opts)
	if err != nil {
		return fmt.Errorf("dead letters: list: %w", err)
	}
	defer cur.Close(ctx)
	if ready != nil {
		ready()
	}
	for cur.Next(ctx) {
		var r record
		if err := cur.Decode(&r); err != nil {
			return fmt.Errorf("dead letters: list: decode: %w", err)
		}
		if err := fn(r.entry()); err != nil {
			return err
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("dead letters: list: %w", err)
	}
	return nil
}

// ids returns the _ids of the entries List(f) would return.
func (s *Store) ids(ctx context.Context, f Filter) ([]string, error) {
	q, err := s.pageQuery(ctx, f)
	if err != nil {
		return nil, err
	}
	opts := options.Find().SetSort(f.sort()).SetProjection(bson.D{{Key: "_id", Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := s.coll.Find(ctx, q, opts)
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	var out []string
	for cur.Next(ctx) {
		id, ok := cur.Current.Lookup("_id").StringValueOK()
		if !ok {
			continue // not ours
		}
		out = append(out, id)
	}
	return out, cur.Err()
}

// Count returns the number of entries matching f; with f.Limit (or
// f.AfterID), the number List(f) would return.
func (s *Store) Count(ctx context.Context, f Filter) (int64, error) {
	q, err := s.pageQuery(ctx, f)
	if err != nil {
		return 0, fmt.Errorf("dead letters: count: %w", err)
	}
	opts := options.Count()
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	n, err := s.coll.CountDocuments(ctx, q, opts)
	if err != nil {
		return 0, fmt.Errorf("dead letters: count: %w", err)
	}
	return n, nil
}

// CountBySink returns the number of entries of kind (every kind when empty)
// per sink. Gaps have no sink: they are counted under "".
func (s *Store) CountBySink(ctx context.Context, kind Kind) (map[string]int64, error) {
	pipeline := bson.A{}
	if kind != "" {
		pipeline = append(pipeline, bson.D{{Key: "$match", Value: bson.D{{Key: "kind", Value: kind}}}})
	}
	pipeline = append(pipeline, bson.D{{Key: "$group", Value: bson.D{
		{Key: "_id", Value: "$sink"},
		{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
	}}})
	cur, err := s.coll.Aggregate(ctx, pipeline)
	if err != nil {
		return nil, fmt.Errorf("dead letters: count by sink: %w", err)
	}
	defer cur.Close(ctx)
	out := map[string]int64{}
	for cur.Next(ctx) {
		var row struct {
			Sink *string `bson:"_id"`
			N    int64   `bson:"n"`
		}
		if err := cur.Decode(&row); err != nil {
			return nil, fmt.Errorf("dead letters: count by sink: decode: %w", err)
		}
		sink := ""
		if row.Sink != nil {
			sink = *row.Sink
		}
		out[sink] += row.N
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("dead letters: count by sink: %w", err)
	}
	return out, nil
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

// Purge deletes the entries matching f (with f.Limit or f.AfterID, those
// List(f) would return) and returns how many it deleted. An empty Filter
// purges everything: callers exposing Purge to people should ask for
// confirmation.
func (s *Store) Purge(ctx context.Context, f Filter) (int64, error) {
	q, err := f.query()
	if err != nil {
		return 0, fmt.Errorf("dead letters: purge: %w", err)
	}
	if f.Limit > 0 || f.AfterID != "" {
		ids, err := s.ids(ctx, f)
		if err != nil {
			return 0, fmt.Errorf("dead letters: purge: %w", err)
		}
		if len(ids) == 0 {
			return 0, nil
		}
		q = bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}
	}
	res, err := s.coll.DeleteMany(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("dead letters: purge: %w", err)
	}
	return res.DeletedCount, nil
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
