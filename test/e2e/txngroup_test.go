package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/test/receiver"
)

const txnGroupConfig = `
[mongo]
uri = "%URI%"
state_database = "%STATE%"

[server]
listen = "127.0.0.1:0"
shutdown_grace = "10s"

[[sources]]
name = "shop"
database = "%DB%"
checkpoint_interval = "100ms"
max_await = "200ms"

[[sinks]]
name = "grouped"
type = "webhook"
url = "%GROUPED%"
secret = "${TEST_SECRET}"
allow_private_networks = true
max_in_flight = 8
transactions = "group"
  [sinks.retry]
  max_attempts = 4
  initial_interval = "50ms"
  max_interval = "500ms"

[[sinks]]
name = "plain"
type = "webhook"
url = "%PLAIN%"
secret = "${TEST_SECRET}"
allow_private_networks = true
max_in_flight = 8
  [sinks.retry]
  max_attempts = 4
  initial_interval = "50ms"
  max_interval = "500ms"

[[rules]]
name = "all"
source = "shop"
sinks = ["grouped", "plain"]
`

// groupRequest is one request the grouped sink's receiver got: its
// envelopes in order, and its place in arrival order.
type groupRequest struct {
	n     int
	array bool
	envs  []groupEnv
}

type groupEnv struct {
	ID string `json:"id"`
	NS struct {
		Coll string `json:"coll"`
	} `json:"ns"`
	DocumentKey struct {
		ID int `json:"_id"`
	} `json:"documentKey"`
	FullDocument *struct {
		V int `json:"v"`
	} `json:"fullDocument"`
	UpdateDescription *struct {
		UpdatedFields struct {
			V int `json:"v"`
		} `json:"updatedFields"`
	} `json:"updateDescription"`
	Txn *struct {
		ID    string `json:"id"`
		Index int    `json:"index"`
		Last  bool   `json:"last"`
		Part  int    `json:"part"`
		Parts int    `json:"parts"`
	} `json:"txn"`
}

// v is the write number the change carries (every write sets v).
func (g groupEnv) v() int {
	if g.UpdateDescription != nil {
		return g.UpdateDescription.UpdatedFields.V
	}
	if g.FullDocument != nil {
		return g.FullDocument.V
	}
	return -1
}

func (g groupEnv) doc() string { return fmt.Sprint(g.NS.Coll, "/", g.DocumentKey.ID) }

// groupReceiver records the grouped sink's requests in arrival order.
type groupReceiver struct {
	mu   sync.Mutex
	reqs []groupRequest
}

func (r *groupReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	if err := webhook.Verify([]string{testSecret}, req.Header, body, 5*time.Minute, time.Now()); err != nil {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var g groupRequest
	if len(body) > 0 && body[0] == '[' {
		g.array = true
		if err := json.Unmarshal(body, &g.envs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	} else {
		var e groupEnv
		if err := json.Unmarshal(body, &e); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		g.envs = []groupEnv{e}
	}
	time.Sleep(time.Millisecond) // a receiver that takes a moment
	r.mu.Lock()
	g.n = len(r.reqs)
	r.reqs = append(r.reqs, g)
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *groupReceiver) requests() []groupRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]groupRequest(nil), r.reqs...)
}

// txnWrite is one write of the workload: its document and number.
type txnWrite struct {
	doc string
	v   int
}

