// Package deadletter stores the (event, sink) deliveries that did not
// succeed, and the history gaps of sources, in a MongoDB collection, and
// lists, counts, purges and replays them.
//
// One collection holds three kinds of entries:
//
//   - failed: a delivery failed permanently or exhausted its retries. It stays
//     until an operator replays (Store.Replay) or purges it.
//   - parked: an event set aside for a lagging sink (sink isolation). The
//     router re-drives parked entries automatically, in stream order
//     (ClusterTime, then Order, then ID), and deletes each once delivered
//     (Store.DeleteVersion: only the version it delivered), or converts it
//     to failed (Store.Convert).
//   - gap: a time range of changes that were never read because the change
//     stream history was lost. A gap cannot be replayed; it is a record for
//     the operator.
//
// Failed and parked entries of one event and sink share an _id
// (EventID + "/" + Sink), so writing an entry again after a crash updates it
// instead of duplicating it.
package deadletter

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/changegate/changegate/event"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Kind is the kind of a dead-letter entry.
type Kind string

// The kinds of entries.
const (
	// KindFailed is a delivery that failed permanently or exhausted its retries.
	KindFailed Kind = "failed"
	// KindParked is an event parked for a lagging sink (sink isolation),
	// re-driven automatically in order.
	KindParked Kind = "parked"
	// KindGap is a time range of changes that were never read (history lost).
	KindGap Kind = "gap"
)

// Valid reports whether k is one of the defined kinds.
func (k Kind) Valid() bool {
	return k == KindFailed || k == KindParked || k == KindGap
}

// Entry is one dead-letter entry. The bson names of its fields (used in the
// collection and its indexes) are the json names of MarshalJSON.
type Entry struct {
	// ID is the document _id: EntryID(EventID, Sink) for failed and parked
	// entries; for gaps it is chosen by the writer, e.g. GapID.
	ID   string
	Kind Kind
	// EventID is the stable event id (event.Event.ID); empty for gaps.
	EventID string
	// Source and Sink name the [[sources]] and [[sinks]] entries; Sink is
	// empty for gaps.
	Source, Sink string
	// Unit is the unit of work the event was read by: the source, or one
	// partition of it ("orders#2/4"). In cluster mode a replica re-drives
	// only the parked entries of the units it owns. Put stores Source when
	// it is empty.
	Unit string
	// Rules are the names of the rules that routed the event to the sink.
	Rules []string
	// Operation is the change's operationType.
	Operation string
	// Namespace is "db.coll" (just "db" for database-level events).
	Namespace string
	// DocumentKey is the change's documentKey, nil when it has none.
	DocumentKey bson.Raw
	// Change is the original change stream document; replay rebuilds the
	// event from it with event.FromChange. It is nil for gaps, and for an
	// entry whose change was too large to be stored (ChangeDropped).
	Change bson.Raw
	// Envelope is the relaxed JSON envelope of the event as a BSON document,
	// for people and queries. It is left out when storing it next to Change
	// would exceed MongoDB's document size limit.
	Envelope bson.Raw
	// ChangeDropped is set by Put when Change alone was too large to be
	// stored with the entry; such an entry cannot be replayed.
	ChangeDropped bool
	// Shaped is set when the sink's payload is shaped (projection,
	// redaction, envelope form): Envelope is the shaped payload, and
	// Change, kept for replay (which re-applies the current shaping), is
	// never shown (MarshalJSON leaves it out), since it holds what the
	// shaping removes or redacts.
	Shaped bool
	// ClusterTime is the change's cluster time.
	ClusterTime bson.Timestamp
	// Attempts is the number of delivery attempts. Put adds the Attempts of
	// the entry it writes to those already stored.
	Attempts int
	// Reason is a short cause, e.g. "http_400", "oversize", "exhausted",
	// "history_lost", "parked".
	Reason string
	// FirstError and LastError are the first and the latest error messages.
	FirstError, LastError string
	// FirstFailedAt, LastFailedAt and CreatedAt are UTC times (millisecond
	// precision once stored).
	FirstFailedAt, LastFailedAt, CreatedAt time.Time
	// Order breaks ties between entries of the same ClusterTime that are not
	// told apart by their ID. Writers since the parking order fix leave it 0:
	// an entry's place is its change's position (ClusterTime, then ID, whose
	// resume token sorts in stream order within a source), fixed the first
	// time it is written, whenever that is. Entries written by older versions
	// carry a time-based Order, kept as a tie-break.
	Order int64
	// Epoch is the lease epoch (cluster mode) of the tenure that wrote the
	// entry; 0 outside cluster mode. With it, Put and PutMany are fenced:
	// refused by the store when the unit's fence (Store.Fence) is higher.
	Epoch int64
	// Version changes on every write of the entry (Put and PutMany draw a
	// new one). A re-drive deletes an entry only at the version it read
	// (DeleteVersion), so an entry written again in between survives.
	Version int64
	// RetryAt, when set, is the earliest time the next delivery attempt may
	// be made: the backoff or Retry-After in force when the entry was
	// parked. The re-drive waits for it.
	RetryAt time.Time
	// GapFrom and GapTo bound the lost time range of a gap; LastToken is the
	// last persisted resume token of the source before the gap.
	GapFrom, GapTo time.Time
	LastToken      bson.Raw
	// Txn is the event's transaction metadata (event.Event.Txn), nil for
	// a single write and for entries written before transactions were
	// marked. It is stored because its index and last depend on the
	// stream around the change, not on the change alone; Event restores
	// it, so a replay or re-drive delivers the same txn.
	Txn *event.Txn
}

