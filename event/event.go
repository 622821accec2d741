// Package event defines the change event that flows from a source through the
// router to the sinks, and its JSON envelope.
package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/internal/nozero"
	"github.com/changegate/changegate/memory"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ErrAmbiguousJSON is returned (wrapped) by Envelope(true) for a change
// holding a field name that starts with "$" (MongoDB 5.0+ allows them):
// Extended JSON has no escape for it, so {"$oid": "x"} written as a user
// document would read back as an ObjectId. Canonical mode promises an
// unambiguous rendering, so it refuses such an event (the sink fails it
// permanently and the dead letter keeps the raw change); relaxed mode
// writes it as the MongoDB drivers do.
var ErrAmbiguousJSON = errors.New(`a field name starting with "$" cannot be written unambiguously in canonical Extended JSON (use json = "relaxed" for such documents)`)

// Event is one change read from a MongoDB change stream, as delivered to sinks.
//
// An Event is created by a source, completed by the router (Rules) and then
// shared read-only by every sink it is routed to; after routing it is safe for
// concurrent use.
type Event struct {
	// ID is stable across re-deliveries: "<source>:<resume token data>".
	ID string
	// Source is the name of the [[sources]] entry that read the event.
	Source string
	// Seq is the event's position in its source's stream since the source
	// process started; it increases by one per event and is used for
	// checkpoint tracking only.
	Seq uint64
	// Token is the change event's _id, the resume token.
	Token bson.Raw
	// OperationType is insert, update, replace, delete, drop, rename,
	// dropDatabase or invalidate.
	OperationType string
	// DB and Coll are the namespace of the change (ns.db, ns.coll).
	DB, Coll string
	// DocumentKey is the documentKey field (nil when the event has none).
	DocumentKey bson.Raw
	// ClusterTime is the oplog time of the change.
	ClusterTime bson.Timestamp
	// WallTime is the server wall clock time of the change; when the server
	// does not report it, it is derived from ClusterTime.
	WallTime time.Time
	// Raw is the change event document as read from the stream.
	Raw bson.Raw
	// Rules lists the names of the rules that matched the event, in config
	// order. Set by the router before the event is handed to sinks.
	Rules []string
	// Tenure is the ownership under which the event was read in cluster
	// mode (nil when this process owns every unit). Set by the source.
	Tenure *Tenure
	// Mem is the event's share of the process's byte budget
	// (max_in_flight_bytes), set by whoever admitted it (a source, a
	// re-drive, a replay, a backfill); nil when nothing counts it. The
	// encodings and shaped views cached on the event are charged to it
	// when they are made (Mem.Grow); views share their event's Mem.
	Mem *memory.Charge
	// Txn is the transaction metadata of an event written by a
	// multi-document transaction, nil for a single write. Set by the source
	// before dispatch (and by dead-letter replay from the stored entry).
	Txn *Txn
	// Observed links the states the router's observers keep for the
	// change (package observe: a trace, ...), nil when none does. Shaped
	// views share their event's.
	Observed *Observation
	// Exclusive is set by the router's Dispatch when it hands the event to
	// one sink only: that sink may encode the payload straight into its
	// request (AppendRecord) rather than cache it on the event for other
	// sinks to share. False (the default) always caches.
	Exclusive bool

	// noTxn: FromChange found no lsid document and integer txnNumber in
	// Raw, so TxnID(Raw) is not ok (false for an event made otherwise).
	noTxn bool

	relaxed   lazyJSON
	canonical lazyJSON

	// Shaping (shapeview.go): a shaped view of an event points to the event
	// it was made from (base) and its shape; an event caches its views.
	shaping
}

// Observation is one observer's state of an event, linked to the other
// observers' (Event.Observed). Package observe sets and reads them.
type Observation struct {
	Key, State any
	Next       *Observation
}

type lazyJSON struct {
	once sync.Once
	b    []byte
	err  error
}

// TokenData returns a printable form of a resume token: its _data string when
// it has one (as MongoDB tokens do), otherwise a hex SHA-256 of the raw token.
func TokenData(token bson.Raw) string {
	if v, err := token.LookupErr("_data"); err == nil {
		if s, ok := v.StringValueOK(); ok {
			return s
		}
	}
	sum := sha256.Sum256(token)
	return hex.EncodeToString(sum[:])
}

