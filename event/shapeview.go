package event

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/changegate/changegate/internal/bsonraw"
)

// This file holds the shaped views of an event: Event.Shaped makes one view
// per shape and caches it on the event, and a view encodes its payload in its
// envelope form (Record, AppendRecord, Metadata).

// shaping holds the shaping state of an Event: two pointers, so that an
// event that is never shaped stays small.
type shaping struct {
	view  *viewState              // set on a view: what it is a view of
	views atomic.Pointer[viewSet] // the views made from this event
}

// viewState is what a view knows beyond its Event fields.
type viewState struct {
	base     *Event // the event the view was made from
	shape    *Shape
	shapeErr error
	skip     bool
	record   [2]lazyJSON // Record's encodings (relaxed, canonical) of a document-form view
}

// viewSet holds the views of an event, one per shape fingerprint.
type viewSet struct {
	mu   sync.Mutex
	list []*Event
}

// Shaped returns the view of e that shape s makes: an Event with e's id,
// position and metadata whose Raw is the shaped change and whose Envelope
// is the shaped payload. skip reports an update whose shaped changes are
// empty under skip_empty_updates: it is not to be sent (but acknowledged).
// A nil shape returns e itself. Views are made once per (event, shape
// fingerprint) and cached on e, so sinks of the same shape share one view
// and its encodings; Shaped is safe for concurrent use. A change the shape
// cannot be applied to yields a view whose Envelope fails (the sink then
// fails it permanently and the dead letter keeps the raw change).
func (e *Event) Shaped(s *Shape) (view *Event, skip bool) {
	if s == nil {
		return e, false
	}
	base := e.Unshaped()
	set := base.views.Load()
	if set == nil {
		base.views.CompareAndSwap(nil, &viewSet{})
		set = base.views.Load()
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	for _, v := range set.list {
		if v.view.shape.fp == s.fp {
			return v, v.view.skip
		}
	}
	v := &Event{
		ID: base.ID, Source: base.Source, Seq: base.Seq, Token: base.Token, OperationType: base.OperationType,
		DB: base.DB, Coll: base.Coll, DocumentKey: base.DocumentKey, ClusterTime: base.ClusterTime,
		WallTime: base.WallTime, Rules: base.Rules, Tenure: base.Tenure, Txn: base.Txn, Mem: base.Mem,
		Observed: base.Observed,
	}
	vs := &viewState{base: base, shape: s}
	v.view = vs
	sc, err := s.apply(base.Raw, base.OperationType)
	if err != nil {
		vs.shapeErr = fmt.Errorf("event %s: shape payload: %w", base.ID, err)
	} else {
		v.Raw = sc.raw
		vs.skip = sc.empty && s.skip
		if len(v.Raw) > 0 && (len(base.Raw) == 0 || &v.Raw[0] != &base.Raw[0]) {
			base.Mem.Grow(int64(cap(v.Raw))) // the view lives as long as its event
		}
	}
	set.list = append(set.list, v)
	return v, vs.skip
}

// Unshaped returns the event a view was made from (e itself when e is not
// a view): its Raw is the change as read, for dead letters and replay.
func (e *Event) Unshaped() *Event {
	if e.view != nil {
		return e.view.base
	}
	return e
}

// Shape returns the shape of a view (nil for an event that is not one).
func (e *Event) Shape() *Shape {
	if e.view == nil {
		return nil
	}
	return e.view.shape
}

// Form returns the envelope form of e's payload.
func (e *Event) Form() Form { return e.Shape().Form() }

// encodeShaped encodes the payload of e's form (Envelope's cache calls it).
func (e *Event) encodeShaped(canonical bool) ([]byte, error) {
	if e.view == nil {
		return e.encode(canonical)
	}
	if e.view.shapeErr != nil {
		return nil, e.view.shapeErr
	}
	switch e.Form() {
	case FormDocument:
		return e.encodeDocument(canonical)
	case FormKey:
		return e.encodeKey(canonical)
	}
	return e.encode(canonical)
}

// encodeDocument returns the shaped post-image as Extended JSON, or null
// when the change has none (a delete, an update without a lookup).
func (e *Event) encodeDocument(canonical bool) ([]byte, error) {
	v, err := e.Raw.LookupErr("fullDocument")
	if err != nil || v.Type != bson.TypeEmbeddedDocument {
		return []byte("null"), nil
	}
	if canonical && mayHaveDollarKey(v.Value) {
		if path := bsonraw.DollarPath(v.Document()); path != "" {
			return nil, fmt.Errorf("event %s: field %q: %w", e.ID, "fullDocument."+path, ErrAmbiguousJSON)
		}
	}
	b, err := encodeSized(len(v.Value), func(b []byte) ([]byte, error) {
		b, _, err := appendExtJSONValue(b, v.Type, v.Value, canonical)
		return b, err
	})
	if err != nil {
		if errors.Is(err, ErrInvalidUTF8) {
			return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
		}
		if b, err = bson.MarshalExtJSON(v.Document(), canonical, false); err != nil {
			return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
		}
	}
	return b, nil
}

// encodeKey returns {"id","operationType","ns","documentKey"} and, for an
// event of a transaction, "txn".
func (e *Event) encodeKey(canonical bool) ([]byte, error) {
	b := make([]byte, 0, 128+len(e.DocumentKey)*2)
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"operationType":`...)
	b = appendJSONString(b, e.OperationType)
	for _, k := range [...]string{"ns", "documentKey"} {
		v, err := e.Raw.LookupErr(k)
		if err != nil {
			continue
		}
		b = append(b, ',')
		b = appendJSONString(b, k)
		b = append(b, ':')
		if b, _, err = appendExtJSONValue(b, v.Type, v.Value, canonical); err != nil {
			return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
		}
	}
	if e.Txn != nil {
		b = append(b, `,"txn":`...)
		b = appendTxnJSON(b, e.Txn)
	}
	return append(b, '}'), nil
}

// recordFields are the change fields of a document-form Record.
var recordFields = map[string]bool{"ns": true, "documentKey": true, "fullDocument": true, "to": true, "collectionUUID": true}

// encodeRecord encodes the full envelope of the change restricted to
// recordFields.
func (e *Event) encodeRecord(canonical bool) ([]byte, error) {
	elems, err := e.Raw.Elements()
	if err != nil {
		return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
	}
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, len(e.Raw)))
	for _, el := range elems {
		if recordFields[el.Key()] {
			dst = append(dst, el...)
		}
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	s := &Event{
		ID: e.ID, Source: e.Source, OperationType: e.OperationType, DB: e.DB, Coll: e.Coll,
		DocumentKey: e.DocumentKey, ClusterTime: e.ClusterTime, WallTime: e.WallTime, Raw: bson.Raw(dst), Rules: e.Rules, Txn: e.Txn,
	}
	return s.encode(canonical)
}

// Record returns the shaped payload as one self-contained JSON object: the
// Envelope for the full and key forms; for the document form, the envelope
// with its metadata (id, source, operationType, ns, documentKey,
// clusterTime, wallTime, rules) and the shaped post-image as fullDocument,
// without fullDocumentBeforeChange and updateDescription. It is what an
// EventBridge detail, a batched webhook's array element and a dead
// letter's envelope carry, where there are no per-event headers. Cached
// like Envelope.
func (e *Event) Record(canonical bool) ([]byte, error) {
	if e.Form() != FormDocument {
		return e.Envelope(canonical)
	}
	l := &e.view.record[0]
	if canonical {
		l = &e.view.record[1]
	}
	l.once.Do(func() {
		if e.view.shapeErr != nil {
			l.err = e.view.shapeErr
			return
		}
		l.b, l.err = e.encodeRecord(canonical)
		e.Mem.Grow(int64(cap(l.b)))
	})
	return l.b, l.err
}

// AppendRecord appends Record(canonical) to dst and returns the extended
// buffer (on an error, dst as given). An Exclusive event that is not a
// shaped view is encoded straight into dst and its encoding is not cached
// (nor charged to Mem): its one sink writes it into its request and nothing
// else reads it, which saves a copy and an allocation per event; a later
// Record or Envelope encodes it again. Any other event appends its cached
// Record, encoding and caching it first.
func (e *Event) AppendRecord(dst []byte, canonical bool) ([]byte, error) {
	if e.Exclusive && e.view == nil {
		return e.appendEncoded(dst, canonical)
	}
	b, err := e.Record(canonical)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// MetaField is one item of a document-form payload's metadata.
type MetaField struct {
	// Name is the item's name, e.g. "operationType".
	Name string
	// Value is its value as text: the id, the operation type, the
	// namespace "db.coll", the documentKey as relaxed Extended JSON, the
	// cluster time as RFC 3339.
	Value string
}

// Metadata returns the metadata a document-form payload carries beside its
// body (webhook headers, SQS message attributes), in a fixed order: id,
// operationType, ns, documentKey, clusterTime, txn (its JSON object);
// items the event lacks are left out.
func (e *Event) Metadata() []MetaField {
	ns := e.DB
	if e.Coll != "" {
		ns += "." + e.Coll
	}
	m := []MetaField{{"id", e.ID}, {"operationType", e.OperationType}}
	if ns != "" {
		m = append(m, MetaField{"ns", ns})
	}
	if len(e.DocumentKey) > 0 {
		if b, err := bson.MarshalExtJSON(e.DocumentKey, false, false); err == nil {
			m = append(m, MetaField{"documentKey", string(b)})
		}
	}
	if e.ClusterTime.T != 0 {
		m = append(m, MetaField{"clusterTime", time.Unix(int64(e.ClusterTime.T), 0).UTC().Format(time.RFC3339)})
	}
	if e.Txn != nil {
		m = append(m, MetaField{"txn", e.Txn.JSON()})
	}
	return m
}
