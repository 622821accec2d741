package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/test/receiver"
)

// TestClusterSourceNoStateFeedback: a whole-cluster source with a failing
// catch-all sink and the state database in the same cluster (issue 24).
// The failing sink's dead letters (and the checkpoint saves) are not
// events: no delivery comes from the state database, the failing sink
// gets each change once in requests that do not grow, and a
// redacting sink never sees the raw value inside a dead letter.
func TestClusterSourceNoStateFeedback(t *testing.T) {
	e := newEnv(t)
	ok, bad := receiver.New(testSecret), receiver.New(testSecret)
	t.Cleanup(ok.Close)
	t.Cleanup(bad.Close)
	const ssn = "SSN-123-45-6789"
	var mu sync.Mutex
	var badSizes []int
	bad.SetResponder(func(body []byte) *receiver.Response {
		// Other tests' changes reach a whole-cluster source on a shared
		// real MongoDB: only this test's databases count.
		if bytes.Contains(body, []byte(e.db)) || bytes.Contains(body, []byte(e.state)) {
			mu.Lock()
			badSizes = append(badSizes, len(body))
			mu.Unlock()
		}
		return &receiver.Response{Status: 400} // permanent: straight to the dead-letter store
	})
	cfg := e.config(fmt.Sprintf(`
[mongo]
uri = "%%URI%%"
state_database = "%%STATE%%"

[server]
listen = "127.0.0.1:0"
shutdown_grace = "10s"

[[sources]]
name = "cluster"
checkpoint_interval = "50ms"
max_await = "100ms"

[[sinks]]
name = "ok"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
ordering = "strict"
redact = ["fullDocument.ssn"]

[[sinks]]
name = "bad"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true

[[rules]]
name = "everything"
source = "cluster"
sinks = ["ok", "bad"]
`, ok.URL(), bad.URL()))
	e.start(cfg)
	ctx := context.Background()
	people := e.coll("people")
	const n = 5
	for i := range n {
		if _, err := people.InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "name", Value: "p"}, {Key: "ssn", Value: ssn}}); err != nil {
			t.Fatal(err)
		}
	}
	dls := e.client.Database(e.state).Collection("deadletters")
	failed := bson.D{{Key: "kind", Value: "failed"}}
	waitFor(t, 30*time.Second, "a dead letter per change", func() bool {
		c, err := dls.CountDocuments(ctx, failed)
		return err == nil && c >= n
	})
	// A marker after the dead letters were written: once the strictly
	// ordered sink has it, it has had every change before it, including
	// the dead-letter inserts, had they been events.
	if _, err := e.coll("marker").InsertOne(ctx, bson.D{{Key: "_id", Value: "m"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the marker at sink ok", func() bool {
		for _, d := range ok.Deliveries() {
			if strings.Contains(string(d.Envelope), `"coll":"marker"`) && strings.Contains(string(d.Envelope), e.db) {
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "the marker's dead letter", func() bool {
		c, err := dls.CountDocuments(ctx, failed)
		return err == nil && c >= n+1
	})

	var nPeople int
	for _, d := range ok.Deliveries() {
		env := string(d.Envelope)
		if strings.Contains(env, e.state) {
			t.Fatalf("sink ok got a change of the state database: %s", env)
		}
		if strings.Contains(env, ssn) {
			t.Fatalf("sink ok got the raw SSN: %s", env)
		}
		if strings.Contains(env, `"coll":"people"`) && strings.Contains(env, e.db) {
			nPeople++
		}
	}
	if nPeople != n {
		t.Fatalf("sink ok got %d changes of people, want %d", nPeople, n)
	}
	if c, _ := dls.CountDocuments(ctx, failed); c != n+1 {
		t.Fatalf("%d dead letters, want %d (one per change, none of a dead letter)", c, n+1)
	}
	// A backfill of the whole cluster leaves the state database out too
	// (only against test/mongowire: a shared real cluster holds more).
	if e.srv != nil {
		st, err := app.Backfill(ctx, cfg, e.client, backfill.Request{Source: "cluster", Sink: "ok", Rate: 10000}, nil, nil)
		if err != nil || st.State != "done" {
			t.Fatalf("backfill: %+v, %v", st, err)
		}
		var snaps int
		for _, d := range ok.Deliveries() {
			if d.Operation != "snapshot" {
				continue
			}
			snaps++
			if env := string(d.Envelope); strings.Contains(env, e.state) || strings.Contains(env, ssn) {
				t.Fatalf("the backfill sent %s", env)
			}
		}
		if snaps != n+1 || st.Sent != n+1 {
			t.Fatalf("the backfill sent %d documents (%d delivered), want %d: those of people and marker", st.Sent, snaps, n+1)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(badSizes) != n+1 {
		t.Fatalf("sink bad got %d requests, want %d (one per change)", len(badSizes), n+1)
	}
	for _, s := range badSizes {
		if s > 2048 {
			t.Fatalf("a request of %d bytes to sink bad: requests grow (sizes %v)", s, badSizes)
		}
	}
}
