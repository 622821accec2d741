// Package kinesis is the sink that puts events on an Amazon Kinesis data
// stream with PutRecords (aws-sdk-go-v2).
//
// Each event becomes one record: Data is the event's self-contained JSON
// record (sinks.EncodeRecord: the envelope, with the metadata of envelope =
// "document" beside fullDocument, since a record has no attributes);
// PartitionKey is, by default, the namespace and the document key,
// "<db>.<coll>:<documentKey as relaxed Extended JSON>", or with
// Config.PartitionKey the value of that dotted path in the change event (a
// string as is, another value as Extended JSON; a missing field falls back
// to the default). A key longer than Kinesis's 256 characters is replaced
// by "sha256:" and its hex SHA-256 (awsutil.PartitionKey).
//
// The stream is given by name or by ARN (StreamName or StreamARN).
//
// # Quotas
//
// From the SDK's documentation of PutRecords (aws-sdk-go-v2/service/kinesis
// v1.56.13, api_op_PutRecords.go, and types.PutRecordsRequestEntry): "Each
// PutRecords request can support up to 500 records. Each record in the
// request can be as large as 10 MiB, up to a limit of 10 MiB for the entire
// request, including partition keys"; "the record size limit applies to
// the total size of the partition key and data blob". The record limit is
// the stream's MaxRecordSizeInKiB, 1 MiB unless raised with
// UpdateMaxRecordSize (1024 to 10240 KiB, api_op_UpdateMaxRecordSize.go).
// So MaxBatch is 500, and Config.MaxRequestBytes (default 1 MiB, at most 10
// MiB) caps both one request and so one record, counting Data plus the
// partition key's UTF-8 bytes; set it to the stream's maximum record size
// to send larger records. A record that alone exceeds it fails permanently
// with reason "oversize" or, with Config.Oversize.Strip, goes stripped.
// Send sends the batch in as few calls as the limit allows, in order.
//
// # Order
//
// Kinesis orders the records of a partition key (which maps to one shard)
// by arrival: PutRecords does not guarantee the order of the records of one
// request, and a failed record is rejected while later ones of the same
// request are written. SequenceNumberForOrdering exists only on PutRecord
// (one record per call): it makes a record's sequence number greater than a
// given earlier one, which only matters when a producer has several records
// of one key in flight. changegate never does: with ordering = "key" (the
// default) or "strict" the engine puts at most one event of a document in a
// batch and sends the document's next event only once the earlier one was
// written (a failed record is retried alone, before anything later of its
// document is sent). Per-document order thus holds in the shard without
// PutRecord. A record whose request timed out may have been written: its
// retry duplicates it (at-least-once), right after the original. With
// Config.PartitionKey grouping several documents under one key, different
// documents may interleave out of stream order (they travel in parallel
// lanes); ordering = "strict" with batch_size = 1 keeps their stream order.
//
// # Failures
//
// Send returns nil when every record was written, a *sinks.BatchError when
// only some failed, and otherwise a *sinks.Error for the whole batch. A
// failed record's ErrorCode is ProvisionedThroughputExceededException
// (retryable, reason "throttled": the engine backs off and its adaptive
// limit shrinks) or InternalFailure (retryable), the only two the API
// documents; other codes are retryable too, except those that name a
// condition a retry cannot change (KMS key disabled, missing or not
// accessible, access denied, an unknown stream), which are permanent.
// Whole-call errors are classified as in the other AWS sinks
// (awsutil.ClassifyCall): ProvisionedThroughputExceededException,
// KMSThrottlingException, LimitExceededException, 408/429/5xx, timeouts and
// connection failures retry; ResourceNotFoundException, AccessDenied,
// ValidationException, InvalidArgumentException and the KMS errors are
// permanent. The SDK client retries only failed connections; backoff is
// the engine's.
package kinesis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/awsutil"
	"github.com/changegate/changegate/sinks/internal/confcheck"
)