// writeGroupWorkload inserts 20 documents in each of 3 collections, then
// runs n transactions of 1–20 updates over them, each followed by 0–2
// single updates; every write sets v to its own number. It returns the
// transactions' writes by transaction, the number of writes, and v → the
// transaction that wrote it (-1 for single writes).
func writeGroupWorkload(client *mongo.Client, db *mongo.Database, n int, seed uint64) ([][]txnWrite, int, map[int]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rnd := rand.New(rand.NewPCG(seed, 1))
	colls := []string{"orders", "items", "payments"}
	v := 0
	owner := map[int]int{}
	for _, c := range colls {
		var docs []any
		for i := range 20 {
			v++
			docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: v}})
			owner[v] = -1
		}
		if _, err := db.Collection(c).InsertMany(ctx, docs); err != nil {
			return nil, 0, nil, err
		}
	}
	sess, err := client.StartSession()
	if err != nil {
		return nil, 0, nil, err
	}
	defer sess.EndSession(ctx)
	update := func(ctx context.Context, c string, id, v int) error {
		_, err := db.Collection(c).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: v}}}})
		return err
	}
	var txns [][]txnWrite
	for k := range n {
		size := 1 + rnd.IntN(20)
		type op struct {
			c  string
			id int
		}
		ops := make([]op, size)
		for j := range ops {
			ops[j] = op{colls[rnd.IntN(3)], rnd.IntN(20)}
		}
		base := v
		var writes []txnWrite
		if _, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
			writes = writes[:0]
			for j, o := range ops {
				if err := update(sctx, o.c, o.id, base+j+1); err != nil {
					return nil, err
				}
				writes = append(writes, txnWrite{fmt.Sprint(o.c, "/", o.id), base + j + 1})
			}
			return nil, nil
		}, options.Transaction()); err != nil {
			return nil, 0, nil, fmt.Errorf("transaction %d: %w", k, err)
		}
		v += size
		for _, w := range writes {
			owner[w.v] = k
		}
		txns = append(txns, writes)
		for range rnd.IntN(3) {
			v++
			c, id := colls[rnd.IntN(3)], rnd.IntN(20)
			if err := update(ctx, c, id, v); err != nil {
				return nil, 0, nil, err
			}
			owner[v] = -1
		}
	}
	return txns, v, owner, nil
}

// TestProcessTransactionGroupsSIGKILL runs the real binary with a grouped
// webhook sink and a plain one while 500 transactions of 1–20 updates over
// 3 collections, interleaved with single updates, are written, kills it
// twice with SIGKILL and restarts it, and checks that every request of the
// grouped sink holds exactly one whole transaction (every event of it, in
// order) or one single write; that no change of a document reached it for
// the first time after a later change of that document (so none overtook
// its transaction); that the ids and txn of every re-delivery equal the
// first delivery's; and that the plain sink got every event, those of
// transactions with txn.
func TestProcessTransactionGroupsSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	grp := &groupReceiver{}
	gsrv := httptest.NewServer(grp)
	t.Cleanup(gsrv.Close)
	plain := receiver.New(testSecret)
	t.Cleanup(plain.Close)
	plain.SetResponder(func([]byte) *receiver.Response { time.Sleep(time.Millisecond); return nil })
	tmpl := strings.NewReplacer("%GROUPED%", gsrv.URL, "%PLAIN%", plain.URL()).Replace(txnGroupConfig)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "shop")
		return ok
	})
	const n = 500
	type result struct {
		txns   [][]txnWrite
		writes int
		owner  map[int]int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		txns, w, owner, err := writeGroupWorkload(e.client, e.client.Database(e.db), n, uint64(time.Now().UnixNano()))
		done <- result{txns, w, owner, err}
	}()
	events := func() int {
		n := 0
		for _, r := range grp.requests() {
			n += len(r.envs)
		}
		return n
	}
	kills := 0
	for _, at := range []int{1500, 3500} {
		waitFor(t, 60*time.Second, fmt.Sprintf("%d events at the grouped sink", at), func() bool { return events() >= at })
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p.cmd.Wait()
		kills++
		p = startProcess(t, bin, cfgPath)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	// Every write reached both sinks.
	distinct := func(vs func(yield func(int))) int {
		seen := map[int]bool{}
		vs(func(v int) { seen[v] = true })
		return len(seen)
	}
	grpVs := func(yield func(int)) {
		for _, r := range grp.requests() {
			for _, e := range r.envs {
				yield(e.v())
			}
		}
	}
	plainVs := func(yield func(int)) {
		for _, d := range plain.Deliveries() {
			var env groupEnv
			if json.Unmarshal(d.Envelope, &env) == nil {
				yield(env.v())
			}
		}
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("all %d writes at both sinks", res.writes), func() bool {
		return distinct(grpVs) >= res.writes && distinct(plainVs) >= res.writes
	})

	// Grouped requests: one whole transaction, or one single write.
	first := map[string]groupEnv{} // id → first delivery
	lastV := map[string]int{}      // document → v of its latest first delivery
	redelivered, grouped := 0, 0
	for _, r := range grp.requests() {
		if !r.array {
			e := r.envs[0]
			if e.Txn != nil {
				t.Fatalf("request %d: a transaction's event (v %d) sent alone: %+v", r.n, e.v(), e.Txn)
			}
			if res.owner[e.v()] != -1 {
				t.Fatalf("request %d: v %d of transaction %d sent alone", r.n, e.v(), res.owner[e.v()])
			}
		} else {
			grouped++
			k := res.owner[r.envs[0].v()]
			if k < 0 {
				t.Fatalf("request %d: an array starting with single write v %d", r.n, r.envs[0].v())
			}
			want := res.txns[k]
			if len(r.envs) != len(want) {
				t.Fatalf("request %d: %d events of transaction %d, want %d", r.n, len(r.envs), k, len(want))
			}
			for i, e := range r.envs {
				if e.Txn == nil || e.Txn.ID != r.envs[0].Txn.ID || e.Txn.Index != i || e.Txn.Last != (i == len(want)-1) || e.Txn.Parts != 0 {
					t.Fatalf("request %d, element %d: txn %+v", r.n, i, e.Txn)
				}
				if e.v() != want[i].v || e.doc() != want[i].doc {
					t.Fatalf("request %d, element %d: %s v %d, want %s v %d", r.n, i, e.doc(), e.v(), want[i].doc, want[i].v)
				}
			}
		}
		for _, e := range r.envs {
			if f, ok := first[e.ID]; ok {
				redelivered++
				if f.v() != e.v() || (f.Txn == nil) != (e.Txn == nil) || f.Txn != nil && *f.Txn != *e.Txn {
					t.Fatalf("id %s re-delivered with v %d txn %+v, first v %d txn %+v", e.ID, e.v(), e.Txn, f.v(), f.Txn)
				}
				continue
			}
			first[e.ID] = e
			if prev, ok := lastV[e.doc()]; ok && e.v() < prev {
				t.Fatalf("request %d: %s v %d delivered for the first time after its later change v %d", r.n, e.doc(), e.v(), prev)
			}
			lastV[e.doc()] = e.v()
		}
	}
	if grouped < n {
		t.Fatalf("%d grouped requests, want at least %d", grouped, n)
	}
	// The plain sink: every transaction event with txn, single writes
	// without, the same txn as the grouped sink's.
	for _, d := range plain.Deliveries() {
		var env groupEnv
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		inTxn := res.owner[env.v()] >= 0
		if (env.Txn != nil) != inTxn {
			t.Fatalf("plain sink: v %d (transaction %d) has txn %+v", env.v(), res.owner[env.v()], env.Txn)
		}
		if f, ok := first[env.ID]; ok && env.Txn != nil && *f.Txn != *env.Txn {
			t.Fatalf("plain sink: id %s has txn %+v, the grouped sink %+v", env.ID, env.Txn, f.Txn)
		}
	}
	t.Logf("%d transactions, %d writes; %d grouped requests; %d kills; %d events re-delivered to the grouped sink", n, res.writes, grouped, kills, redelivered)
}

