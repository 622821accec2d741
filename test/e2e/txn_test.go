package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/test/receiver"
)

// writeTxns runs n transactions (transaction k inserts k%7+1 documents,
// _id k*100+j) each followed by a single insert (_id 1000000+k), and
// returns the transactions' sizes by k.
func writeTxns(client *mongo.Client, c *mongo.Collection, n int) (map[int]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sizes := map[int]int{}
	sess, err := client.StartSession()
	if err != nil {
		return nil, err
	}
	defer sess.EndSession(ctx)
	for k := 0; k < n; k++ {
		size := k%7 + 1
		if _, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
			for j := 0; j < size; j++ {
				if _, err := c.InsertOne(sctx, bson.D{{Key: "_id", Value: k*100 + j}}); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}); err != nil {
			return nil, fmt.Errorf("transaction %d: %w", k, err)
		}
		sizes[k] = size
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1000000 + k}}); err != nil {
			return nil, err
		}
	}
	return sizes, nil
}

type txnMeta struct {
	ID    string `json:"id"`
	Index int    `json:"index"`
	Last  bool   `json:"last"`
}

// TestProcessTransactionsSIGKILL runs the real binary while transactions
// and single writes are made, kills it with SIGKILL, restarts it, and
// checks that the webhook got every event; that every event of a
// transaction carries txn with one id per transaction, indexes 0..n-1 and
// exactly one last (on n-1); that single writes carry none; and that a
// re-delivery after the kill carries the same txn as the first delivery.
func TestProcessTransactionsSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	rcv.SetResponder(func([]byte) *receiver.Response { time.Sleep(time.Millisecond); return nil })
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(baseConfig(rcv.URL(), ""))), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(baseConfig(rcv.URL(), "")))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	const n = 150
	type result struct {
		sizes map[int]int
		err   error
	}
	done := make(chan result, 1)
	go func() {
		s, err := writeTxns(e.client, e.coll("items"), n)
		done <- result{s, err}
	}()
	waitFor(t, 60*time.Second, "some deliveries", func() bool { return rcv.Count() > 100 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before := rcv.Count()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	total := n
	for _, s := range res.sizes {
		total += s
	}
	if before >= total {
		t.Fatalf("everything was delivered before SIGKILL; the test proves nothing")
	}
	startProcess(t, bin, cfgPath)
	waitFor(t, 90*time.Second, "every event after the restart", func() bool {
		docs := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			docs[d.DocKey] = true
		}
		return len(docs) >= total
	})

	first := map[string]*txnMeta{} // webhook-id → txn of its first delivery
	seen := map[string]bool{}
	byTxn := map[int]map[int]txnMeta{} // transaction k → index → txn
	idOf := map[int]string{}
	dups := 0
	for _, d := range rcv.Deliveries() {
		var env struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
			Txn *txnMeta `json:"txn"`
		}
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		doc := env.DocumentKey.ID
		if seen[d.WebhookID] {
			dups++
			a, b := first[d.WebhookID], env.Txn
			if (a == nil) != (b == nil) || a != nil && *a != *b {
				t.Fatalf("re-delivery of doc %d with txn %+v, first %+v", doc, b, a)
			}
			continue
		}
		seen[d.WebhookID], first[d.WebhookID] = true, env.Txn
		if doc >= 1000000 {
			if env.Txn != nil {
				t.Fatalf("single write %d has txn %+v", doc, env.Txn)
			}
			continue
		}
		if env.Txn == nil {
			t.Fatalf("doc %d of a transaction has no txn: %s", doc, d.Envelope)
		}
		k, j := doc/100, doc%100
		if id, ok := idOf[k]; ok && id != env.Txn.ID {
			t.Fatalf("transaction %d has ids %s and %s", k, id, env.Txn.ID)
		}
		idOf[k] = env.Txn.ID
		if byTxn[k] == nil {
			byTxn[k] = map[int]txnMeta{}
		}
		if env.Txn.Index != j {
			t.Fatalf("doc %d (operation %d of transaction %d) has index %d", doc, j, k, env.Txn.Index)
		}
		byTxn[k][j] = *env.Txn
	}
	ids := map[string]int{}
	for k, size := range res.sizes {
		got := byTxn[k]
		if len(got) != size {
			t.Fatalf("transaction %d: %d events, want %d", k, len(got), size)
		}
		lasts := 0
		for j, m := range got {
			if m.Last {
				lasts++
				if j != size-1 {
					t.Fatalf("transaction %d: last on index %d of %d", k, j, size)
				}
			}
		}
		if lasts != 1 {
			t.Fatalf("transaction %d: %d events with last", k, lasts)
		}
		if other, ok := ids[idOf[k]]; ok {
			t.Fatalf("transactions %d and %d share id %s", k, other, idOf[k])
		}
		ids[idOf[k]] = k
	}
	t.Logf("%d transactions, %d events; delivered before SIGKILL %d; re-delivered after restart %d", n, total, before, dups)
	if dups == 0 {
		t.Log("no re-delivery after the restart: the same-txn check did not run (" + strconv.Itoa(before) + " before the kill)")
	}
}
