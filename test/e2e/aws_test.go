package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/deadletter"
	awstest "github.com/changegate/changegate/test/aws"
	"github.com/changegate/changegate/test/receiver"
)

// awsEnv points the AWS SDK's default credential chain at the test servers'
// static credentials and away from anything on the machine (shared files,
// instance metadata). The sinks run with the same chain as in production.
func awsEnv(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           awstest.AccessKeyID,
		"AWS_SECRET_ACCESS_KEY":       awstest.SecretAccessKey,
		"AWS_SESSION_TOKEN":           "",
		"AWS_REGION":                  awstest.DefaultRegion,
		"AWS_PROFILE":                 "",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_ENDPOINT_URL":            "",
		"AWS_ROLE_ARN":                "",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "",
	} {
		t.Setenv(k, v)
	}
	for _, k := range []string{"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"} {
		os.Unsetenv(k) // restored by t.Setenv's cleanup
	}
}

// awsConfig routes every change of %DB%.items to a webhook (rule "hooks")
// and to an EventBridge bus and an SQS FIFO queue (rule "aws").
func awsConfig(hookURL, busURL, sqsURL, queueURL, extra string) string {
	return itemsHead + fmt.Sprintf(`
[[sinks]]
name = "hook"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
max_in_flight = 8
timeout = "60s"

[[sinks]]
name = "bus"
type = "eventbridge"
event_bus = "orders"
endpoint = %q
max_in_flight = 4
  [sinks.retry]
  max_attempts = 6
  initial_interval = "50ms"
  max_interval = "200ms"

[[sinks]]
name = "audit"
type = "sqs"
queue_url = %q
endpoint = %q
max_in_flight = 4
%s
  [sinks.retry]
  max_attempts = 6
  initial_interval = "50ms"
  max_interval = "200ms"

[[rules]]
name = "hooks"
source = "items"
sinks = ["hook"]

[[rules]]
name = "aws"
source = "items"
sinks = ["bus", "audit"]
`, hookURL, busURL, queueURL, sqsURL, extra)
}

type awsWorld struct {
	e   *env
	rcv *receiver.Receiver
	eb  *awstest.EventBridge
	sqs *awstest.SQS
	url string // the FIFO queue's URL
}

func newAWSWorld(t *testing.T) *awsWorld {
	awsEnv(t)
	w := &awsWorld{e: newEnv(t), rcv: receiver.New(testSecret)}
	t.Cleanup(w.rcv.Close)
	w.eb = awstest.NewEventBridge(awstest.Options{})
	t.Cleanup(w.eb.Close)
	w.sqs = awstest.NewSQS(awstest.Options{})
	t.Cleanup(w.sqs.Close)
	w.url = w.sqs.CreateQueue("audit.fifo")
	return w
}

func (w *awsWorld) config(extra string) string {
	return awsConfig(w.rcv.URL(), w.eb.URL(), w.sqs.URL(), w.url, extra)
}

// envelope is the part of an envelope the tests look at.
type envelope struct {
	ID            string `json:"id"`
	OperationType string `json:"operationType"`
	DocumentKey   struct {
		ID int `json:"_id"`
	} `json:"documentKey"`
	Rules  []string `json:"rules"`
	Update struct {
		Fields struct {
			N *int `json:"n"`
		} `json:"updatedFields"`
	} `json:"updateDescription"`
}

func parseEnvelope(t *testing.T, s string) envelope {
	t.Helper()
	var v envelope
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("envelope %s: %v", s, err)
	}
	return v
}

// writeChanges inserts docs documents and updates the first updated of them
// twice (n = 1000+i, then 2000+i); it returns the number of changes.
func writeChanges(t *testing.T, e *env, docs, updated int) int {
	t.Helper()
	if err := changeDocs(e.coll("items"), docs, updated); err != nil {
		t.Fatal(err)
	}
	return docs + 2*updated
}