// Limits and defaults (see the package documentation for the sources).
const (
	// MaxRecords is the most records one PutRecords call accepts.
	MaxRecords = 500
	// DefaultMaxRequestBytes is the default limit on one PutRecords call
	// (data and partition keys), and so on one record: 1 MiB, a stream's
	// default maximum record size.
	DefaultMaxRequestBytes = 1 << 20
	// MaxRequestBytesLimit is PutRecords' limit on one request and on one
	// record of a stream whose MaxRecordSizeInKiB was raised to its
	// maximum: 10 MiB.
	MaxRequestBytesLimit = 10 << 20
	// DefaultTimeout bounds one Send when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
)

// Config configures a Kinesis sink.
type Config struct {
	// Name is the sink name, used in errors and logs.
	Name string
	// Stream is the stream name or ARN ("arn:aws:kinesis:...:stream/name");
	// required.
	Stream string
	// PartitionKey is the dotted path of the field whose value is the
	// record's partition key (default: namespace and document key).
	PartitionKey string
	// Region is the AWS region; empty: from the environment or shared
	// config.
	Region string
	// Endpoint overrides the service endpoint (BaseEndpoint).
	Endpoint string
	// RoleARN, when set, is assumed through STS on top of the credentials
	// of the default chain.
	RoleARN string
	// MaxRequestBytes caps one PutRecords call and so one record (default
	// 1 MiB, at most 10 MiB).
	MaxRequestBytes int
	// Oversize is the policy for an event whose record alone exceeds
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

// Kinesis is a sinks.Sink that puts events on one data stream. It is safe
// for concurrent use by several workers.
type Kinesis struct {
	core      awsutil.Core
	streamARN *string
	stream    *string
	keyPath   []string
	client    *kinesis.Client
}

var _ sinks.Sink = (*Kinesis)(nil)

// New returns a Kinesis sink for cfg. It validates the configuration and
// loads the AWS configuration (environment, shared files); it does not
// connect. logger may be nil; the sink logs nothing of its own today.
func New(cfg Config, logger *slog.Logger) (*Kinesis, error) {
	_ = logger
	c := awsutil.Common{
		Options: awsutil.Options{
			Name: cfg.Name, Region: cfg.Region, RoleARN: cfg.RoleARN, Credentials: cfg.Credentials, MaxConns: cfg.MaxConns,
		},
		MaxRequestBytes: cfg.MaxRequestBytes, DefaultMaxRequestBytes: DefaultMaxRequestBytes, MaxRequestBytesLimit: MaxRequestBytesLimit,
		Timeout: cfg.Timeout, DefaultTimeout: DefaultTimeout,
	}
	var keyPath []string
	awsCfg, err := c.Load("kinesis", func(errs *confcheck.Errors) {
		if cfg.Stream == "" {
			errs.Addf("stream is required")
		}
		var ok bool
		if keyPath, ok = awsutil.FieldPath(cfg.PartitionKey); !ok {
			errs.Addf("partition_key: %q is not a dotted field path", cfg.PartitionKey)
		}
	})
	if err != nil {
		return nil, err
	}
	k := &Kinesis{
		keyPath: keyPath,
		client: kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) {
			awsutil.ClientOptions(&o.Retryer, &o.BaseEndpoint, &o.APIOptions, cfg.Endpoint)
		}),
	}
	k.core.Init("kinesis", cfg.Name, c.MaxRequestBytes, cfg.Oversize, cfg.Canonical, c.Timeout)
	if strings.HasPrefix(cfg.Stream, "arn:") {
		k.streamARN = aws.String(cfg.Stream)
	} else {
		k.stream = aws.String(cfg.Stream)
	}
	return k, nil
}

// Name returns the sink name.
func (k *Kinesis) Name() string { return k.core.Name() }

// MaxBatch returns 500, the most records of one PutRecords call.
func (k *Kinesis) MaxBatch() int { return MaxRecords }

