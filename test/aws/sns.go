package awstest

import (
	"encoding/base64"
	"encoding/xml"
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

// SNS limits, from the SDK's documentation of PublishBatch
// (aws-sdk-go-v2/service/sns v1.48.0, api_op_PublishBatch.go).
const (
	// MaxPublishBatchEntries is the most entries one PublishBatch may carry.
	MaxPublishBatchEntries = 10
	// DefaultSNSMaxMessageSize is a topic's default MaximumMessageSize, the
	// limit on one message and on the summed messages of a batch (bodies
	// and attributes): 256 KiB. A topic may raise it to 1 MiB.
	DefaultSNSMaxMessageSize = 256 << 10
)

// snsNamespace is the XML namespace of SNS answers.
const snsNamespace = "http://sns.amazonaws.com/doc/2010-03-31/"

// TopicOptions configure a topic created with CreateTopicWith.
type TopicOptions struct {
	// ContentBasedDeduplication (FIFO only): without a
	// MessageDeduplicationId the SHA-256 of the message is the
	// deduplication id.
	ContentBasedDeduplication bool
	// MaximumMessageSize limits one message and the sum of a batch's
	// (bodies plus attributes); default DefaultSNSMaxMessageSize.
	MaximumMessageSize int
}

// SNSMessage is one message published (or offered, in a FailEntries
// callback) to the SNS server.
type SNSMessage struct {
	MessageID       string // assigned on acceptance; empty in FailEntries callbacks
	Topic           string // topic name
	EntryID         string // the batch entry Id it was sent with
	Message         string
	Subject         string
	Attributes      map[string]MessageAttribute
	GroupID         string // MessageGroupId
	DeduplicationID string // explicit, or the message's SHA-256 with content-based deduplication
	SequenceNumber  string // FIFO topics
	SentAt          time.Time
}

// SNS is a local SNS endpoint serving PublishBatch (AWS query protocol:
// form-encoded requests, XML answers) for topics created with CreateTopic.
type SNS struct {
	*core
	topics messageLogs[SNSMessage, TopicOptions]
}

// NewSNS starts an SNS server on 127.0.0.1. Close it when done.
func NewSNS(opts Options) *SNS {
	opts = opts.withDefaults()
	s := &SNS{topics: newMessageLogs[SNSMessage, TopicOptions]()}
	s.core = newCore(opts, snsService{s})
	return s
}

// CreateTopic creates a topic with default options (a name ending in
// ".fifo" makes a FIFO topic) and returns its ARN.
func (s *SNS) CreateTopic(name string) string { return s.CreateTopicWith(name, TopicOptions{}) }

// CreateTopicWith is CreateTopic with options. An existing topic keeps its
// original options.
func (s *SNS) CreateTopicWith(name string, o TopicOptions) string {
	if o.MaximumMessageSize <= 0 {
		o.MaximumMessageSize = DefaultSNSMaxMessageSize
	}
	s.topics.create(name, o)
	return s.TopicARN(name)
}

// TopicARN is the ARN of topic name (whether or not it exists).
func (s *SNS) TopicARN(name string) string {
	return fmt.Sprintf("arn:aws:sns:%s:%s:%s", s.opts.Region, s.opts.AccountID, name)
}

// Messages returns a copy of the messages topic name accepted, in order.
func (s *SNS) Messages(name string) []SNSMessage {
	return s.topics.messages(name, func(m SNSMessage) SNSMessage {
		m.Attributes = maps.Clone(m.Attributes)
		return m
	})
}

// Duplicates is how many messages FIFO topic name acknowledged but dropped
// as duplicates of a deduplication id seen within the 5-minute interval.
func (s *SNS) Duplicates(name string) int { return s.topics.duplicates(name) }

// FailEntries installs f, called for every batch entry that passed
// validation; a non-empty code puts that entry in the answer's Failed list
// with Code code, Message message and SenderFault senderFault (SNS uses
// SenderFault=false for its own transient failures such as
// "InternalError"). nil removes it. f may be called concurrently from
// several requests and must not call the server's methods.
func (s *SNS) FailEntries(f func(SNSMessage) (code, message string, senderFault bool)) {
	s.topics.setFail(f)
}

// Reset clears stored messages, deduplication state, counters and every
// fault (Throttle, FailStatus, Stall, StallNext, FailEntries). Topics
// remain.
func (s *SNS) Reset() {
	s.topics.reset()
	s.resetCore()
}

type snsService struct{ s *SNS }

func (snsService) signingName() string  { return "sns" }
func (snsService) targetPrefix() string { return "" }
func (snsService) contentType() string  { return "application/x-www-form-urlencoded" }

func (snsService) action(body []byte) string {
	v, err := url.ParseQuery(string(body))
	if err != nil {
		return ""
	}
	return v.Get("Action")
}

// authError answers as the query services do: the codes SQS sends in
// x-amzn-query-error (InvalidClientTokenId, SignatureDoesNotMatch, ...).
func (snsService) authError(a *authError) apiError {
	e := sqsService{}.authError(a)
	return apiError{status: e.status, typ: e.queryCode, fault: e.fault, message: e.message}
}

func (snsService) throttleError() apiError {
	return apiError{status: http.StatusTooManyRequests, typ: "Throttled", fault: "Sender", message: "Rate exceeded"}
}

func (snsService) statusError(status int) apiError {
	switch status {
	case http.StatusServiceUnavailable:
		return apiError{status: status, typ: "ServiceUnavailable", fault: "Receiver", message: "Service is unavailable."}
	default:
		return apiError{status: status, typ: "InternalError", fault: "Receiver", message: fmt.Sprintf("Injected HTTP %d.", status)}
	}
}

func snsSender(status int, code, msg string) *apiError {
	return &apiError{status: status, typ: code, fault: "Sender", message: msg}
}

// writeError writes an error answer of the query protocol: an
// ErrorResponse document whose Error has Type (Sender or Receiver), Code
// and Message.
func (snsService) writeError(w http.ResponseWriter, e apiError) {
	code, fault := e.typ, e.fault
	if code == "UnknownOperationException" {
		code = "InvalidAction"
	}
	if fault == "" {
		fault = "Sender"
	}
	var doc struct {
		XMLName xml.Name `xml:"ErrorResponse"`
		XMLNS   string   `xml:"xmlns,attr"`
		Error   struct {
			Type    string
			Code    string
			Message string
		}
		RequestID string `xml:"RequestId"`
	}
	doc.XMLNS, doc.RequestID = snsNamespace, newUUID()
	doc.Error.Type, doc.Error.Code, doc.Error.Message = fault, code, e.message
	b, _ := xml.Marshal(doc)
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("X-Amzn-Requestid", doc.RequestID)
	w.WriteHeader(e.status)
	w.Write([]byte(xml.Header))
	w.Write(b)
}

type publishBatchResult struct {
	Successful []publishBatchResultEntry `xml:"Successful>member"`
	Failed     []publishBatchErrorEntry  `xml:"Failed>member"`
}

type publishBatchResultEntry struct {
	ID             string `xml:"Id"`
	MessageID      string `xml:"MessageId"`
	SequenceNumber string `xml:",omitempty"`
}

type publishBatchErrorEntry struct {
	ID          string `xml:"Id"`
	Code        string
	Message     string `xml:",omitempty"`
	SenderFault bool
}

// publishBatchResponse is the XML answer of PublishBatch.
type publishBatchResponse struct {
	XMLName   xml.Name           `xml:"PublishBatchResponse"`
	XMLNS     string             `xml:"xmlns,attr"`
	Result    publishBatchResult `xml:"PublishBatchResult"`
	RequestID string             `xml:"ResponseMetadata>RequestId"`
}

func (snsService) writeResponse(w http.ResponseWriter, _ string, out any) {
	b, err := xml.Marshal(out)
	if err != nil {
		snsService{}.writeError(w, apiError{status: 500, typ: "InternalError", fault: "Receiver", message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("X-Amzn-Requestid", newUUID())
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(xml.Header))
	w.Write(b)
}

func (s snsService) handle(op string, body []byte, _ http.Header) (any, *apiError) {
	if op != "PublishBatch" {
		return nil, snsSender(http.StatusBadRequest, "InvalidAction", "The test server does not implement the action "+op+".")
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, snsSender(http.StatusBadRequest, "MalformedQueryString", err.Error())
	}
	if v := form.Get("Version"); v != "2010-03-31" {
		return nil, snsSender(http.StatusBadRequest, "InvalidParameterValue", "Unsupported Version "+v+".")
	}
	arn := form.Get("TopicArn")
	if arn == "" {
		return nil, snsSender(http.StatusBadRequest, "InvalidParameter", "Invalid parameter: TopicArn")
	}
	name, ok := strings.CutPrefix(arn, strings.TrimSuffix(s.s.TopicARN("x"), "x"))
	fifo, topts, fail, exists := s.s.topics.lookup(name)
	if !ok || !exists {
		return nil, snsSender(http.StatusNotFound, "NotFound", "Topic does not exist")
	}
	msgs, aerr := parsePublishBatchEntries(form, name)
	if aerr != nil {
		return nil, aerr
	}
	total := 0
	for _, m := range msgs {
		total += snsMessageSize(m)
	}
	if total > topts.MaximumMessageSize {
		return nil, snsSender(http.StatusBadRequest, "BatchRequestTooLong",
			fmt.Sprintf("The length of all the messages put together is more than the limit: %d bytes, limit %d.", total, topts.MaximumMessageSize))
	}
	resp := publishBatchResponse{XMLNS: snsNamespace, RequestID: newUUID()}
	res := &resp.Result
	for _, m := range msgs {
		f := validateSNSMessage(m, fifo, topts)
		if f == nil && fifo && m.DeduplicationID == "" {
			m.DeduplicationID = ContentDeduplicationID(m.Message)
		}
		f = injectedFailure(f, fail, m)
		if f != nil {
			res.Failed = append(res.Failed, publishBatchErrorEntry{ID: m.EntryID, Code: f.code, Message: f.msg, SenderFault: f.senderFault})
			continue
		}
		m.MessageID, m.SequenceNumber = s.store(name, m)
		res.Successful = append(res.Successful, publishBatchResultEntry{ID: m.EntryID, MessageID: m.MessageID, SequenceNumber: m.SequenceNumber})
	}
	return resp, nil
}

// parsePublishBatchEntries reads the entries of a PublishBatch form, as the
// query protocol lays them out:
// PublishBatchRequestEntries.member.N.Message,
// ....MessageAttributes.entry.M.Name / .Value.DataType / .Value.StringValue.
func parsePublishBatchEntries(form url.Values, topicName string) ([]SNSMessage, *apiError) {
	const prefix = "PublishBatchRequestEntries.member."
	var msgs []SNSMessage
	seen := map[string]bool{}
	for n := 1; ; n++ {
		p := prefix + strconv.Itoa(n) + "."
		if !hasPrefix(form, p) {
			break
		}
		m := SNSMessage{
			Topic: topicName, EntryID: form.Get(p + "Id"), Message: form.Get(p + "Message"), Subject: form.Get(p + "Subject"),
			GroupID: form.Get(p + "MessageGroupId"), DeduplicationID: form.Get(p + "MessageDeduplicationId"),
		}
		if !validBatchEntryID(m.EntryID) {
			return nil, snsSender(http.StatusBadRequest, "InvalidBatchEntryId",
				"A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long.")
		}
		if seen[m.EntryID] {
			return nil, snsSender(http.StatusBadRequest, "BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id.")
		}
		seen[m.EntryID] = true
		for a := 1; ; a++ {
			ap := p + "MessageAttributes.entry." + strconv.Itoa(a) + "."
			if !hasPrefix(form, ap) {
				break
			}
			if m.Attributes == nil {
				m.Attributes = map[string]MessageAttribute{}
			}
			attr := MessageAttribute{DataType: form.Get(ap + "Value.DataType"), StringValue: form.Get(ap + "Value.StringValue")}
			if b := form.Get(ap + "Value.BinaryValue"); b != "" {
				v, err := base64.StdEncoding.DecodeString(b)
				if err != nil {
					return nil, snsSender(http.StatusBadRequest, "InvalidParameterValue", "The message attribute "+form.Get(ap+"Name")+" has an invalid binary value.")
				}
				attr.BinaryValue = v
			}
			m.Attributes[form.Get(ap+"Name")] = attr
		}
		msgs = append(msgs, m)
	}
	switch {
	case len(msgs) == 0:
		return nil, snsSender(http.StatusBadRequest, "EmptyBatchRequest", "The batch request doesn't contain any entries.")
	case len(msgs) > MaxPublishBatchEntries:
		return nil, snsSender(http.StatusBadRequest, "TooManyEntriesInBatchRequest",
			fmt.Sprintf("The batch request contains more entries than permissible: %d, maximum %d.", len(msgs), MaxPublishBatchEntries))
	}
	return msgs, nil
}

func hasPrefix(form url.Values, p string) bool {
	for k := range form {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// snsMessageSize is what SNS counts against MaximumMessageSize: the body
// plus each attribute's name, data type and value, as SQS.
func snsMessageSize(m SNSMessage) int {
	return messageSize(Message{Body: m.Message, Attributes: m.Attributes})
}

// validateSNSMessage applies Publish's per-message checks.
func validateSNSMessage(m SNSMessage, fifo bool, o TopicOptions) *entryFailure {
	invalid := func(msg string) *entryFailure {
		return &entryFailure{"InvalidParameter", "Invalid parameter: " + msg, true}
	}
	switch {
	case m.Message == "":
		return invalid("Message")
	case !utf8.ValidString(m.Message):
		return invalid("Message: not valid UTF-8")
	case len(m.Attributes) > 10:
		return invalid("MessageAttributes: more than 10")
	}
	for _, name := range slices.Sorted(maps.Keys(m.Attributes)) {
		if f := validateAttribute(name, m.Attributes[name]); f != nil {
			return f
		}
	}
	if fifo {
		switch {
		case m.GroupID == "":
			return invalid("The MessageGroupId parameter is required for FIFO topics")
		case m.DeduplicationID == "" && !o.ContentBasedDeduplication:
			return invalid("The topic should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly")
		case len(m.GroupID) > 128 || len(m.DeduplicationID) > 128:
			return invalid("MessageGroupId and MessageDeduplicationId can be at most 128 characters long")
		}
	} else if m.DeduplicationID != "" {
		return invalid("MessageDeduplicationId: The request includes MessageDeduplicationId parameter that is not valid for this topic type")
	}
	return nil
}

// store appends m to the topic, or, for a FIFO duplicate within the
// deduplication interval, drops it and returns the original's ids.
func (s snsService) store(name string, m SNSMessage) (messageID, seq string) {
	return s.s.topics.store(name, s.s.opts.Now(), DefaultDeduplicationWindow, m.DeduplicationID, m, func(m *SNSMessage, id, seq string, at time.Time) {
		m.MessageID, m.SequenceNumber, m.SentAt = id, seq, at
	})
}
