package deadletter

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/internal/bsonraw"
)

// This file selects entries: Filter and its MongoDB query, the order of a
// listing (stream order for parked entries), List, Summaries, Count,
// CountBySink and Purge.

// Filter selects entries. Zero fields do not filter; an invalid Kind or
// DocumentKey makes every method that takes the Filter fail.
type Filter struct {
	// Kind selects one kind of entry. Replay treats an empty Kind as
	// "failed" (counting matching gaps as skipped).
	Kind Kind
	// Sink and Source select entries by sink and source name.
	Sink, Source string
	// SinkPrefix selects the entries of the sinks whose names start with
	// it, taken literally (a [[server.tokens]] token's prefix).
	SinkPrefix string
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

// SinkCondition is the condition on a sink name of a filter: equal to sink
// (unless ""), starting with prefix (unless ""), both as literals: the
// prefix is an anchored, quoted regular expression, so none of its
// characters acts as an operator or a pattern. Nil when both are empty.
func SinkCondition(sink, prefix string) bson.D {
	var c bson.D
	if sink != "" {
		c = append(c, bson.E{Key: "$eq", Value: sink})
	}
	if prefix != "" {
		c = append(c, bson.E{Key: "$regex", Value: "^" + regexp.QuoteMeta(prefix)})
	}
	return c
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
	if sink := SinkCondition(f.Sink, f.SinkPrefix); sink != nil {
		q = append(q, bson.E{Key: "sink", Value: sink})
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
