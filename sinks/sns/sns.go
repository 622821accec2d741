// Package sns is the sink that publishes events to an Amazon SNS topic with
// PublishBatch (aws-sdk-go-v2).
//
// Each event becomes one message, as in the SQS sink: the body is the
// event's cached JSON envelope; String message attributes "source",
// "operationType", "db" and "coll" (with envelope = "document" also "id",
// "documentKey" and "clusterTime") carry its fields, empty ones omitted
// (awsutil.Attributes).
//
// # FIFO topics
//
// A topic whose ARN ends in ".fifo" is FIFO. Its messages get, as SQS FIFO
// messages do: MessageDeduplicationId = the hex SHA-256 of the event id, so
// a re-delivery within the 5-minute deduplication interval is dropped by
// SNS, and MessageGroupId = the namespace and document key, or the value at
// Config.GroupBy, hashed when longer than 128 characters or not printable
// ASCII (awsutil.GroupID). Order holds per group as for SQS: the engine puts
// at most one event of a document in a batch and sends the document's next
// event only once the earlier one was accepted (ordering = "key", the
// default, or "strict").
//
// # Quotas
//
// From the SDK's documentation of PublishBatch (aws-sdk-go-v2/service/sns
// v1.48.0, api_op_PublishBatch.go): up to 10 messages per call; "by
// default, the maximum allowed individual message size and the maximum
// total payload size (the sum of the individual lengths of all of the
// batched messages) are both 256 KiB (262,144 bytes)"; a topic's
// MaximumMessageSize attribute raises both up to 1 MiB, and "the combined
// size of all messages in the batch, including each message's body and
// attributes, must not exceed the topic's MaximumMessageSize". So MaxBatch
// is 10 and Config.MaxRequestBytes (default 256 KiB, at most 1 MiB) caps one
// call, counting bodies and attribute names, types and values as SQS does.
// A message that alone exceeds it fails permanently with reason "oversize"
// or, with Config.Oversize.Strip, goes stripped. Send sends a batch in as
// few calls as the limit allows, in order, and makes no call after one that
// failed as a whole.
//
// # Failures
//
// Send returns nil when every message was accepted, a *sinks.BatchError
// when only some failed, and otherwise a *sinks.Error for the whole batch. A
// failed entry with SenderFault is permanent, otherwise retryable; the
// reason is its Code. Whole-call errors as in the other AWS sinks
// (awsutil.ClassifyCall): Throttled (429), KMSThrottling, 5xx (InternalError)
// and transport failures retry; NotFound, AuthorizationError,
// InvalidParameter, BatchRequestTooLong and other 4xx are permanent. The SDK
// client retries only failed connections; backoff is the engine's.
package sns

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/awsutil"
	"github.com/changegate/changegate/sinks/internal/confcheck"
)

// Limits and defaults (see the package documentation for the sources).
const (
	// MaxEntries is the most messages one PublishBatch call accepts.
	MaxEntries = 10
	// DefaultMaxRequestBytes is the default limit on one PublishBatch
	// payload, and so on one message: 256 KiB, a topic's default
	// MaximumMessageSize.
	DefaultMaxRequestBytes = 256 << 10
	// MaxRequestBytesLimit is the largest MaximumMessageSize of a topic: 1
	// MiB.
	MaxRequestBytesLimit = 1 << 20
	// DefaultTimeout bounds one Send when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
)

// Config configures an SNS sink.
type Config struct {
	// Name is the sink name, used in errors and logs.
	Name string
	// TopicARN is the topic's ARN; required. An ARN ending in ".fifo" is a
	// FIFO topic.
	TopicARN string
	// GroupBy is the dotted path of the field whose value is the FIFO
	// MessageGroupId (default: namespace and document key).
	GroupBy string
	// Region is the AWS region; empty: from the environment or shared
	// config.
	Region string
	// Endpoint overrides the service endpoint (BaseEndpoint).
	Endpoint string
	// RoleARN, when set, is assumed through STS on top of the credentials
	// of the default chain.
	RoleARN string
	// MaxRequestBytes caps the payload of one PublishBatch call (default
	// 256 KiB, at most 1 MiB).
	MaxRequestBytes int
	// Oversize is the policy for an event whose message alone exceeds
	// MaxRequestBytes (sinks.Oversize.Fit).
	Oversize sinks.Oversize
	// Canonical selects canonical instead of relaxed Extended JSON.
	Canonical bool
	// Timeout bounds one Send (default 10s).
	Timeout time.Duration
	// MaxConns is the number of idle connections kept (default 10).
	MaxConns int
	// Credentials replaces the default credential chain (tests); RoleARN
	// still applies on top of it.
	Credentials aws.CredentialsProvider
}

// SNS is a sinks.Sink that publishes events to one topic. It is safe for
// concurrent use by several workers.
type SNS struct {
	core     awsutil.Core
	topicARN string
	fifo     bool
	groupBy  []string
	client   *sns.Client
}

var _ sinks.Sink = (*SNS)(nil)

