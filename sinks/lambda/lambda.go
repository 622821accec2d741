// Package lambda is the sink that invokes an AWS Lambda function with each
// event (or batch of events) through the Invoke API (aws-sdk-go-v2).
//
// The payload is the event's JSON envelope (sinks.EncodeEnvelope), the
// same bytes a webhook receives; with Config.BatchSize > 1 it is a JSON
// array of envelopes, also for a batch of one.
//
// # Invocation types
//
//   - "Event" (the default): asynchronous. Lambda queues the event and
//     answers 202; the function's own failures are Lambda's to retry (its
//     asynchronous retries, on-failure destination or dead-letter queue).
//   - "RequestResponse": synchronous. The function's result decides: 200
//     without X-Amz-Function-Error is delivered; with it, the function
//     failed and the event (every event of the batch) fails with reason
//     "function_error", retryable, so the engine retries it per the sink's
//     retry policy and then dead-letters it; the error keeps the start of
//     the function's error payload (at most 4 KiB).
//
// Qualifier (a version or alias) and ClientContext (a JSON object, passed
// base64-encoded to synchronous invocations only, as Lambda documents) are
// optional.
//
// # Payload limits
//
// The limits are those of the Invoke API per invocation type, enforced
// before the call:
//
//   - synchronous: 6 MB; the service refuses more than 6291456 bytes
//     (6 MiB) with "Request must be smaller than 6291456 bytes for the
//     InvokeFunction operation" (Lambda quotas page, "Invocation payload
//     (request and response): 6 MB each for synchronous");
//   - asynchronous: 1 MB, raised from 256 KB in October 2025 (AWS Compute
//     Blog, "More room to build: serverless services now support payloads
//     up to 1 MB", and the Invoke documentation of
//     aws-sdk-go-v2/service/lambda v1.114.2: "For synchronous invocations,
//     the maximum payload size is 6 MB. For asynchronous invocations, the
//     maximum payload size is 1 MB."). 1 MiB (1048576 bytes) is used.
//
// Config.MaxPayloadBytes can lower the limit (never raise it). A batch is
// sent in as few invocations as the limit allows, in order; an event whose
// payload alone exceeds it fails permanently with reason "oversize" (dead
// letter), or, with Config.Oversize.Strip, is sent stripped
// (sinks.Oversize.Fit: without fullDocument and fullDocumentBeforeChange,
// then without updateDescription's contents, marked "truncated": true), and
// fails only if still too large.
//
// # Failures
//
// Send returns nil when every invocation succeeded, a *sinks.BatchError
// when only some chunks of a batch failed, otherwise a *sinks.Error. Whole
// call errors are classified as in the other AWS sinks
// (awsutil.ClassifyCall): TooManyRequestsException (429, reason
// "throttled", with the answer's Retry-After as RetryAfter),
// ServiceException and every 5xx (Lambda's EC2/ENI/KMS/ResourceNotReady
// errors are 502), 408 and timeouts are retryable; so are
// ResourceConflictException and SnapStartNotReadyException (409: the
// function is being updated or prepared). ResourceNotFoundException,
// access denied (AccessDeniedException, 403 signature errors),
// InvalidRequestContentException, RequestTooLargeException (413) and other
// 4xx are permanent and go to dead letters at once. When one invocation of
// a batch fails as a whole, the later ones are not made (they would
// overtake it): their events fail with the same error, or a retryable
// "not_sent" one when it was permanent; for a transaction
// (transactions = "group") a refused invocation fails the events of every
// later part for good, with its answer (sinks.NotSent).
//
// # Retries inside the SDK
//
// As for the other AWS sinks, the SDK client retries only a failed
// connection (awsutil.ServiceRetryer: up to 3 tries, waits ≤ 200ms, no
// retry quota); throttling, 5xx and function errors go back to the engine
// at once, which owns backoff and dead letters.
package lambda

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/awsutil"
	"github.com/changegate/changegate/sinks/internal/confcheck"
	"github.com/changegate/changegate/tracing"
)

// Invocation types.
const (
	InvocationEvent           = "Event"
	InvocationRequestResponse = "RequestResponse"
)

