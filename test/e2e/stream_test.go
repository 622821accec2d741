package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/test/receiver"
)

// TestSinkIsolation: one source, two sinks; one answers 503 for a while.
// The healthy sink keeps its normal latency the whole time, and once the
// sick sink recovers it receives every event, in order per document,
// through the ordered re-drive of what was parked for it.
func TestSinkIsolation(t *testing.T) {
	outage := 60 * time.Second // as the issue specifies
	if testing.Short() {
		outage = 12 * time.Second
	}
	e := newEnv(t)
	healthy := receiver.New(testSecret)
	t.Cleanup(healthy.Close)
	sick := receiver.New(testSecret)
	t.Cleanup(sick.Close)
	sick.SetResponder(receiver.Unavailable(time.Now().Add(outage), 503, 1))
	cfg := e.config(fmt.Sprintf(`
[mongo]
uri = "%%URI%%"
state_database = "%%STATE%%"
[server]
listen = "127.0.0.1:0"
[[sources]]
name = "items"
database = "%%DB%%"
collection = "items"
max_in_flight_events = 200
checkpoint_interval = "100ms"
max_await = "100ms"
[[sinks]]
name = "healthy"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
[[sinks]]
name = "sick"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
park_after = "1s"
  [sinks.retry]
  max_attempts = 1000
  initial_interval = "100ms"
  max_interval = "500ms"
  max_elapsed = "0s"
[[rules]]
name = "all"
source = "items"
sinks = ["healthy", "sick"]
`, healthy.URL(), sick.URL()))
	e.start(cfg)
	c := e.coll("items")
	ctx := context.Background()

	// Write steadily through the outage: far more events than the source's
	// in-flight cap of 200, on 20 documents.
	var maxLag time.Duration
	written := 0
	deadline := time.Now().Add(outage + 2*time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		doc := i % 20
		at := time.Now()
		if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: doc}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: i}}}}, optsUpsert()); err != nil {
			t.Fatal(err)
		}
		written++
		if i%10 == 0 {
			// The healthy sink must deliver this write promptly.
			want := written
			waitFor(t, 5*time.Second, "healthy sink keeping up", func() bool { return healthy.Count() >= want })
			if lag := time.Since(at); lag > maxLag {
				maxLag = lag
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("wrote %d changes; worst healthy-sink latency %v", written, maxLag)
	if maxLag > 2*time.Second {
		t.Fatalf("the healthy sink fell behind by %v while the other sink was failing", maxLag)
	}
	if written <= 200 {
		t.Fatalf("only %d changes written; the test needs more than the in-flight cap", written)
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("sick sink catching up (%s)", sick), func() bool { return sick.Count() >= written })
	// In order per document, nothing lost.
	last := map[string]int{}
	got := 0
	for _, d := range sick.Deliveries() {
		var env struct {
			FullDocument struct {
				V int `json:"v"`
			} `json:"fullDocument"`
			UpdateDescription struct {
				UpdatedFields struct {
					V *int `json:"v"`
				} `json:"updatedFields"`
			} `json:"updateDescription"`
		}
		if err := jsonUnmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		v := env.FullDocument.V
		if env.UpdateDescription.UpdatedFields.V != nil {
			v = *env.UpdateDescription.UpdatedFields.V
		}
		if prev, ok := last[d.DocKey]; ok && v <= prev {
			t.Fatalf("document %s: value %d delivered after %d", d.DocKey, v, prev)
		}
		last[d.DocKey] = v
		got++
	}
	if got < written {
		t.Fatalf("sick sink got %d of %d", got, written)
	}
	_, store := e.stores(cfg)
	waitFor(t, 10*time.Second, "parked entries to be re-driven and removed", func() bool {
		n, err := store.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked})
		return err == nil && n == 0
	})
}

