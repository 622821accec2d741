package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/test/receiver"
)

// hookConfig is head (the [mongo] table and the items source) with one
// webhook sink "hook" at url that every change goes to; sink holds the
// sink's other keys, one per line.
func hookConfig(head, url, sink string) string {
	return head + fmt.Sprintf(`
[[sinks]]
name = "hook"
type = "webhook"
url = %q
allow_private_networks = true
%s
[[rules]]
name = "all"
source = "items"
sinks = ["hook"]
`, url, sink)
}

// baseConfig routes every change of %DB%.items to one webhook sink.
func baseConfig(url, extraSink string) string {
	return itemsHead + fmt.Sprintf(`
[[sinks]]
name = "hook"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
max_in_flight = 8
%s
  [sinks.retry]
  max_attempts = 4
  initial_interval = "50ms"
  max_interval = "500ms"

[[rules]]
name = "all"
source = "items"
sinks = ["hook"]
`, url, extraSink)
}

// docOf returns the numeric _id of an envelope's documentKey.
func docOf(t *testing.T, d receiver.Delivery) string {
	t.Helper()
	return d.DocKey
}

// TestEveryEventInOrderPerDocument writes 10,000 inserts, updates and
// deletes across documents; the receiver must get every event, with a valid
// signature, in order per document.
func TestEveryEventInOrderPerDocument(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	e.start(e.config(baseConfig(rcv.URL(), "")))
	c := e.coll("items")
	ctx := context.Background()

	const docs = 3000
	insertN(t, c, 0, docs)
	// Per document: insert, two updates, and a delete for every other one.
	want := docs
	for round := 1; round <= 2; round++ {
		for i := 0; i < docs; i++ {
			if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$set", Value: bson.D{{Key: "round", Value: round}}}}); err != nil {
				t.Fatal(err)
			}
			want++
		}
	}
	for i := 0; i < docs; i += 2 {
		if _, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
		want++
	}
	if want < 10000 {
		t.Fatalf("test writes %d changes, want at least 10000", want)
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d deliveries (%s)", want, rcv), func() bool { return rcv.Count() >= want })

	seen := map[string]bool{}
	perDoc := map[string][]string{}
	for _, d := range rcv.Deliveries() {
		if !d.SigOK {
			t.Fatalf("delivery %s with a bad signature", d.ID)
		}
		if d.WebhookID != d.ID {
			t.Fatalf("webhook-id %q differs from the envelope id %q", d.WebhookID, d.ID)
		}
		if seen[d.ID] {
			t.Fatalf("event %s delivered twice without a restart", d.ID)
		}
		seen[d.ID] = true
		perDoc[docOf(t, d)] = append(perDoc[docOf(t, d)], d.Operation)
	}
	if len(seen) != want {
		t.Fatalf("got %d distinct events, want %d", len(seen), want)
	}
	for key, ops := range perDoc {
		got := strings.Join(ops, ",")
		wantOps := "insert,update,update"
		if strings.Contains(key, `"_id":0}`) || evenID(key) {
			wantOps += ",delete"
		}
		if got != wantOps {
			t.Fatalf("document %s: events in order %s, want %s", key, got, wantOps)
		}
	}
	if _, bad := rcv.Requests(); bad != 0 {
		t.Fatalf("%d requests with bad signatures", bad)
	}
}

func evenID(key string) bool {
	var k struct {
		ID int `json:"_id"`
	}
	if err := json.Unmarshal([]byte(key), &k); err != nil {
		return false
	}
	return k.ID%2 == 0
}

