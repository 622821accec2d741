package awstest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Lambda Invoke payload limits, as the service enforces them (see the
// sinks/lambda package for the sources): 6 MiB for a synchronous
// invocation ("Request must be smaller than 6291456 bytes for the
// InvokeFunction operation"), 1 MiB for an asynchronous one since AWS
// raised it from 256 KB (AWS Compute Blog, "More room to build: serverless
// services now support payloads up to 1 MB").
const (
	DefaultLambdaSyncMaxPayload  = 6 << 20
	DefaultLambdaAsyncMaxPayload = 1 << 20
)

// Invocation is one Invoke request the Lambda server accepted for a
// function (after the function was found and the payload checked).
type Invocation struct {
	// FunctionName is the path label as sent: a name, a name with a
	// qualifier, a full or a partial ARN.
	FunctionName string
	// Function is the function's name (resolved from FunctionName).
	Function string
	// Qualifier is the version or alias invoked: the Qualifier query
	// parameter or the one in FunctionName; empty for $LATEST.
	Qualifier string
	// Type is the X-Amz-Invocation-Type: "Event", "RequestResponse" or
	// "DryRun".
	Type string
	// ClientContext is the decoded X-Amz-Client-Context (JSON), empty when
	// absent.
	ClientContext string
	// Payload is the request body.
	Payload []byte
	// TraceHeader is the X-Amzn-Trace-Id header (the X-Ray trace header
	// Lambda gives the function), empty when absent.
	TraceHeader string
}

// Result is what a function handler returns: the response payload and,
// when the function failed, its error type ("Unhandled" for an uncaught
// error, as Lambda reports it), sent in X-Amz-Function-Error. A non-nil
// Error makes the Invoke call itself fail instead, as Lambda answers when
// it cannot run the function (the invocation is then not stored).
type Result struct {
	Payload       []byte
	FunctionError string
	Error         *InvokeError
}

// InvokeError is an error answer of the Invoke API: the HTTP status, the
// error code (x-amzn-ErrorType, e.g. "ResourceConflictException" 409,
// "KMSAccessDeniedException" 502, "InvalidRequestContentException" 400)
// and its message. Service is true for the codes Lambda marks
// "Type":"Service" (ServiceException and the 5xx ones).
type InvokeError struct {
	Status  int
	Code    string
	Message string
	Service bool
}

// Handler runs a test function. It may be called concurrently and must not
// call the server's methods.
type Handler func(Invocation) Result

// Lambda is a local Lambda endpoint serving the Invoke operation,
// POST /2015-03-31/functions/{FunctionName}/invocations, of the REST-JSON
// protocol, as the aws-sdk-go-v2 lambda client calls it:
//
//   - FunctionName in the path (name, name:qualifier, full or partial
//     ARN), the Qualifier query parameter, X-Amz-Invocation-Type (Event,
//     RequestResponse, the default, or DryRun), X-Amz-Client-Context
//     (base64 JSON, at most 3583 bytes);
//   - Event answers 202 with an empty body; RequestResponse answers 200
//     with the handler's payload, X-Amz-Executed-Version and, when the
//     function failed, X-Amz-Function-Error; DryRun answers 204;
//   - errors carry x-amzn-ErrorType and a JSON body {"Type": "User" or
//     "Service", "Message": ...} as Lambda sends them (the SDK takes the
//     code from the header): 404 ResourceNotFoundException for an unknown
//     function or alias, 429 TooManyRequestsException with Retry-After and
//     {"Reason", "Type", "message"} (Throttle), 413
//     RequestEntityTooLargeException over the payload limit of the
//     invocation type, 400 InvalidRequestContentException for a payload
//     that is not JSON, 400 InvalidParameterValueException, 500
//     ServiceException (FailStatus).
//
// Requests are SigV4-checked with the signing name "lambda"; bad
// signatures answer 403 with the front end's shapes
// (InvalidSignatureException, UnrecognizedClientException,
// MissingAuthenticationTokenException).
type Lambda struct {
	*core
	syncMax, asyncMax int

	mu          sync.Mutex
	functions   map[string]*function
	invocations []Invocation
	retryAfter  string
}

type function struct {
	handler Handler
	aliases map[string]string // alias -> version
}

// NewLambda starts a Lambda server on 127.0.0.1. Close it when done.
// Options.MaxRequestSize, when set, replaces both payload limits.
func NewLambda(opts Options) *Lambda {
	opts = opts.withDefaults()
	l := &Lambda{
		syncMax: DefaultLambdaSyncMaxPayload, asyncMax: DefaultLambdaAsyncMaxPayload,
		functions: map[string]*function{}, retryAfter: "1",
	}
	if opts.MaxRequestSize > 0 {
		l.syncMax, l.asyncMax = opts.MaxRequestSize, opts.MaxRequestSize
	}
	l.core = newCore(opts, lambdaService{l})
	return l
}

// AddFunction registers (or replaces) function name with handler h (nil:
// a function that returns null). aliases map alias names to versions.
func (l *Lambda) AddFunction(name string, h Handler, aliases map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.functions[name] = &function{handler: h, aliases: aliases}
}

// RemoveFunction deletes function name: later invocations answer
// ResourceNotFoundException.
func (l *Lambda) RemoveFunction(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.functions, name)
}