// Limits and defaults.
const (
	// MaxSyncPayload is the Invoke payload limit of a synchronous
	// (RequestResponse) invocation: 6 MiB, see the package documentation.
	MaxSyncPayload = 6 << 20
	// MaxAsyncPayload is the Invoke payload limit of an asynchronous
	// (Event) invocation: 1 MiB since October 2025 (256 KiB before), see
	// the package documentation.
	MaxAsyncPayload = 1 << 20
	// MaxClientContext is the largest ClientContext once base64-encoded
	// (3583 bytes, InvokeInput.ClientContext).
	MaxClientContext = 3583
	// DefaultTimeout bounds one Send of an Event sink when Config.Timeout
	// is 0.
	DefaultTimeout = 10 * time.Second
	// DefaultSyncTimeout bounds one Send of a RequestResponse sink when
	// Config.Timeout is 0: the function runs within it.
	DefaultSyncTimeout = time.Minute
	// MaxFunctionErrorBytes is how much of a function's error payload a
	// "function_error" failure quotes.
	MaxFunctionErrorBytes = 4 << 10
)

// MaxPayload returns the payload limit of an invocation type.
func MaxPayload(invocationType string) int {
	if invocationType == InvocationRequestResponse {
		return MaxSyncPayload
	}
	return MaxAsyncPayload
}

// Config configures a Lambda sink.
type Config struct {
	// Name is the sink name, used in errors and logs.
	Name string
	// Function is the function's name, name:qualifier, full ARN or partial
	// ARN (required).
	Function string
	// Qualifier is the version or alias to invoke (optional).
	Qualifier string
	// InvocationType is InvocationEvent (the default when empty) or
	// InvocationRequestResponse.
	InvocationType string
	// ClientContext is a JSON object passed to synchronous invocations in
	// the context object (optional); the sink base64-encodes it.
	ClientContext string
	// BatchSize is the most events per invocation: 1 (or 0) sends each
	// envelope as a JSON object, > 1 a JSON array of envelopes.
	BatchSize int
	// MaxPayloadBytes lowers the payload limit of the invocation type
	// (0: MaxPayload(InvocationType)).
	MaxPayloadBytes int
	// Oversize is the policy for an event whose payload alone exceeds the
	// limit (sinks.Oversize.Fit): failed with reason "oversize" (the zero
	// value), or sent stripped.
	Oversize sinks.Oversize
	// Canonical selects canonical instead of relaxed Extended JSON.
	Canonical bool
	// Region is the AWS region; empty: from the environment or shared
	// config.
	Region string
	// Endpoint overrides the service endpoint (BaseEndpoint).
	Endpoint string
	// RoleARN, when set, is assumed through STS on top of the credentials
	// of the default chain.
	RoleARN string
	// Timeout bounds one Send, all its invocations together (default 10s
	// for Event, 1m for RequestResponse: set it above the function's
	// timeout).
	Timeout time.Duration
	// MaxConns is the number of idle connections kept (default 10).
	MaxConns int
	// Credentials replaces the default credential chain (tests); RoleARN
	// still applies on top of it.
	Credentials aws.CredentialsProvider
}

// Lambda is a sinks.Sink that invokes one function. It is safe for
// concurrent use by several workers.
type Lambda struct {
	name          string
	prefix        string
	function      string
	qualifier     *string
	clientContext *string
	invType       types.InvocationType
	batch         int
	maxBytes      int
	oversize      sinks.Oversize
	canonical     bool
	timeout       time.Duration
	client        *lambda.Client
	log           *slog.Logger
	closed        atomic.Bool
}

var _ sinks.Sink = (*Lambda)(nil)

