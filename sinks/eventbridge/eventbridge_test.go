package eventbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// fakeBus is a minimal EventBridge endpoint (AWS JSON 1.1, PutEvents).
// answer, when set, decides the reply to each call: an HTTP error (status
// and error code) or per-entry error codes ("" for success).
type fakeBus struct {
	mu     sync.Mutex
	calls  [][]putEntry
	auth   []string
	answer func(call int, entries []putEntry) (status int, code string, entryCodes []string)
}

type putEntry struct {
	Source, DetailType, Detail, EventBusName string
	Time                                     *float64
	Resources                                []string
	TraceHeader                              string
}

func (f *fakeBus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Amz-Target") != "AWSEvents.PutEvents" {
		http.Error(w, "unexpected target "+r.Header.Get("X-Amz-Target"), http.StatusBadRequest)
		return
	}
	var in struct{ Entries []putEntry }
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	call := len(f.calls)
	f.calls = append(f.calls, in.Entries)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	answer := f.answer
	f.mu.Unlock()
	status, code, codes := 200, "", []string(nil)
	if answer != nil {
		status, code, codes = answer(call, in.Entries)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	if status != 200 {
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"__type":%q,"message":"injected"}`, code)
		return
	}
	type result struct {
		EventId      string `json:",omitempty"`
		ErrorCode    string `json:",omitempty"`
		ErrorMessage string `json:",omitempty"`
	}
	out := struct {
		FailedEntryCount int
		Entries          []result
	}{}
	for i := range in.Entries {
		if i < len(codes) && codes[i] != "" {
			out.FailedEntryCount++
			out.Entries = append(out.Entries, result{ErrorCode: codes[i], ErrorMessage: "injected " + codes[i]})
			continue
		}
		out.Entries = append(out.Entries, result{EventId: fmt.Sprintf("id-%d-%d", call, i)})
	}
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeBus) snapshot() [][]putEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]putEntry(nil), f.calls...)
}

func newTestSink(t *testing.T, h http.Handler, mod func(*Config)) *EventBridge {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return sinktest.Open(t, New, Config{
		Name: "bus", EventBus: "orders", Region: "us-east-1", Endpoint: srv.URL,
		Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		Timeout:     5 * time.Second,
	}, mod)
}

func testEvent(t testing.TB, n int, padding int) *event.Event {
	t.Helper()
	doc := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08d", n)}}},
		{Key: "operationType", Value: "insert"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: n}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: n}, {Key: "pad", Value: strings.Repeat("x", padding)}}},
		{Key: "wallTime", Value: bson.DateTime(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).UnixMilli())},
	}
	e := sinktest.FromDoc(t, "orders", n, doc)
	e.Rules = []string{"r"}
	return e
}

func events(t testing.TB, n, padding int) []*event.Event {
	out := make([]*event.Event, n)
	for i := range out {
		out[i] = testEvent(t, i, padding)
	}
	return out
}

func TestSendEntries(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, func(c *Config) { c.Resources = []string{"arn:aws:s3:::bucket"} })
	evs := events(t, 3, 10)
	if err := b.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	calls := f.snapshot()
	if len(calls) != 1 || len(calls[0]) != 3 {
		t.Fatalf("calls = %d, want one of 3 entries", len(calls))
	}
	for i, e := range calls[0] {
		env, _ := evs[i].Envelope(false)
		if e.Source != "changegate.orders" || e.DetailType != "shop.orders.insert" || e.EventBusName != "orders" {
			t.Errorf("entry %d: source %q detail type %q bus %q", i, e.Source, e.DetailType, e.EventBusName)
		}
		if e.Detail != string(env) {
			t.Errorf("entry %d: detail %s, want the envelope %s", i, e.Detail, env)
		}
		if e.Time == nil || int64(*e.Time) != evs[i].WallTime.Unix() {
			t.Errorf("entry %d: time %v, want %v", i, e.Time, evs[i].WallTime)
		}
		if len(e.Resources) != 1 || e.Resources[0] != "arn:aws:s3:::bucket" {
			t.Errorf("entry %d: resources %v", i, e.Resources)
		}
	}
	if a := f.auth[0]; !strings.Contains(a, "AWS4-HMAC-SHA256 Credential=AKIDTEST/") || !strings.Contains(a, "/us-east-1/events/aws4_request") {
		t.Errorf("authorization header %q: not signed with the static test credentials", a)
	}
}

func TestTemplates(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, func(c *Config) {
		c.Source = "com.example.{source}"
		c.DetailType = "{{{operationType}}} on {db}/{coll}"
	})
	if err := b.Send(context.Background(), events(t, 1, 0)); err != nil {
		t.Fatal(err)
	}
	e := f.snapshot()[0][0]
	if e.Source != "com.example.orders" || e.DetailType != "{insert} on shop/orders" {
		t.Errorf("source %q, detail type %q", e.Source, e.DetailType)
	}
	for _, bad := range []string{"{nope}", "{db", "a}b"} {
		if _, err := CompileTemplate(bad); err == nil {
			t.Errorf("CompileTemplate(%q) succeeded", bad)
		}
	}
}

func TestByteLimitSplitsCalls(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, func(c *Config) { c.MaxRequestBytes = 2000 })
	evs := events(t, 10, 500) // ~750 bytes per entry: 2 per call
	size := 0
	for _, e := range evs {
		env, _ := e.Envelope(false)
		size = timeEntryBytes + len("changegate.orders") + len("shop.orders.insert") + len(env)
	}
	if err := b.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	calls := f.snapshot()
	total := 0
	for _, c := range calls {
		n := 0
		for _, e := range c {
			n += EntrySize(types.PutEventsRequestEntry{
				Source: &e.Source, DetailType: &e.DetailType, Detail: &e.Detail, Time: aws.Time(time.Now()),
			})
		}
		if n > 2000 || len(c) > MaxEntries {
			t.Errorf("call of %d entries, %d bytes: over the limits", len(c), n)
		}
		total += len(c)
	}
	if total != 10 || len(calls) != (10+2000/size-1)/(2000/size) {
		t.Errorf("%d calls, %d entries (entry size %d)", len(calls), total, size)
	}
	// Order is kept across calls.
	k := 0
	for _, c := range calls {
		for _, e := range c {
			env, _ := evs[k].Envelope(false)
			if e.Detail != string(env) {
				t.Fatalf("entry %d out of order", k)
			}
			k++
		}
	}
}

func TestOversize(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, func(c *Config) { c.MaxRequestBytes = 1000 })
	evs := []*event.Event{testEvent(t, 0, 10), testEvent(t, 1, 2000), testEvent(t, 2, 10)}
	err := b.Send(context.Background(), evs)
	var be *sinks.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[1] == nil {
		t.Fatalf("err = %v, want a BatchError for entry 1", err)
	}
	var de *sinks.Error
	if !errors.As(be.Failed[1], &de) || !de.Permanent || de.Reason != "oversize" {
		t.Fatalf("entry 1: %v, want permanent oversize", be.Failed[1])
	}
	if !strings.Contains(de.Error(), "more than the request limit of 1000 bytes") || !strings.Contains(de.Error(), evs[1].ID) {
		t.Errorf("message %q does not give the size and limit", de)
	}
	if calls := f.snapshot(); len(calls) != 1 || len(calls[0]) != 2 {
		t.Errorf("calls %v, want one call with the 2 other entries", calls)
	}
	// Alone: a plain permanent error in a BatchError all the same.
	err = b.Send(context.Background(), evs[1:2])
	if !errors.As(err, &be) || !errors.As(be.Failed[0], &de) || de.Reason != "oversize" {
		t.Fatalf("single oversize: %v", err)
	}
}

// A Source template that expands to nothing (here {coll} of a
// database-level event) fails only that entry, before the call, instead of
// the whole PutEvents request.
func TestEmptySourceFailsOnlyItsEntry(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, func(c *Config) { c.Source = "{coll}" })
	evs := events(t, 3, 10)
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8299"}}},
		{Key: "operationType", Value: "dropDatabase"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dropDB, err := event.FromChange("orders", 9, raw)
	if err != nil {
		t.Fatal(err)
	}
	evs[1] = dropDB
	err = b.Send(context.Background(), evs)
	var be *sinks.BatchError
	var de *sinks.Error
	if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.As(be.Failed[1], &de) || !de.Permanent || de.Reason != "source" {
		t.Fatalf("err = %v, want entry 1 failed permanently with reason source", err)
	}
	if calls := f.snapshot(); len(calls) != 1 || len(calls[0]) != 2 {
		t.Errorf("calls %v, want one call with the 2 other entries", calls)
	}
}

func TestPartialFailure(t *testing.T) {
	f := &fakeBus{answer: func(call int, es []putEntry) (int, string, []string) {
		codes := make([]string, len(es))
		codes[1] = "ThrottlingException"
		codes[3] = "MalformedDetail"
		codes[4] = "SomethingNew"
		codes[5] = "InternalFailure"
		codes[6] = "NotAuthorizedForSourceException"
		return 200, "", codes
	}}
	b := newTestSink(t, f, nil)
	err := b.Send(context.Background(), events(t, 8, 0))
	var be *sinks.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want BatchError", err)
	}
	want := map[int]struct {
		perm   bool
		reason string
	}{
		1: {false, "throttled"}, 3: {true, "MalformedDetail"}, 4: {false, "SomethingNew"},
		5: {false, "InternalFailure"}, 6: {true, "NotAuthorizedForSourceException"},
	}
	if len(be.Failed) != len(want) {
		t.Errorf("failed %v, want indexes 1 3 4 5 6", be.Failed)
	}
	for i, w := range want {
		var de *sinks.Error
		if !errors.As(be.Failed[i], &de) || de.Permanent != w.perm || de.Reason != w.reason {
			t.Errorf("entry %d: %#v, want permanent=%v reason %q", i, be.Failed[i], w.perm, w.reason)
		}
	}
}

func TestCallErrors(t *testing.T) {
	tests := []struct {
		status int
		code   string
		perm   bool
		reason string
	}{
		{400, "ThrottlingException", false, "throttled"},
		{429, "", false, "throttled"},
		{500, "InternalException", false, "InternalException"},
		{503, "ServiceUnavailable", false, "ServiceUnavailable"},
		{400, "ValidationException", true, "ValidationException"},
		{400, "AccessDeniedException", true, "AccessDeniedException"},
		{400, "ResourceNotFoundException", true, "ResourceNotFoundException"},
		{400, "ExpiredTokenException", false, "ExpiredTokenException"},
		{403, "", true, "http_403"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%s", tt.status, tt.code), func(t *testing.T) {
			f := &fakeBus{answer: func(int, []putEntry) (int, string, []string) { return tt.status, tt.code, nil }}
			b := newTestSink(t, f, nil)
			err := b.Send(context.Background(), events(t, 3, 0))
			sinktest.CheckError(t, "call", err, tt.perm, tt.reason)
			if n := len(f.snapshot()); n != 1 {
				t.Errorf("%d requests: the SDK must not retry answers", n)
			}
		})
	}
}

func TestSplitCallFailureStops(t *testing.T) {
	f := &fakeBus{answer: func(call int, _ []putEntry) (int, string, []string) {
		if call == 0 {
			return 400, "AccessDeniedException", nil
		}
		return 200, "", nil
	}}
	b := newTestSink(t, f, func(c *Config) { c.MaxRequestBytes = 2000 })
	err := b.Send(context.Background(), events(t, 6, 500))
	be := sinktest.BatchFailures(t, err, 6)
	var first, last *sinks.Error
	errors.As(be.Failed[0], &first)
	errors.As(be.Failed[5], &last)
	if !first.Permanent || last.Permanent || last.Reason != "not_sent" {
		t.Errorf("first %v, last %v: want permanent, then retryable not_sent", first, last)
	}
	if n := len(f.snapshot()); n != 1 {
		t.Errorf("%d calls after a failed one, want 1", n)
	}
}

func TestTransportAndTimeout(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	b, err := New(Config{Name: "bus", EventBus: "b", Region: "us-east-1", Endpoint: url,
		Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Send(context.Background(), events(t, 1, 0))
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent || de.Reason != "transport" {
		t.Errorf("refused: %v, want retryable transport", err)
	}

	stall := make(chan struct{})
	defer close(stall)
	slow := newTestSink(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}), func(c *Config) { c.Timeout = 100 * time.Millisecond })
	err = slow.Send(context.Background(), events(t, 1, 0))
	if !errors.As(err, &de) || de.Permanent || de.Reason != "timeout" {
		t.Errorf("stalled: %v, want retryable timeout", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = slow.Send(ctx, events(t, 1, 0))
	if !errors.Is(err, context.Canceled) || errors.As(err, &de) {
		t.Errorf("cancelled: %v, want context.Canceled and no *sinks.Error", err)
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := New(Config{Name: "x", MaxRequestBytes: 2000000, DetailType: "{bad}", Region: "us-east-1"}, nil)
	want := `eventbridge x: event_bus is required
max_request_bytes must be between 1 and 1048576, got 2000000
detail_type: unknown placeholder {bad}; allowed: {db}, {coll}, {operationType}, {source}`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

func BenchmarkSend10(b *testing.B) {
	f := &fakeBus{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	s, err := New(Config{Name: "bus", EventBus: "orders", Region: "us-east-1", Endpoint: srv.URL,
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
		f.calls, f.auth = f.calls[:0], f.auth[:0]
		f.mu.Unlock()
	}
}

func BenchmarkTemplate(b *testing.B) {
	t := MustCompileTemplate(DefaultDetailType)
	e := testEvent(b, 1, 0)
	b.ReportAllocs()
	for b.Loop() {
		_ = t.Execute(e)
	}
}

// TestCredentialsFailure: credentials that cannot be retrieved (here
// role_arn assumed through an STS endpoint that refuses with 403, as it does
// for a few seconds after a role or its trust policy changes) are retried
// with reason "credentials", not dead-lettered as if PutEvents had refused
// the entries.
func TestCredentialsFailure(t *testing.T) {
	stsSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/xml")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>not authorized to perform sts:AssumeRole</Message></Error><RequestId>1</RequestId></ErrorResponse>`)
	}))
	defer stsSrv.Close()
	t.Setenv("AWS_ENDPOINT_URL_STS", stsSrv.URL)
	bus := &fakeBus{}
	b := newTestSink(t, bus, func(c *Config) { c.RoleARN = "arn:aws:iam::123456789012:role/publisher" })
	err := b.Send(context.Background(), []*event.Event{testEvent(t, 0, 0)})
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent || de.Reason != "credentials" {
		t.Fatalf("%v: want a retryable error with reason credentials", err)
	}
	if n := len(bus.snapshot()); n != 0 {
		t.Errorf("%d PutEvents calls without credentials", n)
	}
}

