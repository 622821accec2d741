package deliverylog

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/deadletter"
)

// Log is the delivery log's collection, for the indexes and the reads. It
// is safe for concurrent use.
type Log struct {
	coll      *mongo.Collection
	retention time.Duration
	mode      string
	deps      Deps
}

// Deps are what Lifecycle reads besides the log; nil fields are not
// consulted (and the answer says so).
type Deps struct {
	// Checkpoints lists the saved checkpoints (checkpoint.Store).
	Checkpoints Checkpoints
	// DeadLetters reads dead-letter and parked entries by id
	// (deadletter.Store).
	DeadLetters DeadLetters
	// Routes returns the sinks the rules of a source may route its events
	// to, each with those rules; nil: only sinks with records or entries
	// are listed.
	Routes func(source string) []Route
}

// Route is a sink the rules of a source may route events to.
type Route struct {
	Sink  string
	Rules []string
}

// NewLog returns the log in coll, kept for retention (the TTL of
// EnsureIndexes) and written in mode (config.DeliveryLog*).
func NewLog(coll *mongo.Collection, retention time.Duration, mode string, deps Deps) *Log {
	return &Log{coll: coll, retention: retention, mode: mode, deps: deps}
}

// Collection returns the log's collection, for a Writer.
func (l *Log) Collection() *mongo.Collection { return l.coll }

// indexes serve the queries: the TTL on at, one per equality filter of
// List followed by its sort (at, _id, newest first), and the event ids of
// Lifecycle. An array field (event_ids, rules, keys) is the only one of its
// index, as MongoDB requires of a compound multikey index.
var indexes = []struct {
	name string
	keys bson.D
}{
	{"at_id", bson.D{{Key: "at", Value: -1}, {Key: "_id", Value: -1}}},
	{"event_ids", bson.D{{Key: "event_ids", Value: 1}, {Key: "at", Value: 1}}},
	{"sink_at", bson.D{{Key: "sink", Value: 1}, {Key: "at", Value: -1}, {Key: "_id", Value: -1}}},
	{"outcome_at", bson.D{{Key: "outcome", Value: 1}, {Key: "at", Value: -1}, {Key: "_id", Value: -1}}},
	{"rules_at", bson.D{{Key: "rules", Value: 1}, {Key: "at", Value: -1}, {Key: "_id", Value: -1}}},
	{"source_at", bson.D{{Key: "source", Value: 1}, {Key: "at", Value: -1}, {Key: "_id", Value: -1}}},
	{"keys_at", bson.D{{Key: "keys", Value: 1}, {Key: "at", Value: -1}, {Key: "_id", Value: -1}}},
}

// ttlIndex is the name of the TTL index on at.
const ttlIndex = "ttl_at"

// EnsureIndexes creates the log's indexes: the TTL index on at with the
// log's retention, and those of the queries. A TTL index made with another
// retention is changed to this one (collMod).
func (l *Log) EnsureIndexes(ctx context.Context) error {
	secs := int32(l.retention / time.Second)
	models := []mongo.IndexModel{{Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetName(ttlIndex).SetExpireAfterSeconds(secs)}}
	for _, ix := range indexes {
		models = append(models, mongo.IndexModel{Keys: ix.keys, Options: options.Index().SetName(ix.name)})
	}
	_, err := l.coll.Indexes().CreateMany(ctx, models)
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == 85 { // IndexOptionsConflict: the retention changed
		err = l.coll.Database().RunCommand(ctx, bson.D{{Key: "collMod", Value: l.coll.Name()}, {Key: "index", Value: bson.D{
			{Key: "name", Value: ttlIndex}, {Key: "expireAfterSeconds", Value: secs}}}}).Err()
		if err == nil {
			_, err = l.coll.Indexes().CreateMany(ctx, models[1:])
		}
	}
	if err != nil {
		return fmt.Errorf("delivery log %s: create indexes: %w", l.coll.Name(), err)
	}
	return nil
}

