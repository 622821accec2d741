package lambda

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// These tests run the sink against test/aws's Lambda server, which
// verifies every request's SigV4 signature (service "lambda") and answers
// as the Invoke API does.

func changeDoc(t testing.TB, n int, docID any, padding int) *event.Event {
	t.Helper()
	doc := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08d%s", n, strings.Repeat("A", 40))}}},
		{Key: "operationType", Value: "update"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "jobs"}, {Key: "coll", Value: "jobs"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: docID}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: docID}, {Key: "state", Value: "step1"}, {Key: "pad", Value: strings.Repeat("x", padding)}}},
	}
	e := sinktest.FromDoc(t, "jobs", n, doc)
	return e
}

func events(t testing.TB, n, padding int) []*event.Event {
	out := make([]*event.Event, n)
	for i := range out {
		out[i] = changeDoc(t, i, i, padding)
	}
	return out
}

func newSink(t *testing.T, srv *awstest.Lambda, mod func(*Config)) *Lambda {
	t.Helper()
	return sinktest.Open(t, New, Config{
		Name: "step1", Function: "step1", Region: awstest.DefaultRegion, Endpoint: srv.URL(),
		Credentials: srv.Config().Credentials,
		Timeout:     5 * time.Second,
	}, mod)
}

func envelope(t *testing.T, e *event.Event) []byte {
	env, err := e.Envelope(false)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestInvokeAsyncAndSync(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, map[string]string{"live": "4"})
	ctx := context.Background()
	evs := events(t, 2, 0)

	async := newSink(t, srv, nil)
	if err := async.Send(ctx, evs[:1]); err != nil {
		t.Fatal(err)
	}
	sync := newSink(t, srv, func(c *Config) {
		c.Function = srv.ARN("step1")
		c.Qualifier = "live"
		c.InvocationType = InvocationRequestResponse
		c.ClientContext = `{"custom":{"from":"changegate"}}`
	})
	if err := sync.Send(ctx, evs[1:]); err != nil {
		t.Fatal(err)
	}
	invs := srv.Invocations()
	if len(invs) != 2 || srv.Rejected() != 0 {
		t.Fatalf("invocations %+v, rejected %d", invs, srv.Rejected())
	}
	if invs[0].Type != "Event" || invs[0].Qualifier != "" || invs[0].ClientContext != "" || !bytes.Equal(invs[0].Payload, envelope(t, evs[0])) {
		t.Errorf("async invocation %+v", invs[0])
	}
	if invs[1].Type != "RequestResponse" || invs[1].Qualifier != "live" || invs[1].Function != "step1" ||
		invs[1].ClientContext != `{"custom":{"from":"changegate"}}` || !bytes.Equal(invs[1].Payload, envelope(t, evs[1])) {
		t.Errorf("sync invocation %+v", invs[1])
	}
	// Same events again: the payload (and so the event ids) is unchanged.
	if err := async.Send(ctx, evs[:1]); err != nil || !bytes.Equal(srv.Invocations()[2].Payload, invs[0].Payload) {
		t.Errorf("re-delivery: %v", err)
	}
}

// A synchronous function that fails (X-Amz-Function-Error) fails the
// event, retryably, quoting the function's error payload (truncated); an
// asynchronous invocation of the same function is delivered: its failure
// is Lambda's to retry.
func TestFunctionError(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	long := strings.Repeat("y", 10000)
	srv.AddFunction("step1", func(inv awstest.Invocation) awstest.Result {
		return awstest.Result{Payload: []byte(`{"errorMessage":"state is not pending` + long + `","errorType":"Error"}`), FunctionError: "Unhandled"}
	}, nil)
	ctx := context.Background()
	sync := newSink(t, srv, func(c *Config) { c.InvocationType = InvocationRequestResponse })
	de := sinktest.CheckError(t, "function error", sync.Send(ctx, events(t, 1, 0)), false, "function_error")
	if de != nil {
		msg := de.Error()
		if !strings.Contains(msg, "function error (Unhandled, version $LATEST)") || !strings.Contains(msg, `"errorMessage":"state is not pending`) ||
			!strings.HasSuffix(msg, "...") || len(msg) > MaxFunctionErrorBytes+200 {
			t.Errorf("message (%d bytes) %.300q", len(msg), msg)
		}
		// What the delivery's observers record: the function's error
		// kind and at most 1 KiB of its answer.
		if de.Code != "Unhandled" || de.Status != 200 || !strings.HasPrefix(de.Answer, `{"errorMessage":"state is not pending`) || len(de.Answer) > sinks.MaxAnswer {
			t.Errorf("code %q, status %d, answer (%d bytes) %.80q", de.Code, de.Status, len(de.Answer), de.Answer)
		}
	}
	if err := newSink(t, srv, nil).Send(ctx, events(t, 1, 0)); err != nil {
		t.Errorf("async: %v", err)
	}
}