// TokenClusterTime returns the cluster time a MongoDB resume token encodes:
// its _data is a hex KeyString that begins with the type byte 0x82 (a
// timestamp) followed by the time's seconds and increment, big-endian (as
// MongoDB's resume-token decoders read it). It returns false for a token of
// another shape.
func TokenClusterTime(token bson.Raw) (bson.Timestamp, bool) {
	v, err := token.LookupErr("_data")
	if err != nil {
		return bson.Timestamp{}, false
	}
	s, ok := v.StringValueOK()
	if !ok {
		return bson.Timestamp{}, false
	}
	return DataClusterTime(s)
}

// DataClusterTime is TokenClusterTime of a token's _data string (the part
// of an event id after its source: SplitID).
func DataClusterTime(data string) (bson.Timestamp, bool) {
	if len(data) < 18 {
		return bson.Timestamp{}, false
	}
	var b [9]byte
	if _, err := hex.Decode(b[:], []byte(data[:18])); err != nil || b[0] != 0x82 {
		return bson.Timestamp{}, false
	}
	return bson.Timestamp{T: binary.BigEndian.Uint32(b[1:5]), I: binary.BigEndian.Uint32(b[5:9])}, true
}

// MakeID returns the stable event id for a source and resume token.
func MakeID(source string, token bson.Raw) string {
	return source + ":" + TokenData(token)
}

// SplitID returns the source of an event id (MakeID) and the token data
// that follows it; false when id has no source or no data.
func SplitID(id string) (source, data string, ok bool) {
	source, data, ok = strings.Cut(id, ":")
	return source, data, ok && source != "" && data != ""
}

// Top-level change fields FromChange reads, found in one pass.
const (
	chID = iota
	chOperationType
	chNS
	chDocumentKey
	chClusterTime
	chWallTime
	chLsid
	chTxnNumber
	chFields
)

// changeField returns the chXxx index of a top-level change field, or -1.
func changeField(key []byte) int {
	switch string(key) {
	case "_id":
		return chID
	case "operationType":
		return chOperationType
	case "ns":
		return chNS
	case "documentKey":
		return chDocumentKey
	case "clusterTime":
		return chClusterTime
	case "wallTime":
		return chWallTime
	case "lsid":
		return chLsid
	case "txnNumber":
		return chTxnNumber
	}
	return -1
}

// scanChange finds the fields FromChange reads in one pass over raw, with
// the results raw.LookupErr would give for each: the first occurrence of a
// key, and nothing from a malformed element on.
func scanChange(raw bson.Raw) (vals [chFields]bsoncore.Value, found [chFields]bool) {
	length, rem, ok := bsoncore.ReadLength(raw)
	if !ok {
		return vals, found
	}
	length -= 4
	for length > 1 {
		keyEnd, end, ok := elementBounds(rem)
		if !ok {
			return vals, found
		}
		length -= int32(end)
		if i := changeField(rem[1:keyEnd]); i >= 0 && !found[i] {
			// A value that cannot be read stays the zero Value (type 0):
			// found, but of no usable type, as LookupErr's error.
			found[i] = true
			vals[i], _ = element{t: rem[0], value: rem[keyEnd+1 : end]}.coreValue()
		}
		rem = rem[end:]
	}
	return vals, found
}

// stringBytes returns the bytes of a BSON string value, with the checks of
// bsoncore's Value.StringValueOK, without allocating.
func stringBytes(v bsoncore.Value) ([]byte, bool) {
	if v.Type != bsoncore.TypeString {
		return nil, false
	}
	l, rem, ok := bsoncore.ReadLength(v.Data)
	if !ok || len(rem) < int(l) || l <= 0 {
		return nil, false
	}
	return rem[:l-1], true
}

// tokenData returns TokenData(token) as bytes when the token has a _data
// string (without allocating), or nil, false.
func tokenData(token bson.Raw) ([]byte, bool) {
	v, ok := lookup(token, "_data")
	if !ok {
		return nil, false
	}
	return stringBytes(v)
}

