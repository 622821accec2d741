package config

import (
	"regexp"
	"strings"
)

// The Kinesis and SNS sinks: constants, option structs and decoders.

// Sink types of this file.
const (
	// SinkKinesis puts events on an Amazon Kinesis data stream; see
	// [KinesisSink].
	SinkKinesis = "kinesis"
	// SinkSNS publishes events to an Amazon SNS topic; see [SNSSink].
	SinkSNS = "sns"
)

// Defaults and limits of the Kinesis and SNS sinks, from the SDK's
// documentation (aws-sdk-go-v2/service/kinesis v1.56.13 PutRecords and
// UpdateMaxRecordSize; service/sns v1.48.0 PublishBatch): see the
// sinks/kinesis and sinks/sns package documentation.
const (
	// DefaultKinesisMaxRequestBytes is the default limit on one PutRecords
	// request and so on one record: 1 MiB, a stream's default maximum
	// record size.
	DefaultKinesisMaxRequestBytes = 1 << 20
	// MaxKinesisMaxRequestBytes is PutRecords' request limit (10 MiB), also
	// the largest maximum record size of a stream.
	MaxKinesisMaxRequestBytes = 10 << 20
	// MaxKinesisBatchSize is the most records of one PutRecords call.
	MaxKinesisBatchSize = 500
	// DefaultSNSMaxRequestBytes is the default limit on one PublishBatch
	// payload: 256 KiB, a topic's default MaximumMessageSize.
	DefaultSNSMaxRequestBytes = 256 << 10
	// MaxSNSMaxRequestBytes is the largest MaximumMessageSize of a topic (1
	// MiB).
	MaxSNSMaxRequestBytes = 1 << 20
)

var (
	streamNameRE = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,128}$`)
	streamARNRE  = regexp.MustCompile(`^arn:aws[a-z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$`)
	topicARNRE   = regexp.MustCompile(`^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$`)
)

// KinesisSink holds the options of a kinesis sink. AWS.MaxRequestBytes
// caps one PutRecords request and so one record (data plus partition key).
type KinesisSink struct {
	AWS
	// Stream is the stream name or ARN.
	Stream string
	// PartitionKey is the dotted path of the event field whose value is
	// the records' partition key (empty: namespace and document key).
	PartitionKey string
}

// SNSSink holds the options of an sns sink.
type SNSSink struct {
	AWS
	// TopicARN is the topic's ARN; a name ending in ".fifo" is a FIFO
	// topic.
	TopicARN string
	// MessageGroupID is the dotted path of the event field whose value is
	// the FIFO MessageGroupId (empty: namespace and document key). Only for
	// FIFO topics.
	MessageGroupID string
}

// FIFO reports whether the topic is a FIFO topic (its name ends in
// ".fifo").
func (s *SNSSink) FIFO() bool { return strings.HasSuffix(s.TopicARN, ".fifo") }

func decodeKinesis(d *decoder, o *obj, s *Sink) {
	k := &KinesisSink{}
	s.Kinesis = k
	if v, ok := o.reqString("stream"); ok {
		if strings.HasPrefix(v, "arn:") && !streamARNRE.MatchString(v) {
			d.errorf(o.keyPath("stream"), o.lineOf("stream"), `an ARN must be a stream ARN like "arn:aws:kinesis:us-east-1:123456789012:stream/changes", got %q`, v)
		} else if !strings.HasPrefix(v, "arn:") && !streamNameRE.MatchString(v) {
			d.errorf(o.keyPath("stream"), o.lineOf("stream"), `invalid stream name %q: use 1 to 128 letters, digits, "_", "." and "-", or an ARN`, v)
		}
		k.Stream = v
	}
	k.AWS = d.aws(o, DefaultKinesisMaxRequestBytes, MaxKinesisMaxRequestBytes)
	if p, v, ok := o.str("partition_key"); ok {
		if !fieldPathRE.MatchString(p) {
			d.errorf(o.keyPath("partition_key"), v.line, `must be a dotted field path like "fullDocument.customerId", got %q`, p)
		}
		k.PartitionKey = p
	}
}

func decodeSNS(d *decoder, o *obj, s *Sink) {
	n := &SNSSink{}
	s.SNS = n
	arn, ok := o.reqString("topic_arn")
	if ok {
		if !topicARNRE.MatchString(arn) {
			d.errorf(o.keyPath("topic_arn"), o.lineOf("topic_arn"), `must be a topic ARN like "arn:aws:sns:us-east-1:123456789012:changes" (".fifo" at the end for a FIFO topic), got %q`, arn)
		}
		n.TopicARN = arn
	}
	n.AWS = d.aws(o, DefaultSNSMaxRequestBytes, MaxSNSMaxRequestBytes)
	if g, v, gok := o.str("message_group_id"); gok {
		switch {
		case !fieldPathRE.MatchString(g):
			d.errorf(o.keyPath("message_group_id"), v.line, `must be a dotted field path like "fullDocument.customerId", got %q`, g)
		case ok && !n.FIFO():
			d.errorf(o.keyPath("message_group_id"), v.line, `only applies to FIFO topics (a topic name ending in ".fifo")`)
		}
		n.MessageGroupID = g
	}
}
