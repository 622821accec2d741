// Package awsutil is what the AWS sinks (EventBridge, SQS, SNS, Kinesis,
// Lambda) share:
// the SDK client setup (credential chain, assumed role, transport-only
// retries), the state and start of a Send (Core), the batch calls
// (SendEntries) and the classification of whole-call errors into retry
// decisions. The webhook sink's SigV4 signing uses its credential chain
// too.
package awsutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/confcheck"
	"github.com/changegate/changegate/tracing"
)

// Transport-level retries inside one Send: connection failures only (refused,
// reset, closed), with short waits. Everything else is left to the engine.
const (
	transportAttempts   = 3
	transportMaxBackoff = 200 * time.Millisecond
)

// Options are the client options shared by the AWS sinks.
type Options struct {
	Name        string // sink name, for the assumed role's session name
	Region      string
	RoleARN     string
	Credentials aws.CredentialsProvider // nil: the SDK's default chain
	MaxConns    int
}

// LoadConfig builds the SDK configuration: the default credential chain
// (or o.Credentials), then role_arn assumed on top of it through STS. It
// reads the environment and shared config files only; it does not connect.
//
// The retryer given to the service client (see ServiceRetryer) is not used
// by STS, which keeps the SDK's standard retries for credential refreshes.
func LoadConfig(o Options) (aws.Config, error) {
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConns = max(o.MaxConns, 10)
		tr.MaxIdleConnsPerHost = max(o.MaxConns, 10)
	})
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithHTTPClient(httpClient)}
	if o.Region != "" {
		opts = append(opts, awsconfig.WithRegion(o.Region))
	}
	if o.Credentials != nil {
		opts = append(opts, awsconfig.WithCredentialsProvider(o.Credentials))
	}
	cfg, err := awsconfig.LoadDefaultConfig(context.Background(), opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load aws config: %w", err)
	}
	if cfg.Region == "" {
		return aws.Config{}, errors.New("no region: set region or AWS_REGION")
	}
	if o.RoleARN != "" {
		stsClient := sts.NewFromConfig(cfg)
		cfg.Credentials = aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(stsClient, o.RoleARN,
			func(ao *stscreds.AssumeRoleOptions) { ao.RoleSessionName = "changegate-" + o.Name }))
	}
	if cfg.Credentials != nil {
		// The SDK reports a failed retrieval as a plain wrapped error
		// ("get identity: ..."), often around the credential source's own
		// HTTP error (STS AccessDenied, IMDS 404) that ClassifyCall would
		// otherwise take for the service's answer.
		cfg.Credentials = aws.NewCredentialsCache(markedCredentials{cfg.Credentials})
	}
	return cfg, nil
}

// CredentialsError is the error of a credentials provider that could not
// retrieve credentials, as marked by the providers LoadConfig returns.
type CredentialsError struct{ Err error }

func (e *CredentialsError) Error() string { return "retrieve credentials: " + e.Err.Error() }
func (e *CredentialsError) Unwrap() error { return e.Err }

// markedCredentials wraps a provider's errors in *CredentialsError.
type markedCredentials struct{ p aws.CredentialsProvider }

func (m markedCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c, err := m.p.Retrieve(ctx)
	if err != nil {
		return c, &CredentialsError{Err: err}
	}
	return c, nil
}

// ServiceRetryer is the service client's retryer: up to transportAttempts
// tries of one request, only when the connection failed. Throttling, 5xx
// and every other answer are returned at once, classified, to the delivery
// engine, which owns backoff (a second backoff inside the SDK would hide
// throttling from the engine and multiply waits). No client-side retry
// quota either: the engine's backoff is the rate limiter.
func ServiceRetryer() aws.Retryer {
	return retry.NewStandard(func(so *retry.StandardOptions) {
		so.MaxAttempts = transportAttempts
		so.MaxBackoff = transportMaxBackoff
		so.Retryables = []retry.IsErrorRetryable{retry.RetryableConnectionError{}}
		so.RateLimiter = ratelimit.None
	})
}

