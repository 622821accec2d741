package kinesis

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
	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// The tests run the sink against test/aws's Kinesis server, which verifies
// every request's SigV4 signature and Kinesis's limits.

func newSink(t *testing.T, srv *awstest.Kinesis, mod func(*Config)) *Kinesis {
	t.Helper()
	return sinktest.Open(t, New, Config{
		Name: "changes", Stream: "changes", Region: awstest.DefaultRegion, Endpoint: srv.URL(),
		Credentials: srv.Config().Credentials,
		Timeout:     5 * time.Second,
	}, mod)
}

func newServer(t *testing.T, opts awstest.Options) *awstest.Kinesis {
	srv := awstest.NewKinesis(opts)
	t.Cleanup(srv.Close)
	srv.CreateStreamWith("changes", awstest.StreamOptions{Shards: 4})
	return srv
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{Name: "k", MaxRequestBytes: 11 << 20, PartitionKey: "a..b", Timeout: -1, Region: "us-east-1"}, nil)
	want := "kinesis k: stream is required\npartition_key: \"a..b\" is not a dotted field path\n" +
		"max_request_bytes must be between 1 and 10485760, got 11534336\ntimeout must not be negative, got -1ns"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
}

func TestSendRecords(t *testing.T) {
	srv := newServer(t, awstest.Options{})
	k := newSink(t, srv, nil)
	evs := sinktest.Changes(t, 600, 10)
	if err := k.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	recs := srv.Records("changes")
	if len(recs) != 600 || srv.Calls("PutRecords") != 2 {
		t.Fatalf("%d records in %d calls, want 600 in 2 (500 + 100)", len(recs), srv.Calls("PutRecords"))
	}
	for i, r := range recs {
		want, _ := evs[i].Record(false)
		if string(r.Data) != string(want) {
			t.Fatalf("record %d: data is not the event's record", i)
		}
		if wantKey := `shop.orders:{"_id":` + strconv.Itoa(i) + `}`; r.PartitionKey != wantKey {
			t.Fatalf("record %d: partition key %q, want %q", i, r.PartitionKey, wantKey)
		}
	}

	// By ARN, with a partition key path.
	srv.Reset()
	byARN := newSink(t, srv, func(c *Config) { c.Stream = srv.StreamARN("changes"); c.PartitionKey = "fullDocument.customerId" })
	if err := byARN.Send(context.Background(), evs[:3]); err != nil {
		t.Fatal(err)
	}
	for _, r := range srv.Records("changes") {
		if r.PartitionKey != "42" {
			t.Fatalf("partition key %q, want the customerId 42", r.PartitionKey)
		}
	}

	// A document key longer than 256 characters is hashed.
	srv.Reset()
	long := sinktest.Change(t, 1, strings.Repeat("é", 300), 0)
	if err := k.Send(context.Background(), []*event.Event{long}); err != nil {
		t.Fatal(err)
	}
	if r := srv.Records("changes"); len(r) != 1 || !strings.HasPrefix(r[0].PartitionKey, "sha256:") || len(r[0].PartitionKey) != 71 {
		t.Fatalf("records %+v, want one with a hashed partition key", r)
	}
	if srv.Rejected() != 0 {
		t.Fatalf("%d requests rejected", srv.Rejected())
	}
}

