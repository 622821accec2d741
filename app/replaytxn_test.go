package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
)

// TestReplayTxnGroup: a replay of the dead letters of a 3-event
// transaction sends them to a sink with transactions = "group" as one
// request (a JSON array in txn.index order) and deletes all three; when
// that request fails, all three stay with the failure recorded. A sink
// without grouping still gets one request per entry.
func TestReplayTxnGroup(t *testing.T) {
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	var (
		mu     sync.Mutex
		bodies = map[string][]string{}
		refuse atomic.Bool
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if refuse.Load() {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		bodies[r.URL.Path] = append(bodies[r.URL.Path], string(b))
		mu.Unlock()
	}))
	defer hook.Close()
	cfg, err := config.Parse("replay.toml", []byte(fmt.Sprintf(`
[mongo]
uri = %[2]q
state_database = %[3]q
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
[[sinks]]
name = "grouped"
type = "webhook"
url = "%[1]s/grouped"
allow_private_networks = true
transactions = "group"
[sinks.retry]
max_attempts = 1
[[sinks]]
name = "single"
type = "webhook"
url = "%[1]s/single"
allow_private_networks = true
[sinks.retry]
max_attempts = 1
[[rules]]
name = "all"
source = "orders"
sinks = ["grouped", "single"]
`, hook.URL, uri, mongotest.UniqueName("cgreplaytxn_"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, dls := app.Stores(cfg, client)
	if err := dls.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	const txnID = "0123456789abcdef0123456789abcdef"
	// The entries are stored last index first: the replay orders them.
	for _, i := range []int{2, 1, 0} {
		raw, err := bson.Marshal(bson.D{
			{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%02d", 1795000000, i)}}},
			{Key: "operationType", Value: "insert"},
			{Key: "clusterTime", Value: bson.Timestamp{T: 1795000000, I: 1}},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: i}}},
			{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: i}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := event.FromChange("orders", uint64(i), raw)
		if err != nil {
			t.Fatal(err)
		}
		ev.Rules = []string{"all"}
		ev.Txn = &event.Txn{ID: txnID, Index: i, Last: i == 2}
		for _, sink := range []string{"grouped", "single"} {
			en, err := deadletter.EntryFor(ev, sink, deadletter.KindFailed)
			if err != nil {
				t.Fatal(err)
			}
			en.LastError = "http 503"
			if err := dls.Put(ctx, en); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(sink string) int64 {
		t.Helper()
		n, err := dls.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed, Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The grouped sink refuses: all three stay, the failure recorded on each.
	refuse.Store(true)
	res, err := app.Replay(ctx, cfg, client, deadletter.Filter{Sink: "grouped"}, app.ReplayOptions{}, nil)
	if err != nil || res.Failed != 3 || res.Replayed != 0 || len(res.Errors) != 3 {
		t.Fatalf("failed grouped replay: %+v, %v", res, err)
	}
	if n := count("grouped"); n != 3 {
		t.Fatalf("%d grouped entries left after a failed replay, want 3", n)
	}
	es, err := dls.List(ctx, deadletter.Filter{Sink: "grouped"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Attempts != 1 || e.LastError == "http 503" {
			t.Errorf("entry %s after a failed replay: attempts %d, last error %q", e.ID, e.Attempts, e.LastError)
		}
	}

	refuse.Store(false)
	res, err = app.Replay(ctx, cfg, client, deadletter.Filter{}, app.ReplayOptions{}, nil)
	if err != nil || res.Replayed != 6 || res.Failed != 0 || res.Skipped != 0 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if n := count(""); n != 0 {
		t.Fatalf("%d entries left after the replay", n)
	}
	mu.Lock()
	defer mu.Unlock()
	type env struct {
		Txn struct {
			ID    string `json:"id"`
			Index int    `json:"index"`
		} `json:"txn"`
	}
	if got := bodies["/grouped"]; len(got) != 1 {
		t.Fatalf("grouped sink got %d requests, want one: %q", len(got), got)
	}
	var group []env
	if err := json.Unmarshal([]byte(bodies["/grouped"][0]), &group); err != nil || len(group) != 3 {
		t.Fatalf("grouped body %s: %v", bodies["/grouped"][0], err)
	}
	for i, e := range group {
		if e.Txn.ID != txnID || e.Txn.Index != i {
			t.Errorf("group element %d has txn %+v", i, e.Txn)
		}
	}
	if got := bodies["/single"]; len(got) != 3 {
		t.Fatalf("single sink got %d requests, want three: %q", len(got), got)
	}
	for i, b := range bodies["/single"] {
		var e env
		if err := json.Unmarshal([]byte(b), &e); err != nil || e.Txn.Index != i {
			t.Errorf("single request %d: txn %+v, %v (%s)", i, e.Txn, err, b)
		}
	}
}
