package awstest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// SQS limits.
const (
	// DefaultSQSMaxBatchSize is the default limit on the summed message sizes
	// of one SendMessageBatch: 1 MiB, the current AWS limit (it was 256 KiB
	// before 2025). Override with Options.MaxRequestSize.
	DefaultSQSMaxBatchSize = 1 << 20
	// DefaultSQSMaxMessageSize is a queue's default MaximumMessageSize.
	DefaultSQSMaxMessageSize = 1 << 20
	// MaxSendMessageBatchEntries is the most entries one SendMessageBatch may
	// carry.
	MaxSendMessageBatchEntries = 10
	// DefaultDeduplicationWindow is how long a FIFO queue remembers a
	// deduplication id.
	DefaultDeduplicationWindow = 5 * time.Minute
)

// QueueOptions configure a queue created with CreateQueueWith.
type QueueOptions struct {
	// ContentBasedDeduplication (FIFO only): without a
	// MessageDeduplicationId the SHA-256 of the body is the deduplication id.
	ContentBasedDeduplication bool
	// MaximumMessageSize limits body plus attributes of one message; default
	// DefaultSQSMaxMessageSize.
	MaximumMessageSize int
	// DeduplicationWindow (FIFO only); default DefaultDeduplicationWindow.
	DeduplicationWindow time.Duration
}

// Message is one message accepted (or offered, in a FailEntries callback) by
// the SQS server.
type Message struct {
	MessageID        string // assigned on acceptance; empty in FailEntries callbacks
	Queue            string // queue name
	EntryID          string // the batch entry Id it was sent with
	Body             string
	Attributes       map[string]MessageAttribute // MessageAttributes
	SystemAttributes map[string]MessageAttribute // MessageSystemAttributes (AWSTraceHeader)
	GroupID          string                      // MessageGroupId
	DeduplicationID  string                      // explicit, or the body's SHA-256 with content-based deduplication
	SequenceNumber   string                      // FIFO queues
	DelaySeconds     int
	MD5OfBody        string
	MD5OfAttributes  string
	SentAt           time.Time
}

// SQS is a local SQS endpoint serving AmazonSQS.SendMessageBatch and
// AmazonSQS.GetQueueUrl for queues created with CreateQueue.
type SQS struct {
	*core
	maxBatch int
	queues   messageLogs[Message, QueueOptions]
}

// NewSQS starts an SQS server on 127.0.0.1. Close it when done.
func NewSQS(opts Options) *SQS {
	opts = opts.withDefaults()
	s := &SQS{maxBatch: opts.MaxRequestSize, queues: newMessageLogs[Message, QueueOptions]()}
	if s.maxBatch <= 0 {
		s.maxBatch = DefaultSQSMaxBatchSize
	}
	s.core = newCore(opts, sqsService{s})
	return s
}

// CreateQueue creates a queue with default options (a name ending in
// ".fifo" makes a FIFO queue) and returns its URL,
// <URL()>/<account id>/<name>. Creating an existing queue returns its URL.
// It panics on an invalid name.
func (s *SQS) CreateQueue(name string) string { return s.CreateQueueWith(name, QueueOptions{}) }

// CreateQueueWith is CreateQueue with options. An existing queue keeps its
// original options.
func (s *SQS) CreateQueueWith(name string, o QueueOptions) string {
	if !validQueueName(name) {
		panic(fmt.Sprintf("awstest: invalid SQS queue name %q", name))
	}
	if o.MaximumMessageSize <= 0 {
		o.MaximumMessageSize = DefaultSQSMaxMessageSize
	}
	if o.DeduplicationWindow <= 0 {
		o.DeduplicationWindow = DefaultDeduplicationWindow
	}
	s.queues.create(name, o)
	return s.QueueURL(name)
}

// QueueURL is the URL of queue name (whether or not it exists).
func (s *SQS) QueueURL(name string) string {
	return s.URL() + "/" + s.opts.AccountID + "/" + name
}

// Messages returns a copy of the messages queue name accepted, in order.
func (s *SQS) Messages(name string) []Message {
	return s.queues.messages(name, func(m Message) Message {
		m.Attributes = maps.Clone(m.Attributes)
		m.SystemAttributes = maps.Clone(m.SystemAttributes)
		return m
	})
}