// EntryID returns the _id of the failed or parked entry of an event and sink.
func EntryID(eventID, sink string) string {
	return eventID + "/" + sink
}

// GapID returns an _id for the gap of source that starts at from:
// "gap/<source>/<from as RFC 3339 in UTC>".
func GapID(source string, from time.Time) string {
	return "gap/" + source + "/" + from.UTC().Format(time.RFC3339Nano)
}

// EntryFor returns the entry of kind (failed or parked) for the delivery of e
// to sink, with the event fields filled in: ID, Kind, EventID, Source, Sink,
// Rules, Operation, Namespace, DocumentKey, Change, Envelope (parsed from
// e.Record(false): for a shaped view of an event, the shaped payload; the
// change is the raw one, and Shaped is set) and ClusterTime. The caller sets Attempts, Reason, the
// errors, the times and, for parked entries, RetryAt. Envelope is left out
// when it cannot be encoded or read back (a document with field names such
// as "$oid"): the entry must still be written, and Change is what replay
// uses. The only error is a kind other than failed or parked.
func EntryFor(e *event.Event, sink string, kind Kind) (Entry, error) {
	if kind != KindFailed && kind != KindParked {
		return Entry{}, fmt.Errorf("dead letter for event %s: kind %q is not failed or parked", e.ID, kind)
	}
	// A shaped view of the event: the envelope shown is the shaped
	// payload (as one object: Record), the change stored is the raw one.
	raw := e.Unshaped().Raw
	var envDoc bson.Raw
	if env, err := e.Record(false); err == nil {
		if err := bson.UnmarshalExtJSON(env, false, &envDoc); err != nil {
			envDoc = nil
		}
	}
	ns := e.DB
	if e.Coll != "" {
		ns += "." + e.Coll
	}
	var rules []string
	if len(e.Rules) > 0 {
		rules = append(rules, e.Rules...)
	}
	return Entry{
		ID:          EntryID(e.ID, sink),
		Kind:        kind,
		EventID:     e.ID,
		Source:      e.Source,
		Sink:        sink,
		Rules:       rules,
		Operation:   e.OperationType,
		Namespace:   ns,
		DocumentKey: e.DocumentKey,
		Change:      raw,
		Envelope:    envDoc,
		Shaped:      e.Shape() != nil,
		ClusterTime: e.ClusterTime,
		Txn:         e.Txn,
	}, nil
}

// ErrNotReplayable is reported (wrapped, in ReplayResult.Errors) for an
// entry that cannot be replayed: a gap, or an entry stored without its
// change.
var ErrNotReplayable = errors.New("entry cannot be replayed")

// Event rebuilds the event of a failed or parked entry from its change
// document, with the entry's rules and transaction metadata. Its Seq is 0.
func (e Entry) Event() (*event.Event, error) {
	if e.Kind == KindGap || len(e.Change) == 0 {
		return nil, fmt.Errorf("dead letter %s: %w", e.ID, ErrNotReplayable)
	}
	ev, err := event.FromChange(e.Source, 0, e.Change)
	if err != nil {
		return nil, fmt.Errorf("dead letter %s: rebuild event: %w", e.ID, err)
	}
	if len(e.Rules) > 0 {
		ev.Rules = append([]string(nil), e.Rules...)
	}
	ev.Txn = e.Txn
	return ev, nil
}