// FromChange builds an Event from a raw change stream document. seq is the
// position assigned by the source.
func FromChange(source string, seq uint64, raw bson.Raw) (*Event, error) {
	vals, found := scanChange(raw)
	if !found[chID] || vals[chID].Type == 0 {
		return nil, fmt.Errorf("change event has no _id (resume token)")
	}
	idv := bson.RawValue{Type: bson.Type(vals[chID].Type), Value: vals[chID].Data}
	tok, ok := idv.DocumentOK()
	if !ok {
		return nil, fmt.Errorf("change event _id is a %s, not a document", idv.Type)
	}
	e := &Event{
		Source: source,
		Seq:    seq,
		Token:  tok,
		Raw:    raw,
	}
	// The event's strings (id, operation type, database, collection) share
	// one allocation.
	data, hasData := tokenData(tok)
	var op, db, coll []byte
	if found[chOperationType] {
		op, _ = stringBytes(vals[chOperationType])
	}
	if found[chNS] {
		// As raw.LookupErr("ns", "db"): ns may be a document or an array.
		if ns := vals[chNS]; ns.Type == bsoncore.TypeEmbeddedDocument || ns.Type == bsoncore.TypeArray {
			if v, ok := lookup(ns.Data, "db"); ok {
				db, _ = stringBytes(v)
			}
			if v, ok := lookup(ns.Data, "coll"); ok {
				coll, _ = stringBytes(v)
			}
		}
	}
	var sb strings.Builder
	if hasData {
		sb.Grow(len(source) + 1 + len(data) + len(op) + len(db) + len(coll))
		sb.WriteString(source)
		sb.WriteByte(':')
		sb.Write(data)
	} else {
		sb.Grow(len(op) + len(db) + len(coll))
	}
	sb.Write(op)
	sb.Write(db)
	sb.Write(coll)
	all := sb.String()
	n := 0
	if hasData {
		n = len(source) + 1 + len(data)
		e.ID = all[:n]
	} else {
		e.ID = MakeID(source, tok)
	}
	e.OperationType = all[n : n+len(op)]
	n += len(op)
	e.DB = all[n : n+len(db)]
	n += len(db)
	e.Coll = all[n : n+len(coll)]
	if found[chDocumentKey] {
		e.DocumentKey, _ = bson.RawValue{Type: bson.Type(vals[chDocumentKey].Type), Value: vals[chDocumentKey].Data}.DocumentOK()
	}
	if found[chClusterTime] {
		t, i, _ := vals[chClusterTime].TimestampOK()
		e.ClusterTime = bson.Timestamp{T: t, I: i}
	}
	if found[chWallTime] {
		if dt, ok := vals[chWallTime].DateTimeOK(); ok {
			e.WallTime = time.UnixMilli(dt).UTC()
		}
	}
	if e.WallTime.IsZero() && e.ClusterTime.T != 0 {
		e.WallTime = time.Unix(int64(e.ClusterTime.T), 0).UTC()
	}
	// TxnID needs an lsid document and an integer txnNumber (the first of
	// each key, as its LookupErr finds them): without them the change is
	// not a transaction's, known here without reading it again.
	lsid, number := vals[chLsid].Type, vals[chTxnNumber].Type
	e.noTxn = !found[chLsid] || lsid != bsoncore.TypeEmbeddedDocument ||
		!found[chTxnNumber] || (number != bsoncore.TypeInt64 && number != bsoncore.TypeInt32)
	return e, nil
}

// OrderingKey returns the key that orders deliveries within a sink: events
// with equal keys are delivered in stream order. It is the namespace plus the
// document key; events without a document key (drop, rename, ...) order by
// namespace alone.
func (e *Event) OrderingKey() string {
	return e.DB + "." + e.Coll + "\x00" + string(e.DocumentKey)
}

// OrderingKeyHash returns a 64-bit hash of OrderingKey(), without building
// the key: FNV-1a, finished with MurmurHash3's 64-bit finaliser (fmix64).
// Its users reduce it modulo a partition count or mask it to a bucket, and
// FNV-1a's low bits and residues follow its last bytes too closely for
// that: 8,500 sequential int32 _ids fell into 1,641 of 10,000 partitions
// (5,732 with the finaliser, as random keys would), so a lane with 2,048
// requests allowed kept about 1,000 in flight. The finaliser is a
// bijection: equal hashes still mean equal FNV-1a hashes.
func (e *Event) OrderingKeyHash() uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(e.DB); i++ {
		h = (h ^ uint64(e.DB[i])) * prime64
	}
	h = (h ^ '.') * prime64
	for i := 0; i < len(e.Coll); i++ {
		h = (h ^ uint64(e.Coll[i])) * prime64
	}
	h *= prime64 // the "\x00" separator byte: h ^ 0 == h
	for _, c := range e.DocumentKey {
		h = (h ^ uint64(c)) * prime64
	}
	return fmix64(h)
}

// fmix64 is MurmurHash3's 64-bit finaliser: every input bit affects every
// output bit.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// SameOrderingKey reports whether e and o have the same OrderingKey().
func (e *Event) SameOrderingKey(o *Event) bool {
	return e.DB == o.DB && e.Coll == o.Coll && string(e.DocumentKey) == string(o.DocumentKey)
}