// SetRetryAfter sets the Retry-After header (seconds) of the throttling
// answers (default "1"; "" sends none).
func (l *Lambda) SetRetryAfter(v string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retryAfter = v
}

// Invocations returns the accepted invocations in arrival order, those
// whose function then failed included.
func (l *Lambda) Invocations() []Invocation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Invocation(nil), l.invocations...)
}

// ARN returns the ARN of function name in the server's region and account.
func (l *Lambda) ARN(name string) string {
	return "arn:aws:lambda:" + l.opts.Region + ":" + l.opts.AccountID + ":function:" + name
}

// Reset clears the stored invocations, counters and faults; functions
// stay registered.
func (l *Lambda) Reset() {
	l.mu.Lock()
	l.invocations = nil
	l.mu.Unlock()
	l.resetCore()
}

type lambdaService struct{ l *Lambda }

func (lambdaService) signingName() string  { return "lambda" }
func (lambdaService) targetPrefix() string { return "" }
func (lambdaService) contentType() string  { return "application/json" }

// handle is not used: Lambda is a restService.
func (lambdaService) handle(string, []byte, http.Header) (any, *apiError) {
	return nil, &apiError{status: http.StatusNotFound, typ: "UnknownOperationException", message: "Unknown operation"}
}

// authError answers as the JSON services' front end does (jsonAuthError),
// except that an expired signature is 403, as any other bad signature.
func (lambdaService) authError(a *authError) apiError {
	e := jsonAuthError(a)
	if a.kind == authExpired {
		e.status = http.StatusForbidden
	}
	return e
}

func (s lambdaService) throttleError() apiError {
	s.l.mu.Lock()
	ra := s.l.retryAfter
	s.l.mu.Unlock()
	return apiError{status: http.StatusTooManyRequests, typ: "TooManyRequestsException", message: "Rate Exceeded.",
		retryAfter: ra, reason: "ReservedFunctionConcurrentInvocationLimitExceeded"}
}

func (lambdaService) statusError(status int) apiError {
	return apiError{status: status, typ: "ServiceException", message: fmt.Sprintf("Injected HTTP %d.", status), fault: "Service"}
}

// writeError writes a Lambda error: the code in x-amzn-ErrorType, the body
// {"Type", "Message"} (errors of the signing front end and
// TooManyRequestsException use a lower-case "message").
func (lambdaService) writeError(w http.ResponseWriter, e apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Amzn-Requestid", newUUID())
	h.Set("X-Amzn-Errortype", e.typ)
	body := map[string]string{}
	switch {
	case e.typ == "TooManyRequestsException":
		body["Type"], body["message"], body["Reason"] = "User", e.message, e.reason
		if e.retryAfter != "" {
			h.Set("Retry-After", e.retryAfter)
		}
	case strings.HasSuffix(e.typ, "SignatureException"), e.typ == "UnrecognizedClientException",
		e.typ == "MissingAuthenticationTokenException", e.typ == "UnknownOperationException":
		body["message"] = e.message
	default:
		typ := "User"
		if e.fault == "Service" {
			typ = "Service"
		}
		body["Type"], body["Message"] = typ, e.message
	}
	b, _ := json.Marshal(body)
	w.WriteHeader(e.status)
	w.Write(b)
}

const invokePrefix = "/2015-03-31/functions/"

func (lambdaService) route(r *http.Request) string {
	if r.Method != http.MethodPost {
		return ""
	}
	rest, ok := strings.CutPrefix(r.URL.Path, invokePrefix)
	if !ok || !strings.HasSuffix(rest, "/invocations") || strings.Count(rest, "/") != 1 {
		return ""
	}
	return "Invoke"
}

// functionNameRE is the Invoke FunctionName pattern of the Lambda API
// reference (NamespacedFunctionName, 1 to 170 characters).
var functionNameRE = regexp.MustCompile(`^(arn:(aws[a-zA-Z-]*)?:lambda:)?([a-z]{2}((-gov)|(-iso[a-z]?))?-[a-z]+-\d{1}:)?(\d{12}:)?(function:)?([a-zA-Z0-9-_\.]+)(:(\$LATEST(\.PUBLISHED)?|[a-zA-Z0-9-_]+))?$`)

// maxClientContext is the documented limit on X-Amz-Client-Context (base64).
const maxClientContext = 3583