// New returns a Lambda sink for cfg. It validates the configuration and
// loads the AWS configuration (environment, shared files); it does not
// connect. logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Lambda, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	errs := confcheck.New("lambda", cfg.Name)
	prefix := errs.Prefix()
	if cfg.Function == "" {
		errs.Addf("function is required")
	}
	invType := cfg.InvocationType
	switch invType {
	case "":
		invType = InvocationEvent
	case InvocationEvent, InvocationRequestResponse:
	default:
		errs.Addf("invocation_type must be %q or %q, got %q", InvocationEvent, InvocationRequestResponse, invType)
	}
	limit := MaxPayload(invType)
	if cfg.MaxPayloadBytes < 0 || cfg.MaxPayloadBytes > limit {
		errs.Addf("max_request_bytes must be between 1 and %d for %s invocations, got %d", limit, invType, cfg.MaxPayloadBytes)
	}
	if cfg.BatchSize < 0 {
		errs.Addf("batch_size must be >= 1, got %d", cfg.BatchSize)
	}
	if cfg.Timeout < 0 {
		errs.Addf("timeout must not be negative, got %s", cfg.Timeout)
	}
	var clientContext *string
	if cfg.ClientContext != "" {
		enc, err := EncodeClientContext(cfg.ClientContext)
		if err != nil {
			errs.Addf("client_context: %v", err)
		}
		clientContext = aws.String(enc)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	awsCfg, err := awsutil.LoadConfig(awsutil.Options{
		Name: cfg.Name, Region: cfg.Region, RoleARN: cfg.RoleARN,
		Credentials: cfg.Credentials, MaxConns: cfg.MaxConns,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prefix, err)
	}
	client := lambda.NewFromConfig(awsCfg, func(o *lambda.Options) {
		awsutil.ClientOptions(&o.Retryer, &o.BaseEndpoint, &o.APIOptions, cfg.Endpoint)
	})
	l := &Lambda{
		name: cfg.Name, prefix: prefix, function: cfg.Function, clientContext: clientContext,
		invType: types.InvocationType(invType), batch: max(cfg.BatchSize, 1), maxBytes: limit,
		oversize: cfg.Oversize, canonical: cfg.Canonical, timeout: cfg.Timeout, client: client, log: logger,
	}
	if cfg.Qualifier != "" {
		l.qualifier = aws.String(cfg.Qualifier)
	}
	if cfg.MaxPayloadBytes > 0 {
		l.maxBytes = cfg.MaxPayloadBytes
	}
	if l.timeout == 0 {
		l.timeout = DefaultTimeout
		if invType == InvocationRequestResponse {
			l.timeout = DefaultSyncTimeout
		}
	}
	return l, nil
}

// EncodeClientContext returns the X-Amz-Client-Context value of a client
// context given as a JSON object: its base64 encoding. It fails when s is
// not a JSON object or is too long once encoded.
func EncodeClientContext(s string) (string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &obj); err != nil || obj == nil {
		return "", errors.New(`must be a JSON object, like {"custom": {"source": "changegate"}}`)
	}
	enc := base64.StdEncoding.EncodeToString([]byte(s))
	if len(enc) > MaxClientContext {
		return "", fmt.Errorf("is %d bytes once base64-encoded, more than Lambda's %d", len(enc), MaxClientContext)
	}
	return enc, nil
}

// Name returns the sink name.
func (l *Lambda) Name() string { return l.name }

// MaxBatch returns Config.BatchSize (at least 1).
func (l *Lambda) MaxBatch() int { return l.batch }

// Close marks the sink closed; no Send may follow it.
func (l *Lambda) Close() error {
	l.closed.Store(true)
	return nil
}