// TestTransactionGroupLargerThanBudgets writes a transaction of more
// events than max_in_flight_events and more bytes than max_in_flight_bytes
// to a grouped sink and a plain one: the source admits its events as the
// budgets allow, the plain sink gets every event, the grouped one gets the
// transaction in several parts, in order, numbered from 1, the last part
// saying how many (issue 39; before, the source admitted the transaction
// whole, past both budgets).
func TestTransactionGroupLargerThanBudgets(t *testing.T) {
	e := newEnv(t)
	plain, grouped := newTxnReceiver(t, 0), newTxnReceiver(t, 0)
	cfg := txnBudgetConfig("max_in_flight_bytes = 1048576\n", plain.srv.URL, grouped.srv.URL, "max_request_bytes = 4194304\n")
	cfg = strings.Replace(cfg, "max_await", "max_in_flight_events = 4\nmax_await", 1)
	e.start(e.config(cfg))
	const size = 40
	writeBigTxn(t, e, size, 40<<10) // 40 × 40 KiB: more than the byte budget
	waitFor(t, 30*time.Second, "the transaction and the single write at both sinks", func() bool {
		return plain.distinct() == size+1 && grouped.distinct() == size+1
	})
	checkTxnDelivery(t, "plain", plain.elems(), size, false)
	checkTxnDelivery(t, "grouped", grouped.elems(), size, true)
	if grouped.reqs < 3 {
		t.Fatalf("the grouped sink got %d requests, want the transaction in parts", grouped.reqs)
	}
}
