package awsutil

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/aws"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/tracing"
)

// What the message sinks (SQS, SNS) and Kinesis share: the message
// attributes of an event, the FIFO group and deduplication ids, the
// partition key of a stream record, and the classification of one failed
// entry of a batch.

// Message attribute names of the SQS and SNS sinks.
const (
	AttrSource        = "source"
	AttrOperationType = "operationType"
	AttrDB            = "db"
	AttrColl          = "coll"
	// With envelope = "document" (the body is the post-image alone), the
	// rest of the event's metadata: its id, the documentKey as relaxed
	// Extended JSON and the cluster time (RFC 3339).
	AttrID          = "id"
	AttrDocumentKey = "documentKey"
	AttrClusterTime = "clusterTime"
	// AttrTxn is the "txn" object (compact JSON) of an event written by a
	// multi-document transaction (envelope = "document" only).
	AttrTxn = "txn"

	// AttrStringType is the DataType of every attribute.
	AttrStringType = "String"
)

// Attribute is one String message attribute.
type Attribute struct{ Name, Value string }

// Attributes returns the String message attributes of e, as the SQS and
// SNS sinks send them: source, operationType, db and coll, plus id,
// documentKey, clusterTime and txn for envelope = "document". Empty values are
// left out (both services refuse them). It also returns their size as
// both services count it against the message size limit: per attribute,
// its name, its type ("String") and its value.
func Attributes(e *event.Event) ([]Attribute, int) {
	attrs := make([]Attribute, 0, 8)
	size := 0
	add := func(name, v string) {
		if v == "" {
			return
		}
		attrs = append(attrs, Attribute{name, v})
		size += len(name) + len(AttrStringType) + len(v)
	}
	add(AttrSource, e.Source)
	add(AttrOperationType, e.OperationType)
	add(AttrDB, e.DB)
	add(AttrColl, e.Coll)
	if e.Form() == event.FormDocument {
		for _, m := range e.Metadata() {
			switch m.Name {
			case "id":
				add(AttrID, m.Value)
			case "documentKey":
				add(AttrDocumentKey, m.Value)
			case "clusterTime":
				add(AttrClusterTime, m.Value)
			case "txn":
				add(AttrTxn, m.Value)
			}
		}
	}
	return attrs, size
}

// Message attributes of the trace context (W3C Trace Context), added by
// TraceAttributes.
const (
	AttrTraceparent = "traceparent"
	AttrTracestate  = "tracestate"
)

// TraceAttributes returns attrs and size with the traceparent (and
// tracestate, when not empty) attributes of entry i of the batch sent in
// ctx added; attrs unchanged without tracing or with trace_context = false.
// Attributes returns at most 8, so the message stays within the 10
// attributes SQS and SNS accept.
func TraceAttributes(ctx context.Context, i int, attrs []Attribute, size int) ([]Attribute, int) {
	tp, ts := tracing.Entry(ctx, i)
	if tp == "" {
		return attrs, size
	}
	attrs = append(attrs, Attribute{AttrTraceparent, tp})
	size += len(AttrTraceparent) + len(AttrStringType) + len(tp)
	if ts != "" && len(attrs) < 10 {
		attrs = append(attrs, Attribute{AttrTracestate, ts})
		size += len(AttrTracestate) + len(AttrStringType) + len(ts)
	}
	return attrs, size
}

// MessageAttributes returns the message attributes of entry i of the batch
// sent in ctx for e, as the SQS and SNS sinks send them (Attributes, then
// TraceAttributes), in the SDK's attribute map: value makes the SDK's
// value of one attribute from its data type (AttrStringType) and its
// value. It also returns their size (see Attributes).
func MessageAttributes[V any](ctx context.Context, i int, e *event.Event, value func(dataType, v *string) V) (map[string]V, int) {
	list, size := Attributes(e)
	list, size = TraceAttributes(ctx, i, list, size)
	attrs := make(map[string]V, len(list))
	for _, a := range list {
		attrs[a.Name] = value(aws.String(AttrStringType), aws.String(a.Value))
	}
	return attrs, size
}

// SharedBody returns env as the body of an SQS or SNS entry without
// copying it: the envelope is cached and never modified (event.Envelope's
// contract), and the SDK only reads it.
func SharedBody(env []byte) *string {
	return aws.String(unsafe.String(unsafe.SliceData(env), len(env)))
}

// DeduplicationID returns the FIFO MessageDeduplicationId of an event (SQS
// and SNS): the hex SHA-256 of its id (64 characters).
func DeduplicationID(e *event.Event) string {
	sum := sha256.Sum256([]byte(e.ID))
	return hex.EncodeToString(sum[:])
}

// MaxGroupIDLen is the limit of SQS and SNS on MessageGroupId.
const MaxGroupIDLen = 128

// GroupID returns the FIFO MessageGroupId of e (SQS and SNS): Key(e,
// path), replaced by "sha256:" and its hex SHA-256 when it is longer than
// 128 characters or has characters the services do not accept (anything
// but printable ASCII without space).
func GroupID(e *event.Event, path []string) string {
	g := Key(e, path)
	if len(g) > MaxGroupIDLen || !printableASCII(g) {
		return hashed(g)
	}
	return g
}