// envelopeFields are copied from the change event into the envelope, in this
// order, when present.
var envelopeFields = [...]string{
	"ns", "documentKey", "fullDocument", "fullDocumentBeforeChange",
	"updateDescription", "to", "collectionUUID",
}

// envelopeField returns the index of key in envelopeFields, or -1.
func envelopeField(key []byte) int {
	switch string(key) {
	case "ns":
		return 0
	case "documentKey":
		return 1
	case "fullDocument":
		return 2
	case "fullDocumentBeforeChange":
		return 3
	case "updateDescription":
		return 4
	case "to":
		return 5
	case "collectionUUID":
		return 6
	}
	return -1
}

// Envelope returns the JSON envelope delivered to receivers. It is encoded
// once per format and cached; callers must not modify the returned slice.
func (e *Event) Envelope(canonical bool) ([]byte, error) {
	l := &e.relaxed
	if canonical {
		l = &e.canonical
	}
	l.once.Do(func() {
		l.b, l.err = e.encodeShaped(canonical)
		e.Mem.Grow(int64(cap(l.b))) // cached as long as the event is held
	})
	return l.b, l.err
}

// encode returns the envelope (appendEncoded) in a buffer of its own.
func (e *Event) encode(canonical bool) ([]byte, error) {
	b, err := encodeSized(len(e.Raw), func(b []byte) ([]byte, error) { return e.appendEncoded(b, canonical) })
	if err != nil {
		return nil, err
	}
	return b, nil
}

// scratchMaxRaw is the largest change whose envelope is encoded in a
// pooled scratch buffer and then copied out at its exact size; a larger
// one is encoded straight into its own buffer (envelopeCap), where a
// second copy of megabytes would cost more than a spare capacity.
// scratchKeep is the largest scratch buffer put back into the pool.
const (
	scratchMaxRaw = 32 << 10
	scratchKeep   = 256 << 10
)

// scratchPool holds the scratch buffers of encodeFast. A buffer is only
// ever held by one encodeFast call, from Get to Put, and nothing it
// returns aliases it (the envelope is a copy), so the envelope bytes cached
// on an event and shared by sinks are never recycled. It is the one
// package-level variable of the package: a cache of spare capacity (as
// encoding/json's encoder pool), nothing observable depends on what it holds.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// encodeFast encodes the envelope with the direct encoder of extjson.go;
// it fails (and encode falls back to encodeDriver) on malformed BSON.
// The envelope of a small change is encoded in a pooled scratch buffer and
// copied into an allocation of its own size (no over-sized buffer to
// zero, collect and charge to the byte budget while it is cached).
func (e *Event) encodeFast(canonical bool) ([]byte, error) {
	return encodeSized(len(e.Raw), func(b []byte) ([]byte, error) { return e.appendEnvelope(b, canonical) })
}

// encodeSized returns what appendTo appends to an empty buffer, for an
// encoding of n bytes of BSON: up to scratchMaxRaw through a pooled
// scratch buffer, copied out at its exact size, or else appended straight
// to a buffer of envelopeCap(n).
func encodeSized(n int, appendTo func([]byte) ([]byte, error)) ([]byte, error) {
	if n > scratchMaxRaw {
		// Not cleared first: the encoder overwrites what it uses, and
		// clearing megabytes costs as much as a copy of them.
		return appendTo(nozero.Bytes(envelopeCap(n)))
	}
	sp := scratchPool.Get().(*[]byte)
	b, err := appendTo((*sp)[:0])
	var out []byte
	if err == nil {
		out = bytes.Clone(b)
	}
	if cap(b) <= scratchKeep {
		*sp = b[:0]
	}
	scratchPool.Put(sp)
	return out, err
}