// Close marks the sink closed. No Send may follow Close.
func (k *Kinesis) Close() error { return k.core.Close() }

// PartitionKey returns the partition key of e for the configured path.
func (k *Kinesis) PartitionKey(e *event.Event) string { return awsutil.PartitionKey(e, k.keyPath) }

// Send puts batch on the stream; see the package documentation for
// batching, order and the errors returned. When ctx ends, Send returns
// ctx's error, wrapped.
func (k *Kinesis) Send(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel, err := k.core.Begin(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	prefix := k.core.Prefix()
	return awsutil.SendEntries(ctx, prefix+": PutRecords", batch, MaxRecords, k.core.MaxBytes, k.core.Oversize,
		func(_ int, e *event.Event) (types.PutRecordsRequestEntry, sinks.Payload, error) {
			data, err := sinks.EncodeRecord(e, k.core.Canonical)
			if err != nil {
				return types.PutRecordsRequestEntry{}, sinks.Payload{}, sinks.Permanent("encode", fmt.Errorf("%s: %w", prefix, err))
			}
			key := k.PartitionKey(e)
			p, err := k.core.Oversize.Fit(e, k.core.Canonical, data, k.core.MaxBytes, func(b []byte) int { return len(b) + len(key) }, prefix, "record")
			if err != nil {
				return types.PutRecordsRequestEntry{}, p, err
			}
			// Data is the cached record (or a fresh stripped one), which
			// the SDK only reads.
			return types.PutRecordsRequestEntry{Data: p.Body, PartitionKey: aws.String(key)}, p, nil
		},
		func(ctx context.Context, records []types.PutRecordsRequestEntry, idx []int, fail func(int, error)) error {
			return k.putRecords(ctx, batch, records, idx, fail)
		})
}

// putRecords makes one PutRecords call with records, those of the events
// at idx, and reports the failed ones through fail. It returns the
// classified error of a call that failed as a whole.
func (k *Kinesis) putRecords(ctx context.Context, batch []*event.Event, records []types.PutRecordsRequestEntry, idx []int, fail func(int, error)) error {
	in := &kinesis.PutRecordsInput{StreamName: k.stream, StreamARN: k.streamARN, Records: records}
	prefix := k.core.Prefix()
	out, err := k.client.PutRecords(ctx, in)
	if err != nil {
		return awsutil.ClassifyCall(ctx, prefix+": PutRecords", err)
	}
	// The result records correlate with the request's by position.
	for j, i := range idx {
		if j >= len(out.Records) {
			fail(i, sinks.Retryable("missing_result", 0, fmt.Errorf("%s: event %s: PutRecords returned no result for the record", prefix, batch[i].ID)))
			continue
		}
		r := out.Records[j]
		if code := aws.ToString(r.ErrorCode); code != "" {
			fail(i, awsutil.EntryError(prefix, batch[i].ID, code, aws.ToString(r.ErrorMessage), permanentCodes[code]))
		} else if aws.ToString(r.SequenceNumber) == "" {
			fail(i, sinks.Retryable("missing_result", 0, fmt.Errorf("%s: event %s: PutRecords returned neither a sequence number nor an error for the record", prefix, batch[i].ID)))
		}
	}
	return nil
}

// permanentCodes are the record error codes that a retry cannot change.
// The API documents only ProvisionedThroughputExceededException and
// InternalFailure for a record; these are the whole-call codes of
// PutRecords (types/errors.go) that would mean the same for one record.
var permanentCodes = map[string]bool{
	"AccessDeniedException":     true,
	"KMSAccessDeniedException":  true,
	"KMSDisabledException":      true,
	"KMSInvalidStateException":  true,
	"KMSNotFoundException":      true,
	"KMSOptInRequired":          true,
	"ResourceNotFoundException": true,
	"InvalidArgumentException":  true,
	"ValidationException":       true,
}
