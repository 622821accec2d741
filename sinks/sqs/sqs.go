// Package sqs is the sink that sends events to an Amazon SQS queue with
// SendMessageBatch (aws-sdk-go-v2).
//
// Each event becomes one message: the body is the event's cached JSON
// envelope; String message attributes "source", "operationType", "db" and
// "coll" carry the event's fields (an empty one, such as coll of a
// dropDatabase event, is omitted: SQS refuses empty attribute values).
//
// The queue is given by URL, or by name, resolved with GetQueueUrl at the
// first Send and cached (a failed resolution is retried at the next Send).
//
// # FIFO queues
//
// A queue whose URL or name ends in ".fifo" is FIFO. Its messages get:
//
//   - MessageDeduplicationId: the hex SHA-256 of the event id (64
//     characters). Event ids are stable across re-deliveries, so a message
//     re-sent after a crash or a lost answer, within SQS's 5-minute
//     deduplication interval, is dropped by SQS itself.
//   - MessageGroupId: by default the namespace and the document key,
//     "<db>.<coll>:<documentKey as relaxed Extended JSON>" (the namespace
//     alone for events without a document key). With Config.GroupBy, a
//     dotted path into the change event (e.g. "fullDocument.customerId"): a
//     string value as is, another value as Extended JSON; when the field is
//     missing (e.g. delete events have no fullDocument) the default is used.
//     A group id longer than 128 characters or with characters SQS does not
//     accept (anything but printable ASCII without space) is replaced by
//     "sha256:" and the hex SHA-256 of it.
//
// Order: SQS keeps the order in which messages of a group are sent; the
// engine sends the events of one document in change-stream order only with
// ordering = "key" (the default) or "strict", and a batch keeps their order.
// With ordering = "none" a FIFO queue's order is arbitrary. A partial
// failure cannot reorder a document: the engine puts at most one event per
// document in a batch, and Send makes no further call of a batch after a
// call failed as a whole. With GroupBy grouping several documents, events of
// different documents may be sent out of stream order (they travel in
// parallel lanes, and a failed entry is retried after later entries of its
// group were accepted); ordering = "strict" with batch_size = 1 keeps
// their stream order.
//
// # Batching and the request size
//
// MaxBatch is 10, the SendMessageBatch maximum. Send sends the batch in as
// few calls as Config.MaxRequestBytes (default and at most 1 MiB, the API
// limit documented by the SDK) allows, one after the other, in order. A message's
// size is its body plus, per attribute, the bytes of its name, its type
// ("String") and its value, as SQS counts it. A message that alone exceeds
// the limit fails permanently with reason "oversize" or, with
// Config.Oversize.Strip, goes stripped (sinks.Oversize.Fit). When a call fails as
// a whole, the calls after it are not made (FIFO order).
//
// # Failures
//
// Send returns nil when every message was accepted, a *sinks.BatchError when
// only some failed, and otherwise a *sinks.Error for the whole batch. A
// failed entry with SenderFault is permanent, otherwise retryable; the
// reason is its Code. Whole-call errors are classified as in the
// EventBridge sink: throttling ("throttled", e.g. RequestThrottled),
// 408/429/5xx and internal errors are retryable, other 4xx
// (QueueDoesNotExist, AccessDenied, InvalidParameterValue,
// BatchRequestTooLong...) are permanent, credentials that cannot be
// retrieved, timeouts and connection failures are retryable. The SDK client
// retries only failed connections; backoff is the engine's.
package sqs

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/awsutil"
	"github.com/changegate/changegate/sinks/internal/confcheck"
)

// Limits and defaults.
const (
	// MaxEntries is the most messages one SendMessageBatch call accepts.
	MaxEntries = 10
	// DefaultMaxRequestBytes is the default limit on the payload of one
	// SendMessageBatch call, and so on one message: 1 MiB, the current
	// quota. AWS raised SQS's maximum message size from 256 KiB to 1 MiB
	// (1,048,576 bytes) in 2025; it is the default MaximumMessageSize of a
	// queue, and SendMessageBatch allows 1 MiB per message and per batch
	// (aws-sdk-go-v2/service/sqs v1.52.10, api_op_SendMessageBatch.go and
	// api_op_CreateQueue.go; "More room to build: serverless services now
	// support payloads up to 1 MB", AWS Compute Blog,
	// https://aws.amazon.com/blogs/compute/more-room-to-build-serverless-services-now-support-payloads-up-to-1-mb).
	// A queue created with a lower MaximumMessageSize (or LocalStack)
	// refuses larger messages: set Config.MaxRequestBytes to it.
	DefaultMaxRequestBytes = 1 << 20
	// MaxRequestBytesLimit is the SendMessageBatch payload limit of the API
	// (1 MiB, see above).
	MaxRequestBytesLimit = 1 << 20
	// DefaultTimeout bounds one Send when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// MaxIDLen is SQS's limit on MessageGroupId and MessageDeduplicationId.
	MaxIDLen = awsutil.MaxGroupIDLen
)

