package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/test/receiver"
)

// txnConfig is baseConfig with retries that outlast a refusing receiver.
func txnConfig(url string) string {
	return strings.Replace(baseConfig(url, ""), "max_attempts = 4", "max_attempts = 10000", 1)
}

// TestTransactionsDeliveredOnceInOrder: changes written in multi-document
// transactions (several documents per transaction, documents touched by
// several transactions, aborted transactions in between) are each delivered
// exactly once, in order per document, and nothing of an aborted
// transaction is delivered.
func TestTransactionsDeliveredOnceInOrder(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	e.start(e.config(baseConfig(rcv.URL(), "")))
	c := e.coll("items")
	ctx := context.Background()
	sess, err := e.client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)

	const txns, shared = 150, 10
	want := map[string][]string{} // per document key, the expected operations
	key := func(id any) string { b, _ := json.Marshal(map[string]any{"_id": id}); return string(b) }
	total := 0
	for i := 0; i < txns; i++ {
		// Each transaction inserts two documents, updates one of them and a
		// shared counter, and deletes the other every third time.
		a, b, s := fmt.Sprintf("t%d-a", i), fmt.Sprintf("t%d-b", i), fmt.Sprintf("shared%d", i%shared)
		_, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
			if _, err := c.InsertMany(sctx, []any{bson.D{{Key: "_id", Value: a}}, bson.D{{Key: "_id", Value: b}}}); err != nil {
				return nil, err
			}
			if _, err := c.UpdateOne(sctx, bson.D{{Key: "_id", Value: a}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: i}}}}); err != nil {
				return nil, err
			}
			if _, err := c.UpdateOne(sctx, bson.D{{Key: "_id", Value: s}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}, optsUpsert()); err != nil {
				return nil, err
			}
			if i%3 == 0 {
				if _, err := c.DeleteOne(sctx, bson.D{{Key: "_id", Value: b}}); err != nil {
					return nil, err
				}
			}
			return nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want[key(a)] = []string{"insert", "update"}
		want[key(b)] = []string{"insert"}
		total += 4
		if i%3 == 0 {
			want[key(b)] = append(want[key(b)], "delete")
			total++
		}
		if i < shared {
			want[key(s)] = []string{"insert"}
		} else {
			want[key(s)] = append(want[key(s)], "update")
		}
		// An aborted transaction touching the same documents.
		if i%5 == 0 {
			if err := sess.StartTransaction(); err != nil {
				t.Fatal(err)
			}
			sctx := mongo.NewSessionContext(ctx, sess)
			if _, err := c.InsertOne(sctx, bson.D{{Key: "_id", Value: fmt.Sprintf("aborted%d", i)}}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.UpdateOne(sctx, bson.D{{Key: "_id", Value: a}}, bson.D{{Key: "$set", Value: bson.D{{Key: "aborted", Value: true}}}}); err != nil {
				t.Fatal(err)
			}
			if err := sess.AbortTransaction(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d deliveries (%s)", total, rcv), func() bool { return rcv.Count() >= total })
	// Let anything extra arrive before judging.
	time.Sleep(300 * time.Millisecond)
	seen := map[string]bool{}
	got := map[string][]string{}
	for _, d := range rcv.Deliveries() {
		if seen[d.ID] {
			t.Fatalf("event %s delivered twice", d.ID)
		}
		seen[d.ID] = true
		if strings.Contains(d.DocKey, "aborted") || strings.Contains(string(d.Envelope), `"aborted"`) {
			t.Fatalf("change of an aborted transaction delivered: %s", d.Envelope)
		}
		got[d.DocKey] = append(got[d.DocKey], d.Operation)
	}
	if len(seen) != total {
		t.Fatalf("%d distinct events, want %d", len(seen), total)
	}
	for k, ops := range want {
		if strings.Join(got[k], ",") != strings.Join(ops, ",") {
			t.Fatalf("document %s: events %v, want %v", k, got[k], ops)
		}
	}
}

// TestRestartInsideTransaction: the gateway stops after delivering the
// first change of a transaction but before the others are delivered. The
// checkpoint never falls inside a transaction, so after the restart the
// whole transaction is read again: the first change is delivered again
// with its id, and the rest with the ids they had before the restart.
func TestRestartInsideTransaction(t *testing.T) {
	e := newEnv(t)
	e.needServer()
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	cfg := e.config(txnConfig(rcv.URL()))

	var mu sync.Mutex
	refused := map[string]string{} // envelope id -> document key of refused attempts
	refuseAfterFirst := true
	rcv.SetResponder(func(body []byte) *receiver.Response {
		var envs []struct {
			ID          string          `json:"id"`
			DocumentKey json.RawMessage `json:"documentKey"`
		}
		if len(body) > 0 && body[0] == '[' {
			_ = json.Unmarshal(body, &envs)
		} else {
			envs = make([]struct {
				ID          string          `json:"id"`
				DocumentKey json.RawMessage `json:"documentKey"`
			}, 1)
			_ = json.Unmarshal(body, &envs[0])
		}
		mu.Lock()
		defer mu.Unlock()
		refuse := false
		for _, env := range envs {
			if refuseAfterFirst && !strings.Contains(string(env.DocumentKey), `"x1"`) {
				refuse = true
			}
		}
		if !refuse {
			return nil
		}
		for _, env := range envs {
			refused[env.ID] = string(env.DocumentKey)
		}
		return &receiver.Response{Status: http.StatusServiceUnavailable}
	})
	g := e.start(cfg)
	ctx := context.Background()
	c := e.coll("items")
	// Our own stream gives the events' resume tokens.
	cs, err := c.Watch(ctx, mongo.Pipeline{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	sess, err := e.client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	if _, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		for _, id := range []string{"x1", "x2", "x3"} {
			if _, err := c.InsertOne(sctx, bson.D{{Key: "_id", Value: id}}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for range 3 {
		if !cs.Next(ctx) {
			t.Fatal(cs.Err())
		}
		tokens = append(tokens, cs.ResumeToken().Lookup("_data").StringValue())
	}
	cps, _ := e.stores(cfg)
	// x2 and x3 are refused, each in its own document queue. One time in
	// eight (the lane has 8 queues, chosen by a hash of the key with the
	// test's random database name) x3 shares x2's queue and waits behind
	// x2's retries, first sent after the restart: then only x2 is refused.
	waitFor(t, 20*time.Second, "x1 delivered, x2 or x3 refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rcv.Count() == 1 && len(refused) >= 1
	})
	_ = holdsWithin(3*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(refused) >= 2
	})
	if rcv.Count() != 1 {
		t.Fatalf("%d deliveries before the restart, want x1 only", rcv.Count())
	}
	// A checkpoint never falls inside a transaction: x1 is acknowledged,
	// but the checkpoint stays before the transaction, so a restart reads
	// it whole again (and numbers its events the same way).
	if cp, ok, err := cps.Load(ctx, "items"); err != nil {
		t.Fatal(err)
	} else if ok && slices.Contains(tokens, cp.Token.Lookup("_data").StringValue()) {
		t.Fatalf("checkpoint inside the transaction: %s (tokens %v)", cp.Token, tokens)
	}
	first := rcv.Deliveries()[0]
	if err := g.stop(t, true); err != nil {
		t.Fatalf("stop: %v", err)
	}
	mu.Lock()
	refuseAfterFirst = false
	before := map[string]string{}
	for id, k := range refused {
		before[k] = id
	}
	mu.Unlock()

	e.start(cfg)
	waitFor(t, 30*time.Second, "x1 again, x2 and x3 after the restart", func() bool {
		return rcv.Count() >= 4
	})
	time.Sleep(300 * time.Millisecond)
	perDoc := map[string][]string{}
	for _, d := range rcv.Deliveries() {
		perDoc[d.DocKey] = append(perDoc[d.DocKey], d.ID)
	}
	for k, ids := range perDoc {
		for _, id := range ids {
			if k == first.DocKey && id != first.ID {
				t.Fatalf("x1 re-delivered with id %s, first %s", id, first.ID)
			}
			if prev, ok := before[k]; ok && id != prev {
				t.Fatalf("%s delivered with id %s after the restart, %s before", k, id, prev)
			}
		}
		want := 1 // x2 and x3: refused before the restart, delivered once after it
		if k == first.DocKey {
			want = 2 // x1: before the restart, and again with its transaction
		}
		if len(ids) != want {
			t.Fatalf("%s delivered %d times, want %d: %v", k, len(ids), want, ids)
		}
	}
	if len(perDoc) != 3 {
		t.Fatalf("deliveries for %d documents, want 3: %v", len(perDoc), perDoc)
	}
}

// holdsWithin polls cond until it holds or d has passed, and reports
// whether it held.
func holdsWithin(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
