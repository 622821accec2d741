package receive

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Envelope is one change event as changegate delivers it (see
// docs/receivers.md). Document-valued fields are MongoDB Extended JSON
// (relaxed by default, canonical with json = "canonical" on the sink), kept
// raw so the receiver decodes them into its own types; a field the change
// does not have is nil.
type Envelope struct {
	// ID is the stable event id, "<source>:<resume token>": the same on
	// every re-delivery, and the webhook-id of a single-event request.
	ID string `json:"id"`
	// Source is the name of the changegate source that read the change.
	Source string `json:"source"`
	// OperationType is insert, update, replace, delete, drop, rename,
	// dropDatabase or invalidate.
	OperationType string `json:"operationType"`
	// NS is the namespace of the change.
	NS Namespace `json:"ns"`
	// DocumentKey is the changed document's key, e.g. {"_id": ...}.
	DocumentKey json.RawMessage `json:"documentKey,omitempty"`
	// FullDocument is the document after the change (inserts, replaces;
	// updates with the source's full_document option).
	FullDocument json.RawMessage `json:"fullDocument,omitempty"`
	// FullDocumentBeforeChange is the pre-image, with the source's
	// full_document_before_change option.
	FullDocumentBeforeChange json.RawMessage `json:"fullDocumentBeforeChange,omitempty"`
	// UpdateDescription is set on updates.
	UpdateDescription *UpdateDescription `json:"updateDescription,omitempty"`
	// To is the new namespace of a rename.
	To *Namespace `json:"to,omitempty"`
	// ClusterTime is the change's cluster time (second precision).
	ClusterTime time.Time `json:"clusterTime"`
	// WallTime is the server's wall clock time of the change, when known.
	WallTime time.Time `json:"wallTime"`
	// Txn is set on an event of a multi-document transaction (nil for a
	// single write); see docs/receivers.md.
	Txn *Txn `json:"txn,omitempty"`
	// Rules are the names of the rules that routed this event to the sink.
	Rules []string `json:"rules"`
	// Truncated is true when the sink sent the event without fullDocument
	// and fullDocumentBeforeChange because it was too large
	// (oversize = "strip"): fetch the document by DocumentKey.
	Truncated bool `json:"truncated,omitempty"`
}

// Namespace is a database and collection.
type Namespace struct {
	DB   string `json:"db"`
	Coll string `json:"coll,omitempty"`
}

// UpdateDescription is what an update changed.
type UpdateDescription struct {
	// UpdatedFields maps dotted paths to their new values (Extended JSON).
	UpdatedFields map[string]json.RawMessage `json:"updatedFields"`
	// RemovedFields are the dotted paths the update removed.
	RemovedFields []string `json:"removedFields"`
	// TruncatedArrays are arrays the update shortened.
	TruncatedArrays []TruncatedArray `json:"truncatedArrays,omitempty"`
	// DisambiguatedPaths is set by MongoDB 6.1+ for ambiguous dotted paths.
	DisambiguatedPaths json.RawMessage `json:"disambiguatedPaths,omitempty"`
}

// TruncatedArray is one entry of updateDescription.truncatedArrays.
type TruncatedArray struct {
	Field   string `json:"field"`
	NewSize int    `json:"newSize"`
}

// Updated reports whether an update set the top-level or dotted field path,
// and returns its new value (Extended JSON).
func (e *Envelope) Updated(path string) (json.RawMessage, bool) {
	if e.UpdateDescription == nil {
		return nil, false
	}
	v, ok := e.UpdateDescription.UpdatedFields[path]
	return v, ok
}

// Decode decodes one envelope (a request body of a sink with batch_size = 1).
func Decode(body []byte) (Envelope, error) {
	var env Envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Envelope{}, fmt.Errorf("decode envelope: %w", err)
	}
	if env.ID == "" {
		return Envelope{}, errors.New(`decode envelope: no "id"`)
	}
	return env, nil
}