// changeDocs is writeChanges for a goroutine: it returns the first error.
func changeDocs(c *mongo.Collection, docs, updated int) error {
	if err := insertDocs(c, 0, docs); err != nil {
		return err
	}
	for round := 1; round <= 2; round++ {
		for i := 0; i < updated; i++ {
			_, err := c.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: i}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: round*1000 + i}}}})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// checkDocOrder checks that the envelopes of each document come as insert,
// then the updates in the order they were made.
func checkDocOrder(t *testing.T, sink string, envs []envelope, updated int) {
	t.Helper()
	perDoc := map[int][]string{}
	for _, v := range envs {
		op := v.OperationType
		if v.Update.Fields.N != nil {
			op += fmt.Sprint(*v.Update.Fields.N / 1000)
		}
		perDoc[v.DocumentKey.ID] = append(perDoc[v.DocumentKey.ID], op)
	}
	for id, ops := range perDoc {
		want := "insert"
		if id < updated {
			want = "insert,update1,update2"
		}
		if got := strings.Join(ops, ","); got != want {
			t.Fatalf("%s: document %d: %s, want %s", sink, id, got, want)
		}
	}
}

func dedupID(eventID string) string {
	sum := sha256.Sum256([]byte(eventID))
	return hex.EncodeToString(sum[:])
}

// TestAwsFanOutToWebhookEventBridgeAndSQS: one change stream, routed by two
// rules to a webhook, an EventBridge bus and an SQS FIFO queue; every event
// arrives at each sink exactly once, with the right attributes, SigV4
// verified by the servers, and per-document order on the FIFO queue.
func TestAwsFanOutToWebhookEventBridgeAndSQS(t *testing.T) {
	w := newAWSWorld(t)
	w.e.start(w.e.config(w.config("")))
	const docs, updated = 300, 60
	want := writeChanges(t, w.e, docs, updated)

	waitFor(t, 60*time.Second, "every event at every sink", func() bool {
		return w.rcv.Count() >= want && len(w.eb.Events()) >= want && len(w.sqs.Messages("audit.fifo")) >= want
	})
	time.Sleep(300 * time.Millisecond) // let any duplicate show up before counting

	hookIDs := map[string]bool{}
	for _, d := range w.rcv.Deliveries() {
		if hookIDs[d.ID] || !d.SigOK {
			t.Fatalf("webhook: event %s twice or badly signed", d.ID)
		}
		hookIDs[d.ID] = true
	}

	events := w.eb.Events()
	ebIDs := map[string]bool{}
	for _, ev := range events {
		v := parseEnvelope(t, ev.Detail)
		if ebIDs[v.ID] {
			t.Fatalf("eventbridge: event %s twice", v.ID)
		}
		ebIDs[v.ID] = true
		wantDT := w.e.db + ".items." + v.OperationType
		if ev.Source != "changegate.items" || ev.DetailType != wantDT || ev.EventBusName != "orders" || ev.Time.IsZero() {
			t.Fatalf("eventbridge entry: source %q detail type %q (want %q) bus %q time %v", ev.Source, ev.DetailType, wantDT, ev.EventBusName, ev.Time)
		}
		if strings.Join(v.Rules, ",") != "hooks,aws" {
			t.Fatalf("eventbridge: rules %v", v.Rules)
		}
	}

	msgs := w.sqs.Messages("audit.fifo")
	sqsIDs := map[string]bool{}
	var sqsEnvs []envelope
	for _, m := range msgs {
		v := parseEnvelope(t, m.Body)
		if sqsIDs[v.ID] {
			t.Fatalf("sqs: event %s twice", v.ID)
		}
		sqsIDs[v.ID] = true
		sqsEnvs = append(sqsEnvs, v)
		attrs := map[string]string{"source": "items", "operationType": v.OperationType, "db": w.e.db, "coll": "items"}
		for k, want := range attrs {
			if a := m.Attributes[k]; a.DataType != "String" || a.StringValue != want {
				t.Fatalf("sqs message %s: attribute %s = %+v, want %q", v.ID, k, a, want)
			}
		}
		if m.DeduplicationID != dedupID(v.ID) {
			t.Fatalf("sqs message %s: deduplication id %q", v.ID, m.DeduplicationID)
		}
		if wantGroup := fmt.Sprintf(`%s.items:{"_id":%d}`, w.e.db, v.DocumentKey.ID); m.GroupID != wantGroup {
			t.Fatalf("sqs message %s: group %q, want %q", v.ID, m.GroupID, wantGroup)
		}
	}

	if len(hookIDs) != want || len(ebIDs) != want || len(sqsIDs) != want {
		t.Fatalf("distinct events: webhook %d, eventbridge %d, sqs %d; want %d each", len(hookIDs), len(ebIDs), len(sqsIDs), want)
	}
	for id := range hookIDs {
		if !ebIDs[id] || !sqsIDs[id] {
			t.Fatalf("event %s missing from eventbridge or sqs", id)
		}
	}
	checkDocOrder(t, "sqs", sqsEnvs, updated)
	if w.eb.Rejected() != 0 || w.sqs.Rejected() != 0 {
		t.Fatalf("requests rejected by SigV4 verification: eventbridge %d, sqs %d", w.eb.Rejected(), w.sqs.Rejected())
	}
	// Batching: far fewer requests than events.
	if n := w.sqs.Requests(); n > want/2 {
		t.Errorf("sqs: %d requests for %d events; batching does not work", n, want)
	}
	t.Logf("%d events; eventbridge %d requests, sqs %d requests", want, w.eb.Requests(), w.sqs.Requests())
}