// Message attribute names (shared with the SNS sink).
const (
	AttrSource        = awsutil.AttrSource
	AttrOperationType = awsutil.AttrOperationType
	AttrDB            = awsutil.AttrDB
	AttrColl          = awsutil.AttrColl
	AttrID            = awsutil.AttrID
	AttrDocumentKey   = awsutil.AttrDocumentKey
	AttrClusterTime   = awsutil.AttrClusterTime
	AttrTxn           = awsutil.AttrTxn
)

// Config configures an SQS sink.
type Config struct {
	// Name is the sink name, used in errors and logs.
	Name string
	// QueueURL is the queue URL; exclusive with QueueName, one is required.
	QueueURL string
	// QueueName is the queue name, resolved with GetQueueUrl at first use.
	QueueName string
	// Region is the AWS region; empty: from the environment or shared
	// config.
	Region string
	// Endpoint overrides the service endpoint (BaseEndpoint), e.g.
	// "http://localhost:4566" for LocalStack.
	Endpoint string
	// RoleARN, when set, is assumed through STS on top of the credentials
	// of the default chain.
	RoleARN string
	// GroupBy is the dotted path of the field whose value is the FIFO
	// MessageGroupId (default: namespace and document key).
	GroupBy string
	// MaxRequestBytes caps the payload of one SendMessageBatch call
	// (default and at most 1 MiB).
	MaxRequestBytes int
	// Oversize is the policy for an event whose message alone exceeds
	// MaxRequestBytes (sinks.Oversize.Fit): failed with reason "oversize"
	// (the zero value), or sent stripped.
	Oversize sinks.Oversize
	// Canonical selects canonical instead of relaxed Extended JSON.
	Canonical bool
	// Timeout bounds one Send, queue resolution and calls together
	// (default 10s).
	Timeout time.Duration
	// MaxConns is the number of idle connections kept (default 10).
	MaxConns int
	// Credentials replaces the default credential chain (tests); RoleARN
	// still applies on top of it.
	Credentials aws.CredentialsProvider
}

// SQS is a sinks.Sink that sends events to one queue. It is safe for
// concurrent use by several workers.
type SQS struct {
	core      awsutil.Core
	queueName string
	fifo      bool
	groupBy   []string
	client    *sqs.Client
	log       *slog.Logger

	urlMu    sync.Mutex
	queueURL atomic.Pointer[string]
}

var _ sinks.Sink = (*SQS)(nil)

// New returns an SQS sink for cfg. It validates the configuration and loads
// the AWS configuration (environment, shared files); it does not connect.
// logger may be nil.
func New(cfg Config, logger *slog.Logger) (*SQS, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := awsutil.Common{
		Options: awsutil.Options{
			Name: cfg.Name, Region: cfg.Region, RoleARN: cfg.RoleARN, Credentials: cfg.Credentials, MaxConns: cfg.MaxConns,
		},
		MaxRequestBytes: cfg.MaxRequestBytes, DefaultMaxRequestBytes: DefaultMaxRequestBytes, MaxRequestBytesLimit: MaxRequestBytesLimit,
		Timeout: cfg.Timeout, DefaultTimeout: DefaultTimeout,
	}
	var groupBy []string
	awsCfg, err := c.Load("sqs", func(errs *confcheck.Errors) {
		switch {
		case cfg.QueueURL == "" && cfg.QueueName == "":
			errs.Addf("queue_url or queue_name is required")
		case cfg.QueueURL != "" && cfg.QueueName != "":
			errs.Addf("queue_url and queue_name are exclusive")
		}
		var ok bool
		if groupBy, ok = awsutil.FieldPath(cfg.GroupBy); !ok {
			errs.Addf("message_group_id: %q is not a dotted field path", cfg.GroupBy)
		}
	})
	if err != nil {
		return nil, err
	}
	s := &SQS{
		queueName: cfg.QueueName, groupBy: groupBy,
		client: sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
			awsutil.ClientOptions(&o.Retryer, &o.BaseEndpoint, &o.APIOptions, cfg.Endpoint)
		}),
		log:  logger,
		fifo: strings.HasSuffix(cfg.QueueURL, ".fifo") || strings.HasSuffix(cfg.QueueName, ".fifo"),
	}
	s.core.Init("sqs", cfg.Name, c.MaxRequestBytes, cfg.Oversize, cfg.Canonical, c.Timeout)
	if cfg.QueueURL != "" {
		u := cfg.QueueURL
		s.queueURL.Store(&u)
	}
	return s, nil
}

