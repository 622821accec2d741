package deliverylog

import (
	"bytes"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// MaxExcerpt is the most bytes of the receiver's answer a record keeps.
const MaxExcerpt = 1024

// maxError is the most bytes of an error message a record keeps.
const maxError = 512

// Outcome is how one attempt (or the step that followed it) ended.
type Outcome string

// The outcomes of a record.
const (
	// OutcomeDelivered: the receiver took the event.
	OutcomeDelivered Outcome = "delivered"
	// OutcomeRetrying: the attempt failed; another follows after a backoff.
	OutcomeRetrying Outcome = "retrying"
	// OutcomeDeadLettered: failed for good (a permanent error or retries
	// exhausted) and written to the dead-letter store.
	OutcomeDeadLettered Outcome = "dead_lettered"
	// OutcomeParked: the sink failed for park_after and the event was
	// parked in the dead-letter store, to be re-driven in order.
	OutcomeParked Outcome = "parked"
	// OutcomeSkipped: not sent, by shaping (skip_empty_updates).
	OutcomeSkipped Outcome = "skipped"
	// OutcomeAbandoned: not finished here (the unit's tenure ended, or the
	// process stopped); the event is not acknowledged and is delivered
	// again from the checkpoint.
	OutcomeAbandoned Outcome = "abandoned"
	// OutcomeFailed: the attempt failed; what follows (retrying, parked,
	// dead_lettered) is a record of its own. Also a replay that did not
	// deliver.
	OutcomeFailed Outcome = "failed"
)

// Outcomes lists every outcome.
var Outcomes = []Outcome{OutcomeDelivered, OutcomeRetrying, OutcomeDeadLettered, OutcomeParked, OutcomeSkipped, OutcomeAbandoned, OutcomeFailed}

// Valid reports whether o is one of the outcomes.
func (o Outcome) Valid() bool {
	for _, x := range Outcomes {
		if o == x {
			return true
		}
	}
	return false
}

// Failed reports whether the attempt did not deliver: every outcome but
// delivered and skipped.
func (o Outcome) Failed() bool { return o != OutcomeDelivered && o != OutcomeSkipped }

// Record is one delivery attempt to one sink, or one request of a batch.
// The stored document has the fields named in brackets; it never holds a
// payload.
type Record struct {
	// EventID is the id of the event [event_ids: its first element].
	EventID string
	// BatchIDs are the ids of every event of a batch request, EventID
	// first (nil for one event) [event_ids].
	BatchIDs []string
	// Source is the source's name [source].
	Source string
	// DB and Coll are the change's namespace [db, coll]; for a batch, the
	// first event's, or empty when its events differ.
	DB, Coll string
	// Operation is the change's operationType [op]; for a batch as DB.
	Operation string
	// DocumentKey is the event's documentKey as the sink's shape shows it
	// (redacted fields redacted) [keys: its first element].
	DocumentKey bson.Raw
	// BatchKeys are the keys of a batch's events, as DocumentKey [keys].
	BatchKeys []bson.Raw
	// Sink is the sink's name [sink].
	Sink string
	// Rules are the rules that routed the event (every one of a batch's
	// events) to the sink [rules].
	Rules []string
	// Attempt is the attempt's number, from 1 [attempt]; 0 for a record
	// that is not an attempt (a park or a skip).
	Attempt int
	// Outcome is how the attempt ended [outcome].
	Outcome Outcome
	// Status is the receiver's HTTP status, 0 when there was none [status].
	Status int
	// Code is an AWS or Kafka error code ("ThrottlingException",
	// "NOT_LEADER_FOR_PARTITION") [code].
	Code string
	// ErrorClass is a short class of the failure ("http_503", "timeout",
	// "transport", "oversize") [class].
	ErrorClass string
	// Error is the error message, at most 512 bytes [error].
	Error string
	// Duration is how long the attempt took [duration_ms, a double].
	Duration time.Duration
	// Response is the first bytes of the receiver's answer, kept as at
	// most MaxExcerpt bytes of printable UTF-8 [response].
	Response string
	// TraceID is the trace's id when the change is traced [trace_id].
	TraceID string
	// Redelivery is "redrive" (a parked entry) or "replay" (a dead
	// letter), empty for a live delivery [redelivery].
	Redelivery string
	// Replica is the instance that made the attempt (set by the Writer)
	// [replica]; Unit the unit of work that read the event [unit] and
	// Epoch its lease epoch in cluster mode [epoch], for reading only:
	// records are not fenced.
	Replica, Unit string
	Epoch         int64
	// ClusterTime is the change's cluster time [cluster_time].
	ClusterTime bson.Timestamp
	// Time is when the attempt ended [at, the TTL field]; Enqueue sets it
	// when zero.
	Time time.Time
}

// IDs returns the event ids of r: BatchIDs, or EventID alone.
func (r *Record) IDs() []string {
	if r.BatchIDs != nil {
		return r.BatchIDs
	}
	if r.EventID == "" {
		return nil
	}
	return []string{r.EventID}
}

// Events is the number of events r covers.
func (r *Record) Events() int {
	if r.BatchIDs != nil {
		return len(r.BatchIDs)
	}
	return 1
}

// recordOverhead approximates what a queued Record holds besides its
// variable parts: the struct and the slice headers it points to.
const recordOverhead = 320

// size approximates the bytes a queued record holds, for the queue's
// byte bound. Rules are shared with the router and not counted.
func (r *Record) size() int64 {
	n := recordOverhead + len(r.EventID) + len(r.Source) + len(r.DB) + len(r.Coll) + len(r.Operation) +
		len(r.DocumentKey) + len(r.Sink) + len(r.ErrorClass) + len(r.Code) + len(r.Error) + len(r.Response) + len(r.TraceID) + len(r.Unit)
	for _, id := range r.BatchIDs {
		n += 16 + len(id)
	}
	for _, k := range r.BatchKeys {
		n += 24 + len(k)
	}
	return int64(n)
}

// FromEvent returns the record of an attempt to deliver ev (the event or
// the sink's shaped view of it, as the lane holds it) to sink, with the
// event's fields filled in: its id, source, namespace, operation, rules,
// cluster time, unit and epoch (in cluster mode), and its document key as
// the view's shape shows it (a copy: the record does not hold the change).
// The caller sets the attempt's fields. A key the shape cannot read is
// left out rather than stored in clear.
func FromEvent(ev *event.Event, sink string) Record {
	r := Record{
		EventID: ev.ID, Source: ev.Source, DB: ev.DB, Coll: ev.Coll, Operation: ev.OperationType,
		DocumentKey: shownKey(ev), Sink: sink, Rules: ev.Rules, ClusterTime: ev.ClusterTime,
	}
	if t := ev.Tenure; t != nil {
		r.Unit, r.Epoch = t.Unit, t.Epoch
	}
	return r
}

// FromBatch returns the record of one request carrying evs (the views the
// lane holds) to sink: every id and key, the namespace and operation when
// the events share them, the union of their rules, and the first event's
// other fields.
func FromBatch(evs []*event.Event, sink string) Record {
	if len(evs) == 1 {
		return FromEvent(evs[0], sink)
	}
	if len(evs) == 0 {
		return Record{Sink: sink}
	}
	r := FromEvent(evs[0], sink)
	r.BatchIDs = make([]string, len(evs))
	r.BatchKeys = make([]bson.Raw, len(evs))
	var rules []string
	for i, ev := range evs {
		r.BatchIDs[i] = ev.ID
		if i == 0 {
			r.BatchKeys[0] = r.DocumentKey
		} else {
			r.BatchKeys[i] = shownKey(ev)
		}
		if ev.DB != r.DB || ev.Coll != r.Coll {
			r.DB, r.Coll = "", ""
		}
		if ev.OperationType != r.Operation {
			r.Operation = ""
		}
		for _, name := range ev.Rules {
			if !contains(rules, name) {
				rules = append(rules, name)
			}
		}
	}
	r.Rules = rules
	return r
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// shownKey is ev's document key as its shape shows it, copied.
func shownKey(ev *event.Event) bson.Raw {
	if len(ev.DocumentKey) == 0 {
		return nil
	}
	k, err := ev.Shape().RedactKey(ev.DocumentKey)
	if err != nil {
		return nil
	}
	return bytes.Clone(k)
}

// Excerpt returns the first bytes of a receiver's answer as a record keeps
// it: at most MaxExcerpt bytes of printable UTF-8, each invalid byte and
// each control character but newline and tab replaced by U+FFFD, cut at a
// character boundary.
func Excerpt(b []byte) string {
	return printable(b, MaxExcerpt)
}

// printable returns b as at most limit bytes of printable UTF-8.
func printable(b []byte, limit int) string {
	var sb strings.Builder
	sb.Grow(min(len(b), limit))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 || r != '\n' && r != '\t' && !unicode.IsPrint(r) {
			r = utf8.RuneError
		}
		if sb.Len()+utf8.RuneLen(r) > limit {
			break
		}
		sb.WriteRune(r)
		b = b[n:]
	}
	return sb.String()
}

// durationMS is d in milliseconds, as stored.
func durationMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Latency buckets: bucket b holds durations up to bucketBound(b), growing
// by 2^(1/4) (19%) from 0.1 ms; bucket 0 holds everything up to 0.1 ms.
// Stored with each record (lat_bucket) so that percentiles over any window
// are one $group away, on MongoDB 5.0 as on 7.0.
const (
	bucketBase   = 0.1 // ms
	bucketsPerX2 = 4
	maxBucket    = 120 // about 12 days
)

// latencyBucket returns the bucket of a duration in milliseconds.
func latencyBucket(ms float64) int {
	if ms <= bucketBase {
		return 0
	}
	b := int(math.Ceil(math.Log2(ms/bucketBase)*bucketsPerX2 - 1e-9))
	return min(max(b, 0), maxBucket)
}

// bucketBound returns the upper bound of bucket b in milliseconds.
func bucketBound(b int) float64 {
	return bucketBase * math.Exp2(float64(b)/bucketsPerX2)
}
