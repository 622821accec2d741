package eventbridge

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

// These tests run the sink against test/aws, the local EventBridge server
// that verifies every request's SigV4 signature and enforces PutEvents'
// limits.

func newAWSTestSink(t *testing.T, srv *awstest.EventBridge, mod func(*Config)) *EventBridge {
	t.Helper()
	return sinktest.Open(t, New, Config{
		Name: "bus", EventBus: "orders", Region: awstest.DefaultRegion, Endpoint: srv.URL(),
		Credentials: srv.Config().Credentials,
		Timeout:     5 * time.Second,
	}, mod)
}

func TestAWSTestDelivery(t *testing.T) {
	srv := awstest.NewEventBridge(awstest.Options{})
	defer srv.Close()
	b := newAWSTestSink(t, srv, nil)
	evs := events(t, 10, 100)
	if err := b.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	got := srv.Events()
	if len(got) != 10 || srv.Requests() != 1 || srv.Rejected() != 0 {
		t.Fatalf("%d events in %d requests (%d rejected), want 10 in 1", len(got), srv.Requests(), srv.Rejected())
	}
	for i, e := range got {
		env, _ := evs[i].Envelope(false)
		if e.Source != "changegate.orders" || e.DetailType != "shop.orders.insert" || e.EventBusName != "orders" ||
			e.Detail != string(env) || !e.Time.Equal(evs[i].WallTime) {
			t.Errorf("event %d: %+v", i, e)
		}
	}
}

func TestAWSTestByteLimit(t *testing.T) {
	// The server enforces the same limit: a request over it would fail.
	srv := awstest.NewEventBridge(awstest.Options{MaxRequestSize: 3000})
	defer srv.Close()
	b := newAWSTestSink(t, srv, func(c *Config) { c.MaxRequestBytes = 3000 })
	evs := events(t, 10, 700)
	evs = slices.Insert(evs, 4, events(t, 1, 5000)...)
	err := b.Send(context.Background(), evs)
	var be *sinks.BatchError
	var de *sinks.Error
	if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.As(be.Failed[4], &de) || de.Reason != "oversize" || !de.Permanent {
		t.Fatalf("err = %v, want entry 4 permanent oversize", err)
	}
	if n := len(srv.Events()); n != 10 {
		t.Errorf("%d events accepted, want 10", n)
	}
	if srv.Requests() < 4 {
		t.Errorf("%d requests: ~1 KiB entries under a 3000-byte limit need at least 4", srv.Requests())
	}
}

func TestAWSTestFaults(t *testing.T) {
	srv := awstest.NewEventBridge(awstest.Options{})
	defer srv.Close()
	b := newAWSTestSink(t, srv, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	sinktest.CheckServerFaults(t, srv, "InternalException", func() error { return b.Send(context.Background(), events(t, 3, 0)) })
	if n := len(srv.Events()); n != 0 {
		t.Errorf("%d events stored after failures", n)
	}
	if err := b.Send(context.Background(), events(t, 3, 0)); err != nil {
		t.Errorf("after the faults: %v", err)
	}

	// Partial failure: only the failed entries are reported.
	srv.Reset()
	srv.FailEntries(func(e awstest.PutEventsEntry) (string, string) {
		switch {
		case strings.Contains(e.Detail, `"_id":1,`):
			return "ThrottlingException", "Rate exceeded"
		case strings.Contains(e.Detail, `"_id":3,`):
			return "MalformedDetail", "Detail is malformed."
		}
		return "", ""
	})
	err := b.Send(context.Background(), events(t, 5, 0))
	be := sinktest.BatchFailures(t, err, 2)
	sinktest.CheckError(t, "entry 1", be.Failed[1], false, "throttled")
	if de := sinktest.CheckError(t, "entry 3", be.Failed[3], true, "MalformedDetail"); de != nil && (de.Code != "MalformedDetail" || de.Answer != "Detail is malformed.") {
		t.Errorf("entry 3: code %q, answer %q", de.Code, de.Answer)
	}
	if n := len(srv.Events()); n != 3 {
		t.Errorf("%d events accepted, want 3", n)
	}
}

func TestAWSTestWrongSignature(t *testing.T) {
	srv := awstest.NewEventBridge(awstest.Options{})
	defer srv.Close()
	b := newAWSTestSink(t, srv, func(c *Config) {
		c.Credentials = credentials.NewStaticCredentialsProvider(awstest.AccessKeyID, "wrong-secret", "")
	})
	err := b.Send(context.Background(), events(t, 1, 0))
	var de *sinks.Error
	if !errors.As(err, &de) || !de.Permanent || de.Reason != "InvalidSignatureException" {
		t.Errorf("wrong secret: %v, want permanent InvalidSignatureException", err)
	}
	if srv.Rejected() != 1 || len(srv.Events()) != 0 {
		t.Errorf("rejected %d, stored %d", srv.Rejected(), len(srv.Events()))
	}
}