// Status selects records in List.
type Status string

// The statuses of List.
const (
	// StatusFailed: every attempt that did not deliver (retrying, parked,
	// dead_lettered, abandoned).
	StatusFailed       Status = "failed"
	StatusRetrying     Status = "retrying"
	StatusParked       Status = "parked"
	StatusDeadLettered Status = "dead_lettered"
	StatusDelivered    Status = "delivered"
)

// Statuses lists the statuses List accepts.
var Statuses = []Status{StatusFailed, StatusRetrying, StatusParked, StatusDeadLettered, StatusDelivered}

// Filter selects records. Zero fields do not filter.
type Filter struct {
	// Sink, Rule and Source select records by name.
	Sink, Rule, Source string
	// SinkPrefix selects the records of the sinks whose names start with
	// it, taken literally (a [[server.tokens]] token's prefix).
	SinkPrefix string
	// Status selects by outcome (Statuses).
	Status Status
	// Since (inclusive) and Until (exclusive) bound the record's time.
	Since, Until time.Time
	// DocumentKey selects the records of a document: its key exactly as
	// the sink's shape shows it (a redacted field as its mask or hash),
	// matched literally. A key that is not a non-empty document, or holds
	// a field name starting with "$", is an error.
	DocumentKey bson.Raw
	// MinAttempts selects attempts numbered at least this.
	MinAttempts int
	// MinDuration selects attempts that took at least this long.
	MinDuration time.Duration
	// Limit is the page size (default 50, at most MaxLimit).
	Limit int
	// Cursor continues from a Page's Next.
	Cursor string
}

// Page sizes of List.
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)

// ErrBadFilter is wrapped by the errors of an invalid Filter.
var ErrBadFilter = errors.New("invalid filter")

// Page is one page of List: newest first.
type Page struct {
	Records []Record
	// Next is the cursor of the next page; empty on the last one.
	Next string
}

// query translates f, without the cursor, into a MongoDB filter of typed
// values only: names are compared with $eq, the document key is one $eq
// operand, so no part of a user's input becomes an operator.
func (f Filter) query() (bson.D, error) {
	q := bson.D{}
	eq := func(k string, v any) { q = append(q, bson.E{Key: k, Value: bson.D{{Key: "$eq", Value: v}}}) }
	if sink := deadletter.SinkCondition(f.Sink, f.SinkPrefix); sink != nil {
		q = append(q, bson.E{Key: "sink", Value: sink})
	}
	if f.Rule != "" {
		eq("rules", f.Rule)
	}
	if f.Source != "" {
		eq("source", f.Source)
	}
	switch f.Status {
	case "":
	case StatusFailed:
		var failed []Outcome
		for _, o := range Outcomes {
			if o.Failed() {
				failed = append(failed, o)
			}
		}
		q = append(q, bson.E{Key: "outcome", Value: bson.D{{Key: "$in", Value: failed}}})
	case StatusRetrying, StatusParked, StatusDeadLettered, StatusDelivered:
		eq("outcome", string(f.Status))
	default:
		return nil, fmt.Errorf("%w: status %q: use one of failed, retrying, parked, dead_lettered, delivered", ErrBadFilter, f.Status)
	}
	var at bson.D
	if !f.Since.IsZero() {
		at = append(at, bson.E{Key: "$gte", Value: f.Since.UTC()})
	}
	if !f.Until.IsZero() {
		at = append(at, bson.E{Key: "$lt", Value: f.Until.UTC()})
	}
	if at != nil {
		q = append(q, bson.E{Key: "at", Value: at})
	}
	if f.DocumentKey != nil {
		if err := checkKey(f.DocumentKey); err != nil {
			return nil, err
		}
		eq("keys", f.DocumentKey)
	}
	if f.MinAttempts < 0 || f.MinDuration < 0 {
		return nil, fmt.Errorf("%w: min_attempts and min_duration must not be negative", ErrBadFilter)
	}
	if f.MinAttempts > 0 {
		q = append(q, bson.E{Key: "attempt", Value: bson.D{{Key: "$gte", Value: f.MinAttempts}}})
	}
	if f.MinDuration > 0 {
		q = append(q, bson.E{Key: "duration_ms", Value: bson.D{{Key: "$gte", Value: durationMS(f.MinDuration)}}})
	}
	return q, nil
}