// TestAwsCrashRestartSameDeduplicationIDs: the webhook holds every request,
// so no checkpoint advances while EventBridge and SQS accept everything; a
// crash (no drain) and a restart re-send every event with the same ids: the
// FIFO queue drops them all as duplicates and keeps per-document order.
func TestAwsCrashRestartSameDeduplicationIDs(t *testing.T) {
	w := newAWSWorld(t)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before rcv.Close (cleanups run last-in first-out)
	w.rcv.SetResponder(func([]byte) *receiver.Response { <-release; return nil })

	cfg := w.e.config(w.config(""))
	g := w.e.start(cfg)
	const docs, updated = 200, 50
	want := writeChanges(t, w.e, docs, updated)
	waitFor(t, 60*time.Second, "every event at eventbridge and sqs", func() bool {
		return len(w.eb.Events()) >= want && len(w.sqs.Messages("audit.fifo")) >= want
	})
	if err := g.stop(t, true); err != nil {
		t.Fatalf("hard stop: %v", err)
	}
	first := w.sqs.Messages("audit.fifo")
	if w.rcv.Count() != 0 {
		t.Fatalf("the webhook accepted %d events; the test needs none acknowledged", w.rcv.Count())
	}

	unblock()
	w.e.start(cfg)
	waitFor(t, 60*time.Second, "every event at the webhook and every re-send dropped by the FIFO queue", func() bool {
		return w.rcv.Count() >= want && w.sqs.Duplicates("audit.fifo") >= want
	})

	msgs := w.sqs.Messages("audit.fifo")
	if len(msgs) != want {
		t.Fatalf("sqs holds %d messages after the restart, want %d (re-sends must be dropped)", len(msgs), want)
	}
	var envs []envelope
	for i, m := range msgs {
		v := parseEnvelope(t, m.Body)
		if m.DeduplicationID != dedupID(v.ID) || m.DeduplicationID != first[i].DeduplicationID {
			t.Fatalf("message %d: deduplication id changed", i)
		}
		envs = append(envs, v)
	}
	checkDocOrder(t, "sqs", envs, updated)
	// EventBridge has no deduplication: it got everything again, with the
	// same event ids.
	ids := map[string]int{}
	for _, ev := range w.eb.Events() {
		ids[parseEnvelope(t, ev.Detail).ID]++
	}
	if len(ids) != want {
		t.Fatalf("eventbridge: %d distinct events, want %d", len(ids), want)
	}
	t.Logf("sqs duplicates dropped %d; eventbridge entries %d for %d events", w.sqs.Duplicates("audit.fifo"), len(w.eb.Events()), want)
}

