package sns

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/awsutil"
	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// The tests run the sink against test/aws's SNS server, which verifies
// every request's SigV4 signature, sizes and FIFO parameters, and
// de-duplicates FIFO messages.

func newSink(t *testing.T, srv *awstest.SNS, topic string, mod func(*Config)) *SNS {
	t.Helper()
	return sinktest.Open(t, New, Config{
		Name: "fanout", TopicARN: srv.TopicARN(topic), Region: awstest.DefaultRegion, Endpoint: srv.URL(),
		Credentials: srv.Config().Credentials,
		Timeout:     5 * time.Second,
	}, mod)
}

func newServer(t *testing.T, max int) *awstest.SNS {
	srv := awstest.NewSNS(awstest.Options{})
	t.Cleanup(srv.Close)
	srv.CreateTopicWith("changes", awstest.TopicOptions{MaximumMessageSize: max})
	srv.CreateTopicWith("changes.fifo", awstest.TopicOptions{MaximumMessageSize: max})
	return srv
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{Name: "s", MaxRequestBytes: 2 << 20, GroupBy: ".x", Region: "us-east-1"}, nil)
	want := "sns s: topic_arn is required\nmessage_group_id: \".x\" is not a dotted field path\n" +
		"max_request_bytes must be between 1 and 1048576, got 2097152"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
}

func TestSendStandardAndFIFO(t *testing.T) {
	srv := newServer(t, 0)
	std := newSink(t, srv, "changes", nil)
	evs := sinktest.Changes(t, 25, 10)
	if err := std.Send(context.Background(), evs[:10]); err != nil {
		t.Fatal(err)
	}
	msgs := srv.Messages("changes")
	if len(msgs) != 10 || std.FIFO() {
		t.Fatalf("%d messages, want 10", len(msgs))
	}
	for i, m := range msgs {
		env, _ := evs[i].Envelope(false)
		if m.Message != string(env) || m.GroupID != "" || m.DeduplicationID != "" {
			t.Errorf("message %d: %+v", i, m)
		}
		for k, v := range map[string]string{"source": "orders", "operationType": "update", "db": "shop", "coll": "orders"} {
			if a := m.Attributes[k]; a.DataType != "String" || a.StringValue != v {
				t.Errorf("message %d attribute %s = %+v", i, k, a)
			}
		}
	}

	fifo := newSink(t, srv, "changes.fifo", nil)
	for range 2 { // re-sent: the same deduplication ids, dropped by SNS
		if err := fifo.Send(context.Background(), evs[:10]); err != nil {
			t.Fatal(err)
		}
	}
	msgs = srv.Messages("changes.fifo")
	if len(msgs) != 10 || srv.Duplicates("changes.fifo") != 10 || !fifo.FIFO() {
		t.Fatalf("%d messages, %d duplicates; want 10, 10", len(msgs), srv.Duplicates("changes.fifo"))
	}
	for i, m := range msgs {
		if m.DeduplicationID != awsutil.DeduplicationID(evs[i]) || m.GroupID != `shop.orders:{"_id":`+strconv.Itoa(i)+`}` {
			t.Errorf("message %d: group %q dedup %q", i, m.GroupID, m.DeduplicationID)
		}
	}
	byCustomer := newSink(t, srv, "changes.fifo", func(c *Config) { c.GroupBy = "fullDocument.customerId" })
	srv.Reset()
	if err := byCustomer.Send(context.Background(), evs[10:12]); err != nil {
		t.Fatal(err)
	}
	for _, m := range srv.Messages("changes.fifo") {
		if m.GroupID != "42" {
			t.Errorf("group %q, want the customerId", m.GroupID)
		}
	}
	if srv.Rejected() != 0 {
		t.Errorf("%d requests rejected", srv.Rejected())
	}
}

func TestSendFailures(t *testing.T) {
	srv := newServer(t, 0)
	s := newSink(t, srv, "changes", func(c *Config) { c.Timeout = 300 * time.Millisecond })
	ctx := context.Background()
	sinktest.CheckServerFaults(t, srv, "InternalError", func() error { return s.Send(ctx, sinktest.Changes(t, 3, 0)) })
	sinktest.CheckError(t, "unknown topic", newSink(t, srv, "nope", nil).Send(ctx, sinktest.Changes(t, 3, 0)), true, "NotFound")
	bad := newSink(t, srv, "changes", func(c *Config) {
		c.Credentials = credentials.NewStaticCredentialsProvider(awstest.AccessKeyID, "wrong-secret", "")
	})
	sinktest.CheckError(t, "bad signature", bad.Send(ctx, sinktest.Changes(t, 3, 0)), true, "SignatureDoesNotMatch")
	if n := len(srv.Messages("changes")); n != 0 {
		t.Fatalf("%d messages stored after failures", n)
	}

	srv.FailEntries(func(m awstest.SNSMessage) (string, string, bool) {
		switch {
		case strings.Contains(m.Message, `"documentKey":{"_id":1}`):
			return "InternalError", "try again", false
		case strings.Contains(m.Message, `"documentKey":{"_id":2}`):
			return "KMSThrottling", "slow down", false
		case strings.Contains(m.Message, `"documentKey":{"_id":3}`):
			return "InvalidParameter", "bad", true
		}
		return "", "", false
	})
	err := s.Send(ctx, sinktest.Changes(t, 5, 0))
	be := sinktest.BatchFailures(t, err, 3)
	sinktest.CheckError(t, "entry 1", be.Failed[1], false, "InternalError")
	sinktest.CheckError(t, "entry 2", be.Failed[2], false, "throttled")
	sinktest.CheckError(t, "entry 3", be.Failed[3], true, "InvalidParameter")
	if n := len(srv.Messages("changes")); n != 2 {
		t.Fatalf("%d messages, want 2", n)
	}
}

func TestSendSizes(t *testing.T) {
	// The topic takes 4000 bytes per batch: the sink must split.
	srv := newServer(t, 4000)
	s := newSink(t, srv, "changes", func(c *Config) { c.MaxRequestBytes = 4000 })
	evs := sinktest.Changes(t, 10, 900)
	evs = slices.Insert(evs, 3, sinktest.Change(t, 99, 99, 5000))
	err := s.Send(context.Background(), evs)
	be := sinktest.BatchFailures(t, err, 1)
	sinktest.CheckError(t, "oversize", be.Failed[3], true, "oversize")
	if n, calls := len(srv.Messages("changes")), srv.Calls("PublishBatch"); n != 10 || calls < 3 {
		t.Fatalf("%d messages in %d calls, want 10 in at least 3", n, calls)
	}

	srv.Reset()
	var stripped sinktest.Counter
	strip := newSink(t, srv, "changes", func(c *Config) {
		c.MaxRequestBytes = 4000
		c.Oversize = sinks.Oversize{Strip: true, Stripped: &stripped}
	})
	if err := strip.Send(context.Background(), []*event.Event{sinktest.Change(t, 98, 98, 5000)}); err != nil {
		t.Fatal(err)
	}
	m := srv.Messages("changes")
	if len(m) != 1 || !strings.Contains(m[0].Message, `"truncated":true`) || strings.Contains(m[0].Message, "fullDocument") || stripped.N() != 1 {
		t.Fatalf("stripped: %d messages, counter %d", len(m), stripped.N())
	}
}