func TestThrottlingAndServerErrors(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	ctx := context.Background()
	s := newSink(t, srv, func(c *Config) { c.Timeout = 300 * time.Millisecond })

	srv.SetRetryAfter("7")
	srv.Throttle(1)
	if de := sinktest.CheckError(t, "throttled", s.Send(ctx, events(t, 1, 0)), false, "throttled"); de != nil && de.RetryAfter != 7*time.Second {
		t.Errorf("RetryAfter = %s, want 7s", de.RetryAfter)
	}
	srv.FailStatus(1, 500)
	sinktest.CheckError(t, "500", s.Send(ctx, events(t, 1, 0)), false, "ServiceException")
	srv.FailStatus(1, 502)
	sinktest.CheckError(t, "502", s.Send(ctx, events(t, 1, 0)), false, "ServiceException")
	srv.Stall(time.Minute)
	sinktest.CheckError(t, "stalled", s.Send(ctx, events(t, 1, 0)), false, "timeout")
	srv.Stall(0)
	// One throttled call is one request: the SDK's retryer does not retry
	// it behind the engine's back.
	if n := srv.Calls("Invoke"); n != 4 {
		t.Errorf("%d Invoke calls, want 4 (no SDK retries)", n)
	}
	if n := len(srv.Invocations()); n != 0 {
		t.Errorf("%d invocations stored after failures", n)
	}
	if err := s.Send(ctx, events(t, 1, 0)); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

func TestPermanentFailures(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	ctx := context.Background()
	sinktest.CheckError(t, "not found", newSink(t, srv, func(c *Config) { c.Function = "step9" }).Send(ctx, events(t, 1, 0)), true, "ResourceNotFoundException")
	sinktest.CheckError(t, "unknown alias", newSink(t, srv, func(c *Config) { c.Qualifier = "nope" }).Send(ctx, events(t, 1, 0)), true, "ResourceNotFoundException")
	bad := newSink(t, srv, func(c *Config) {
		c.Credentials = credentials.NewStaticCredentialsProvider(awstest.AccessKeyID, "wrong-secret", "")
	})
	sinktest.CheckError(t, "bad signature", bad.Send(ctx, events(t, 1, 0)), true, "InvalidSignatureException")
	// A server limit below the sink's: the 413 is permanent too.
	small := awstest.NewLambda(awstest.Options{MaxRequestSize: 200})
	defer small.Close()
	small.AddFunction("step1", nil, nil)
	sinktest.CheckError(t, "413", newSink(t, small, nil).Send(ctx, events(t, 1, 0)), true, "RequestEntityTooLargeException")
	if n := srv.Calls("Invoke"); n != 2 {
		t.Errorf("%d Invoke calls, want 2 (one each, no retries)", n)
	}
}

// With batch_size > 1 the payload is a JSON array of envelopes, split into
// as few invocations as the payload limit allows, in order.
func TestBatchArrays(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	evs := events(t, 5, 300)
	one := len(envelope(t, evs[0]))
	// Room for exactly two envelopes per invocation.
	limit := sinks.JSONArraySize(one, one)
	s := newSink(t, srv, func(c *Config) { c.BatchSize = 5; c.MaxPayloadBytes = limit })
	if err := s.Send(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	invs := srv.Invocations()
	if len(invs) != 3 {
		t.Fatalf("%d invocations, want 3 (2+2+1)", len(invs))
	}
	var got []string
	for _, inv := range invs {
		var arr []json.RawMessage
		if err := json.Unmarshal(inv.Payload, &arr); err != nil {
			t.Fatalf("payload is not a JSON array: %v", err)
		}
		if len(inv.Payload) > limit {
			t.Errorf("payload of %d bytes over the limit %d", len(inv.Payload), limit)
		}
		for _, env := range arr {
			got = append(got, string(env))
		}
	}
	for i, e := range evs {
		if i >= len(got) || got[i] != string(envelope(t, e)) {
			t.Fatalf("envelope %d not delivered in order", i)
		}
	}
	// A batch of one is still an array.
	if err := s.Send(context.Background(), evs[:1]); err != nil || !bytes.HasPrefix(srv.Invocations()[3].Payload, []byte("[{")) {
		t.Errorf("batch of one: %v", err)
	}
}

// An event over the limit is dead-lettered (permanent "oversize") without
// an invocation, or, with oversize = "strip", sent without its documents
// and counted.
func TestOversize(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	ctx := context.Background()
	evs := []*event.Event{changeDoc(t, 0, 0, 10), changeDoc(t, 1, 1, 3000), changeDoc(t, 2, 2, 10)}

	for _, batch := range []int{1, 3} {
		srv.Reset()
		s := newSink(t, srv, func(c *Config) { c.MaxPayloadBytes = 1500; c.BatchSize = batch })
		err := s.Send(ctx, evs)
		var be *sinks.BatchError
		if batch == 1 {
			// One event per Send, as the engine calls a sink of batch size 1.
			err = s.Send(ctx, evs[1:2])
			sinktest.CheckError(t, "oversize alone", err, true, "oversize")
			continue
		}
		if !errors.As(err, &be) || len(be.Failed) != 1 {
			t.Fatalf("batch %d: %v, want only the oversize event failed", batch, err)
		}
		sinktest.CheckError(t, "oversize in batch", be.Failed[1], true, "oversize")
		if invs := srv.Invocations(); len(invs) != 1 || bytes.Contains(invs[0].Payload, []byte(evs[1].ID)) {
			t.Errorf("batch %d: invocations %d, or the oversize event was sent", batch, len(invs))
		}
	}
	if n := srv.Calls("Invoke"); n != 1 {
		t.Errorf("the oversize event reached the server (%d calls)", n)
	}

	srv.Reset()
	var stripped counter
	strip := newSink(t, srv, func(c *Config) {
		c.MaxPayloadBytes = 1500
		c.Oversize = sinks.Oversize{Strip: true, Stripped: &stripped}
	})
	if err := strip.Send(ctx, evs[1:2]); err != nil {
		t.Fatal(err)
	}
	if stripped.n.Load() != 1 {
		t.Errorf("counted %d stripped events, want 1", stripped.n.Load())
	}
	p := string(srv.Invocations()[0].Payload)
	if strings.Contains(p, "fullDocument") || !strings.Contains(p, `"truncated":true`) || !strings.Contains(p, `"id":"`+evs[1].ID+`"`) {
		t.Errorf("stripped payload: %s", p)
	}
}

// The payload limits are the invocation type's by default: a 2 MiB event
// is too large for an Event invocation and fine for a RequestResponse one.
func TestDefaultLimits(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	ctx := context.Background()
	big := []*event.Event{changeDoc(t, 0, 0, 2<<20)}
	sinktest.CheckError(t, "async 2 MiB", newSink(t, srv, nil).Send(ctx, big), true, "oversize")
	if err := newSink(t, srv, func(c *Config) { c.InvocationType = InvocationRequestResponse }).Send(ctx, big); err != nil {
		t.Errorf("sync 2 MiB: %v", err)
	}
	if MaxPayload(InvocationEvent) != awstest.DefaultLambdaAsyncMaxPayload || MaxPayload(InvocationRequestResponse) != awstest.DefaultLambdaSyncMaxPayload {
		t.Error("the sink's limits differ from the test server's")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "function is required"},
		{Config{Function: "f", InvocationType: "DryRun"}, `invocation_type must be "Event" or "RequestResponse", got "DryRun"`},
		{Config{Function: "f", ClientContext: "[1]"}, "client_context: must be a JSON object"},
		{Config{Function: "f", ClientContext: `{"a":"` + strings.Repeat("x", 3000) + `"}`}, "more than Lambda's 3583"},
		{Config{Function: "f", MaxPayloadBytes: 2 << 20}, "max_request_bytes must be between 1 and 1048576 for Event invocations"},
	} {
		_, err := New(tc.cfg, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"0123456789abc", 10, "0123456789..."},
		{"a\nb", 10, "a b"},
		{"ééééé", 5, "éé..."},
		{"\xff", 10, "\uFFFD"},
	} {
		if got := quote([]byte(tc.in), tc.n); got != tc.want {
			t.Errorf("quote(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// Errors Lambda answers when it cannot run the function: "not now" ones
// are retried, the others dead-lettered at once.
func TestInvokeErrorClasses(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	var next atomic.Pointer[awstest.InvokeError]
	srv.AddFunction("step1", func(awstest.Invocation) awstest.Result {
		return awstest.Result{Error: next.Load()}
	}, nil)
	s := newSink(t, srv, nil)
	for _, tc := range []struct {
		status  int
		code    string
		service bool
		perm    bool
		reason  string
	}{
		{400, "InvalidRequestContentException", false, true, "InvalidRequestContentException"},
		{413, "RequestTooLargeException", false, true, "RequestTooLargeException"},
		{403, "AccessDeniedException", false, true, "AccessDeniedException"},
		{415, "UnsupportedMediaTypeException", false, true, "UnsupportedMediaTypeException"},
		{400, "RecursiveInvocationException", false, true, "RecursiveInvocationException"},
		{409, "ResourceConflictException", false, false, "ResourceConflictException"},
		{409, "SnapStartNotReadyException", false, false, "SnapStartNotReadyException"},
		{502, "EC2ThrottledException", true, false, "throttled"},
		{502, "KMSAccessDeniedException", true, false, "KMSAccessDeniedException"},
		{502, "ResourceNotReadyException", true, false, "ResourceNotReadyException"},
		{500, "ServiceException", true, false, "ServiceException"},
	} {
		next.Store(&awstest.InvokeError{Status: tc.status, Code: tc.code, Message: "injected", Service: tc.service})
		sinktest.CheckError(t, tc.code, s.Send(context.Background(), events(t, 1, 0)), tc.perm, tc.reason)
	}
	if n := len(srv.Invocations()); n != 0 {
		t.Errorf("%d invocations stored", n)
	}
}

// counter is a sinks.Counter.
type counter struct{ n atomic.Int64 }

func (c *counter) Inc() { c.n.Add(1) }

// A transaction (transactions = "group") is one invocation with a JSON
// array whatever batch_size says; one over the payload limit is split in
// order into invocations whose elements carry part and parts.
func TestSendTxnGroup(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	srv.AddFunction("step1", nil, nil)
	ctx := sinks.WithTxnGroup(context.Background())
	txn := func(n int) []*event.Event {
		return sinktest.Txn(events(t, n, 300))
	}
	type elem struct {
		Txn struct{ Index, Part, Parts int } `json:"txn"`
	}
	parse := func(p []byte) []elem {
		var out []elem
		if err := json.Unmarshal(p, &out); err != nil {
			t.Fatalf("payload is not an array: %v", err)
		}
		return out
	}
	s := newSink(t, srv, nil) // batch_size 1
	if err := s.Send(ctx, txn(6)); err != nil {
		t.Fatal(err)
	}
	invs := srv.Invocations()
	if len(invs) != 1 || len(parse(invs[0].Payload)) != 6 {
		t.Fatalf("%d invocations, want one array of 6", len(invs))
	}
	srv.Reset()
	s = newSink(t, srv, func(c *Config) { c.MaxPayloadBytes = 2500 })
	if err := s.Send(ctx, txn(6)); err != nil {
		t.Fatal(err)
	}
	invs = srv.Invocations()
	if len(invs) < 2 {
		t.Fatalf("%d invocations, want parts", len(invs))
	}
	idx := 0
	for p, inv := range invs {
		if len(inv.Payload) > 2500 {
			t.Errorf("part %d: %d bytes over the limit", p+1, len(inv.Payload))
		}
		for _, e := range parse(inv.Payload) {
			if e.Txn.Index != idx || e.Txn.Part != p+1 || e.Txn.Parts != len(invs) {
				t.Fatalf("part %d: element %+v, want index %d", p+1, e.Txn, idx)
			}
			idx++
		}
	}
	if idx != 6 {
		t.Fatalf("%d events invoked, want 6", idx)
	}
}

// A refused invocation of a split transaction fails its events and those
// of every later part for good, with Lambda's answer; the later parts are
// not invoked.
func TestSendTxnGroupRefusedPart(t *testing.T) {
	srv := awstest.NewLambda(awstest.Options{})
	defer srv.Close()
	var n atomic.Int32
	srv.AddFunction("step1", func(awstest.Invocation) awstest.Result {
		if n.Add(1) == 2 {
			return awstest.Result{Error: &awstest.InvokeError{Status: 400, Code: "InvalidRequestContentException", Message: "refused: part two"}}
		}
		return awstest.Result{}
	}, nil)
	s := newSink(t, srv, func(c *Config) { c.MaxPayloadBytes = 2500 })
	evs := sinktest.Txn(events(t, 12, 300))
	err := s.Send(sinks.WithTxnGroup(context.Background()), evs)
	if got := n.Load(); got != 2 {
		t.Fatalf("%d invocations, want 2 (none after the refused part)", got)
	}
	var be *sinks.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want a batch error", err)
	}
	first := -1
	for i := range evs {
		ferr, failed := be.Failed[i]
		if !failed {
			if first >= 0 {
				t.Fatalf("entry %d not failed after failed entry %d", i, first)
			}
			continue
		}
		if first < 0 {
			first = i
		}
		de := sinktest.CheckError(t, fmt.Sprint("entry ", i), ferr, true, "InvalidRequestContentException")
		if de != nil && !strings.Contains(de.Error(), "refused: part two") {
			t.Errorf("entry %d: %v does not carry Lambda's answer", i, de)
		}
	}
	if first <= 0 || len(be.Failed) != len(evs)-first {
		t.Fatalf("failed %d entries from %d, want every entry from the second part on", len(be.Failed), first)
	}
}
