// Package eventbridge is the sink that puts events on an Amazon EventBridge
// event bus with PutEvents (aws-sdk-go-v2).
//
// Each event becomes one PutEvents entry: Source (default
// "changegate.<source name>"), DetailType (default
// "<db>.<coll>.<operationType>"), Detail = the event's cached JSON envelope,
// Time = the change's wall time, EventBusName and optional Resources. Source
// and DetailType are templates with the placeholders {db}, {coll},
// {operationType} and {source}, compiled once.
//
// # Batching and the request size
//
// MaxBatch is 10, the PutEvents maximum. The engine hands Send up to
// batch_size events; Send sends them in as few PutEvents calls as the
// request-size limit (Config.MaxRequestBytes, default 256 KiB, up to 1 MiB
// where AWS accepts it) allows, one
// call after the other, in order. An entry's size is computed as AWS
// documents it (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html):
// 14 bytes for Time, plus the UTF-8 bytes of Source, DetailType, Detail and
// each Resources element. An event whose entry alone exceeds the limit can
// never be sent whole: it fails permanently with reason "oversize" (and goes
// to the dead-letter collection) while the rest of the batch is sent, or,
// with Config.Oversize.Strip, goes stripped (sinks.Oversize.Fit). When a
// call fails as a whole, the calls after it are not made: their entries
// fail with the same error when it is retryable, otherwise with a retryable
// "not_sent" error (a permanent failure of one call says nothing about the
// entries of the next), except in a transaction's batch (transactions =
// "group"), where a refused call fails the later entries for good with its
// answer (sinks.NotSent).
//
// # Failures
//
// Send returns nil when every entry was accepted, a *sinks.BatchError when
// only some failed (the engine retries just those), and otherwise a
// *sinks.Error for the whole batch. Reasons:
//
//   - per entry (PutEvents answers 200 with FailedEntryCount > 0), the
//     entry's ErrorCode: ThrottlingException (reason "throttled"),
//     InternalFailure, InternalException, ServiceUnavailable and any code
//     not listed below are retryable; AccessDeniedException,
//     InvalidAccountIdException, InvalidArgument, MalformedDetail,
//     RedactionFailure, NotAuthorizedForSourceException,
//     NotAuthorizedForDetailTypeException, ValidationException and
//     ResourceNotFoundException are permanent;
//   - whole call: throttling error codes ("throttled"), 408, 429, 5xx and
//     internal errors are retryable; other 4xx (ValidationException,
//     AccessDeniedException, ResourceNotFoundException, signature errors...)
//     are permanent, the reason being the error code; credentials that
//     cannot be retrieved ("credentials"), timeouts ("timeout") and
//     connection failures ("transport") are retryable;
//   - "oversize": see above; "detail_type": the expanded DetailType is
//     longer than 128 characters; "encode": the envelope cannot be encoded.
//     All permanent.
//
// # Retries inside the SDK
//
// The SDK client retries a request only when the connection failed (up to 3
// tries, waits ≤ 200ms) and has no client-side retry quota. Throttling and
// server errors are returned to the delivery engine at once: the engine owns
// backoff, Retry-After-like waits and dead-lettering, and its metrics see
// every failure.
package eventbridge

import (
	"context"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/awsutil"
	"github.com/changegate/changegate/sinks/internal/confcheck"
	"github.com/changegate/changegate/tracing"
)

// Limits and defaults.
const (
	// MaxEntries is the most entries one PutEvents call accepts.
	MaxEntries = 10
	// DefaultMaxRequestBytes is the default PutEvents request size limit
	// (256 KiB), computed as in the package documentation: the limit AWS
	// documents in the EventBridge user guide, and LocalStack's.
	DefaultMaxRequestBytes = 256 << 10
	// MaxRequestBytesLimit is the largest MaxRequestBytes: AWS raised the
	// PutEvents limit to 1 MB (the SDK's PutEvents documentation says
	// "less than 1MB"; the user guide still says 256KB); set
	// MaxRequestBytes to use it where the bus accepts it.
	MaxRequestBytesLimit = 1 << 20
	// DefaultDetailType is the DetailType template when none is configured.
	DefaultDetailType = "{db}.{coll}.{operationType}"
	// DefaultSource is the Source template when none is configured.
	DefaultSource = "changegate.{source}"
	// DefaultTimeout bounds one Send when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// MaxDetailTypeLen is EventBridge's limit on DetailType, in characters.
	MaxDetailTypeLen = 128
	// MaxSourceLen is EventBridge's limit on an entry's Source, in
	// characters (PutEventsRequestEntry.Source; it must not be empty).
	MaxSourceLen = 256

	timeEntryBytes = 14 // Time's share of an entry's size
)