// ClientOptions sets what a sink's service client takes on top of the
// configuration LoadConfig returns: the retryer (ServiceRetryer) and, when
// endpoint (the sink's endpoint option) is set, the BaseEndpoint. Call it
// from the service's NewFromConfig option function:
//
//	sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
//		awsutil.ClientOptions(&o.Retryer, &o.BaseEndpoint, &o.APIOptions, cfg.Endpoint)
//	})
func ClientOptions(retryer *aws.Retryer, baseEndpoint **string, apiOptions *[]func(*middleware.Stack) error, endpoint string) {
	*retryer = ServiceRetryer()
	if endpoint != "" {
		*baseEndpoint = aws.String(endpoint)
	}
	*apiOptions = append(*apiOptions, chargeBody, traceCall)
}

// traceCall adds to a client's stack the recording of each call on the
// attempt's span (tracing): service, operation, request id and HTTP
// status, as the AWS SDK semantic conventions name them.
func traceCall(stack *middleware.Stack) error {
	return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("changegate.TraceCall",
		func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
			out, md, err := next.HandleDeserialize(ctx, in)
			if tracing.Active(ctx) {
				status := 0
				if resp, ok := out.RawResponse.(*smithyhttp.Response); ok {
					status = resp.StatusCode
				}
				id, _ := awsmiddleware.GetRequestIDMetadata(md)
				tracing.SetAWSCall(ctx, awsmiddleware.GetServiceID(ctx), awsmiddleware.GetOperationName(ctx), id, status)
			}
			return out, md, err
		}), middleware.Before)
}

// chargeBody adds to a client's stack, after the request is serialized,
// the charge of its body to the byte budget in the call's context
// (memory.WithBudget, which the engine puts in Send's context): the body
// the SDK encoded for this call (entries, attributes, escaped JSON,
// base64 records) or the payload it sends as is (Lambda), charged with
// sinks.Hold from here until the call returns, whatever its outcome. The
// body is made once per call: the SDK's retries rewind it and the SigV4
// signer reads it, neither copies it.
func chargeBody(stack *middleware.Stack) error {
	return stack.Build.Add(middleware.BuildMiddlewareFunc("changegate.ChargeBody",
		func(ctx context.Context, in middleware.BuildInput, next middleware.BuildHandler) (middleware.BuildOutput, middleware.Metadata, error) {
			var n int64
			if req, ok := in.Request.(*smithyhttp.Request); ok {
				if l, ok, err := req.StreamLength(); err == nil && ok {
					n = l
				}
			}
			release := sinks.Hold(ctx, n)
			defer release()
			return next.HandleBuild(ctx, in)
		}), middleware.After)
}

// SetHeader returns a client option (an APIOptions entry) that sets the
// HTTP header name of the request to value.
func SetHeader(name, value string) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Build.Add(middleware.BuildMiddlewareFunc("changegate.SetHeader."+name,
			func(ctx context.Context, in middleware.BuildInput, next middleware.BuildHandler) (middleware.BuildOutput, middleware.Metadata, error) {
				if req, ok := in.Request.(*smithyhttp.Request); ok {
					req.Header.Set(name, value)
				}
				return next.HandleBuild(ctx, in)
			}), middleware.After)
	}
}

// ErrSendTimeout is the cause of a Send's context when Config.Timeout
// expires.
var ErrSendTimeout = errors.New("timeout (the sink's timeout option) exceeded")

// WithTimeout returns the context of one Send: ctx bounded by d, with
// ErrSendTimeout as the cause when d expires.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, ErrSendTimeout)
}

// Cancelled reports whether the caller's context of a Send (not the sink's
// own timeout) has ended: then Send returns ctx's error, not a
// *sinks.Error.
func Cancelled(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrSendTimeout)
}

// Error codes of whole-call failures that are worth retrying besides the
// SDK's throttling codes (retry.DefaultThrottleErrorCodes).
var transientCodes = map[string]bool{
	"InternalFailure":         true,
	"InternalError":           true,
	"InternalException":       true,
	"InternalServerError":     true,
	"ServiceUnavailable":      true,
	"ServiceUnavailableError": true,
	"RequestTimeout":          true,
	"RequestTimeoutException": true,
	"KmsThrottled":            true,
	"KMS.ThrottlingException": true,
	// Credentials that expired or a clock that drifted: the SDK refreshes
	// credentials and corrects the skew for the next attempt.
	"ExpiredToken":          true,
	"ExpiredTokenException": true,
	"RequestExpired":        true,
	"RequestTimeTooSkewed":  true,
}