// TestDropCollectionInvalidate: dropping the watched collection invalidates
// the stream; the gateway reopens after it and delivers new inserts.
func TestDropCollectionInvalidate(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	e.start(e.config(baseConfig(rcv.URL(), "")))
	c := e.coll("items")
	insertN(t, c, 0, 3)
	waitFor(t, 10*time.Second, "3 inserts", func() bool { return rcv.Count() >= 3 })
	if err := c.Drop(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the stream see the invalidate before the next insert
	insertN(t, c, 10, 3)
	waitFor(t, 20*time.Second, "inserts after the drop", func() bool {
		n := 0
		for _, d := range rcv.Deliveries() {
			if d.Operation == "insert" && (strings.Contains(d.DocKey, ":10}") || strings.Contains(d.DocKey, ":11}") || strings.Contains(d.DocKey, ":12}")) {
				n++
			}
		}
		return n == 3
	})
	ops := map[string]int{}
	for _, d := range rcv.Deliveries() {
		ops[d.Operation]++
	}
	if ops["drop"] != 1 || ops["invalidate"] != 1 {
		t.Fatalf("operations delivered %v, want one drop and one invalidate", ops)
	}
}

// TestHistoryLost: the oplog is truncated while the gateway is down. With
// "fail" the gateway exits with an error that says what happened and how to
// recover; with "resume_from_now" it continues and records the gap.
func TestHistoryLost(t *testing.T) {
	e := newEnv(t)
	e.needServer()
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	cfg := e.config(baseConfig(rcv.URL(), ""))
	g := e.start(cfg)
	c := e.coll("items")
	insertN(t, c, 0, 3)
	waitFor(t, 10*time.Second, "3 inserts", func() bool { return rcv.Count() >= 3 })
	if err := g.stop(t, false); err != nil {
		t.Fatal(err)
	}
	insertN(t, c, 3, 3) // written while the gateway is down...
	e.srv.DiscardHistory()
	insertN(t, c, 6, 1) // ...and lost from the oplog

	g = e.start(cfg)
	var err error
	select {
	case err = <-g.done:
		g.cancel = nil
	case <-time.After(20 * time.Second):
		t.Fatal("gateway did not fail on lost history")
	}
	if !errors.Is(err, source.ErrHistoryLost) {
		t.Fatalf("exit error %v, want history lost", err)
	}
	for _, want := range []string{"source items", "on_history_lost = \"resume_from_now\"", "checkpoints reset"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not mention %q", err, want)
		}
	}

	cfg.Sources[0].OnHistoryLost = "resume_from_now"
	e.start(cfg)
	_, store := e.stores(cfg)
	var gaps []deadletter.Entry
	waitFor(t, 20*time.Second, "the recorded gap", func() bool {
		gaps, _ = store.List(context.Background(), deadletter.Filter{Kind: deadletter.KindGap})
		return len(gaps) == 1
	})
	if gaps[0].Source != "items" || gaps[0].GapTo.Before(gaps[0].GapFrom) || gaps[0].LastToken == nil {
		t.Fatalf("gap entry %+v", gaps[0])
	}
	insertN(t, c, 20, 1)
	waitFor(t, 20*time.Second, "an insert after resuming from now", func() bool {
		for _, d := range rcv.Deliveries() {
			if strings.Contains(d.DocKey, ":20}") {
				return true
			}
		}
		return false
	})
}

// TestQuietFilteredSourceAdvancesCheckpoint: a source whose rule matches
// nothing that is written still moves its persisted checkpoint forward (from
// post-batch resume tokens), so it does not fall off the oplog.
func TestQuietFilteredSourceAdvancesCheckpoint(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	cfg := e.config(strings.Replace(baseConfig(rcv.URL(), ""), `sinks = ["hook"]`,
		`filter = { "fullDocument.kind" = "rare" }
sinks = ["hook"]`, 1))
	e.start(cfg)
	cps, _ := e.stores(cfg)
	ctx := context.Background()
	var first bson.Raw
	waitFor(t, 10*time.Second, "an initial checkpoint", func() bool {
		cp, ok, err := cps.Load(ctx, "items")
		first = cp.Token
		return err == nil && ok
	})
	insertN(t, e.coll("items"), 0, 50) // none match; pushdown filters them in MongoDB
	waitFor(t, 10*time.Second, "the checkpoint to advance past filtered changes", func() bool {
		cp, _, _ := cps.Load(ctx, "items")
		return cp.Token != nil && !bytesEqual(cp.Token, first)
	})
	if rcv.Count() != 0 {
		t.Fatalf("%d deliveries for a filter that matches nothing", rcv.Count())
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }
