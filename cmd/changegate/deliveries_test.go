package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/test/mongotest"
)

// deliveries list and events show read the delivery log of the config's
// state database.
func TestDeliveriesListAndEventsShow(t *testing.T) {
	uri, _ := mongotest.URI(t)
	state := mongotest.UniqueName("cgclistate_")
	db := mongotest.Client(t, uri).Database(state)
	t.Cleanup(func() { _ = db.Drop(context.Background()) })
	path := filepath.Join(t.TempDir(), "c.toml")
	cfg := fmt.Sprintf(`[mongo]
uri = %q
state_database = %q
[[sources]]
name = "orders"
database = "shop"
[[sinks]]
name = "billing"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "paid"
source = "orders"
sinks = ["billing"]
`, uri, state)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	l := deliverylog.NewLog(db.Collection("deliveries"), 72*time.Hour, "failures", deliverylog.Deps{})
	w := deliverylog.NewWriter(l.Collection(), deliverylog.WriterOptions{Mode: "failures"})
	w.Start()
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: 42}})
	id := "orders:8264F1A2B3000000012B0229296E04"
	for i, o := range []deliverylog.Outcome{deliverylog.OutcomeFailed, deliverylog.OutcomeRetrying, deliverylog.OutcomeFailed} {
		w.Enqueue(deliverylog.Record{EventID: id, Source: "orders", Sink: "billing", Rules: []string{"paid"}, DocumentKey: key,
			Attempt: 1 + i/2, Outcome: o, Status: 503, Time: time.Now().Add(time.Duration(i) * time.Millisecond)})
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	var out, errOut bytes.Buffer
	if code := run([]string{"deliveries", "list", "-config", path, "-status", "failed", "-document-key", `{"_id": 42}`, "-limit", "1"}, &out, &errOut); code != 0 {
		t.Fatalf("deliveries list: exit %d: %s", code, errOut.String())
	}
	var rec map[string]any
	if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
		t.Fatalf("deliveries list printed %q: %v", out.String(), err)
	}
	if rec["outcome"] != "failed" || rec["attempt"] != 2.0 || rec["status"] != 503.0 || rec["sink"] != "billing" || !strings.HasPrefix(errOut.String(), "next: ") {
		t.Errorf("deliveries list: %s (stderr %q)", out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"deliveries", "list", "-config", path, "-document-key", `{"_id": {"$gt": 0}}`}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "query operator") {
		t.Errorf("an operator in -document-key: exit %d, %q", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"events", "show", id, "-config", path}, &out, &errOut); code != 0 {
		t.Fatalf("events show: exit %d: %s", code, errOut.String())
	}
	var lc deliverylog.Lifecycle
	if err := json.Unmarshal(out.Bytes(), &lc); err != nil || len(lc.Sinks) != 1 || lc.Sinks[0].Sink != "billing" ||
		lc.Sinks[0].State != deliverylog.StateRetrying || len(lc.Sinks[0].Attempts) != 3 {
		t.Errorf("events show: %s (%v)", out.String(), err)
	}
	if code := run([]string{"events", "show", "orders:82FF", "-config", path}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "event not found") {
		t.Errorf("events show of an unknown event: exit %d, %q", code, errOut.String())
	}
}

// events redeliver reads a change again from the oplog and delivers it to
// the sink named, with the same id; -sink is required; sinks redeliver
// does the same for a window of the oplog, bad requests exit 2; a change
// rolled off the oplog is refused, saying so.
func TestEventsRedeliver(t *testing.T) {
	uri, srv := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	state, dbName := mongotest.UniqueName("cgclistate_"), mongotest.UniqueName("cgclidb_")
	t.Cleanup(func() {
		_ = client.Database(state).Drop(context.Background())
		_ = client.Database(dbName).Drop(context.Background())
	})
	var mu sync.Mutex
	var got []string
	hook := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("webhook-id"))
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	path := filepath.Join(t.TempDir(), "c.toml")
	cfg := fmt.Sprintf(`[mongo]
uri = %q
state_database = %q
[[sources]]
name = "orders"
database = %q
collection = "orders"
[[sinks]]
name = "billing"
type = "webhook"
url = %q
allow_private_networks = true
[[rules]]
name = "paid"
source = "orders"
sinks = ["billing"]
`, uri, state, dbName, hook.URL)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// The change's id, as the gateway would have made it.
	ctx := context.Background()
	coll := client.Database(dbName).Collection("orders")
	cs, err := coll.Watch(ctx, bson.A{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 7}}); err != nil {
		t.Fatal(err)
	}
	if !cs.Next(ctx) {
		t.Fatal(cs.Err())
	}
	id := "orders:" + cs.Current.Lookup("_id", "_data").StringValue()

	var out, errOut bytes.Buffer
	if code := run([]string{"events", "redeliver", id, "-config", path}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "-sink is required") {
		t.Errorf("without -sink: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"events", "redeliver", id, "-config", path, "-sink", "billing"}, &out, &errOut); code != 0 {
		t.Fatalf("events redeliver: exit %d: %s", code, errOut.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res["state"] != "delivered" || res["id"] != id {
		t.Errorf("events redeliver printed %s (%v)", out.String(), err)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != id {
		t.Errorf("the receiver got %v, want %s once", got, id)
	}
	mu.Unlock()

	// The window of the oplog that holds the change, to the same sink.
	since := time.Now().Add(-time.Minute).UTC()
	until := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(until) + 20*time.Millisecond)
	out.Reset()
	errOut.Reset()
	if code := run([]string{"sinks", "redeliver", "billing", "-config", path, "-since", since.Format(time.RFC3339), "-until", until.UTC().Format(time.RFC3339)}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "done: scanned 1, sent 1, finished 1, failed 0") {
		t.Fatalf("sinks redeliver: exit %d: %s %s", code, out.String(), errOut.String())
	}
	mu.Lock()
	if len(got) != 2 || got[1] != id {
		t.Errorf("after sinks redeliver the receiver got %v, want %s twice", got, id)
	}
	mu.Unlock()
	for _, args := range [][]string{
		{"sinks", "redeliver", "billing", "-config", path, "-since", since.Format(time.RFC3339)},
		{"sinks", "redeliver", "billing", "-config", path, "-since", "yesterday", "-until", until.Format(time.RFC3339)},
		{"sinks", "redeliver", "nope", "-config", path, "-since", since.Format(time.RFC3339), "-until", until.Format(time.RFC3339)},
		{"sinks", "redeliver", "-config", path, "-resume", "abc", "-rate", "5"},
		{"sinks", "redeliver", "-config", path, "-resume", "abc"},
	} {
		errOut.Reset()
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut.String())
		}
	}

	if srv == nil {
		return
	}
	srv.DiscardHistory()
	out.Reset()
	errOut.Reset()
	if code := run([]string{"events", "redeliver", id, "-config", path, "-sink", "billing"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "no longer in the oplog") {
		t.Errorf("a change rolled off: exit %d, %q", code, errOut.String())
	}
}
