package sqs

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// These tests run the sink against test/aws, the local SQS server that
// verifies every request's SigV4 signature, checks sizes and attribute
// MD5s and de-duplicates FIFO messages.

func newAWSTestSink(t *testing.T, srv *awstest.SQS, mod func(*Config)) *SQS {
	t.Helper()
	return sinktest.Open(t, New, Config{
		Name: "audit", Region: awstest.DefaultRegion, Endpoint: srv.URL(),
		Credentials: srv.Config().Credentials,
		Timeout:     5 * time.Second,
	}, mod)
}

func TestAWSTestFIFODedup(t *testing.T) {
	srv := awstest.NewSQS(awstest.Options{})
	defer srv.Close()
	srv.CreateQueue("audit.fifo")
	s := newAWSTestSink(t, srv, func(c *Config) { c.QueueName = "audit.fifo" })
	evs := events(t, 10, 0)
	for range 2 {
		if err := s.Send(context.Background(), evs); err != nil {
			t.Fatal(err)
		}
	}
	msgs := srv.Messages("audit.fifo")
	if len(msgs) != 10 || srv.Duplicates("audit.fifo") != 10 || srv.Rejected() != 0 {
		t.Fatalf("%d messages, %d duplicates, %d rejected; want 10, 10, 0", len(msgs), srv.Duplicates("audit.fifo"), srv.Rejected())
	}
	for i, m := range msgs {
		env, _ := evs[i].Envelope(false)
		if m.Body != string(env) || m.DeduplicationID != DeduplicationID(evs[i]) || m.GroupID != GroupID(evs[i], nil) {
			t.Errorf("message %d: %+v", i, m)
		}
		for k, v := range map[string]string{"source": "orders", "operationType": "update", "db": "shop", "coll": "orders"} {
			if a := m.Attributes[k]; a.DataType != "String" || a.StringValue != v {
				t.Errorf("message %d attribute %s = %+v", i, k, a)
			}
		}
	}
	// GetQueueUrl once, then two batches.
	if srv.Requests() != 3 {
		t.Errorf("%d requests, want 3", srv.Requests())
	}
}

func TestAWSTestFaults(t *testing.T) {
	srv := awstest.NewSQS(awstest.Options{MaxRequestSize: 4000})
	defer srv.Close()
	url := srv.CreateQueue("plain")
	s := newAWSTestSink(t, srv, func(c *Config) { c.QueueURL = url; c.MaxRequestBytes = 4000; c.Timeout = 300 * time.Millisecond })
	sinktest.CheckServerFaults(t, srv, "InternalFailure", func() error { return s.Send(context.Background(), events(t, 3, 0)) })
	if n := len(srv.Messages("plain")); n != 0 {
		t.Errorf("%d messages stored after failures", n)
	}

	// Byte limit (enforced by the server too) and oversize.
	evs := events(t, 10, 900)
	evs = slices.Insert(evs, 3, events(t, 1, 5000)...)
	err := s.Send(context.Background(), evs)
	be := sinktest.BatchFailures(t, err, 1)
	sinktest.CheckError(t, "oversize", be.Failed[3], true, "oversize")
	if n := len(srv.Messages("plain")); n != 10 {
		t.Errorf("%d messages, want 10", n)
	}

	// Partial failure.
	srv.Reset()
	srv.FailEntries(func(m awstest.Message) (string, string, bool) {
		switch {
		case strings.Contains(m.Body, `"orders:8200000001`):
			return "InternalError", "try again", false
		case strings.Contains(m.Body, `"orders:8200000002`):
			return "InvalidParameterValue", "bad", true
		}
		return "", "", false
	})
	err = s.Send(context.Background(), events(t, 4, 0))
	if !errors.As(err, &be) || len(be.Failed) != 2 {
		t.Fatalf("partial: %v", err)
	}
	sinktest.CheckError(t, "entry 1", be.Failed[1], false, "InternalError")
	sinktest.CheckError(t, "entry 2", be.Failed[2], true, "InvalidParameterValue")
}

func TestAWSTestQueueErrors(t *testing.T) {
	srv := awstest.NewSQS(awstest.Options{})
	defer srv.Close()
	srv.CreateQueue("audit")
	err := newAWSTestSink(t, srv, func(c *Config) { c.QueueName = "nope" }).Send(context.Background(), events(t, 1, 0))
	var de *sinks.Error
	if !errors.As(err, &de) || !de.Permanent {
		t.Errorf("unknown queue: %v, want permanent", err)
	}
	bad := newAWSTestSink(t, srv, func(c *Config) {
		c.QueueName = "audit"
		c.Credentials = credentials.NewStaticCredentialsProvider(awstest.AccessKeyID, "wrong-secret", "")
	})
	err = bad.Send(context.Background(), events(t, 1, 0))
	if !errors.As(err, &de) || !de.Permanent || srv.Rejected() != 1 {
		t.Errorf("wrong signature: %v (rejected %d), want permanent", err, srv.Rejected())
	}
}