// Config configures an EventBridge sink.
type Config struct {
	// Name is the sink name, used in errors and logs.
	Name string
	// EventBus is the event bus name or ARN (required).
	EventBus string
	// Region is the AWS region; empty: from the environment or shared
	// config (AWS_REGION, profile).
	Region string
	// Endpoint overrides the service endpoint (BaseEndpoint), e.g.
	// "http://localhost:4566" for LocalStack. Empty: the region's endpoint.
	Endpoint string
	// RoleARN, when set, is assumed through STS on top of the credentials
	// of the default chain.
	RoleARN string
	// Source is the entries' Source template (default
	// "changegate.{source}").
	Source string
	// DetailType is the entries' DetailType template (default
	// "{db}.{coll}.{operationType}").
	DetailType string
	// Resources are ARNs attached to every entry (optional).
	Resources []string
	// MaxRequestBytes caps the size of one PutEvents request (default 256
	// KiB, at most 1 MiB).
	MaxRequestBytes int
	// Oversize is the policy for an event whose entry alone exceeds
	// MaxRequestBytes (sinks.Oversize.Fit): failed with reason "oversize"
	// (the zero value), or sent stripped.
	Oversize sinks.Oversize
	// Canonical selects canonical instead of relaxed Extended JSON.
	Canonical bool
	// Timeout bounds one Send, all its PutEvents calls together (default
	// 10s).
	Timeout time.Duration
	// MaxConns is the number of idle connections kept (default 10; set it
	// to the sink's max_in_flight).
	MaxConns int
	// Credentials replaces the default credential chain (tests); RoleARN
	// still applies on top of it.
	Credentials aws.CredentialsProvider
}

// EventBridge is a sinks.Sink that puts events on one event bus. It is safe
// for concurrent use by several workers.
type EventBridge struct {
	core       awsutil.Core
	bus        string
	source     *Template
	detailType *Template
	resources  []string
	resBytes   int
	client     *eventbridge.Client
	log        *slog.Logger
}

var _ sinks.Sink = (*EventBridge)(nil)

