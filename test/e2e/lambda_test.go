package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/deadletter"
	awstest "github.com/changegate/changegate/test/aws"
)

// TestLambdaSinkOutcomes runs three lambda sinks through the real app, each
// against its own test Lambda server (SigV4 verified):
//
//   - "sync" (RequestResponse): the first two calls (of documents 0-2) are
//     throttled (429 with Retry-After) and retried; document 3's function always fails
//     (X-Amz-Function-Error): it is invoked max_attempts times, then
//     dead-lettered with the function's error payload;
//   - "missing": the function does not exist: every event is dead-lettered
//     after one attempt;
//   - "batch" (Event, batch_size 4): every envelope arrives, in JSON arrays.
func TestLambdaSinkOutcomes(t *testing.T) {
	awsEnv(t)
	e := newEnv(t)
	syncSrv, missingSrv, batchSrv := awstest.NewLambda(awstest.Options{}), awstest.NewLambda(awstest.Options{}), awstest.NewLambda(awstest.Options{})
	for _, s := range []*awstest.Lambda{syncSrv, missingSrv, batchSrv} {
		t.Cleanup(s.Close)
	}
	docOf := func(payload []byte) int {
		var v struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}
		if err := json.Unmarshal(payload, &v); err != nil {
			t.Errorf("payload %s: %v", payload, err)
		}
		return v.DocumentKey.ID
	}
	var mu sync.Mutex
	runs := map[int]int{}
	syncSrv.AddFunction("step1", func(inv awstest.Invocation) awstest.Result {
		id := docOf(inv.Payload)
		mu.Lock()
		runs[id]++
		mu.Unlock()
		if id == 3 {
			return awstest.Result{Payload: []byte(`{"errorMessage":"job 3 is not in state pending","errorType":"StateError"}`), FunctionError: "Unhandled"}
		}
		return awstest.Result{Payload: []byte(`{"ok":true}`)}
	}, map[string]string{"live": "2"})
	batchSrv.AddFunction("audit", nil, nil)
	syncSrv.Throttle(2)

	cfg := e.config(itemsHead + fmt.Sprintf(`
[[sinks]]
name = "sync"
type = "lambda"
function = "step1:live"
invocation_type = "RequestResponse"
endpoint = %q
  [sinks.retry]
  max_attempts = 3
  initial_interval = "20ms"
  max_interval = "50ms"

[[sinks]]
name = "missing"
type = "lambda"
function = "nope"
endpoint = %q
  [sinks.retry]
  max_attempts = 3
  initial_interval = "20ms"
  max_interval = "50ms"

[[sinks]]
name = "batch"
type = "lambda"
function = %q
batch_size = 4
batch_wait = "50ms"
ordering = "none"
endpoint = %q

[[rules]]
name = "all"
source = "items"
sinks = ["sync", "missing", "batch"]
`, syncSrv.URL(), missingSrv.URL(), batchSrv.ARN("audit"), batchSrv.URL()))
	e.start(cfg)
	// A throttled call is an attempt: were document 3 among the two
	// throttled ones, it would run max_attempts - 1 times and the sync
	// sink would never see 12 invocations (the wait below timed out that
	// way in a CI run on a loaded machine, where the workers reach the
	// limiter in another order). Documents 0-2 take both throttles first.
	insertN(t, e.coll("items"), 0, 3)
	waitFor(t, 30*time.Second, "the two throttled sync calls", func() bool { return syncSrv.Calls("Invoke") >= 2 })
	insertN(t, e.coll("items"), 3, 7)

	_, dls := e.stores(cfg)
	ctx := context.Background()
	batchDocs := func() map[int]int {
		seen := map[int]int{}
		for _, inv := range batchSrv.Invocations() {
			var arr []json.RawMessage
			if err := json.Unmarshal(inv.Payload, &arr); err != nil {
				t.Fatalf("batch payload is not an array: %v", err)
			}
			for _, env := range arr {
				seen[docOf(env)]++
			}
		}
		return seen
	}
	var dead int64 // the last count the wait saw, for the failure report
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("at the end: %d failed dead letters (want 11), %d sync invocations (want 12), %d batch documents (want 10)",
				dead, len(syncSrv.Invocations()), len(batchDocs()))
		}
	})
	waitFor(t, 30*time.Second, "deliveries and dead letters", func() bool {
		dead, _ = dls.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
		return dead >= 11 && len(syncSrv.Invocations()) >= 12 && len(batchDocs()) >= 10
	})
	time.Sleep(300 * time.Millisecond) // nothing more arrives

	mu.Lock()
	for id := range 10 {
		want := 1
		if id == 3 {
			want = 3
		}
		if runs[id] != want {
			t.Errorf("sync: document %d run %d times, want %d", id, runs[id], want)
		}
	}
	mu.Unlock()
	// Two throttled calls, then 9 deliveries and 3 attempts of document 3.
	if n := syncSrv.Calls("Invoke"); n != 14 {
		t.Errorf("sync: %d Invoke calls, want 14 (2 throttled + 12 invocations)", n)
	}
	for _, inv := range syncSrv.Invocations() {
		if inv.Type != "RequestResponse" || inv.Qualifier != "live" {
			t.Errorf("sync invocation %+v", inv)
		}
	}
	if n := missingSrv.Calls("Invoke"); n != 10 {
		t.Errorf("missing: %d Invoke calls, want 10 (no retries)", n)
	}
	for id, n := range batchDocs() {
		if n != 1 {
			t.Errorf("batch: document %d delivered %d times", id, n)
		}
	}
	if syncSrv.Rejected()+missingSrv.Rejected()+batchSrv.Rejected() != 0 {
		t.Error("requests with bad signatures")
	}

	entries, err := dls.List(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
	if err != nil {
		t.Fatal(err)
	}
	bySink := map[string]int{}
	for _, en := range entries {
		bySink[en.Sink]++
		switch en.Sink {
		case "sync":
			if en.Reason != "exhausted" || en.Attempts != 3 || !strings.Contains(en.LastError, "job 3 is not in state pending") ||
				!strings.Contains(en.LastError, "Unhandled, version 2") {
				t.Errorf("sync dead letter: %s after %d attempts: %q", en.Reason, en.Attempts, en.LastError)
			}
		case "missing":
			if en.Reason != "ResourceNotFoundException" || en.Attempts != 1 || !strings.Contains(en.LastError, "Function not found") {
				t.Errorf("missing dead letter: %s after %d attempts: %q", en.Reason, en.Attempts, en.LastError)
			}
		default:
			t.Errorf("dead letter of sink %s: %s %q", en.Sink, en.Reason, en.LastError)
		}
	}
	if bySink["sync"] != 1 || bySink["missing"] != 10 {
		t.Errorf("dead letters per sink %v, want sync 1, missing 10", bySink)
	}
}