// jsonTimestamp is a bson.Timestamp rendered as relaxed Extended JSON.
type jsonTimestamp struct {
	T uint32 `json:"t"`
	I uint32 `json:"i"`
}

// txnJSON is an entry's transaction metadata in JSON.
type txnJSON struct {
	ID    string `json:"id"`
	Index int    `json:"index"`
	Last  bool   `json:"last,omitempty"`
}

type entryJSON struct {
	ID          string          `json:"id"`
	Kind        Kind            `json:"kind"`
	EventID     string          `json:"eventId,omitempty"`
	Source      string          `json:"source,omitempty"`
	Sink        string          `json:"sink,omitempty"`
	Unit        string          `json:"unit,omitempty"`
	Rules       []string        `json:"rules,omitempty"`
	Operation   string          `json:"operation,omitempty"`
	Namespace   string          `json:"namespace,omitempty"`
	DocumentKey json.RawMessage `json:"documentKey,omitempty"`
	// DocumentKeyBSON is the key's raw BSON, base64: set when documentKey's
	// JSON does not say exactly what the key is (DocumentKeyLossy).
	DocumentKeyBSON string `json:"documentKeyBSON,omitempty"`
	ClusterTime     *struct {
		Timestamp jsonTimestamp `json:"$timestamp"`
	} `json:"clusterTime,omitempty"`
	Attempts      int             `json:"attempts"`
	Reason        string          `json:"reason,omitempty"`
	FirstError    string          `json:"firstError,omitempty"`
	LastError     string          `json:"lastError,omitempty"`
	FirstFailedAt time.Time       `json:"firstFailedAt,omitzero"`
	LastFailedAt  time.Time       `json:"lastFailedAt,omitzero"`
	CreatedAt     time.Time       `json:"createdAt,omitzero"`
	Order         int64           `json:"order,omitempty"`
	RetryAt       time.Time       `json:"retryAt,omitzero"`
	GapFrom       time.Time       `json:"gapFrom,omitzero"`
	GapTo         time.Time       `json:"gapTo,omitzero"`
	LastToken     json.RawMessage `json:"lastToken,omitempty"`
	ChangeDropped bool            `json:"changeDropped,omitempty"`
	Shaped        bool            `json:"shaped,omitempty"`
	Txn           *txnJSON        `json:"txn,omitempty"`
	Envelope      json.RawMessage `json:"envelope,omitempty"`
	Change        json.RawMessage `json:"change,omitempty"`
}