// TestAwsFailuresRetriedOrDeadLettered: throttling and partial failures are
// retried until delivered (only the failed entries are re-sent); a
// malformed-entry error and an oversize message are dead-lettered at once
// with a reason that says so.
func TestAwsFailuresRetriedOrDeadLettered(t *testing.T) {
	w := newAWSWorld(t)
	var mu sync.Mutex
	tries := map[string]int{}
	// EventBridge: throttles the first two calls; then fails document 3 once
	// (retryable) and document 5 always with MalformedDetail (permanent).
	w.eb.Throttle(2)
	w.eb.FailEntries(func(e awstest.PutEventsEntry) (string, string) {
		v := struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}{}
		_ = json.Unmarshal([]byte(e.Detail), &v)
		mu.Lock()
		defer mu.Unlock()
		tries[fmt.Sprint(v.DocumentKey.ID)]++
		switch {
		case v.DocumentKey.ID == 3 && tries["3"] == 1:
			return "InternalFailure", "try again"
		case v.DocumentKey.ID == 5:
			return "MalformedDetail", "Detail is malformed."
		}
		return "", ""
	})
	cfg := w.e.config(w.config(`max_request_bytes = 2048`)) // applies to the sqs sink
	w.e.start(cfg)

	c := w.e.coll("items")
	insertN(t, c, 0, 20)
	big := strings.Repeat("x", 4096)
	if _, err := c.InsertOne(context.Background(), bson.D{{Key: "_id", Value: 100}, {Key: "big", Value: big}}); err != nil {
		t.Fatal(err)
	}
	_, dls := w.e.stores(cfg)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "deliveries and dead letters", func() bool {
		n, _ := dls.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
		return len(w.eb.Events()) >= 20 && len(w.sqs.Messages("audit.fifo")) >= 20 && n >= 2
	})
	time.Sleep(300 * time.Millisecond)

	// EventBridge: 21 events, document 5 dead-lettered, each other event once
	// (a partial failure re-sends only the failed entry).
	seen := map[int]int{}
	for _, ev := range w.eb.Events() {
		seen[parseEnvelope(t, ev.Detail).DocumentKey.ID]++
	}
	for id, n := range seen {
		if n != 1 || id == 5 {
			t.Fatalf("eventbridge: document %d accepted %d times", id, n)
		}
	}
	if len(seen) != 20 {
		t.Fatalf("eventbridge: %d documents accepted, want 20 (all but 5, with 100)", len(seen))
	}
	mu.Lock()
	if tries["3"] != 2 || tries["4"] != 1 {
		t.Errorf("entry attempts: document 3 %d (want 2), document 4 %d (want 1: not re-sent)", tries["3"], tries["4"])
	}
	mu.Unlock()

	entries, err := dls.List(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, en := range entries {
		got = append(got, en.Sink+":"+en.Reason)
		switch en.Sink {
		case "bus":
			if en.Reason != "MalformedDetail" || !strings.Contains(en.LastError, "Detail is malformed") {
				t.Errorf("bus dead letter: %s %q", en.Reason, en.LastError)
			}
		case "audit":
			if en.Reason != "oversize" || !strings.Contains(en.LastError, "more than the request limit of 2048 bytes") || en.Attempts != 1 {
				t.Errorf("audit dead letter: %s %q after %d attempts", en.Reason, en.LastError, en.Attempts)
			}
		}
	}
	if len(entries) != 2 {
		t.Fatalf("dead letters %v, want bus:MalformedDetail and audit:oversize", got)
	}
	if n := len(w.sqs.Messages("audit.fifo")); n != 20 {
		t.Fatalf("sqs: %d messages, want 20 (the oversize one dead-lettered)", n)
	}
}