// Send invokes the function with batch; see the package documentation for
// the payload, batching and the errors returned. When ctx ends, Send
// returns ctx's error, wrapped.
func (l *Lambda) Send(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	if l.closed.Load() {
		return sinks.Retryable("closed", 0, fmt.Errorf("%s: send after close", l.prefix))
	}
	if sinks.TxnGroup(ctx) {
		return l.sendGroup(ctx, batch)
	}
	var failed map[int]error
	envs := make([][]byte, len(batch))
	sizes := make([]int, len(batch))
	stripped := make([]bool, len(batch))
	built := 0
	// A single event is sent as an object; in a batching sink every
	// envelope takes one more byte (its comma or the closing bracket)
	// after the opening bracket, so the chunks' sizes add up exactly.
	extra, maxBytes := 0, l.maxBytes
	if l.batch > 1 {
		extra, maxBytes = 1, l.maxBytes-1
	}
	for i, e := range batch {
		p, err := l.payload(e, maxBytes-extra)
		if err != nil {
			if failed == nil {
				failed = make(map[int]error, len(batch))
			}
			failed[i] = err
			continue
		}
		envs[i], sizes[i], stripped[i] = p.Body, p.Size+extra, p.Stripped
		built += p.Built()
	}

	// The stripped payloads built above, until Send returns.
	defer sinks.Hold(ctx, int64(built))()
	ctx, cancel := awsutil.WithTimeout(ctx, l.timeout)
	defer cancel()
	err := awsutil.SendInChunks(ctx, l.prefix+": Invoke", len(batch), sizes, l.batch, maxBytes, failed,
		func(ctx context.Context, idx []int, _ func(int, error)) error {
			var body []byte
			if l.batch == 1 {
				body = envs[idx[0]]
			} else {
				parts := make([][]byte, len(idx))
				sz := make([]int, len(idx))
				for j, i := range idx {
					parts[j], sz[j] = envs[i], len(envs[i])
				}
				body = sinks.AppendJSONArray(make([]byte, 0, sinks.JSONArraySize(sz...)), parts...)
			}
			return l.invoke(ctx, body)
		})
	l.oversize.Delivered(stripped, err)
	var be *sinks.BatchError
	if len(batch) == 1 && errors.As(err, &be) && be.Failed[0] != nil {
		return be.Failed[0] // the one event failed before the call
	}
	return err
}

// sendGroup invokes the function once with the events of one transaction
// (sinks.WithTxnGroup) as a JSON array, whatever batch_size says. A payload
// over the invocation type's limit is split in order into parts, each
// element's "txn" then carrying "part" and "parts", invoked one after the
// other; once one fails the later ones are not invoked and fail with its
// error (for good when it was permanent, sinks.NotSent). An event whose
// payload alone is too large follows the oversize policy and is left out.
func (l *Lambda) sendGroup(ctx context.Context, batch []*event.Event) error {
	failed := map[int]error{}
	envs := make([][]byte, len(batch))
	sizes := make([]int, len(batch))
	ok := make([]bool, len(batch))
	stripped := make([]bool, len(batch))
	built := 0
	for i, e := range batch {
		env, err := sinks.EncodeRecord(e, l.canonical)
		if err != nil {
			failed[i] = sinks.Permanent("encode", fmt.Errorf("%s: %w", l.prefix, err))
			continue
		}
		p, err := l.oversize.Fit(e, l.canonical, env, l.maxBytes-2-event.TxnPartReserve, payloadLen, l.prefix, "payload for invocation type "+string(l.invType))
		if err != nil {
			failed[i] = err
			continue
		}
		envs[i], sizes[i], ok[i], stripped[i] = p.Body, len(p.Body), true, p.Stripped
		built += p.Built()
	}
	pre := len(failed)
	// Split when too large: every element then says which part it is in.
	parts, marked := sinks.SplitTxn(batch, envs, sizes, ok, l.maxBytes, sinks.TxnPartOf(ctx))
	built += marked
	defer sinks.Hold(ctx, int64(built))()
	ctx, cancel := awsutil.WithTimeout(ctx, l.timeout)
	defer cancel()
	var callErr error
	for _, idx := range parts {
		if callErr != nil {
			nerr := sinks.NotSent(l.prefix+": Invoke", callErr, true)
			for _, i := range idx {
				failed[i] = nerr
			}
			continue
		}
		ps := make([][]byte, len(idx))
		sz := make([]int, len(idx))
		for j, i := range idx {
			ps[j], sz[j] = envs[i], len(envs[i])
		}
		body := sinks.AppendJSONArray(make([]byte, 0, sinks.JSONArraySize(sz...)), ps...)
		if err := l.invoke(ctx, body); err != nil {
			if awsutil.Cancelled(ctx) {
				return err
			}
			callErr = err
			for _, i := range idx {
				failed[i] = err
			}
		}
	}
	var err error
	switch {
	case len(failed) == 0:
	case pre == 0 && len(parts) == 1 && callErr != nil:
		err = callErr
	default:
		err = &sinks.BatchError{Failed: failed}
	}
	l.oversize.Delivered(stripped, err)
	return err
}

