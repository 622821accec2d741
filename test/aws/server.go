// Package awstest provides local HTTP servers that speak the AWS wire
// protocols the aws-sdk-go-v2 clients use, for tests: an EventBridge server
// (AWS JSON 1.1, AWSEvents.PutEvents), an SQS server (AWS JSON 1.0 with
// awsQueryCompatible errors, AmazonSQS.SendMessageBatch and
// AmazonSQS.GetQueueUrl), a Lambda server (REST-JSON, Invoke; see
// lambda.go), a Kinesis Data Streams server (AWS JSON 1.1,
// Kinesis_20131202.PutRecords; see kinesis.go) and an SNS server (AWS query
// protocol: form-encoded Action=PublishBatch, XML answers; see sns.go).
//
// Each service is a separate server ([NewEventBridge], [NewSQS],
// [NewLambda], [NewKinesis], [NewSNS]) because each has its own SigV4
// signing name ("events", "sqs", "lambda", "kinesis", "sns") and its own
// error shapes. [VerifySigV4] checks the
// signature of any request, for receivers of SigV4-signed webhooks.
// Both listen on 127.0.0.1 only. Point a real SDK client at URL() through
// BaseEndpoint (or use the server's Config helper):
//
//	eb := awstest.NewEventBridge(awstest.Options{})
//	defer eb.Close()
//	client := eventbridge.NewFromConfig(eb.Config())
//
// Every request's SigV4 signature is recomputed from the request (canonical
// request, string to sign, signing key) with the server's credentials and
// compared to the Authorization header; requests with a bad or missing
// signature, an unknown access key or an X-Amz-Date more than five minutes
// off are rejected with the error shape AWS uses and counted by Rejected().
//
// Servers store what they accept for assertions and can be told to throttle,
// fail entries, answer 5xx or stall. All methods are safe for concurrent use.
//
// Error answers, as the SDK sees them (ErrorCode() / Go type):
//
//	                     EventBridge (JSON 1.1)               SQS (JSON 1.0; code from x-amzn-query-error)
//	bad signature/skew   403/400 InvalidSignatureException    403 SignatureDoesNotMatch
//	unknown access key   403 UnrecognizedClientException      403 InvalidClientTokenId
//	Throttle             400 *types.ThrottlingException       400 *types.RequestThrottled
//	FailStatus(n, 500)   500 *types.InternalException         500 InternalFailure
//	FailStatus(n, 503)   503 ServiceUnavailable               503 ServiceUnavailable
//	request validation   400 ValidationException              400 *types.TooManyEntriesInBatchRequest,
//	                                                          BatchRequestTooLong, BatchEntryIdsNotDistinct,
//	                                                          InvalidBatchEntryId, EmptyBatchRequest,
//	                                                          QueueDoesNotExist (code AWS.SimpleQueueService.*)
//
// Kinesis answers as EventBridge does (JSON 1.1, same authentication
// errors), with 400 *types.ProvisionedThroughputExceededException for
// Throttle, 500 InternalFailure, 503 ServiceUnavailable, 400
// *types.ResourceNotFoundException for an unknown stream, ValidationException
// (records count, partition key length, record size) and
// InvalidArgumentException (request size). SNS answers with an XML
// ErrorResponse (Type, Code, Message): 403 InvalidClientTokenId /
// SignatureDoesNotMatch, 429 *types.ThrottledException, 500
// *types.InternalErrorException, 503 ServiceUnavailable, 404
// *types.NotFoundException, 400 BatchRequestTooLong,
// TooManyEntriesInBatchRequest, BatchEntryIdsNotDistinct, EmptyBatchRequest,
// InvalidBatchEntryId.
//
// Throttling codes and 5xx statuses are retryable for the SDK's standard
// retryer; the signature-expired answers carry a Date header from the server
// clock, so the SDK's clock-skew correction re-signs and retries once.
package awstest

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Default test credentials, region and account. Servers built with a zero
// Options accept requests signed with AccessKeyID and SecretAccessKey.
const (
	AccessKeyID     = "AKIDCHANGEGATETEST"
	SecretAccessKey = "changegate+test/secret+access+key/0123456789"
	DefaultRegion   = "us-east-1"
	// DefaultAccountID is the account in SQS queue URLs.
	DefaultAccountID = "123456789012"
	// MaxClockSkew is how far X-Amz-Date may be from the server clock, as AWS.
	MaxClockSkew = 5 * time.Minute
)