// cursor is the position after the last record of a page: its time and _id.
type cursor struct {
	at time.Time
	id bson.ObjectID
}

const cursorVersion = 1

func (c cursor) String() string {
	var b [21]byte
	b[0] = cursorVersion
	binary.BigEndian.PutUint64(b[1:9], uint64(c.at.UnixMilli()))
	copy(b[9:], c.id[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 21 || b[0] != cursorVersion {
		return cursor{}, fmt.Errorf("%w: cursor %q: not a cursor this log returned", ErrBadFilter, s)
	}
	c := cursor{at: time.UnixMilli(int64(binary.BigEndian.Uint64(b[1:9]))).UTC()}
	copy(c.id[:], b[9:])
	return c, nil
}

// List returns a page of the records f selects, newest first.
func (l *Log) List(ctx context.Context, f Filter) (Page, error) {
	q, err := f.query()
	if err != nil {
		return Page{}, err
	}
	limit := f.Limit
	switch {
	case limit < 0:
		return Page{}, fmt.Errorf("%w: limit must not be negative", ErrBadFilter)
	case limit == 0:
		limit = DefaultLimit
	case limit > MaxLimit:
		limit = MaxLimit
	}
	if f.Cursor != "" {
		c, err := parseCursor(f.Cursor)
		if err != nil {
			return Page{}, err
		}
		q = append(q, bson.E{Key: "$or", Value: bson.A{
			bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: c.at}}}},
			bson.D{{Key: "at", Value: bson.D{{Key: "$eq", Value: c.at}}}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: c.id}}}},
		}})
	}
	opts := options.Find().SetSort(bson.D{{Key: "at", Value: -1}, {Key: "_id", Value: -1}}).SetLimit(int64(limit) + 1)
	cur, err := l.coll.Find(ctx, q, opts)
	if err != nil {
		return Page{}, fmt.Errorf("delivery log: list: %w", err)
	}
	var docs []stored
	if err := cur.All(ctx, &docs); err != nil {
		return Page{}, fmt.Errorf("delivery log: list: %w", err)
	}
	var p Page
	if len(docs) > limit {
		docs = docs[:limit]
		last := docs[limit-1]
		p.Next = cursor{at: last.At, id: last.ID}.String()
	}
	p.Records = make([]Record, len(docs))
	for i := range docs {
		p.Records[i] = docs[i].record()
	}
	return p, nil
}

// ParseDocumentKey reads a document key given as (Extended) JSON, as the
// API and the CLI take it, for Filter.DocumentKey: a non-empty object whose
// field names do not start with "$" once the Extended JSON wrappers
// ({"$oid": ...}) were read, so that it is matched literally.
func ParseDocumentKey(s string) (bson.Raw, error) {
	var key bson.Raw
	if err := bson.UnmarshalExtJSON([]byte(s), false, &key); err != nil {
		return nil, fmt.Errorf("%w: document key %q: not a JSON object: %w", ErrBadFilter, s, err)
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return key, nil
}

// checkKey refuses a document key that is not a non-empty document or
// holds a field name starting with "$" (deadletter.CheckDocumentKey).
func checkKey(key bson.Raw) error {
	if elems, err := key.Elements(); err != nil || len(elems) == 0 {
		return fmt.Errorf("%w: document key: not a non-empty document", ErrBadFilter)
	}
	if err := deadletter.CheckDocumentKey(key); err != nil {
		return fmt.Errorf("%w: document key: %w", ErrBadFilter, err)
	}
	return nil
}
