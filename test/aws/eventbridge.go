package awstest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultEventBridgeMaxRequestSize is the default limit on the summed
// PutEventsEntrySize of one PutEvents request: 256 KiB, as documented in
// "Calculating Amazon EventBridge PutEvents event entry size". (The
// PutEvents doc comment in aws-sdk-go-v2/service/eventbridge v1.55.9 says
// 1MB; set Options.MaxRequestSize to test against that.)
const DefaultEventBridgeMaxRequestSize = 256 * 1024

// MaxPutEventsEntries is the most entries one PutEvents request may carry.
const MaxPutEventsEntries = 10

// PutEventsEntry is one event accepted (or offered, in a FailEntries
// callback) by the EventBridge server.
type PutEventsEntry struct {
	EventID      string // assigned on acceptance; empty in FailEntries callbacks
	EventBusName string // as sent (name or ARN); "default" when omitted
	Source       string
	DetailType   string
	Detail       string
	Resources    []string
	Time         time.Time // zero when the entry had no Time
	TraceHeader  string
}

// PutEventsEntrySize is the size EventBridge counts for an entry: 14 bytes
// for Time if present, plus the UTF-8 lengths of Source, DetailType, Detail
// and each of Resources.
func PutEventsEntrySize(e PutEventsEntry) int {
	n := len(e.Source) + len(e.DetailType) + len(e.Detail)
	if !e.Time.IsZero() {
		n += 14
	}
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}

// EventBridge is a local EventBridge endpoint serving AWSEvents.PutEvents.
type EventBridge struct {
	*core
	maxSize int

	mu     sync.Mutex
	events []PutEventsEntry
	fail   func(PutEventsEntry) (code, message string)
}

// NewEventBridge starts an EventBridge server on 127.0.0.1. Close it when
// done.
func NewEventBridge(opts Options) *EventBridge {
	opts = opts.withDefaults()
	eb := &EventBridge{maxSize: opts.MaxRequestSize}
	if eb.maxSize <= 0 {
		eb.maxSize = DefaultEventBridgeMaxRequestSize
	}
	eb.core = newCore(opts, ebService{eb})
	return eb
}

// Events returns a copy of the accepted events, in acceptance order.
func (eb *EventBridge) Events() []PutEventsEntry {
	eb.mu.Lock()
	defer eb.mu.Unlock()
	out := make([]PutEventsEntry, len(eb.events))
	for i, e := range eb.events {
		e.Resources = slices.Clone(e.Resources)
		out[i] = e
	}
	return out
}

// FailEntries installs f, called for every entry that passed validation;
// a non-empty code fails that entry with ErrorCode code and ErrorMessage
// message (for example "ThrottlingException", "InternalFailure",
// "MalformedDetail"), and the response's FailedEntryCount counts it. nil
// removes it. f may be called concurrently from several requests and must
// not call the server's methods.
func (eb *EventBridge) FailEntries(f func(PutEventsEntry) (code, message string)) {
	eb.mu.Lock()
	defer eb.mu.Unlock()
	eb.fail = f
}

// Reset clears the stored events, counters and every fault (Throttle,
// FailStatus, Stall, StallNext, FailEntries).
func (eb *EventBridge) Reset() {
	eb.mu.Lock()
	eb.events, eb.fail = nil, nil
	eb.mu.Unlock()
	eb.resetCore()
}

type ebService struct{ eb *EventBridge }

func (ebService) signingName() string  { return "events" }
func (ebService) targetPrefix() string { return "AWSEvents" }
func (ebService) contentType() string  { return "application/x-amz-json-1.1" }

func (ebService) authError(a *authError) apiError { return jsonAuthError(a) }

// jsonAuthError is the answer of the AWS JSON 1.1 services (EventBridge,
// Kinesis) to a request that failed authentication.
func jsonAuthError(a *authError) apiError {
	switch a.kind {
	case authMissing:
		return apiError{status: http.StatusForbidden, typ: "MissingAuthenticationTokenException", message: a.msg}
	case authIncomplete:
		return apiError{status: http.StatusBadRequest, typ: "IncompleteSignatureException", message: a.msg}
	case authUnknownKey:
		return apiError{status: http.StatusForbidden, typ: "UnrecognizedClientException", message: a.msg}
	case authExpired:
		return apiError{status: http.StatusBadRequest, typ: "InvalidSignatureException", message: a.msg}
	default:
		return apiError{status: http.StatusForbidden, typ: "InvalidSignatureException", message: a.msg}
	}
}

func (ebService) throttleError() apiError {
	return apiError{status: http.StatusBadRequest, typ: "ThrottlingException", message: "Rate exceeded"}
}