// MaxPartitionKeyLen is Kinesis's limit on a partition key, in Unicode
// characters (PutRecordsRequestEntry.PartitionKey, aws-sdk-go-v2
// service/kinesis types.go).
const MaxPartitionKeyLen = 256

// PartitionKey returns the Kinesis partition key of e: Key(e, path),
// replaced by "sha256:" and its hex SHA-256 when it is longer than 256
// characters.
func PartitionKey(e *event.Event, path []string) string {
	k := Key(e, path)
	n := 0
	for range k {
		n++
	}
	if n > MaxPartitionKeyLen || k == "" {
		return hashed(k)
	}
	return k
}

func hashed(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Key returns the grouping key of e: the field at path (nil: the default)
// or the namespace and document key, "<db>.<coll>:<documentKey as relaxed
// Extended JSON>" (the namespace alone without a document key). A string
// field is taken as is, another value as Extended JSON; when the field is
// missing the default is used, except that a path into fullDocument is
// looked up in fullDocumentBeforeChange first (a delete has no
// fullDocument, its pre-image holds the same field, so the delete joins
// the group of the document's earlier changes).
func Key(e *event.Event, path []string) string {
	var g string
	if len(path) > 0 {
		v, err := e.Raw.LookupErr(path...)
		if err != nil && path[0] == "fullDocument" {
			v, err = e.Raw.LookupErr(append([]string{"fullDocumentBeforeChange"}, path[1:]...)...)
		}
		if err == nil {
			if str, ok := v.StringValueOK(); ok {
				g = str
			} else if b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false); err == nil {
				g = string(b[len(`{"v":`) : len(b)-1])
			}
		}
	}
	if g == "" {
		g = e.DB
		if e.Coll != "" {
			g += "." + e.Coll
		}
		if len(e.DocumentKey) > 0 {
			if b, err := bson.MarshalExtJSON(e.DocumentKey, false, false); err == nil {
				g += ":" + string(b)
			} else {
				g += ":" + hex.EncodeToString(e.DocumentKey)
			}
		}
	}
	return g
}

// FieldPath splits a dotted field path ("fullDocument.customerId"); ok is
// false when a name in it is empty.
func FieldPath(s string) (path []string, ok bool) {
	if s == "" {
		return nil, true
	}
	path = strings.Split(s, ".")
	for _, p := range path {
		if p == "" {
			return nil, false
		}
	}
	return path, true
}

// printableASCII reports whether s is non-empty and printable ASCII
// without space.
func printableASCII(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// EntryError classifies the failure of one entry of a batch (SQS
// SendMessageBatch, SNS PublishBatch, Kinesis PutRecords): permanent when
// senderFault, otherwise retryable, with reason "throttled" for throttling
// codes (IsThrottle); the reason is otherwise the code ("unknown" when
// empty).
func EntryError(prefix, eventID, code, message string, senderFault bool) *sinks.Error {
	if code == "" {
		code = "unknown"
	}
	err := fmt.Errorf("%s: event %s: %s: %s", prefix, eventID, code, message)
	var de *sinks.Error
	switch {
	case senderFault:
		de = sinks.Permanent(code, err)
	case IsThrottle(code):
		de = sinks.Retryable("throttled", 0, err)
	default:
		de = sinks.Retryable(code, 0, err)
	}
	de.Code, de.Answer = code, sinks.Answer([]byte(message))
	return de
}

// EntryFailure is one entry of the Failed list of a batch answer (SQS
// SendMessageBatch, SNS PublishBatch).
type EntryFailure struct {
	ID, Code, Message string
	SenderFault       bool
}

// ReportEntries reports through fail the entries of one call for the
// events batch[i], i in idx, whose entry ids are their indexes in batch:
// each failed entry with EntryError, and each entry the answer lists
// neither as successful (succeeded ids) nor as failed as retryable
// "missing_result". op names the call in errors ("PublishBatch").
func ReportEntries(prefix, op string, batch []*event.Event, idx []int, succeeded []string, failed []EntryFailure, fail func(int, error)) {
	done := make(map[int]bool, len(idx))
	for _, id := range succeeded {
		if i, err := strconv.Atoi(id); err == nil {
			done[i] = true
		}
	}
	for _, f := range failed {
		i, err := strconv.Atoi(f.ID)
		if err != nil || i < 0 || i >= len(batch) {
			continue
		}
		done[i] = true
		fail(i, EntryError(prefix, batch[i].ID, f.Code, f.Message, f.SenderFault))
	}
	for _, i := range idx {
		if !done[i] {
			fail(i, sinks.Retryable("missing_result", 0, fmt.Errorf("%s: event %s: %s returned no result for the message", prefix, batch[i].ID, op)))
		}
	}
}

// ReportBatch is ReportEntries for the answer of one call as the SDK gives
// it (SQS SendMessageBatch, SNS PublishBatch): id returns the Id of an
// entry of its Successful list, failure the fields of one of its Failed
// list.
func ReportBatch[S, F any](prefix, op string, batch []*event.Event, idx []int, successful []S, failed []F,
	id func(S) string, failure func(F) EntryFailure, fail func(int, error)) {
	succeeded := make([]string, len(successful))
	for j, r := range successful {
		succeeded[j] = id(r)
	}
	failures := make([]EntryFailure, len(failed))
	for j, f := range failed {
		failures[j] = failure(f)
	}
	ReportEntries(prefix, op, batch, idx, succeeded, failures, fail)
}