// DecodeBatch decodes a request body that is one envelope or a JSON array of
// envelopes (batch_size > 1), in delivery order.
func DecodeBatch(body []byte) ([]Envelope, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '[' {
		env, err := Decode(body)
		if err != nil {
			return nil, err
		}
		return []Envelope{env}, nil
	}
	var envs []Envelope
	if err := json.Unmarshal(body, &envs); err != nil {
		return nil, fmt.Errorf("decode envelope batch: %w", err)
	}
	for i := range envs {
		if envs[i].ID == "" {
			return nil, fmt.Errorf(`decode envelope batch: entry %d has no "id"`, i)
		}
	}
	return envs, nil
}

// EventBridgeEvent is an event as EventBridge hands it to a target (a Lambda,
// or the body of an SQS message when the rule's target is a queue). Detail is
// the changegate envelope.
type EventBridgeEvent struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"` // EventBridge's own id, not changegate's
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       time.Time       `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

// Envelope decodes the event's detail. Deduplicate on the envelope's ID:
// EventBridge gives a re-delivered changegate event a new event id of its
// own.
func (e *EventBridgeEvent) Envelope() (Envelope, error) {
	if len(e.Detail) == 0 {
		return Envelope{}, errors.New("eventbridge event has no detail")
	}
	return Decode(e.Detail)
}

// FromEventBridge decodes an EventBridge event (the JSON a Lambda target
// receives) and returns its changegate envelope.
func FromEventBridge(event []byte) (Envelope, error) {
	var ev EventBridgeEvent
	if err := json.Unmarshal(event, &ev); err != nil {
		return Envelope{}, fmt.Errorf("decode eventbridge event: %w", err)
	}
	return ev.Envelope()
}

// SQSEvent is the event a Lambda receives from an SQS event source mapping.
// Only the fields needed to read changegate's messages are declared.
type SQSEvent struct {
	Records []SQSMessage `json:"Records"`
}

// SQSMessage is one record of an SQSEvent.
type SQSMessage struct {
	MessageID         string                         `json:"messageId"`
	ReceiptHandle     string                         `json:"receiptHandle"`
	Body              string                         `json:"body"`
	Attributes        map[string]string              `json:"attributes"`
	MessageAttributes map[string]SQSMessageAttribute `json:"messageAttributes"`
	EventSourceARN    string                         `json:"eventSourceARN"`
	AWSRegion         string                         `json:"awsRegion"`
}

// SQSMessageAttribute is a message attribute as a Lambda receives it;
// changegate sets String attributes source, operationType, db and coll.
type SQSMessageAttribute struct {
	DataType    string `json:"dataType"`
	StringValue string `json:"stringValue,omitempty"`
}

// Envelope decodes the message body; see FromSQSBody.
func (m *SQSMessage) Envelope() (Envelope, error) { return FromSQSBody(m.Body) }

// FromSQSBody decodes the body of an SQS message: the envelope itself when
// changegate's sqs sink sent it, or an EventBridge event whose detail is the
// envelope when an EventBridge rule forwarded it to the queue. Deduplicate on
// the envelope's ID, not on the SQS message id.
func FromSQSBody(body string) (Envelope, error) {
	var probe struct {
		DetailType *string         `json:"detail-type"`
		Detail     json.RawMessage `json:"detail"`
	}
	if err := json.Unmarshal([]byte(body), &probe); err != nil {
		return Envelope{}, fmt.Errorf("decode sqs body: %w", err)
	}
	if probe.DetailType != nil && len(probe.Detail) > 0 {
		return Decode(probe.Detail)
	}
	return Decode([]byte(body))
}

// Txn is an event's transaction metadata: the transaction's id, the
// event's index among its events (from 0), Last on its final one, and, in
// a transaction a grouped sink split over several requests, which Part (from
// 1) of Parts the event was sent in.
type Txn struct {
	ID    string `json:"id"`
	Index int    `json:"index"`
	Last  bool   `json:"last,omitempty"`
	Part  int    `json:"part,omitempty"`
	Parts int    `json:"parts,omitempty"`
}