// Duplicates is how many messages FIFO queue name acknowledged but dropped as
// duplicates of a deduplication id seen within the window.
func (s *SQS) Duplicates(name string) int { return s.queues.duplicates(name) }

// FailEntries installs f, called for every batch entry that passed
// validation; a non-empty code puts that entry in the response's Failed list
// with Code code, Message message and SenderFault senderFault (AWS uses
// SenderFault=false for its own transient failures such as "InternalError"
// or "ServiceUnavailable"). nil removes it. f may be called concurrently
// from several requests and must not call the server's methods.
func (s *SQS) FailEntries(f func(Message) (code, message string, senderFault bool)) {
	s.queues.setFail(f)
}

// Reset clears stored messages, deduplication state, counters and every
// fault (Throttle, FailStatus, Stall, StallNext, FailEntries). Queues remain.
func (s *SQS) Reset() {
	s.queues.reset()
	s.resetCore()
}

func validQueueName(name string) bool {
	base := strings.TrimSuffix(name, ".fifo")
	return base != "" && len(name) <= 80 && alnumDashUnderscore(base)
}

// alnumDashUnderscore reports whether s has only ASCII letters, digits,
// hyphens and underscores: what SQS accepts in queue names and batch entry
// ids (SNS too, in entry ids).
func alnumDashUnderscore(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

type sqsService struct{ s *SQS }

func (sqsService) signingName() string  { return "sqs" }
func (sqsService) targetPrefix() string { return "AmazonSQS" }
func (sqsService) contentType() string  { return "application/x-amz-json-1.0" }

// sqsError builds an error in the shape SQS's JSON protocol uses: a
// namespaced __type plus the legacy query code in x-amzn-query-error, which
// the SDK (awsQueryCompatible) prefers as the error code.
func sqsError(status int, typ, queryCode, fault, msg string) *apiError {
	return &apiError{status: status, typ: typ, queryCode: queryCode, fault: fault, message: msg}
}

func sqsModeled(name, queryCode, msg string) *apiError {
	return sqsError(http.StatusBadRequest, "com.amazonaws.sqs#"+name, queryCode, "Sender", msg)
}

func (sqsService) authError(a *authError) apiError {
	var e *apiError
	switch a.kind {
	case authMissing:
		e = sqsError(http.StatusForbidden, "com.amazon.coral.service#MissingAuthenticationTokenException", "MissingAuthenticationToken", "Sender", a.msg)
	case authIncomplete:
		e = sqsError(http.StatusBadRequest, "com.amazon.coral.service#IncompleteSignatureException", "IncompleteSignature", "Sender", a.msg)
	case authUnknownKey:
		e = sqsError(http.StatusForbidden, "com.amazon.coral.service#UnrecognizedClientException", "InvalidClientTokenId", "Sender", a.msg)
	default: // mismatch, expired
		e = sqsError(http.StatusForbidden, "com.amazon.coral.service#InvalidSignatureException", "SignatureDoesNotMatch", "Sender", a.msg)
	}
	return *e
}

func (sqsService) throttleError() apiError {
	return *sqsModeled("RequestThrottled", "RequestThrottled", "Rate exceeded")
}

func (sqsService) statusError(status int) apiError {
	switch status {
	case http.StatusServiceUnavailable:
		return *sqsError(status, "com.amazon.coral.availability#ServiceUnavailableException", "ServiceUnavailable", "Receiver", "Service is unavailable.")
	default:
		return *sqsError(status, "com.amazon.coral.service#InternalFailure", "InternalFailure", "Receiver", fmt.Sprintf("Injected HTTP %d.", status))
	}
}

func errQueueDoesNotExist() *apiError {
	return sqsModeled("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist.")
}

func missingParameter(name string) *apiError {
	return sqsError(http.StatusBadRequest, "com.amazon.coral.validate#ValidationException", "MissingParameter", "Sender", "The request must contain the parameter "+name+".")
}

func (s sqsService) handle(op string, body []byte, _ http.Header) (any, *apiError) {
	switch op {
	case "GetQueueUrl":
		return s.getQueueURL(body)
	case "SendMessageBatch":
		return s.sendMessageBatch(body)
	}
	return nil, sqsError(http.StatusBadRequest, "com.amazon.coral.service#UnknownOperationException", "InvalidAction", "Sender", "The test server does not implement AmazonSQS."+op)
}

func serializationError(err error) *apiError {
	return sqsError(http.StatusBadRequest, "com.amazon.coral.service#SerializationException", "SerializationException", "Sender", err.Error())
}

func (s sqsService) getQueueURL(body []byte) (any, *apiError) {
	var req struct {
		QueueName              *string
		QueueOwnerAWSAccountId *string
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, serializationError(err)
	}
	if req.QueueName == nil {
		return nil, missingParameter("QueueName")
	}
	if o := deref(req.QueueOwnerAWSAccountId); o != "" && o != s.s.opts.AccountID {
		return nil, errQueueDoesNotExist()
	}
	if !s.s.queues.exists(*req.QueueName) {
		return nil, errQueueDoesNotExist()
	}
	return map[string]string{"QueueUrl": s.s.QueueURL(*req.QueueName)}, nil
}

// queueFromURL resolves a QueueUrl (any host) to a queue name.
func (s sqsService) queueFromURL(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false
	}
	acct, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !ok || acct != s.s.opts.AccountID {
		return "", false
	}
	return name, s.s.queues.exists(name)
}