// Name returns the sink name.
func (s *SQS) Name() string { return s.core.Name() }

// MaxBatch returns 10, the most messages of one SendMessageBatch call.
func (s *SQS) MaxBatch() int { return MaxEntries }

// FIFO reports whether the queue is a FIFO queue.
func (s *SQS) FIFO() bool { return s.fifo }

// Close marks the sink closed. No Send may follow Close.
func (s *SQS) Close() error { return s.core.Close() }

// url returns the queue URL, resolving the queue name once.
func (s *SQS) url(ctx context.Context) (string, error) {
	if u := s.queueURL.Load(); u != nil {
		return *u, nil
	}
	s.urlMu.Lock()
	defer s.urlMu.Unlock()
	if u := s.queueURL.Load(); u != nil {
		return *u, nil
	}
	out, err := s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(s.queueName)})
	if err != nil {
		return "", awsutil.ClassifyCall(ctx, fmt.Sprintf("%s: GetQueueUrl %s", s.core.Prefix(), s.queueName), err)
	}
	u := aws.ToString(out.QueueUrl)
	if u == "" {
		return "", sinks.Retryable("GetQueueUrl", 0, fmt.Errorf("%s: GetQueueUrl %s: empty queue URL", s.core.Prefix(), s.queueName))
	}
	s.queueURL.Store(&u)
	s.log.Debug("queue URL resolved", "queue", s.queueName, "url", u)
	return u, nil
}

// DeduplicationID returns the MessageDeduplicationId of an event: the hex
// SHA-256 of its id (awsutil.DeduplicationID).
func DeduplicationID(e *event.Event) string { return awsutil.DeduplicationID(e) }

// GroupID returns the MessageGroupId of e: the field at path (nil: the
// default) or the namespace and document key; see the package
// documentation (awsutil.GroupID).
func GroupID(e *event.Event, path []string) string { return awsutil.GroupID(e, path) }

// entry builds the message of e and returns it with its size.
func (s *SQS) entry(ctx context.Context, id int, e *event.Event, env []byte) (types.SendMessageBatchRequestEntry, int) {
	attrs, attrSize := awsutil.MessageAttributes(ctx, id, e, func(dataType, v *string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: dataType, StringValue: v}
	})
	size := len(env) + attrSize
	m := types.SendMessageBatchRequestEntry{
		Id:                aws.String(strconv.Itoa(id)),
		MessageBody:       awsutil.SharedBody(env),
		MessageAttributes: attrs,
	}
	if s.fifo {
		m.MessageGroupId = aws.String(GroupID(e, s.groupBy))
		m.MessageDeduplicationId = aws.String(DeduplicationID(e))
	}
	return m, size
}

// Send sends batch to the queue; see the package documentation for
// batching and the errors returned. When ctx ends, Send returns ctx's
// error, wrapped.
func (s *SQS) Send(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel, err := s.core.Begin(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	url, err := s.url(ctx)
	if err != nil {
		return err
	}
	prefix := s.core.Prefix()

	return awsutil.SendEntries(ctx, prefix+": SendMessageBatch", batch, MaxEntries, s.core.MaxBytes, s.core.Oversize,
		func(i int, e *event.Event) (types.SendMessageBatchRequestEntry, sinks.Payload, error) {
			return awsutil.EnvelopeEntry(s.core.Oversize, e, s.core.Canonical, s.core.MaxBytes, prefix, "message", func(body []byte) (types.SendMessageBatchRequestEntry, int) {
				return s.entry(ctx, i, e, body)
			})
		},
		func(ctx context.Context, entries []types.SendMessageBatchRequestEntry, idx []int, fail func(int, error)) error {
			return s.sendBatch(ctx, url, batch, entries, idx, fail)
		})
}

// sendBatch makes one SendMessageBatch call with entries, those of the
// events at idx, and reports the failed ones through fail. It returns the
// classified error of a call that failed as a whole.
func (s *SQS) sendBatch(ctx context.Context, url string, batch []*event.Event, entries []types.SendMessageBatchRequestEntry, idx []int, fail func(int, error)) error {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}
	prefix := s.core.Prefix()
	out, err := s.client.SendMessageBatch(ctx, in)
	if err != nil {
		return awsutil.ClassifyCall(ctx, prefix+": SendMessageBatch", err)
	}
	if len(out.Failed) == 0 && len(out.Successful) == len(idx) {
		return nil
	}
	// Entry ids are the events' indexes in batch.
	awsutil.ReportBatch(prefix, "SendMessageBatch", batch, idx, out.Successful, out.Failed,
		func(r types.SendMessageBatchResultEntry) string { return aws.ToString(r.Id) },
		func(f types.BatchResultErrorEntry) awsutil.EntryFailure {
			return awsutil.EntryFailure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
		}, fail)
	return nil
}