// appendEnvelope appends the envelope to b (encodeFast's encoder).
func (e *Event) appendEnvelope(b []byte, canonical bool) ([]byte, error) {
	// An id or operation type that is not valid UTF-8 refuses the
	// envelope before anything of the change is read.
	b = append(b, `{"id":`...)
	b, ok := appendValidJSONStringOf(b, e.ID)
	if !ok {
		return b, ErrInvalidUTF8
	}
	b = append(b, `,"source":`...)
	b = appendJSONString(b, e.Source)
	b = append(b, `,"operationType":`...)
	if b, ok = appendValidJSONStringOf(b, e.OperationType); !ok {
		return b, ErrInvalidUTF8
	}
	// One pass over the change finds the envelope fields (the first
	// occurrence of each, as LookupErr would).
	var vals [len(envelopeFields)]bsoncore.Value
	var found [len(envelopeFields)]bool
	doc := e.Raw
	if len(doc) < 5 {
		return nil, errSlowPath
	}
	for rem := doc[4 : len(doc)-1]; len(rem) > 0; {
		keyEnd, end, ok := elementBounds(rem)
		if !ok {
			return nil, errSlowPath
		}
		if i := envelopeField(rem[1:keyEnd]); i >= 0 && !found[i] {
			// A value Element.Value cannot read is found, of type 0:
			// appendExtJSONValue fails on it.
			el := element{t: rem[0], value: rem[keyEnd+1 : end]}
			vals[i], _ = el.coreValue()
			found[i] = true
		}
		rem = rem[end:]
	}
	for i, k := range envelopeFields {
		if !found[i] {
			continue
		}
		b = append(b, ',', '"')
		b = append(b, k...)
		b = append(b, '"', ':')
		var err error
		if b, _, err = appendExtJSONValue(b, bson.Type(vals[i].Type), vals[i].Data, canonical); err != nil {
			return nil, err
		}
	}
	if e.ClusterTime.T != 0 {
		b = append(b, `,"clusterTime":"`...)
		b = appendDateSecs(b, int64(e.ClusterTime.T))
		b = append(b, 'Z', '"')
	}
	if !e.WallTime.IsZero() {
		// RFC 3339 needs no JSON escaping.
		b = append(b, `,"wallTime":"`...)
		b = appendTimeRFC3339(b, e.WallTime)
		b = append(b, '"')
	}
	if e.Txn != nil {
		b = append(b, `,"txn":`...)
		b = appendTxnJSON(b, e.Txn)
	}
	b = append(b, `,"rules":[`...)
	for i, r := range e.Rules {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, r)
	}
	return append(b, "]}"...), nil
}

// appendEncoded appends the envelope to dst, encoded straight into it (no
// scratch buffer, no copy, nothing cached; encode runs it in a scratch
// buffer): the $-key check of canonical mode, the direct encoder
// (appendEnvelope) and, where it cannot handle the change, encodeDriver.
// On an error dst is returned as it was given (its length; bytes past it
// may have been written).
func (e *Event) appendEncoded(dst []byte, canonical bool) ([]byte, error) {
	if canonical && mayHaveDollarKey(e.Raw) {
		if path := bsonraw.DollarPath(e.Raw); path != "" {
			return dst, fmt.Errorf("event %s: field %q: %w", e.ID, path, ErrAmbiguousJSON)
		}
	}
	n := len(dst)
	b, err := e.appendEnvelope(dst, canonical)
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, ErrInvalidUTF8):
		return dst[:n], fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
	}
	d, err := e.encodeDriver(canonical)
	if err != nil {
		return dst[:n], err
	}
	return append(dst[:n], d...), nil
}

// encodeDriver encodes the envelope with bson.MarshalExtJSON: the reference
// encoding, used when encodeFast cannot handle the event.
func (e *Event) encodeDriver(canonical bool) ([]byte, error) {
	d := make(bson.D, 0, 12)
	d = append(d,
		bson.E{Key: "id", Value: e.ID},
		bson.E{Key: "source", Value: e.Source},
		bson.E{Key: "operationType", Value: e.OperationType},
	)
	for _, k := range envelopeFields {
		if v, err := e.Raw.LookupErr(k); err == nil {
			d = append(d, bson.E{Key: k, Value: v})
		}
	}
	if e.ClusterTime.T != 0 {
		d = append(d, bson.E{Key: "clusterTime", Value: time.Unix(int64(e.ClusterTime.T), 0).UTC().Format(time.RFC3339)})
	}
	if !e.WallTime.IsZero() {
		d = append(d, bson.E{Key: "wallTime", Value: e.WallTime.Format(time.RFC3339Nano)})
	}
	rules := e.Rules
	if rules == nil {
		rules = []string{}
	}
	d = append(d, bson.E{Key: "rules", Value: rules})
	b, err := bson.MarshalExtJSON(d, canonical, false)
	if err != nil {
		return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
	}
	if e.Txn != nil {
		// Before "rules", with plain JSON numbers as encodeFast writes them
		// (canonical Extended JSON would wrap the index in $numberLong).
		i := bytes.LastIndex(b, []byte(`,"rules":`))
		if i < 0 {
			return nil, fmt.Errorf("event %s: encode envelope: no rules", e.ID)
		}
		out := make([]byte, 0, len(b)+len(e.Txn.ID)+40)
		out = append(out, b[:i]...)
		out = append(out, `,"txn":`...)
		out = appendTxnJSON(out, e.Txn)
		b = append(out, b[i:]...)
	}
	return b, nil
}