// TestSigV4WebhookEndToEnd: a webhook with auth = "aws_sigv4" and a
// Standard Webhooks secret, credentials from the default chain (the
// environment); the receiver plays a function URL with AuthType AWS_IAM:
// it recomputes every signature and refuses a bad one with 403 (which
// would dead-letter the event).
func TestSigV4WebhookEndToEnd(t *testing.T) {
	awsEnv(t)
	e := newEnv(t)
	var mu sync.Mutex
	var verified, refused int
	docs := map[int]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		err := awstest.VerifySigV4(r, body, awstest.Options{Region: "eu-west-1"}, "lambda")
		mu.Lock()
		defer mu.Unlock()
		if err != nil || r.Header.Get("webhook-signature") == "" {
			refused++
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		verified++
		var v envelope
		if json.Unmarshal(body, &v) == nil {
			docs[v.DocumentKey.ID] = true
		}
	}))
	t.Cleanup(srv.Close)
	cfg := e.config(itemsHead + fmt.Sprintf(`[[sinks]]
name = "url"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
auth = "aws_sigv4"
region = "eu-west-1"
allow_private_networks = true
[[rules]]
name = "all"
source = "items"
sinks = ["url"]
`, srv.URL))
	e.start(cfg)
	insertN(t, e.coll("items"), 0, 5)
	waitFor(t, 20*time.Second, "5 verified deliveries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(docs) == 5
	})
	mu.Lock()
	defer mu.Unlock()
	if refused != 0 || verified != 5 {
		t.Errorf("%d verified, %d refused; want 5, 0", verified, refused)
	}
}
