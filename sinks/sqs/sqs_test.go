package sqs

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

type attr struct{ DataType, StringValue string }

type message struct {
	Id, MessageBody                        string
	MessageGroupId, MessageDeduplicationId string
	MessageAttributes                      map[string]attr
}

// fakeQueue is a minimal SQS endpoint (AWS JSON 1.0: GetQueueUrl,
// SendMessageBatch). answer, when set, decides the reply to each batch
// call: an HTTP error (status, code) or per-entry failures (code, sender
// fault), "" for success.
type fakeQueue struct {
	mu       sync.Mutex
	urls     map[string]string
	lookups  int
	calls    []sendCall
	answer   func(call int, ms []message) (status int, code string, fails []entryFail)
	noResult bool
}

type sendCall struct {
	QueueUrl string
	Entries  []message
}

type entryFail struct {
	code   string
	sender bool
}

func (f *fakeQueue) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Header.Get("X-Amz-Target") {
	case "AmazonSQS.GetQueueUrl":
		var in struct{ QueueName string }
		_ = json.Unmarshal(body, &in)
		f.lookups++
		u, ok := f.urls[in.QueueName]
		if !ok {
			w.WriteHeader(400)
			fmt.Fprint(w, `{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."}`)
			return
		}
		fmt.Fprintf(w, `{"QueueUrl":%q}`, u)
	case "AmazonSQS.SendMessageBatch":
		var in sendCall
		if err := json.Unmarshal(body, &in); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		call := len(f.calls)
		f.calls = append(f.calls, in)
		status, code, fails := 200, "", []entryFail(nil)
		if f.answer != nil {
			status, code, fails = f.answer(call, in.Entries)
		}
		if status != 200 {
			// "Shape|QueryCode": the modeled shape plus the
			// X-Amzn-Query-Error header real SQS sends (awsQueryCompatible).
			if shape, query, ok := strings.Cut(code, "|"); ok {
				code = shape
				w.Header().Set("X-Amzn-Query-Error", query+";Sender")
			}
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"__type":"com.amazonaws.sqs#%s","message":"injected"}`, code)
			return
		}
		type ok struct{ Id, MessageId, MD5OfMessageBody string }
		type failed struct {
			Id, Code, Message string
			SenderFault       bool
		}
		out := struct {
			Successful []ok
			Failed     []failed
		}{Successful: []ok{}, Failed: []failed{}}
		for i, m := range in.Entries {
			if i < len(fails) && fails[i].code != "" {
				out.Failed = append(out.Failed, failed{m.Id, fails[i].code, "injected", fails[i].sender})
				continue
			}
			if f.noResult && i == len(in.Entries)-1 {
				continue
			}
			sum := md5.Sum([]byte(m.MessageBody))
			out.Successful = append(out.Successful, ok{m.Id, fmt.Sprintf("m-%d-%d", call, i), hex.EncodeToString(sum[:])})
		}
		_ = json.NewEncoder(w).Encode(out)
	default:
		http.Error(w, "unexpected target", 400)
	}
}

func (f *fakeQueue) snapshot() []sendCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sendCall(nil), f.calls...)
}

func newTestSink(t *testing.T, f *fakeQueue, mod func(*Config)) (*SQS, string) {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	s := sinktest.Open(t, New, Config{
		Name: "audit", QueueURL: srv.URL + "/123456789012/audit.fifo", Region: "us-east-1", Endpoint: srv.URL,
		Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		Timeout:     5 * time.Second,
	}, mod)
	return s, srv.URL
}

func events(t testing.TB, n, padding int) []*event.Event {
	out := make([]*event.Event, n)
	for i := range out {
		out[i] = sinktest.Change(t, i, i%3, padding)
	}
	return out
}

func TestSendFIFO(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, nil)
	if !s.FIFO() {
		t.Fatal("audit.fifo not detected as FIFO")
	}
	evs := events(t, 4, 0)
	for range 2 { // twice: ids are stable across re-deliveries
		if err := s.Send(context.Background(), evs); err != nil {
			t.Fatal(err)
		}
	}
	calls := f.snapshot()
	if len(calls) != 2 {
		t.Fatalf("%d calls, want 2", len(calls))
	}
	for c, call := range calls {
		if !strings.HasSuffix(call.QueueUrl, "/audit.fifo") {
			t.Errorf("queue url %q", call.QueueUrl)
		}
		for i, m := range call.Entries {
			env, _ := evs[i].Envelope(false)
			if m.MessageBody != string(env) {
				t.Errorf("call %d message %d: body is not the envelope", c, i)
			}
			want := map[string]string{"source": "orders", "operationType": "update", "db": "shop", "coll": "orders"}
			for k, v := range want {
				if a := m.MessageAttributes[k]; a.DataType != "String" || a.StringValue != v {
					t.Errorf("attribute %s = %+v, want String %q", k, a, v)
				}
			}
			if len(m.MessageDeduplicationId) != 64 || m.MessageDeduplicationId != DeduplicationID(evs[i]) {
				t.Errorf("dedup id %q", m.MessageDeduplicationId)
			}
			wantGroup := fmt.Sprintf(`shop.orders:{"_id":%d}`, i%3)
			if m.MessageGroupId != wantGroup {
				t.Errorf("group id %q, want %q", m.MessageGroupId, wantGroup)
			}
			if other := calls[1-c].Entries[i]; other.MessageDeduplicationId != m.MessageDeduplicationId || other.MessageGroupId != m.MessageGroupId {
				t.Errorf("message %d: ids differ between two Sends of the same event", i)
			}
		}
	}
	if calls[0].Entries[0].MessageDeduplicationId == calls[0].Entries[1].MessageDeduplicationId {
		t.Error("two events share a deduplication id")
	}
}

func TestStandardQueueHasNoFIFOIDs(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, func(c *Config) { c.QueueURL = strings.TrimSuffix(c.QueueURL, ".fifo") })
	if err := s.Send(context.Background(), events(t, 1, 0)); err != nil {
		t.Fatal(err)
	}
	if m := f.snapshot()[0].Entries[0]; m.MessageGroupId != "" || m.MessageDeduplicationId != "" {
		t.Errorf("standard queue got group %q dedup %q", m.MessageGroupId, m.MessageDeduplicationId)
	}
}

func TestGroupID(t *testing.T) {
	long := sinktest.Change(t, 1, strings.Repeat("k", 200), 0)
	spaced := sinktest.Change(t, 1, "John Smith", 0)
	e := sinktest.Change(t, 1, bson.ObjectID{}, 0)
	tests := []struct {
		name string
		e    *event.Event
		path []string
		want string
	}{
		{"object id", e, nil, `shop.orders:{"_id":{"$oid":"000000000000000000000000"}}`},
		{"field path int", e, []string{"fullDocument", "customerId"}, "42"},
		{"field path missing", e, []string{"fullDocument", "nope"}, `shop.orders:{"_id":{"$oid":"000000000000000000000000"}}`},
		{"too long", long, nil, "sha256:"},
		{"space", spaced, nil, "sha256:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := GroupID(tt.e, tt.path)
			if strings.HasSuffix(tt.want, ":") {
				if !strings.HasPrefix(g, tt.want) || len(g) != len("sha256:")+64 {
					t.Errorf("group %q, want a sha256: hash", g)
				}
				if g != GroupID(tt.e, tt.path) {
					t.Error("not stable")
				}
				return
			}
			if g != tt.want {
				t.Errorf("group %q, want %q", g, tt.want)
			}
		})
	}
	if GroupID(long, nil) == GroupID(spaced, nil) {
		t.Error("different keys hash to the same group")
	}
}

func TestConfiguredGroup(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, func(c *Config) { c.GroupBy = "fullDocument.customerId" })
	if err := s.Send(context.Background(), events(t, 2, 0)); err != nil {
		t.Fatal(err)
	}
	for _, m := range f.snapshot()[0].Entries {
		if m.MessageGroupId != "42" {
			t.Errorf("group %q, want 42", m.MessageGroupId)
		}
	}
}

// A delete carries no fullDocument; with a pre-image its group comes from
// fullDocumentBeforeChange, the same group as the document's other changes.
func TestConfiguredGroupForDeleteUsesPreImage(t *testing.T) {
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "01"}}},
		{Key: "operationType", Value: "delete"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 7}}},
		{Key: "fullDocumentBeforeChange", Value: bson.D{{Key: "_id", Value: 7}, {Key: "customerId", Value: "c-9"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := event.FromChange("orders", 0, raw)
	if err != nil {
		t.Fatal(err)
	}
	if g := GroupID(e, []string{"fullDocument", "customerId"}); g != "c-9" {
		t.Fatalf("delete's group %q, want c-9 from the pre-image", g)
	}
}

func TestQueueNameResolution(t *testing.T) {
	f := &fakeQueue{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	f.urls = map[string]string{"audit.fifo": srv.URL + "/123456789012/audit.fifo"}
	mk := func(name string) *SQS {
		s, err := New(Config{Name: "a", QueueName: name, Region: "us-east-1", Endpoint: srv.URL,
			Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := mk("audit.fifo")
	if !s.FIFO() {
		t.Error("FIFO not detected from the name")
	}
	for range 3 {
		if err := s.Send(context.Background(), events(t, 2, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if f.lookups != 1 {
		t.Errorf("%d GetQueueUrl calls, want 1 (cached)", f.lookups)
	}
	if c := f.snapshot(); len(c) != 3 || c[0].QueueUrl != f.urls["audit.fifo"] {
		t.Errorf("calls %+v", c)
	}

	err := mk("nope").Send(context.Background(), events(t, 1, 0))
	var de *sinks.Error
	if !errors.As(err, &de) || !de.Permanent || de.Reason != "QueueDoesNotExist" || !strings.Contains(err.Error(), "GetQueueUrl nope") {
		t.Errorf("unknown queue: %v, want permanent QueueDoesNotExist", err)
	}
}

func TestByteLimitAndOversize(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, func(c *Config) { c.MaxRequestBytes = 3000 })
	evs := events(t, 10, 700) // ~1 KiB each: 2 per call
	big := sinktest.Change(t, 99, 99, 4000)
	batch := append(evs[:5:5], big)
	batch = append(batch, evs[5:]...)
	err := s.Send(context.Background(), batch)
	be := sinktest.BatchFailures(t, err, 1)
	var de *sinks.Error
	if !errors.As(be.Failed[5], &de) || !de.Permanent || de.Reason != "oversize" || !strings.Contains(de.Error(), "more than the request limit of 3000 bytes") {
		t.Fatalf("entry 5: %v", be.Failed[5])
	}
	var got []string
	for _, c := range f.snapshot() {
		size := 0
		for _, m := range c.Entries {
			size += len(m.MessageBody)
			for k, a := range m.MessageAttributes {
				size += len(k) + len(a.DataType) + len(a.StringValue)
			}
			got = append(got, m.MessageDeduplicationId)
		}
		if size > 3000 || len(c.Entries) > MaxEntries {
			t.Errorf("call of %d messages, %d bytes", len(c.Entries), size)
		}
	}
	if len(got) != 10 {
		t.Fatalf("%d messages sent, want 10", len(got))
	}
	for i, id := range got {
		if id != DeduplicationID(evs[i]) {
			t.Errorf("message %d out of order", i)
		}
	}
}

func TestPartialFailure(t *testing.T) {
	f := &fakeQueue{answer: func(call int, ms []message) (int, string, []entryFail) {
		fails := make([]entryFail, len(ms))
		fails[2] = entryFail{"InternalError", false}
		fails[4] = entryFail{"InvalidParameterValue", true}
		fails[7] = entryFail{"RequestThrottled", false}
		return 200, "", fails
	}}
	s, _ := newTestSink(t, f, nil)
	err := s.Send(context.Background(), events(t, 9, 0))
	be := sinktest.BatchFailures(t, err, 3)
	want := map[int]struct {
		perm   bool
		reason string
	}{2: {false, "InternalError"}, 4: {true, "InvalidParameterValue"}, 7: {false, "throttled"}}
	for i, w := range want {
		var de *sinks.Error
		if !errors.As(be.Failed[i], &de) || de.Permanent != w.perm || de.Reason != w.reason {
			t.Errorf("entry %d: %v, want permanent=%v %q", i, be.Failed[i], w.perm, w.reason)
		}
	}

	// An entry with no result at all is retried.
	f2 := &fakeQueue{noResult: true}
	s2, _ := newTestSink(t, f2, nil)
	err = s2.Send(context.Background(), events(t, 3, 0))
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[2] == nil {
		t.Fatalf("missing result: %v", err)
	}
}

func TestCallErrors(t *testing.T) {
	tests := []struct {
		status int
		code   string
		perm   bool
		reason string
	}{
		{400, "RequestThrottled", false, "throttled"},
		{400, "ThrottlingException", false, "throttled"},
		{500, "InternalError", false, "InternalError"},
		{503, "ServiceUnavailable", false, "ServiceUnavailable"},
		{400, "AccessDenied", true, "AccessDenied"},
		{400, "QueueDoesNotExist", true, "QueueDoesNotExist"},
		{400, "BatchRequestTooLong", true, "BatchRequestTooLong"},
		{400, "KmsThrottled", false, "throttled"},
		// Real SQS answers with the query-compatible code, which the SDK
		// reports as the error code.
		{400, "KmsThrottled|KMS.ThrottlingException", false, "throttled"},
		{400, "RequestThrottled|RequestThrottled", false, "throttled"},
		{400, "QueueDoesNotExist|AWS.SimpleQueueService.NonExistentQueue", true, "AWS.SimpleQueueService.NonExistentQueue"},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			f := &fakeQueue{answer: func(int, []message) (int, string, []entryFail) { return tt.status, tt.code, nil }}
			s, _ := newTestSink(t, f, nil)
			err := s.Send(context.Background(), events(t, 3, 0))
			sinktest.CheckError(t, tt.code, err, tt.perm, tt.reason)
			if n := len(f.snapshot()); n != 1 {
				t.Errorf("%d requests: the SDK must not retry answers", n)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := New(Config{Name: "x", QueueURL: "u", QueueName: "n", MaxRequestBytes: 2 << 20, GroupBy: "a..b"}, nil)
	want := `sqs x: queue_url and queue_name are exclusive
message_group_id: "a..b" is not a dotted field path
max_request_bytes must be between 1 and 1048576, got 2097152`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

func BenchmarkSend10(b *testing.B) {
	f := &fakeQueue{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	s, err := New(Config{Name: "q", QueueURL: srv.URL + "/1/q.fifo", Region: "us-east-1", Endpoint: srv.URL,
		Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")}, nil)
	if err != nil {
		b.Fatal(err)
	}
	evs := events(b, 10, 200)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Send(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
		f.mu.Lock()
		f.calls = f.calls[:0]
		f.mu.Unlock()
	}
}

// A transaction (transactions = "group") larger than one call goes out as
// consecutive entries of as few SendMessageBatch calls as the quotas allow
// (10 entries each), in order.
func TestSendTxnGroup(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, nil)
	evs := sinktest.Txn(events(t, 25, 100))
	if err := s.Send(sinks.WithTxnGroup(context.Background()), evs); err != nil {
		t.Fatal(err)
	}
	calls := f.snapshot()
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3", len(calls))
	}
	i := 0
	for _, c := range calls {
		for _, m := range c.Entries {
			if m.MessageDeduplicationId != DeduplicationID(evs[i]) {
				t.Fatalf("message %d out of order", i)
			}
			i++
		}
	}
	if i != 25 {
		t.Fatalf("%d messages, want 25", i)
	}
}