// throttleCodes are the throttling codes of the sinks' services that the
// SDK's retry.DefaultThrottleErrorCodes does not list. SQS's KMS
// throttling has two codes: KmsThrottled (the JSON shape) and
// KMS.ThrottlingException (its query-compatible code, which real SQS sends
// in X-Amzn-Query-Error and the SDK reports as the error code). SNS
// answers Throttled and KMSThrottling (service/sns types/errors.go),
// Kinesis KMSThrottlingException (service/kinesis types/errors.go); its
// ProvisionedThroughputExceededException is in the SDK's list.
var throttleCodes = map[string]bool{
	"KmsThrottled":            true,
	"KMS.ThrottlingException": true,
	"Throttled":               true,
	"KMSThrottling":           true,
	"KMSThrottlingException":  true,
}

// IsThrottle reports whether an AWS error code means throttling.
func IsThrottle(code string) bool {
	_, ok := retry.DefaultThrottleErrorCodes[code]
	return ok || throttleCodes[code]
}

// ClassifyCall turns the error of a whole API call into Send's result:
//
//   - ctx ended: ctx's error, wrapped (not a *sinks.Error);
//   - credentials could not be retrieved (default chain, assumed role):
//     retryable, reason "credentials";
//   - an AWS error code: throttling codes are retryable with reason
//     "throttled"; transientCodes, HTTP 408, 429 and 5xx are retryable;
//     any other code (validation, access denied, unknown queue or bus, 4xx)
//     is permanent. The reason is the error code ("http_<status>" without
//     one);
//   - a signature refused because of the clock skew the SDK detected (it
//     corrects its clock for the next call): retryable, reason
//     "clock_skew";
//   - a timeout (Config.Timeout): retryable, reason "timeout";
//   - anything else (connection failures already retried by the SDK):
//     retryable, reason "transport".
func ClassifyCall(ctx context.Context, prefix string, err error) error {
	if Cancelled(ctx) {
		return fmt.Errorf("%s: %w", prefix, ctx.Err())
	}
	if errors.Is(context.Cause(ctx), ErrSendTimeout) {
		return sinks.Retryable("timeout", 0, fmt.Errorf("%s: %w", prefix, ErrSendTimeout))
	}
	var se *v4.SigningError
	var ce *CredentialsError
	if errors.As(err, &se) || errors.As(err, &ce) {
		return sinks.Retryable("credentials", 0, fmt.Errorf("%s: %w", prefix, err))
	}
	// The SDK marks a signature refused because of a clock skew it saw in
	// the answer's Date header (InvalidSignatureException, ...); it signs
	// the next call with the corrected time, so retrying fixes it.
	var sr interface{ RetryableError() bool }
	if errors.As(err, &sr) && sr.RetryableError() {
		return sinks.Retryable("clock_skew", 0, fmt.Errorf("%s: %w", prefix, err))
	}
	var ae smithy.APIError
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	if errors.As(err, &ae) || status != 0 {
		code := ""
		if ae != nil {
			code = ae.ErrorCode()
		}
		if code == "UnknownError" { // the SDK's name for an error without a code
			code = ""
		}
		reason := code
		if reason == "" {
			reason = "http_" + strconv.Itoa(status)
		}
		msg := fmt.Errorf("%s: %w", prefix, err)
		var de *sinks.Error
		switch {
		case IsThrottle(code) || status == http.StatusTooManyRequests:
			de = sinks.Retryable("throttled", 0, msg)
		case transientCodes[code] || status == http.StatusRequestTimeout || status >= 500:
			de = sinks.Retryable(reason, 0, msg)
		case ae != nil && ae.ErrorFault() == smithy.FaultServer && status == 0:
			de = sinks.Retryable(reason, 0, msg)
		default:
			de = sinks.Permanent(reason, msg)
		}
		de.Status, de.Code = status, code
		if ae != nil {
			de.Answer = sinks.Answer([]byte(ae.ErrorMessage()))
		}
		return de
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return sinks.Retryable("timeout", 0, fmt.Errorf("%s: %w", prefix, err))
	}
	return sinks.Retryable("transport", 0, fmt.Errorf("%s: %w", prefix, err))
}