type wireAttribute struct {
	DataType         *string
	StringValue      *string
	BinaryValue      []byte
	StringListValues []string
	BinaryListValues [][]byte
}

type sendMessageBatchRequest struct {
	QueueUrl *string
	Entries  []struct {
		Id                      *string
		MessageBody             *string
		DelaySeconds            *int32
		MessageAttributes       map[string]wireAttribute
		MessageSystemAttributes map[string]wireAttribute
		MessageDeduplicationId  *string
		MessageGroupId          *string
	}
}

type sendMessageBatchResultEntry struct {
	Id                           string
	MessageId                    string
	MD5OfMessageBody             string
	MD5OfMessageAttributes       string `json:",omitempty"`
	MD5OfMessageSystemAttributes string `json:",omitempty"`
	SequenceNumber               string `json:",omitempty"`
}

type batchResultErrorEntry struct {
	Id          string
	SenderFault bool
	Code        string
	Message     string `json:",omitempty"`
}

type sendMessageBatchResponse struct {
	Successful []sendMessageBatchResultEntry
	Failed     []batchResultErrorEntry
}

// entryFailure is a per-entry failure.
type entryFailure struct {
	code, msg   string
	senderFault bool
}

// injectedFailure returns f, or, for an entry that passed validation (f
// nil), the failure the FailEntries hook fail (nil: none) gives m, nil when
// it gives none.
func injectedFailure[M any](f *entryFailure, fail func(M) (code, message string, senderFault bool), m M) *entryFailure {
	if f != nil || fail == nil {
		return f
	}
	if code, msg, sf := fail(m); code != "" {
		return &entryFailure{code, msg, sf}
	}
	return nil
}

func invalidValue(msg string) *entryFailure {
	return &entryFailure{"InvalidParameterValue", msg, true}
}

func convertAttributes(in map[string]wireAttribute) map[string]MessageAttribute {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]MessageAttribute, len(in))
	for n, a := range in {
		out[n] = MessageAttribute{
			DataType:         deref(a.DataType),
			StringValue:      deref(a.StringValue),
			BinaryValue:      a.BinaryValue,
			StringListValues: a.StringListValues,
			BinaryListValues: a.BinaryListValues,
		}
	}
	return out
}

// messageSize is what SQS counts against size limits: the body plus each
// attribute's name, data type and value.
func messageSize(m Message) int {
	n := len(m.Body)
	for name, a := range m.Attributes {
		n += len(name) + len(a.DataType) + len(a.StringValue) + len(a.BinaryValue)
	}
	return n
}