// TestClockSkew: with the machine's clock 15 minutes behind, EventBridge
// refuses the signature (InvalidSignatureException, "Signature expired")
// and its Date header shows the skew. That is not the entries' fault: the
// SDK corrects its clock from the answer, so the batch must be retried, not
// dead-lettered; the next call succeeds.
func TestClockSkew(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if n == 1 {
			w.Header().Set("Date", time.Now().Add(15*time.Minute).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"__type":"InvalidSignatureException","message":"Signature expired: 20260101T000000Z is now earlier than 20260101T001000Z (20260101T001500Z - 5 min.)"}`)
			return
		}
		fmt.Fprint(w, `{"FailedEntryCount":0,"Entries":[{"EventId":"1"}]}`)
	})
	b := newTestSink(t, h, nil)
	err := b.Send(context.Background(), events(t, 1, 0))
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent {
		t.Fatalf("%v: want a retryable error", err)
	}
	if err := b.Send(context.Background(), events(t, 1, 0)); err != nil {
		t.Fatalf("after the skew was corrected: %v", err)
	}
}

// With oversize = "strip" an entry over the limit goes without its
// document, marked truncated, and is counted; one small enough is sent
// whole.
func TestOversizeStrip(t *testing.T) {
	f := &fakeBus{}
	var stripped, refused atomic.Int64
	b := newTestSink(t, f, func(c *Config) {
		c.MaxRequestBytes = 1000
		c.Oversize = sinks.Oversize{Strip: true, Stripped: incFunc(stripped.Add), Refused: incFunc(refused.Add)}
	})
	evs := []*event.Event{testEvent(t, 0, 10), testEvent(t, 1, 2000)}
	if err := b.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	calls := f.snapshot()
	if len(calls) != 1 || len(calls[0]) != 2 {
		t.Fatalf("calls %v", calls)
	}
	whole, _ := evs[0].Envelope(false)
	if calls[0][0].Detail != string(whole) {
		t.Errorf("small entry changed: %s", calls[0][0].Detail)
	}
	d := calls[0][1].Detail
	if strings.Contains(d, "fullDocument") || !strings.Contains(d, `"truncated":true`) ||
		!strings.Contains(d, `"documentKey":{"_id":1}`) || !strings.Contains(d, `"id":"`+evs[1].ID+`"`) {
		t.Errorf("stripped entry: %s", d)
	}
	if stripped.Load() != 1 || refused.Load() != 0 {
		t.Errorf("counted %d stripped, %d refused; want 1, 0", stripped.Load(), refused.Load())
	}
}

// incFunc adapts an atomic Add to sinks.Counter.
type incFunc func(int64) int64

func (f incFunc) Inc() { f(1) }

// A transaction (transactions = "group") of 23 events goes out as
// consecutive entries of 3 PutEvents calls (10 entries each at most), in
// order.
func TestSendTxnGroup(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, nil)
	evs := sinktest.Txn(events(t, 23, 100))
	if err := b.Send(sinks.WithTxnGroup(context.Background()), evs); err != nil {
		t.Fatal(err)
	}
	calls := f.snapshot()
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3", len(calls))
	}
	k := 0
	for _, c := range calls {
		for _, e := range c {
			env, _ := evs[k].Envelope(false)
			if e.Detail != string(env) {
				t.Fatalf("entry %d out of order", k)
			}
			k++
		}
	}
	if k != 23 {
		t.Fatalf("%d entries, want 23", k)
	}
}

// In a transaction's batch (transactions = "group") a refused call fails
// the entries of the later calls for good, with its answer, unsent.
func TestSplitCallFailureStopsTxn(t *testing.T) {
	f := &fakeBus{answer: func(call int, _ []putEntry) (int, string, []string) {
		if call == 0 {
			return 400, "AccessDeniedException", nil
		}
		return 200, "", nil
	}}
	b := newTestSink(t, f, func(c *Config) { c.MaxRequestBytes = 2000 })
	err := b.Send(sinks.WithTxnGroup(context.Background()), sinktest.Txn(events(t, 6, 500)))
	be := sinktest.BatchFailures(t, err, 6)
	for i := range 6 {
		sinktest.CheckError(t, fmt.Sprint("entry ", i), be.Failed[i], true, "AccessDeniedException")
	}
	if n := len(f.snapshot()); n != 1 {
		t.Errorf("%d calls after a failed one, want 1", n)
	}
}

// In a transaction's batch an entry refused for good (MalformedDetail)
// refuses the transaction: the later calls are not made and their entries
// fail for good with its answer; the other entries of its call were
// accepted. In a plain batch the later calls go on.
func TestSplitEntryRefusedStopsTxn(t *testing.T) {
	for _, txn := range []bool{true, false} {
		f := &fakeBus{answer: func(call int, es []putEntry) (int, string, []string) {
			if call == 0 {
				return 200, "", []string{"", "MalformedDetail"}
			}
			return 200, "", nil
		}}
		b := newTestSink(t, f, func(c *Config) { c.MaxRequestBytes = 2000 })
		ctx := context.Background()
		if txn {
			ctx = sinks.WithTxnGroup(ctx)
		}
		err := b.Send(ctx, sinktest.Txn(events(t, 6, 500)))
		calls := len(f.snapshot())
		if !txn {
			be := sinktest.BatchFailures(t, err, 1)
			sinktest.CheckError(t, "entry 1", be.Failed[1], true, "MalformedDetail")
			if calls < 2 {
				t.Fatalf("plain batch: %d calls, want the later ones made", calls)
			}
			continue
		}
		if calls != 1 {
			t.Fatalf("%d calls, want 1 (none after the refused entry)", calls)
		}
		perCall := len(f.snapshot()[0])
		be := sinktest.BatchFailures(t, err, 6-perCall+1)
		for i := range 6 {
			if i == 0 || (i > 1 && i < perCall) {
				if be.Failed[i] != nil {
					t.Errorf("entry %d of the first call failed: %v", i, be.Failed[i])
				}
				continue
			}
			de := sinktest.CheckError(t, fmt.Sprint("entry ", i), be.Failed[i], true, "MalformedDetail")
			if de != nil && !strings.Contains(de.Error(), "injected MalformedDetail") {
				t.Errorf("entry %d: %v does not carry the answer", i, de)
			}
		}
	}
}