// TestCrashWithoutDrainLosesNothing cancels the gateway with no drain at all
// in the middle of a stream, restarts it, and checks that every event
// arrived; duplicates are allowed only with the same webhook-id.
func TestCrashWithoutDrainLosesNothing(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	// A slow receiver keeps many events in flight at the crash.
	rcv.SetResponder(func([]byte) *receiver.Response { time.Sleep(2 * time.Millisecond); return nil })
	cfg := e.config(baseConfig(rcv.URL(), ""))
	g := e.start(cfg)
	c := e.coll("items")
	const total = 3000
	writeErr := make(chan error, 1)
	go func() { writeErr <- insertDocs(c, 0, total) }()
	waitFor(t, 30*time.Second, "some deliveries", func() bool { return rcv.Count() > 300 })
	if err := g.stop(t, true); err != nil {
		t.Fatalf("hard stop: %v", err)
	}
	before := rcv.Count()
	if before >= total {
		t.Fatalf("all %d events were delivered before the crash; the test proves nothing", total)
	}
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	rcv.SetResponder(nil)
	e.start(cfg)
	waitFor(t, 60*time.Second, "every event after the restart", func() bool {
		ids := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			ids[d.DocKey] = true
		}
		return len(ids) >= total
	})
	// Duplicates carry the same id as the first delivery.
	byDoc := map[string]string{}
	dups := 0
	for _, d := range rcv.Deliveries() {
		if prev, ok := byDoc[d.DocKey]; ok {
			dups++
			if prev != d.WebhookID {
				t.Fatalf("re-delivery of %s has webhook-id %s, first was %s", d.DocKey, d.WebhookID, prev)
			}
		}
		byDoc[d.DocKey] = d.WebhookID
	}
	t.Logf("delivered before crash %d, duplicates after restart %d", before, dups)
}

// TestRetryAfterThenDeliveredAndDeadLetterReplay: a 503 with Retry-After is
// retried until the receiver recovers; a 400 goes to the dead-letter
// collection at once and is delivered by a replay.
func TestRetryAfterThenDeliveredAndDeadLetterReplay(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	rcv.SetResponder(receiver.Unavailable(time.Now().Add(1500*time.Millisecond), http.StatusServiceUnavailable, 1))
	cfg := e.config(baseConfig(rcv.URL(), ""))
	// Enough attempts to outlast the outage.
	cfg.Sinks[0].Retry.MaxAttempts = 20
	g := e.start(cfg)
	c := e.coll("items")
	insertN(t, c, 0, 5)
	waitFor(t, 20*time.Second, "5 deliveries after the outage", func() bool { return rcv.Count() >= 5 })
	total, _ := rcv.Requests()
	if total <= 5 {
		t.Fatalf("receiver saw %d requests; the 503s were not retried", total)
	}

	// Now a permanent 400 for document 100.
	rcv.SetResponder(func(body []byte) *receiver.Response {
		if strings.Contains(string(body), `"documentKey":{"_id":100}`) {
			return &receiver.Response{Status: http.StatusBadRequest}
		}
		return nil
	})
	insertN(t, c, 100, 1)
	insertN(t, c, 101, 1)
	waitFor(t, 20*time.Second, "document 101", func() bool { return rcv.Count() >= 6 })
	_, store := e.stores(cfg)
	var entries []deadletter.Entry
	waitFor(t, 10*time.Second, "the dead letter of document 100", func() bool {
		var err error
		entries, err = store.List(context.Background(), deadletter.Filter{Sink: "hook"})
		return err == nil && len(entries) == 1
	})
	if entries[0].Reason != "http_400" || entries[0].Attempts != 1 {
		t.Fatalf("dead letter reason %q after %d attempts, want http_400 after 1", entries[0].Reason, entries[0].Attempts)
	}
	if err := g.stop(t, false); err != nil {
		t.Fatal(err)
	}
	// The receiver accepts it now: replay delivers it and removes the entry.
	rcv.SetResponder(nil)
	res, err := e.replay(cfg)
	if err != nil || res.Replayed != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	last := rcv.Deliveries()[rcv.Count()-1]
	if last.ID != entries[0].EventID || last.WebhookID != entries[0].EventID {
		t.Fatalf("replayed delivery id %s / webhook-id %s, want %s", last.ID, last.WebhookID, entries[0].EventID)
	}
	if n, _ := store.Count(context.Background(), deadletter.Filter{}); n != 0 {
		t.Fatalf("%d dead letters left after the replay", n)
	}
}