// New returns an EventBridge sink for cfg. It validates the configuration
// and loads the AWS configuration (environment, shared files); it does not
// connect. logger may be nil.
func New(cfg Config, logger *slog.Logger) (*EventBridge, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	errs := confcheck.New("eventbridge", cfg.Name)
	prefix := errs.Prefix()
	if cfg.EventBus == "" {
		errs.Addf("event_bus is required")
	}
	if cfg.MaxRequestBytes < 0 || cfg.MaxRequestBytes > MaxRequestBytesLimit {
		errs.Addf("max_request_bytes must be between 1 and %d, got %d", MaxRequestBytesLimit, cfg.MaxRequestBytes)
	}
	if cfg.Timeout < 0 {
		errs.Addf("timeout must not be negative, got %s", cfg.Timeout)
	}
	srcText := cfg.Source
	if srcText == "" {
		srcText = DefaultSource
	}
	src, err := CompileTemplate(srcText)
	if err != nil {
		errs.Addf("source: %v", err)
	}
	dtText := cfg.DetailType
	if dtText == "" {
		dtText = DefaultDetailType
	}
	dt, err := CompileTemplate(dtText)
	if err != nil {
		errs.Addf("detail_type: %v", err)
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
	client := eventbridge.NewFromConfig(awsCfg, func(o *eventbridge.Options) {
		awsutil.ClientOptions(&o.Retryer, &o.BaseEndpoint, &o.APIOptions, cfg.Endpoint)
	})
	b := &EventBridge{
		bus: cfg.EventBus, source: src, detailType: dt,
		resources: cfg.Resources, client: client, log: logger,
	}
	for _, r := range cfg.Resources {
		b.resBytes += len(r)
	}
	maxBytes, timeout := cfg.MaxRequestBytes, cfg.Timeout
	if maxBytes == 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	b.core.Init("eventbridge", cfg.Name, maxBytes, cfg.Oversize, cfg.Canonical, timeout)
	return b, nil
}

// Name returns the sink name.
func (b *EventBridge) Name() string { return b.core.Name() }

// MaxBatch returns 10, the most entries of one PutEvents call.
func (b *EventBridge) MaxBatch() int { return MaxEntries }

// Close marks the sink closed; the SDK client holds no other resources that
// need releasing. No Send may follow Close.
func (b *EventBridge) Close() error { return b.core.Close() }

// EntrySize returns the size AWS counts for a PutEvents entry.
func EntrySize(e types.PutEventsRequestEntry) int {
	n := len(aws.ToString(e.Source)) + len(aws.ToString(e.DetailType)) + len(aws.ToString(e.Detail))
	if e.Time != nil {
		n += timeEntryBytes
	}
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}

// Send puts batch on the bus; see the package documentation for batching
// and the errors returned. When ctx ends, Send returns ctx's error, wrapped.
func (b *EventBridge) Send(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel, err := b.core.Begin(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	prefix := b.core.Prefix()
	return awsutil.SendEntries(ctx, prefix+": PutEvents", batch, MaxEntries, b.core.MaxBytes, b.core.Oversize, func(i int, e *event.Event) (types.PutEventsRequestEntry, sinks.Payload, error) {
		return b.entry(ctx, i, prefix, e)
	}, func(ctx context.Context, entries []types.PutEventsRequestEntry, idx []int, fail func(int, error)) error {
		return b.put(ctx, batch, entries, idx, fail)
	})
}

// entry builds the PutEvents entry of e and its payload, or returns the
// permanent error e fails with.
func (b *EventBridge) entry(ctx context.Context, i int, prefix string, e *event.Event) (types.PutEventsRequestEntry, sinks.Payload, error) {
	var none types.PutEventsRequestEntry
	// The detail is self-contained (event.Event.Record): with envelope
	// = "document" the metadata goes beside fullDocument.
	env, err := sinks.EncodeRecord(e, b.core.Canonical)
	if err != nil {
		return none, sinks.Payload{}, sinks.Permanent("encode", fmt.Errorf("%s: %w", prefix, err))
	}
	dt := b.detailType.Execute(e)
	if n := utf8.RuneCountInString(dt); n > MaxDetailTypeLen {
		return none, sinks.Payload{}, sinks.Permanent("detail_type", fmt.Errorf("%s: event %s: detail type %q is %d characters, the maximum is %d",
			prefix, e.ID, dt, n, MaxDetailTypeLen))
	}
	// A Source the API would refuse fails the whole PutEvents call with
	// a validation error; refuse it here so only this entry fails.
	src := b.source.Execute(e)
	if n := utf8.RuneCountInString(src); n == 0 || n > MaxSourceLen {
		return none, sinks.Payload{}, sinks.Permanent("source", fmt.Errorf("%s: event %s: source %q is %d characters, it must be 1 to %d (check the source template)",
			prefix, e.ID, src, n, MaxSourceLen))
	}
	ent := types.PutEventsRequestEntry{
		EventBusName: aws.String(b.bus),
		Source:       aws.String(src),
		DetailType:   aws.String(dt),
		// Detail is set by Fit: the envelope is cached and never modified
		// (event.Envelope's contract), a stripped one is not modified
		// either; their bytes are shared instead of copying up to 1 MiB.
		Resources: b.resources,
	}
	if !e.WallTime.IsZero() {
		ent.Time = aws.Time(e.WallTime)
	}
	if th := tracing.XRayHeader(ctx, i); th != "" {
		ent.TraceHeader = aws.String(th) // X-Ray's format (trace_context)
	}
	p, err := b.core.Oversize.Fit(e, b.core.Canonical, env, b.core.MaxBytes, func(d []byte) int {
		ent.Detail = aws.String(unsafe.String(unsafe.SliceData(d), len(d)))
		return EntrySize(ent)
	}, prefix, "entry")
	if err != nil {
		return none, p, err
	}
	ent.Detail = aws.String(unsafe.String(unsafe.SliceData(p.Body), len(p.Body)))
	return ent, p, nil
}

// put makes one PutEvents call with entries, those of the events at idx,
// and reports the failed ones through fail. It returns the classified error
// of a call that failed as a whole.
func (b *EventBridge) put(ctx context.Context, batch []*event.Event, entries []types.PutEventsRequestEntry, idx []int, fail func(int, error)) error {
	in := &eventbridge.PutEventsInput{Entries: entries}
	prefix := b.core.Prefix()
	out, err := b.client.PutEvents(ctx, in)
	if err != nil {
		return awsutil.ClassifyCall(ctx, prefix+": PutEvents", err)
	}
	if out.FailedEntryCount == 0 && len(out.Entries) == len(idx) {
		return nil
	}
	for j, i := range idx {
		if j >= len(out.Entries) {
			fail(i, sinks.Retryable("missing_result", 0, fmt.Errorf("%s: event %s: PutEvents returned no result for the entry", prefix, batch[i].ID)))
			continue
		}
		r := out.Entries[j]
		if r.ErrorCode == nil {
			continue
		}
		code := aws.ToString(r.ErrorCode)
		fail(i, EntryError(prefix, batch[i].ID, code, aws.ToString(r.ErrorMessage)))
	}
	return nil
}

// permanentEntryCodes are the PutEvents entry error codes that retrying
// cannot fix (documented in PutEventsResultEntry). Every other code,
// ThrottlingException and InternalFailure included, is retryable.
var permanentEntryCodes = map[string]bool{
	"AccessDeniedException":               true,
	"InvalidAccountIdException":           true,
	"InvalidArgument":                     true,
	"MalformedDetail":                     true,
	"RedactionFailure":                    true,
	"NotAuthorizedForSourceException":     true,
	"NotAuthorizedForDetailTypeException": true,
	"ValidationException":                 true,
	"ResourceNotFoundException":           true,
}

// EntryError classifies the failure of one PutEvents entry by its error
// code: permanent for the codes in the package documentation, otherwise
// retryable (reason "throttled" for throttling codes, else the code).
func EntryError(prefix, eventID, code, message string) *sinks.Error {
	err := fmt.Errorf("%s: event %s: %s: %s", prefix, eventID, code, message)
	var de *sinks.Error
	switch {
	case permanentEntryCodes[code]:
		de = sinks.Permanent(code, err)
	case awsutil.IsThrottle(code):
		de = sinks.Retryable("throttled", 0, err)
	default:
		de = sinks.Retryable(code, 0, err)
	}
	de.Code, de.Answer = code, sinks.Answer([]byte(message))
	return de
}