// MarshalJSON renders the entry for the CLI and the admin API: camelCase
// names (as stored), times in UTC (RFC 3339), and DocumentKey, Change,
// Envelope, LastToken and ClusterTime as relaxed Extended JSON. The Change
// of a Shaped entry is left out: the envelope is the shaped payload.
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{
		ID: e.ID, Kind: e.Kind, EventID: e.EventID, Source: e.Source, Sink: e.Sink, Unit: e.Unit,
		Rules: e.Rules, Operation: e.Operation, Namespace: e.Namespace,
		Attempts: e.Attempts, Reason: e.Reason, FirstError: e.FirstError, LastError: e.LastError,
		FirstFailedAt: utc(e.FirstFailedAt), LastFailedAt: utc(e.LastFailedAt), CreatedAt: utc(e.CreatedAt),
		Order: e.Order, RetryAt: utc(e.RetryAt), GapFrom: utc(e.GapFrom), GapTo: utc(e.GapTo), ChangeDropped: e.ChangeDropped,
		Shaped: e.Shaped,
	}
	if e.Txn != nil {
		j.Txn = &txnJSON{ID: e.Txn.ID, Index: e.Txn.Index, Last: e.Txn.Last}
	}
	change := e.Change
	if e.Shaped {
		change = nil // what shaping removed or redacted is never shown
	}
	if len(e.DocumentKey) > 0 && DocumentKeyLossy(e.DocumentKey) {
		j.DocumentKeyBSON = base64.StdEncoding.EncodeToString(e.DocumentKey)
	}
	if !e.ClusterTime.IsZero() {
		j.ClusterTime = &struct {
			Timestamp jsonTimestamp `json:"$timestamp"`
		}{jsonTimestamp{T: e.ClusterTime.T, I: e.ClusterTime.I}}
	}
	var err error
	for _, f := range []struct {
		name string
		src  bson.Raw
		dst  *json.RawMessage
	}{
		{"documentKey", e.DocumentKey, &j.DocumentKey},
		{"lastToken", e.LastToken, &j.LastToken},
		{"envelope", e.Envelope, &j.Envelope},
		{"change", change, &j.Change},
	} {
		if len(f.src) == 0 {
			continue
		}
		if *f.dst, err = bson.MarshalExtJSON(f.src, false, false); err != nil {
			return nil, fmt.Errorf("dead letter %s: %s: %w", e.ID, f.name, err)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(j); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// UnmarshalJSON parses the form written by MarshalJSON, so that clients of
// the admin API can decode entries. Relaxed Extended JSON does not keep
// every BSON type (an int64 small enough for an int32 comes back as an
// int32), so a decoded Change is for reading; replay uses the stored one.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var j entryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := Entry{
		ID: j.ID, Kind: j.Kind, EventID: j.EventID, Source: j.Source, Sink: j.Sink, Unit: j.Unit,
		Rules: j.Rules, Operation: j.Operation, Namespace: j.Namespace,
		Attempts: j.Attempts, Reason: j.Reason, FirstError: j.FirstError, LastError: j.LastError,
		FirstFailedAt: utc(j.FirstFailedAt), LastFailedAt: utc(j.LastFailedAt), CreatedAt: utc(j.CreatedAt),
		Order: j.Order, RetryAt: utc(j.RetryAt), GapFrom: utc(j.GapFrom), GapTo: utc(j.GapTo), ChangeDropped: j.ChangeDropped,
		Shaped: j.Shaped,
	}
	if j.Txn != nil {
		out.Txn = &event.Txn{ID: j.Txn.ID, Index: j.Txn.Index, Last: j.Txn.Last}
	}
	if j.ClusterTime != nil {
		out.ClusterTime = bson.Timestamp{T: j.ClusterTime.Timestamp.T, I: j.ClusterTime.Timestamp.I}
	}
	for _, f := range []struct {
		name string
		src  json.RawMessage
		dst  *bson.Raw
	}{
		{"documentKey", j.DocumentKey, &out.DocumentKey},
		{"lastToken", j.LastToken, &out.LastToken},
		{"envelope", j.Envelope, &out.Envelope},
		{"change", j.Change, &out.Change},
	} {
		if len(f.src) == 0 || string(f.src) == "null" {
			continue
		}
		if err := bson.UnmarshalExtJSON(f.src, false, f.dst); err != nil {
			return fmt.Errorf("dead letter %s: %s: %w", j.ID, f.name, err)
		}
	}
	if j.DocumentKeyBSON != "" {
		raw, err := base64.StdEncoding.DecodeString(j.DocumentKeyBSON)
		if err != nil || bson.Raw(raw).Validate() != nil {
			return fmt.Errorf("dead letter %s: documentKeyBSON: not the base64 of a BSON document", j.ID)
		}
		out.DocumentKey = raw
	}
	*e = out
	return nil
}

// DocumentKeyLossy reports whether the relaxed Extended JSON of key does not
// say exactly what the key is: a string or field name that is not valid
// UTF-8 (written as U+FFFD), or a field name starting with "$" (a document
// that reads back as a typed value, such as {"$oid": "x"}). Listings then
// carry the key's raw BSON as well (documentKeyBSON), and look-ups by it
// (Filter.ExactDocumentKey) find the entry.
func DocumentKeyLossy(key bson.Raw) bool {
	elems, err := key.Elements()
	if err != nil {
		return true
	}
	for _, el := range elems {
		if !utf8.ValidString(el.Key()) || strings.HasPrefix(el.Key(), "$") {
			return true
		}
		v := el.Value()
		switch v.Type {
		case bson.TypeString:
			if !utf8.ValidString(v.StringValue()) {
				return true
			}
		case bson.TypeEmbeddedDocument:
			if DocumentKeyLossy(v.Document()) {
				return true
			}
		case bson.TypeArray:
			if DocumentKeyLossy(bson.Raw(v.Array())) {
				return true
			}
		case bson.TypeRegex:
			p, o := v.Regex()
			if !utf8.ValidString(p) || !utf8.ValidString(o) {
				return true
			}
		}
	}
	return false
}

// Summary returns a copy of e without Change and Envelope, for listings
// that need not carry whole documents.
func (e Entry) Summary() Entry {
	e.Change, e.Envelope = nil, nil
	return e
}