// New returns an SNS sink for cfg. It validates the configuration and
// loads the AWS configuration (environment, shared files); it does not
// connect. logger may be nil; the sink logs nothing of its own today.
func New(cfg Config, logger *slog.Logger) (*SNS, error) {
	_ = logger
	c := awsutil.Common{
		Options: awsutil.Options{
			Name: cfg.Name, Region: cfg.Region, RoleARN: cfg.RoleARN, Credentials: cfg.Credentials, MaxConns: cfg.MaxConns,
		},
		MaxRequestBytes: cfg.MaxRequestBytes, DefaultMaxRequestBytes: DefaultMaxRequestBytes, MaxRequestBytesLimit: MaxRequestBytesLimit,
		Timeout: cfg.Timeout, DefaultTimeout: DefaultTimeout,
	}
	var groupBy []string
	awsCfg, err := c.Load("sns", func(errs *confcheck.Errors) {
		if cfg.TopicARN == "" {
			errs.Addf("topic_arn is required")
		}
		var ok bool
		if groupBy, ok = awsutil.FieldPath(cfg.GroupBy); !ok {
			errs.Addf("message_group_id: %q is not a dotted field path", cfg.GroupBy)
		}
	})
	if err != nil {
		return nil, err
	}
	s := &SNS{
		topicARN: cfg.TopicARN, fifo: strings.HasSuffix(cfg.TopicARN, ".fifo"), groupBy: groupBy,
		client: sns.NewFromConfig(awsCfg, func(o *sns.Options) {
			awsutil.ClientOptions(&o.Retryer, &o.BaseEndpoint, &o.APIOptions, cfg.Endpoint)
		}),
	}
	s.core.Init("sns", cfg.Name, c.MaxRequestBytes, cfg.Oversize, cfg.Canonical, c.Timeout)
	return s, nil
}

// Name returns the sink name.
func (s *SNS) Name() string { return s.core.Name() }

// MaxBatch returns 10, the most messages of one PublishBatch call.
func (s *SNS) MaxBatch() int { return MaxEntries }

// FIFO reports whether the topic is a FIFO topic.
func (s *SNS) FIFO() bool { return s.fifo }

// Close marks the sink closed. No Send may follow Close.
func (s *SNS) Close() error { return s.core.Close() }

// entry builds the message of e with body env and returns it with its
// size.
func (s *SNS) entry(ctx context.Context, id int, e *event.Event, env []byte) (types.PublishBatchRequestEntry, int) {
	attrs, attrSize := awsutil.MessageAttributes(ctx, id, e, func(dataType, v *string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: dataType, StringValue: v}
	})
	m := types.PublishBatchRequestEntry{
		Id:                aws.String(strconv.Itoa(id)),
		Message:           awsutil.SharedBody(env),
		MessageAttributes: attrs,
	}
	if s.fifo {
		m.MessageGroupId = aws.String(awsutil.GroupID(e, s.groupBy))
		m.MessageDeduplicationId = aws.String(awsutil.DeduplicationID(e))
	}
	return m, len(env) + attrSize
}

// Send publishes batch to the topic; see the package documentation for
// batching and the errors returned. When ctx ends, Send returns ctx's
// error, wrapped.
func (s *SNS) Send(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel, err := s.core.Begin(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	prefix := s.core.Prefix()
	return awsutil.SendEntries(ctx, prefix+": PublishBatch", batch, MaxEntries, s.core.MaxBytes, s.core.Oversize,
		func(i int, e *event.Event) (types.PublishBatchRequestEntry, sinks.Payload, error) {
			return awsutil.EnvelopeEntry(s.core.Oversize, e, s.core.Canonical, s.core.MaxBytes, prefix, "message", func(body []byte) (types.PublishBatchRequestEntry, int) {
				return s.entry(ctx, i, e, body)
			})
		},
		func(ctx context.Context, entries []types.PublishBatchRequestEntry, idx []int, fail func(int, error)) error {
			return s.publishBatch(ctx, batch, entries, idx, fail)
		})
}

// publishBatch makes one PublishBatch call with entries, those of the
// events at idx, and reports the failed ones through fail. It returns the
// classified error of a call that failed as a whole.
func (s *SNS) publishBatch(ctx context.Context, batch []*event.Event, entries []types.PublishBatchRequestEntry, idx []int, fail func(int, error)) error {
	in := &sns.PublishBatchInput{TopicArn: aws.String(s.topicARN), PublishBatchRequestEntries: entries}
	prefix := s.core.Prefix()
	out, err := s.client.PublishBatch(ctx, in)
	if err != nil {
		return awsutil.ClassifyCall(ctx, prefix+": PublishBatch", err)
	}
	// Entry ids are the events' indexes in batch.
	awsutil.ReportBatch(prefix, "PublishBatch", batch, idx, out.Successful, out.Failed,
		func(r types.PublishBatchResultEntry) string { return aws.ToString(r.Id) },
		func(f types.BatchResultErrorEntry) awsutil.EntryFailure {
			return awsutil.EntryFailure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
		}, fail)
	return nil
}