func (s sqsService) sendMessageBatch(body []byte) (any, *apiError) {
	var req sendMessageBatchRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, serializationError(err)
	}
	if req.QueueUrl == nil {
		return nil, missingParameter("QueueUrl")
	}
	qname, ok := s.queueFromURL(*req.QueueUrl)
	if !ok {
		return nil, errQueueDoesNotExist()
	}
	n := len(req.Entries)
	if n == 0 {
		return nil, sqsModeled("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", "There should be at least one SendMessageBatchRequestEntry in the request.")
	}
	if n > MaxSendMessageBatchEntries {
		return nil, sqsModeled("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
			fmt.Sprintf("Maximum number of entries per request are %d. You have sent %d.", MaxSendMessageBatchEntries, n))
	}
	seen := map[string]bool{}
	msgs := make([]Message, n)
	total := 0
	for i, e := range req.Entries {
		id := deref(e.Id)
		if !validBatchEntryID(id) {
			return nil, sqsModeled("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId",
				"A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long.")
		}
		if seen[id] {
			return nil, sqsModeled("BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "Id "+id+" repeated.")
		}
		seen[id] = true
		m := Message{
			Queue:            qname,
			EntryID:          id,
			Body:             deref(e.MessageBody),
			Attributes:       convertAttributes(e.MessageAttributes),
			SystemAttributes: convertAttributes(e.MessageSystemAttributes),
			GroupID:          deref(e.MessageGroupId),
			DeduplicationID:  deref(e.MessageDeduplicationId),
		}
		if e.DelaySeconds != nil {
			m.DelaySeconds = int(*e.DelaySeconds)
		}
		msgs[i] = m
		total += messageSize(m)
	}
	if total > s.s.maxBatch {
		return nil, sqsModeled("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong",
			fmt.Sprintf("Batch requests cannot be longer than %d bytes. You have sent %d bytes.", s.s.maxBatch, total))
	}

	fifo, qopts, fail, _ := s.s.queues.lookup(qname)

	resp := sendMessageBatchResponse{Successful: []sendMessageBatchResultEntry{}, Failed: []batchResultErrorEntry{}}
	for i, m := range msgs {
		f := validateMessage(m, req.Entries[i].MessageBody != nil, req.Entries[i].DelaySeconds != nil, fifo, qopts)
		if f == nil && fifo && m.DeduplicationID == "" {
			m.DeduplicationID = ContentDeduplicationID(m.Body)
		}
		f = injectedFailure(f, fail, m)
		if f != nil {
			resp.Failed = append(resp.Failed, batchResultErrorEntry{Id: m.EntryID, SenderFault: f.senderFault, Code: f.code, Message: f.msg})
			continue
		}
		m.MD5OfBody = md5Hex(m.Body)
		m.MD5OfAttributes = MD5OfMessageAttributes(m.Attributes)
		m.MessageID, m.SequenceNumber = s.store(qname, qopts.DeduplicationWindow, m)
		resp.Successful = append(resp.Successful, sendMessageBatchResultEntry{
			Id:                           m.EntryID,
			MessageId:                    m.MessageID,
			MD5OfMessageBody:             m.MD5OfBody,
			MD5OfMessageAttributes:       m.MD5OfAttributes,
			MD5OfMessageSystemAttributes: MD5OfMessageAttributes(m.SystemAttributes),
			SequenceNumber:               m.SequenceNumber,
		})
	}
	return resp, nil
}

// store appends m to the queue, or, for a FIFO duplicate within the
// deduplication window, drops it and returns the original's ids.
func (s sqsService) store(qname string, window time.Duration, m Message) (messageID, seq string) {
	return s.s.queues.store(qname, s.s.opts.Now(), window, m.DeduplicationID, m, func(m *Message, id, seq string, at time.Time) {
		m.MessageID, m.SequenceNumber, m.SentAt = id, seq, at
	})
}

func validBatchEntryID(id string) bool {
	return id != "" && len(id) <= 80 && alnumDashUnderscore(id)
}