func TestSendFailures(t *testing.T) {
	srv := newServer(t, awstest.Options{})
	k := newSink(t, srv, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	ctx := context.Background()

	sinktest.CheckServerFaults(t, srv, "InternalFailure", func() error { return k.Send(ctx, sinktest.Changes(t, 3, 0)) })
	unknown := newSink(t, srv, func(c *Config) { c.Stream = "nope" })
	sinktest.CheckError(t, "unknown stream", unknown.Send(ctx, sinktest.Changes(t, 3, 0)), true, "ResourceNotFoundException")
	bad := newSink(t, srv, func(c *Config) {
		c.Credentials = credentials.NewStaticCredentialsProvider(awstest.AccessKeyID, "wrong-secret", "")
	})
	sinktest.CheckError(t, "bad signature", bad.Send(ctx, sinktest.Changes(t, 3, 0)), true, "InvalidSignatureException")
	if n := len(srv.Records("changes")); n != 0 {
		t.Fatalf("%d records stored after failures", n)
	}

	// Per record: throttled and internal failures retry, a KMS key that is
	// not accessible does not; the others are written.
	srv.FailRecords(func(r awstest.Record) (string, string) {
		switch r.PartitionKey {
		case `shop.orders:{"_id":1}`:
			return "ProvisionedThroughputExceededException", "Rate exceeded for shard " + r.ShardID
		case `shop.orders:{"_id":2}`:
			return "InternalFailure", "Internal service failure."
		case `shop.orders:{"_id":3}`:
			return "KMSAccessDeniedException", "no access to the key"
		}
		return "", ""
	})
	err := k.Send(ctx, sinktest.Changes(t, 5, 0))
	be := sinktest.BatchFailures(t, err, 3)
	sinktest.CheckError(t, "record 1", be.Failed[1], false, "throttled")
	sinktest.CheckError(t, "record 2", be.Failed[2], false, "InternalFailure")
	sinktest.CheckError(t, "record 3", be.Failed[3], true, "KMSAccessDeniedException")
	if n := len(srv.Records("changes")); n != 2 {
		t.Fatalf("%d records written, want 2", n)
	}
}

func TestSendSizes(t *testing.T) {
	// The server refuses requests over 4000 bytes: the sink must split.
	srv := newServer(t, awstest.Options{MaxRequestSize: 4000})
	k := newSink(t, srv, func(c *Config) { c.MaxRequestBytes = 4000 })
	evs := sinktest.Changes(t, 10, 900)
	evs = slices.Insert(evs, 3, sinktest.Change(t, 99, 99, 5000))
	err := k.Send(context.Background(), evs)
	be := sinktest.BatchFailures(t, err, 1)
	sinktest.CheckError(t, "oversize", be.Failed[3], true, "oversize")
	if !strings.Contains(be.Failed[3].Error(), "record is ") || !strings.Contains(be.Failed[3].Error(), "more than the request limit of 4000 bytes") {
		t.Errorf("oversize message: %v", be.Failed[3])
	}
	if n, calls := len(srv.Records("changes")), srv.Calls("PutRecords"); n != 10 || calls < 3 {
		t.Fatalf("%d records in %d calls, want 10 in at least 3", n, calls)
	}

	// With oversize = "strip" the event goes without its documents.
	srv.Reset()
	var stripped sinktest.Counter
	strip := newSink(t, srv, func(c *Config) {
		c.MaxRequestBytes = 4000
		c.Oversize = sinks.Oversize{Strip: true, Stripped: &stripped}
	})
	if err := strip.Send(context.Background(), []*event.Event{sinktest.Change(t, 98, 98, 5000)}); err != nil {
		t.Fatal(err)
	}
	r := srv.Records("changes")
	if len(r) != 1 || !strings.Contains(string(r[0].Data), `"truncated":true`) || strings.Contains(string(r[0].Data), "fullDocument") || stripped.N() != 1 {
		t.Fatalf("stripped: %d records, counter %d, data %.200s", len(r), stripped.N(), r)
	}
}

// BenchmarkSend500 puts batches of 500 records of ~1 KiB on test/aws's
// server (SigV4 verified on both sides, JSON with base64 data).
func BenchmarkSend500(b *testing.B) {
	srv := awstest.NewKinesis(awstest.Options{})
	defer srv.Close()
	srv.CreateStream("changes")
	k, err := New(Config{
		Name: "changes", Stream: "changes", Region: awstest.DefaultRegion, Endpoint: srv.URL(),
		Credentials: srv.Config().Credentials,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	evs := sinktest.Changes(b, 500, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if err := k.Send(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
		srv.Reset() // keeps the server's memory flat
	}
	b.ReportMetric(float64(b.N*500)/b.Elapsed().Seconds(), "records/s")
}