// Options configure a server. Zero fields take the defaults above.
type Options struct {
	AccessKey string // default AccessKeyID
	SecretKey string // default SecretAccessKey
	Region    string // default "us-east-1"
	AccountID string // default DefaultAccountID (SQS queue URLs)

	// MaxClockSkew bounds |server clock - X-Amz-Date|; default 5 minutes.
	MaxClockSkew time.Duration
	// Now is the server clock (signature expiry, FIFO deduplication window);
	// default time.Now.
	Now func() time.Time

	// MaxRequestSize is EventBridge's limit on the summed entry sizes of a
	// PutEvents request (see PutEventsEntrySize); default
	// DefaultEventBridgeMaxRequestSize. SQS: the limit on the summed message
	// sizes of a SendMessageBatch; default DefaultSQSMaxBatchSize.
	MaxRequestSize int
}

func (o Options) withDefaults() Options {
	if o.AccessKey == "" {
		o.AccessKey = AccessKeyID
	}
	if o.SecretKey == "" {
		o.SecretKey = SecretAccessKey
	}
	if o.Region == "" {
		o.Region = DefaultRegion
	}
	if o.AccountID == "" {
		o.AccountID = DefaultAccountID
	}
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = MaxClockSkew
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// apiError is an error answer. typ is the JSON "__type"; queryCode and fault
// (Sender/Receiver) fill the x-amzn-query-error header for query-compatible
// services (SQS) when set.
type apiError struct {
	status    int
	typ       string
	message   string
	queryCode string
	fault     string
	// retryAfter, when set, is sent as the Retry-After header (Lambda's
	// TooManyRequestsException).
	retryAfter string
	// reason is Lambda's TooManyRequestsException Reason.
	reason string
}

// service is what a concrete server plugs into core.
type service interface {
	signingName() string
	contentType() string
	authError(*authError) apiError
	throttleError() apiError
	statusError(status int) apiError
	// handle answers one authenticated request for operation op (the part of
	// X-Amz-Target after the dot) with headers h; it returns the response
	// body or an error.
	handle(op string, body []byte, h http.Header) (any, *apiError)
	targetPrefix() string
}

// restService is a service of the REST-JSON protocol (Lambda): operations
// are routed by method and path, not X-Amz-Target, and answered by the
// service itself, after core's signature check and fault injection.
type restService interface {
	// route returns the operation of r, or "" when none matches.
	route(r *http.Request) string
	// serveREST answers one authenticated request for operation op.
	serveREST(w http.ResponseWriter, r *http.Request, op string, body []byte)
}

// errorShaper is a service that writes its error answers itself (headers
// and body shape of its protocol).
type errorShaper interface {
	writeError(w http.ResponseWriter, e apiError)
}

// queryService is a service of the AWS query protocol (SNS): the operation
// is the Action field of the form-encoded body, not X-Amz-Target, and
// answers are XML.
type queryService interface {
	errorShaper
	// action returns the Action of a request body, or "".
	action(body []byte) string
	// writeResponse writes the successful answer out of operation op.
	writeResponse(w http.ResponseWriter, op string, out any)
}

// core is the HTTP plumbing, SigV4 check, counters and fault injection shared
// by the services.
type core struct {
	opts    Options
	svc     service
	srv     *httptest.Server
	closing chan struct{}
	once    sync.Once

	mu         sync.Mutex
	requests   int
	rejected   int
	throttle   int
	failN      int
	failStatus int
	stall      time.Duration
	stallN     int
	stallNext  time.Duration
	calls      map[string]int
}

func newCore(opts Options, svc service) *core {
	c := &core{opts: opts, svc: svc, closing: make(chan struct{}), calls: map[string]int{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("awstest: listen: %v", err))
	}
	c.srv = &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(c.serve)}}
	c.srv.Start()
	return c
}

// URL is the endpoint to use as the SDK's BaseEndpoint.
func (c *core) URL() string { return c.srv.URL }

// Close stops the server; stalled requests are released first.
func (c *core) Close() {
	c.once.Do(func() { close(c.closing) })
	c.srv.Close()
}

// Config returns an aws.Config for a real SDK client of this server: the
// server's region, static credentials for its keys, BaseEndpoint = URL().
// The SDK's default retryer is left in place.
func (c *core) Config() aws.Config {
	return aws.Config{
		Region:       c.opts.Region,
		Credentials:  credentials.NewStaticCredentialsProvider(c.opts.AccessKey, c.opts.SecretKey, ""),
		BaseEndpoint: aws.String(c.srv.URL),
	}
}

// Requests is the number of HTTP requests received, including rejected,
// throttled and failed ones.
func (c *core) Requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests
}

// Rejected is the number of requests rejected for authentication (bad or
// missing signature, unknown key, clock skew).
func (c *core) Rejected() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rejected
}

// Throttle answers the next n authenticated requests with the service's
// throttling error (which the SDK's retryer classifies as a retryable
// throttle). n <= 0 cancels.
func (c *core) Throttle(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.throttle = max(n, 0)
}

