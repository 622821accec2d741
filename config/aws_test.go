package config

import (
	"reflect"
	"testing"
	"time"
)

func TestAWSSinks(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[[sinks]]
name = "bus"
type = "eventbridge"
event_bus = "arn:aws:events:us-east-1:123456789012:event-bus/orders"
[[sinks]]
name = "bus2"
type = "eventbridge"
event_bus = "orders"
region = "eu-west-1"
endpoint = "http://localhost:4566"
role_arn = "arn:aws:iam::123456789012:role/changegate"
source = "com.example.{source}"
detail_type = "{{{operationType}}}"
resources = ["arn:aws:s3:::bucket"]
max_request_bytes = 100000
timeout = "3s"
batch_size = 5
[[sinks]]
name = "audit"
type = "sqs"
queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo"
message_group_id = "fullDocument.customerId"
[[sinks]]
name = "plain"
type = "sqs"
queue_name = "plain"
max_request_bytes = 1048576
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		batch int
		eb    *EventBridgeSink
		sqs   *SQSSink
	}{
		{10, &EventBridgeSink{
			AWS:      AWS{MaxRequestBytes: 262144, Timeout: 10 * time.Second},
			EventBus: "arn:aws:events:us-east-1:123456789012:event-bus/orders",
			Source:   "changegate.{source}", DetailType: "{db}.{coll}.{operationType}",
		}, nil},
		{5, &EventBridgeSink{
			AWS: AWS{Region: "eu-west-1", Endpoint: "http://localhost:4566", RoleARN: "arn:aws:iam::123456789012:role/changegate",
				MaxRequestBytes: 100000, Timeout: 3 * time.Second},
			EventBus: "orders", Source: "com.example.{source}", DetailType: "{{{operationType}}}",
			Resources: []string{"arn:aws:s3:::bucket"},
		}, nil},
		{10, nil, &SQSSink{
			AWS:      AWS{MaxRequestBytes: 1 << 20, Timeout: 10 * time.Second},
			QueueURL: "https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo", MessageGroupID: "fullDocument.customerId",
		}},
		{10, nil, &SQSSink{AWS: AWS{MaxRequestBytes: 1 << 20, Timeout: 10 * time.Second}, QueueName: "plain"}},
	}
	for i, w := range want {
		s := cfg.Sinks[i]
		if s.BatchSize != w.batch {
			t.Errorf("%s: batch_size %d, want %d", s.Name, s.BatchSize, w.batch)
		}
		if !reflect.DeepEqual(s.EventBridge, w.eb) || !reflect.DeepEqual(s.SQS, w.sqs) || s.Webhook != nil {
			t.Errorf("%s: eventbridge %+v sqs %+v\nwant %+v %+v", s.Name, s.EventBridge, s.SQS, w.eb, w.sqs)
		}
	}
	if !cfg.Sinks[2].SQS.FIFO() || cfg.Sinks[3].SQS.FIFO() {
		t.Error("FIFO detection")
	}
}