func (ebService) statusError(status int) apiError {
	switch status {
	case http.StatusInternalServerError:
		return apiError{status: status, typ: "InternalException", message: "Internal service error."}
	case http.StatusServiceUnavailable:
		return apiError{status: status, typ: "ServiceUnavailable", message: "Service is unavailable."}
	default:
		return apiError{status: status, typ: "InternalFailure", message: fmt.Sprintf("Injected HTTP %d.", status)}
	}
}

type putEventsRequest struct {
	Entries []struct {
		Time         *json.Number
		Source       *string
		Resources    []string
		DetailType   *string
		Detail       *string
		EventBusName *string
		TraceHeader  *string
	}
	EndpointId *string
}

type putEventsResultEntry struct {
	EventId      string `json:",omitempty"`
	ErrorCode    string `json:",omitempty"`
	ErrorMessage string `json:",omitempty"`
}

type putEventsResponse struct {
	Entries          []putEventsResultEntry
	FailedEntryCount int
}

func validationError(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "ValidationException", message: msg}
}

func (s ebService) handle(op string, body []byte, _ http.Header) (any, *apiError) {
	if op != "PutEvents" {
		return nil, &apiError{status: http.StatusBadRequest, typ: "UnknownOperationException", message: "The test server does not implement AWSEvents." + op}
	}
	var req putEventsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, typ: "SerializationException", message: err.Error()}
	}
	n := len(req.Entries)
	if n < 1 {
		return nil, validationError("1 validation error detected: Value '[]' at 'entries' failed to satisfy constraint: Member must have length greater than or equal to 1")
	}
	if n > MaxPutEventsEntries {
		return nil, validationError(fmt.Sprintf("1 validation error detected: Value at 'entries' failed to satisfy constraint: Member must have length less than or equal to %d", MaxPutEventsEntries))
	}

	entries := make([]PutEventsEntry, n)
	total := 0
	for i, re := range req.Entries {
		e := PutEventsEntry{
			EventBusName: deref(re.EventBusName),
			Source:       deref(re.Source),
			DetailType:   deref(re.DetailType),
			Detail:       deref(re.Detail),
			Resources:    re.Resources,
			TraceHeader:  deref(re.TraceHeader),
		}
		if e.EventBusName == "" {
			e.EventBusName = "default"
		}
		if re.Time != nil {
			f, err := re.Time.Float64()
			if err != nil {
				return nil, &apiError{status: http.StatusBadRequest, typ: "SerializationException", message: "Time: " + err.Error()}
			}
			sec := math.Floor(f)
			e.Time = time.Unix(int64(sec), int64(math.Round((f-sec)*1e3))*1e6).UTC()
		}
		entries[i] = e
		total += PutEventsEntrySize(e)
	}
	if total > s.eb.maxSize {
		return nil, validationError("Total size of the entries in the request is over the limit.")
	}

	s.eb.mu.Lock()
	fail := s.eb.fail
	s.eb.mu.Unlock()

	resp := putEventsResponse{Entries: make([]putEventsResultEntry, n)}
	var accepted []PutEventsEntry
	for i, e := range entries {
		code, msg := validateEntry(e)
		if code == "" && fail != nil {
			code, msg = fail(e)
		}
		if code != "" {
			resp.Entries[i] = putEventsResultEntry{ErrorCode: code, ErrorMessage: msg}
			resp.FailedEntryCount++
			continue
		}
		e.EventID = newUUID()
		resp.Entries[i] = putEventsResultEntry{EventId: e.EventID}
		accepted = append(accepted, e)
	}
	s.eb.mu.Lock()
	s.eb.events = append(s.eb.events, accepted...)
	s.eb.mu.Unlock()
	return resp, nil
}

// validateEntry applies PutEvents' per-entry checks.
func validateEntry(e PutEventsEntry) (code, msg string) {
	switch {
	case e.Source == "":
		return "InvalidArgument", "Parameter Source is not valid. Reason: Source is a required argument."
	case e.DetailType == "":
		return "InvalidArgument", "Parameter DetailType is not valid. Reason: DetailType is a required argument."
	case e.Detail == "":
		return "InvalidArgument", "Parameter Detail is not valid. Reason: Detail is a required argument."
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(e.Detail), &obj); err != nil || obj == nil {
		return "MalformedDetail", "Detail is malformed."
	}
	if strings.HasPrefix(e.EventBusName, "arn:") && !strings.Contains(e.EventBusName, ":event-bus/") {
		return "InvalidArgument", "Parameter EventBusName is not valid. Reason: Provided EventBusName is not a valid event bus ARN."
	}
	return "", ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