func (s lambdaService) serveREST(w http.ResponseWriter, r *http.Request, _ string, body []byte) {
	l := s.l
	raw := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, invokePrefix), "/invocations")
	name, err := url.PathUnescape(raw)
	if err != nil {
		name = raw
	}
	userErr := func(status int, typ, msg string) {
		s.writeError(w, apiError{status: status, typ: typ, message: msg})
	}
	if len(name) > 170 || !functionNameRE.MatchString(name) {
		userErr(http.StatusBadRequest, "ValidationException", fmt.Sprintf("1 validation error detected: Value '%s' at 'functionName' failed to satisfy constraint: Member must satisfy regular expression pattern: %s", name, functionNameRE))
		return
	}
	fn, nameQualifier := splitFunctionName(name)
	qualifier := r.URL.Query().Get("Qualifier")
	if nameQualifier != "" && qualifier != "" && nameQualifier != qualifier {
		userErr(http.StatusBadRequest, "InvalidParameterValueException", "The derived qualifier from the function name does not match the specified qualifier.")
		return
	}
	if qualifier == "" {
		qualifier = nameQualifier
	}
	typ := r.Header.Get("X-Amz-Invocation-Type")
	if typ == "" {
		typ = "RequestResponse"
	}
	if typ != "Event" && typ != "RequestResponse" && typ != "DryRun" {
		userErr(http.StatusBadRequest, "ValidationException", fmt.Sprintf("1 validation error detected: Value '%s' at 'invocationType' failed to satisfy constraint: Member must satisfy enum value set: [Event, RequestResponse, DryRun]", typ))
		return
	}
	var cc string
	if v := r.Header.Get("X-Amz-Client-Context"); v != "" {
		dec, err := base64.StdEncoding.DecodeString(v)
		var obj map[string]any
		if len(v) > maxClientContext || err != nil || json.Unmarshal(dec, &obj) != nil {
			userErr(http.StatusBadRequest, "InvalidRequestContentException", "Client context must be a valid Base64-encoded JSON object.")
			return
		}
		cc = string(dec)
	}

	l.mu.Lock()
	f := l.functions[fn]
	version := "$LATEST"
	found := f != nil
	if found && qualifier != "" && qualifier != "$LATEST" {
		if isDigits(qualifier) {
			version = qualifier
		} else if v, ok := f.aliases[qualifier]; ok {
			version = v
		} else {
			found = false
		}
	}
	l.mu.Unlock()
	if !found {
		arn := l.ARN(fn)
		if qualifier != "" {
			arn += ":" + qualifier
		}
		userErr(http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+arn)
		return
	}

	limit := l.syncMax
	if typ == "Event" {
		limit = l.asyncMax
	}
	if len(body) > limit {
		// The wire code older SDKs and the CLI report for this 413
		// (the model's shape is RequestTooLargeException).
		msg := fmt.Sprintf("Request must be smaller than %d bytes for the InvokeFunction operation", limit)
		if typ == "Event" {
			msg = fmt.Sprintf("%d byte payload is too large for the Event invocation type (limit %d bytes)", len(body), limit)
		}
		userErr(http.StatusRequestEntityTooLarge, "RequestEntityTooLargeException", msg)
		return
	}
	if len(body) > 0 && !json.Valid(body) {
		userErr(http.StatusBadRequest, "InvalidRequestContentException", "Could not parse request body into json: Could not parse payload into json: Unexpected character: was expecting a JSON value")
		return
	}
	if typ == "DryRun" {
		w.WriteHeader(http.StatusNoContent)
		return
	}

	inv := Invocation{FunctionName: name, Function: fn, Qualifier: qualifier, Type: typ, ClientContext: cc, Payload: body,
		TraceHeader: r.Header.Get("X-Amzn-Trace-Id")}
	res := Result{Payload: []byte("null")}
	if f.handler != nil {
		res = f.handler(inv)
	}
	if e := res.Error; e != nil {
		fault := ""
		if e.Service {
			fault = "Service"
		}
		s.writeError(w, apiError{status: e.Status, typ: e.Code, message: e.Message, fault: fault})
		return
	}
	l.mu.Lock()
	l.invocations = append(l.invocations, inv)
	l.mu.Unlock()
	h := w.Header()
	h.Set("X-Amzn-Requestid", newUUID())
	if typ == "Event" {
		// An asynchronous invocation is queued: the function's outcome is
		// not the caller's.
		h.Set("Content-Length", "0")
		w.WriteHeader(http.StatusAccepted)
		return
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Amz-Executed-Version", version)
	if res.FunctionError != "" {
		h.Set("X-Amz-Function-Error", res.FunctionError)
	}
	w.WriteHeader(http.StatusOK)
	w.Write(res.Payload)
}

// splitFunctionName returns the function's name and the qualifier carried
// by a FunctionName: "name", "name:q", "acct:function:name[:q]" or
// "arn:partition:lambda:region:acct:function:name[:q]".
func splitFunctionName(s string) (name, qualifier string) {
	parts := strings.Split(s, ":")
	if i := indexOf(parts, "function"); i >= 0 {
		parts = parts[i+1:]
	}
	name = parts[0]
	if len(parts) > 1 {
		qualifier = parts[1]
	}
	return name, qualifier
}

func indexOf(parts []string, s string) int {
	for i, p := range parts {
		if p == s {
			return i
		}
	}
	return -1
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