// payload returns e's envelope, stripped when it exceeds limit and the sink
// strips (sinks.Oversize.Fit), or a permanent "encode" or "oversize" error.
func (l *Lambda) payload(e *event.Event, limit int) (sinks.Payload, error) {
	encode := sinks.EncodeEnvelope // the webhook body
	if l.batch > 1 {
		encode = sinks.EncodeRecord // an array element, as a batched webhook's
	}
	env, err := encode(e, l.canonical)
	if err != nil {
		return sinks.Payload{}, sinks.Permanent("encode", fmt.Errorf("%s: %w", l.prefix, err))
	}
	return l.oversize.Fit(e, l.canonical, env, limit, payloadLen, l.prefix, "payload for invocation type "+string(l.invType))
}

// payloadLen is the size of an envelope as a payload.
func payloadLen(env []byte) int { return len(env) }

// invoke makes one Invoke call with payload and classifies its outcome.
func (l *Lambda) invoke(ctx context.Context, payload []byte) error {
	var opts []func(*lambda.Options)
	if th := tracing.XRayHeader(ctx, -1); th != "" {
		// As AWS documents for X-Ray: the X-Amzn-Trace-Id header of the
		// Invoke request is the function's trace header (_X_AMZN_TRACE_ID,
		// the Lambda context's trace id).
		opts = append(opts, func(o *lambda.Options) { o.APIOptions = append(o.APIOptions, awsutil.SetHeader("X-Amzn-Trace-Id", th)) })
	}
	out, err := l.client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   aws.String(l.function),
		Qualifier:      l.qualifier,
		InvocationType: l.invType,
		ClientContext:  l.clientContext,
		Payload:        payload,
	}, opts...)
	if err != nil {
		return Classify(ctx, l.prefix+": Invoke", err)
	}
	if out.FunctionError != nil {
		de := sinks.Retryable("function_error", 0, fmt.Errorf("%s: Invoke: function error (%s, version %s): %s",
			l.prefix, aws.ToString(out.FunctionError), aws.ToString(out.ExecutedVersion), quote(out.Payload, MaxFunctionErrorBytes)))
		de.Status, de.Code, de.Answer = int(out.StatusCode), aws.ToString(out.FunctionError), sinks.Answer(out.Payload)
		return de
	}
	return nil
}

// retryableCodes are 4xx Invoke errors that mean "not now" rather than
// "never": the function is being updated (ResourceConflictException) or
// its SnapStart snapshot is not ready yet.
var retryableCodes = map[string]bool{
	"ResourceConflictException":  true,
	"SnapStartNotReadyException": true,
}

// Classify turns the error of an Invoke call into Send's result: as
// awsutil.ClassifyCall, with Lambda's Retry-After of a throttled call in
// RetryAfter and the retryable 409 codes above.
func Classify(ctx context.Context, prefix string, err error) error {
	res := awsutil.ClassifyCall(ctx, prefix, err)
	de, ok := res.(*sinks.Error)
	if !ok {
		return res
	}
	var tm *types.TooManyRequestsException
	if errors.As(err, &tm) {
		if secs, perr := strconv.Atoi(strings.TrimSpace(aws.ToString(tm.RetryAfterSeconds))); perr == nil && secs > 0 {
			de.RetryAfter = time.Duration(min(secs, 24*3600)) * time.Second
		}
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && retryableCodes[ae.ErrorCode()] {
		de.Permanent = false
	}
	return de
}

// quote returns at most n bytes of b (valid UTF-8, control characters as
// spaces), marking a cut with "...".
func quote(b []byte, n int) string {
	s := strings.ToValidUTF8(string(b[:min(len(b), n+utf8.UTFMax)]), "\uFFFD")
	cut := len(b) > n
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s, cut = s[:n], true
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if cut {
		s += "..."
	}
	return s
}