// SendInChunks sends the entries 0..n-1 of a batch that did not already fail
// (failed holds the indexes that failed while being prepared; it may be nil)
// in consecutive chunks of at most maxEntries entries and maxBytes bytes
// (sizes[i] each), in order, one send call per chunk. send reports per-entry
// failures through fail and returns the classified error of a call that
// failed as a whole. Once a call has failed, later chunks are not sent (that
// would put them before the failed ones): their entries fail as
// sinks.NotSent says (a refused call of a transaction's batch fails them for
// good with its answer; in such a batch an entry the destination refused
// for good stops the later calls the same way). what names the operation in those errors
// ("eventbridge bus: PutEvents").
//
// It returns nil when every entry was accepted; the call error when every
// entry failed with it; a *sinks.BatchError with the failed indexes
// otherwise; or ctx's error when ctx was cancelled during a call.
func SendInChunks(ctx context.Context, what string, n int, sizes []int, maxEntries, maxBytes int, failed map[int]error,
	send func(ctx context.Context, idx []int, fail func(int, error)) error) error {
	txn := sinks.TxnGroup(ctx)
	// refused is, in a transaction's batch, the first entry the
	// destination refused for good: the later calls are not made.
	var refused error
	fail := func(i int, err error) {
		if failed == nil {
			failed = make(map[int]error, n)
		}
		failed[i] = err
		if de, ok := err.(*sinks.Error); ok && de.Permanent && txn && refused == nil {
			refused = err
		}
	}
	idx := make([]int, 0, maxEntries)
	var callErr error
	calls, callFailed := 0, 0
	flush := func() error {
		if len(idx) == 0 {
			return nil
		}
		defer func() { idx = idx[:0] }()
		if callErr != nil {
			err := sinks.NotSent(what, callErr, txn)
			for _, i := range idx {
				fail(i, err)
			}
			return nil
		}
		err := send(ctx, idx, fail)
		calls++
		if err == nil && refused != nil {
			callErr = refused // a refused entry refuses its transaction
		}
		if err != nil {
			if Cancelled(ctx) {
				return err
			}
			callErr = err
			callFailed++
			for _, i := range idx {
				fail(i, err)
			}
		}
		return nil
	}
	size := 0
	for i := 0; i < n; i++ {
		if failed[i] != nil {
			continue
		}
		if len(idx) == maxEntries || size+sizes[i] > maxBytes {
			if err := flush(); err != nil {
				return err
			}
			size = 0
		}
		idx = append(idx, i)
		size += sizes[i]
	}
	if err := flush(); err != nil {
		return err
	}
	switch {
	case len(failed) == 0:
		return nil
	case calls > 0 && callFailed == calls && len(failed) == n && onlyErr(failed, callErr):
		return callErr // the whole batch failed the same way
	default:
		return &sinks.BatchError{Failed: failed}
	}
}

func onlyErr(failed map[int]error, err error) bool {
	for _, e := range failed {
		if e != err {
			return false
		}
	}
	return true
}

// Common is the configuration every AWS sink has besides its destination:
// the client Options, the request limit and the timeout of one Send.
type Common struct {
	Options
	// MaxRequestBytes is the sink's max_request_bytes (0: the default),
	// at most MaxRequestBytesLimit.
	MaxRequestBytes, DefaultMaxRequestBytes, MaxRequestBytesLimit int
	// Timeout bounds one Send (0: the default).
	Timeout, DefaultTimeout time.Duration
}

// Load validates the sink's configuration: check adds the errors of its
// own options, then the common ones are checked; all are reported
// together under kind and name (confcheck). It then fills in the defaults
// of c and loads the SDK configuration (LoadConfig).
func (c *Common) Load(kind string, check func(errs *confcheck.Errors)) (aws.Config, error) {
	errs := confcheck.New(kind, c.Name)
	check(errs)
	if c.MaxRequestBytes < 0 || c.MaxRequestBytes > c.MaxRequestBytesLimit {
		errs.Addf("max_request_bytes must be between 1 and %d, got %d", c.MaxRequestBytesLimit, c.MaxRequestBytes)
	}
	if c.Timeout < 0 {
		errs.Addf("timeout must not be negative, got %s", c.Timeout)
	}
	if err := errs.Err(); err != nil {
		return aws.Config{}, err
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = c.DefaultMaxRequestBytes
	}
	if c.Timeout == 0 {
		c.Timeout = c.DefaultTimeout
	}
	cfg, err := LoadConfig(c.Options)
	if err != nil {
		return aws.Config{}, fmt.Errorf("%s: %w", errs.Prefix(), err)
	}
	return cfg, nil
}