// FailStatus answers the next n authenticated requests with HTTP status (for
// example 500 or 503) and the service's error body for it. Applied after
// Throttle. n <= 0 cancels.
func (c *core) FailStatus(n, status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failN, c.failStatus = max(n, 0), status
}

// Stall holds every authenticated request for d before answering it (until
// Stall(0), Reset or Close). A client that gives up earlier sees a timeout;
// the server then drops the request without processing it.
func (c *core) Stall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stall = max(d, 0)
}

// StallNext holds the next n authenticated requests for d each; it takes
// precedence over Stall. n <= 0 cancels.
func (c *core) StallNext(n int, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stallN, c.stallNext = max(n, 0), max(d, 0)
}

// Calls is the number of authenticated requests for operation op (for
// example "PutEvents", "SendMessageBatch", "GetQueueUrl"), including ones
// then answered with an injected fault.
func (c *core) Calls(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

func (c *core) resetCore() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests, c.rejected, c.throttle, c.failN, c.failStatus, c.stall = 0, 0, 0, 0, 0, 0
	c.stallN, c.stallNext, c.calls = 0, 0, map[string]int{}
}

// maxBody bounds a request body; AWS request limits are far below it.
const maxBody = 16 << 20

func (c *core) serve(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.requests++
	c.mu.Unlock()

	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		return
	}
	now := c.opts.Now()
	// The SDK corrects its clock from the Date header when a signature is
	// rejected for skew, so Date must come from the server clock.
	w.Header().Set("Date", now.UTC().Format(http.TimeFormat))
	if ae := verifySigV4(r, body, c.opts, c.svc.signingName(), now); ae != nil {
		c.mu.Lock()
		c.rejected++
		c.mu.Unlock()
		c.writeError(w, c.svc.authError(ae))
		return
	}

	target := r.Header.Get("X-Amz-Target")
	op, hasPrefix := strings.CutPrefix(target, c.svc.targetPrefix()+".")
	rest, isREST := c.svc.(restService)
	if isREST {
		op = rest.route(r)
		hasPrefix = op != ""
	}
	query, isQuery := c.svc.(queryService)
	if isQuery {
		op = query.action(body)
		hasPrefix = op != ""
	}
	c.mu.Lock()
	if hasPrefix {
		c.calls[op]++
	}
	stall := c.stall
	if c.stallN > 0 {
		c.stallN--
		stall = c.stallNext
	}
	c.mu.Unlock()
	if stall > 0 {
		t := time.NewTimer(stall)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-c.closing:
			t.Stop()
			return
		}
	}

	c.mu.Lock()
	var fault *apiError
	switch {
	case c.throttle > 0:
		c.throttle--
		e := c.svc.throttleError()
		fault = &e
	case c.failN > 0:
		c.failN--
		e := c.svc.statusError(c.failStatus)
		fault = &e
	}
	c.mu.Unlock()
	if fault != nil {
		c.writeError(w, *fault)
		return
	}

	if isREST {
		if op == "" {
			c.writeError(w, apiError{status: http.StatusNotFound, typ: "UnknownOperationException", message: "Unknown operation " + r.Method + " " + r.URL.Path})
			return
		}
		rest.serveREST(w, r, op, body)
		return
	}
	if r.Method != http.MethodPost {
		c.writeError(w, apiError{status: http.StatusMethodNotAllowed, typ: "UnknownOperationException", message: "Only POST is supported."})
		return
	}
	if !hasPrefix {
		c.writeError(w, apiError{status: http.StatusBadRequest, typ: "UnknownOperationException", message: "Unknown target: " + target})
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != c.svc.contentType() {
		c.writeError(w, apiError{status: http.StatusBadRequest, typ: "SerializationException", message: "Unexpected Content-Type " + ct})
		return
	}
	out, aerr := c.svc.handle(op, body, r.Header)
	if aerr != nil {
		c.writeError(w, *aerr)
		return
	}
	if isQuery {
		query.writeResponse(w, op, out)
		return
	}
	b, err := json.Marshal(out)
	if err != nil {
		c.writeError(w, apiError{status: 500, typ: "InternalFailure", message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", c.svc.contentType())
	w.Header().Set("X-Amzn-Requestid", newUUID())
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

func (c *core) writeError(w http.ResponseWriter, e apiError) {
	if es, ok := c.svc.(errorShaper); ok {
		es.writeError(w, e)
		return
	}
	h := w.Header()
	h.Set("Content-Type", c.svc.contentType())
	h.Set("X-Amzn-Requestid", newUUID())
	if e.queryCode != "" {
		h.Set("X-Amzn-Query-Error", e.queryCode+";"+e.fault)
	}
	b, _ := json.Marshal(map[string]string{"__type": e.typ, "message": e.message})
	w.WriteHeader(e.status)
	w.Write(b)
}

// newUUID returns a random (version 4) UUID string.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
