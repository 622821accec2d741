package config

import (
	"reflect"
	"testing"
	"time"
)

func TestKinesisAndSNSSinks(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[[sinks]]
name = "stream"
type = "kinesis"
stream = "changes"
[[sinks]]
name = "stream2"
type = "kinesis"
stream = "arn:aws:kinesis:eu-west-1:123456789012:stream/changes"
partition_key = "fullDocument.customerId"
region = "eu-west-1"
endpoint = "http://localhost:4566"
role_arn = "arn:aws:iam::123456789012:role/changegate"
max_request_bytes = 10485760
timeout = "3s"
batch_size = 100
[[sinks]]
name = "topic"
type = "sns"
topic_arn = "arn:aws:sns:us-east-1:123456789012:changes.fifo"
message_group_id = "fullDocument.customerId"
[[sinks]]
name = "plain"
type = "sns"
topic_arn = "arn:aws:sns:us-east-1:123456789012:changes"
max_request_bytes = 1048576
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	def := 10 * time.Second
	want := []struct {
		batch int
		k     *KinesisSink
		sns   *SNSSink
	}{
		{500, &KinesisSink{AWS: AWS{MaxRequestBytes: 1 << 20, Timeout: def}, Stream: "changes"}, nil},
		{100, &KinesisSink{
			AWS: AWS{Region: "eu-west-1", Endpoint: "http://localhost:4566", RoleARN: "arn:aws:iam::123456789012:role/changegate",
				MaxRequestBytes: 10 << 20, Timeout: 3 * time.Second},
			Stream: "arn:aws:kinesis:eu-west-1:123456789012:stream/changes", PartitionKey: "fullDocument.customerId",
		}, nil},
		{10, nil, &SNSSink{AWS: AWS{MaxRequestBytes: 256 << 10, Timeout: def},
			TopicARN: "arn:aws:sns:us-east-1:123456789012:changes.fifo", MessageGroupID: "fullDocument.customerId"}},
		{10, nil, &SNSSink{AWS: AWS{MaxRequestBytes: 1 << 20, Timeout: def}, TopicARN: "arn:aws:sns:us-east-1:123456789012:changes"}},
	}
	for i, w := range want {
		s := cfg.Sinks[i]
		if s.BatchSize != w.batch {
			t.Errorf("%s: batch_size %d, want %d", s.Name, s.BatchSize, w.batch)
		}
		if !reflect.DeepEqual(s.Kinesis, w.k) || !reflect.DeepEqual(s.SNS, w.sns) || s.SQS != nil || s.EventBridge != nil {
			t.Errorf("%s: kinesis %+v sns %+v\nwant %+v %+v", s.Name, s.Kinesis, s.SNS, w.k, w.sns)
		}
	}
	if !cfg.Sinks[2].SNS.FIFO() || cfg.Sinks[3].SNS.FIFO() {
		t.Error("FIFO detection")
	}
}

func TestKinesisAndSNSErrors(t *testing.T) {
	_, err := Parse("config.toml", src(head+`
[[sinks]]
name = "k"
type = "kinesis"
[[sinks]]
name = "k2"
type = "kinesis"
stream = "arn:aws:sqs:us-east-1:123456789012:changes"
partition_key = "fullDocument..id"
max_request_bytes = 20000000
batch_size = 501
topic_arn = "arn:aws:sns:us-east-1:123456789012:changes"
[[sinks]]
name = "k3"
type = "kinesis"
stream = "my stream"
[[sinks]]
name = "s"
type = "sns"
[[sinks]]
name = "s2"
type = "sns"
topic_arn = "changes"
max_request_bytes = 2000000
batch_size = 11
[[sinks]]
name = "s3"
type = "sns"
topic_arn = "arn:aws:sns:us-east-1:123456789012:changes"
message_group_id = "fullDocument.customerId"
stream = "changes"
`), nil)
	want := `sinks[0].stream: required key is missing at config.toml:4
sinks[1].stream: an ARN must be a stream ARN like "arn:aws:kinesis:us-east-1:123456789012:stream/changes", got "arn:aws:sqs:us-east-1:123456789012:changes" at config.toml:10
sinks[1].partition_key: must be a dotted field path like "fullDocument.customerId", got "fullDocument..id" at config.toml:11
sinks[1].max_request_bytes: must be between 1024 and 10485760, got 20000000 at config.toml:12
sinks[1].batch_size: must be between 1 and 500, got 501 at config.toml:13
sinks[1].topic_arn: not an option of kinesis sinks at config.toml:14
sinks[2].stream: invalid stream name "my stream": use 1 to 128 letters, digits, "_", "." and "-", or an ARN at config.toml:18
sinks[3].topic_arn: required key is missing at config.toml:19
sinks[4].topic_arn: must be a topic ARN like "arn:aws:sns:us-east-1:123456789012:changes" (".fifo" at the end for a FIFO topic), got "changes" at config.toml:25
sinks[4].max_request_bytes: must be between 1024 and 1048576, got 2000000 at config.toml:26
sinks[4].batch_size: must be between 1 and 10, got 11 at config.toml:27
sinks[5].message_group_id: only applies to FIFO topics (a topic name ending in ".fifo") at config.toml:32
sinks[5].stream: not an option of sns sinks at config.toml:33`
	if err == nil || err.Error() != want {
		t.Errorf("got:\n%v\nwant:\n%s", err, want)
	}
}