// validateMessage applies SendMessage's per-message checks.
func validateMessage(m Message, hasBody, hasDelay, fifo bool, qo QueueOptions) *entryFailure {
	if !hasBody || m.Body == "" {
		return &entryFailure{"MissingParameter", "The request must contain the parameter MessageBody.", true}
	}
	for _, r := range m.Body {
		if !validSQSChar(r) {
			return &entryFailure{"InvalidMessageContents", fmt.Sprintf("Invalid binary character '#x%X' was found in the message body, the set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF", r), true}
		}
	}
	if size := messageSize(m); size > qo.MaximumMessageSize {
		return invalidValue(fmt.Sprintf("One or more parameters are invalid. Reason: Message must be shorter than %d bytes.", qo.MaximumMessageSize))
	}
	if len(m.Attributes) > 10 {
		return invalidValue(fmt.Sprintf("Number of message attributes [%d] exceeds the allowed maximum [10].", len(m.Attributes)))
	}
	for _, name := range slices.Sorted(maps.Keys(m.Attributes)) {
		if f := validateAttribute(name, m.Attributes[name]); f != nil {
			return f
		}
	}
	for name, a := range m.SystemAttributes {
		if name != "AWSTraceHeader" || a.DataType != "String" || a.StringValue == "" {
			return invalidValue("Message system attribute name '" + name + "' is invalid.")
		}
	}
	if m.DelaySeconds < 0 || m.DelaySeconds > 900 {
		return invalidValue(fmt.Sprintf("Value %d for parameter DelaySeconds is invalid. Reason: must be between 0 and 900, if provided.", m.DelaySeconds))
	}
	if fifo {
		if hasDelay && m.DelaySeconds != 0 {
			return invalidValue(fmt.Sprintf("Value %d for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid for this queue type.", m.DelaySeconds))
		}
		if m.GroupID == "" {
			return &entryFailure{"MissingParameter", "The request must contain the parameter MessageGroupId.", true}
		}
		if m.DeduplicationID == "" && !qo.ContentBasedDeduplication {
			return invalidValue("The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly")
		}
		if len(m.DeduplicationID) > 128 || len(m.GroupID) > 128 {
			return invalidValue("MessageGroupId and MessageDeduplicationId can be at most 128 characters long.")
		}
	} else if m.DeduplicationID != "" {
		return invalidValue("The request include parameter that is not valid for this queue type. Reason: MessageDeduplicationId is supported only for FIFO queues.")
	}
	return nil
}

func validateAttribute(name string, a MessageAttribute) *entryFailure {
	if name == "" || len(name) > 256 || strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, "..") ||
		strings.HasPrefix(strings.ToLower(name), "aws.") || strings.HasPrefix(strings.ToLower(name), "amazon.") {
		return invalidValue("Message attribute name '" + name + "' is invalid.")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return invalidValue("Message attribute name '" + name + "' is invalid.")
		}
	}
	base, _, _ := strings.Cut(a.DataType, ".")
	switch base {
	case "String", "Number":
		if a.StringValue == "" {
			return invalidValue(fmt.Sprintf("The message attribute '%s' must contain non-empty message attribute value for message attribute type '%s'.", name, a.DataType))
		}
		if base == "Number" {
			if _, err := strconv.ParseFloat(a.StringValue, 64); err != nil {
				return invalidValue(fmt.Sprintf("Can't cast the value of message (user) attribute '%s' to a number.", name))
			}
		}
		if !utf8.ValidString(a.StringValue) {
			return invalidValue("Message attribute '" + name + "' value is not valid UTF-8.")
		}
	case "Binary":
		if len(a.BinaryValue) == 0 {
			return invalidValue(fmt.Sprintf("The message attribute '%s' must contain non-empty message attribute value for message attribute type '%s'.", name, a.DataType))
		}
	default:
		return invalidValue(fmt.Sprintf("The type of message (user) attribute '%s' is invalid. You must use only the following supported type prefixes: Binary, Number, String.", name))
	}
	return nil
}

func validSQSChar(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD || (r >= 0x20 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD) || (r >= 0x10000 && r <= 0x10FFFF)
}

// ContentDeduplicationID is the deduplication id a FIFO queue with
// content-based deduplication derives from a body (its SHA-256, hex).
func ContentDeduplicationID(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}
