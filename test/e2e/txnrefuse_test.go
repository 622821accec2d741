package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
)

const txnRefuseConfig = `
[mongo]
uri = "%URI%"
state_database = "%STATE%"

[server]
listen = "127.0.0.1:0"

[[sources]]
name = "shop"
database = "%DB%"
checkpoint_interval = "100ms"
max_await = "200ms"

[[sinks]]
name = "grouped"
type = "webhook"
url = "%GROUPED%"
allow_private_networks = true
transactions = "group"
max_request_bytes = 1048576
park_after = "2s"
  [sinks.retry]
  max_attempts = 20
  initial_interval = "200ms"
  max_interval = "200ms"

[[rules]]
name = "all"
source = "shop"
sinks = ["grouped"]
`

// refuseReceiver answers the grouped sink's requests as its mode says:
// "hold2" accepts a transaction's first part and holds the second until
// release is closed; "refuse2" accepts the first part and refuses (400) the
// others; "accept" accepts everything. It records every request's
// envelopes.
type refuseReceiver struct {
	mu      sync.Mutex
	mode    string
	reqs    [][]groupEnv
	release chan struct{}
}

func (r *refuseReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var envs []groupEnv
	if len(body) > 0 && body[0] != '[' {
		body = append(append([]byte{'['}, body...), ']') // a single change
	}
	if err := json.Unmarshal(body, &envs); err != nil || len(envs) == 0 {
		http.Error(w, fmt.Sprint("not an envelope: ", err), http.StatusUnprocessableEntity)
		return
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, envs)
	mode := r.mode
	r.mu.Unlock()
	part := 0
	if envs[0].Txn != nil {
		part = envs[0].Txn.Part
	}
	switch {
	case mode == "hold2" && part > 1:
		<-r.release
		http.Error(w, "gone", http.StatusServiceUnavailable)
	case mode == "refuse2" && part > 1:
		http.Error(w, "refused: this receiver takes no partial transactions", http.StatusBadRequest)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (r *refuseReceiver) set(mode string) {
	r.mu.Lock()
	r.mode, r.reqs = mode, nil
	r.mu.Unlock()
}

func (r *refuseReceiver) requests() [][]groupEnv {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

// A grouped transaction in parts, the process killed (SIGKILL) while its
// second part is on the wire: the next process sends the first part again,
// and when the receiver refuses the second, dead-letters the second and
// every later part (not sent) with the receiver's answer, under the same
// ids, each once, and the first part not; a replay then sends exactly the
// dead-lettered events, as one transaction in index order.
func TestProcessTxnRefusedAfterKillBetweenParts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	rcv := &refuseReceiver{mode: "hold2", release: make(chan struct{})}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	released := false
	release := func() {
		if !released {
			released = true
			close(rcv.release)
		}
	}
	t.Cleanup(release)
	tmpl := strings.NewReplacer("%GROUPED%", srv.URL).Replace(txnRefuseConfig)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(tmpl)
	cps, dls := e.stores(cfg)
	p := startProcess(t, bin, cfgPath)
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "shop")
		return ok
	})

	// 12 inserts of 200 KB in one transaction: 3 or more parts of 1 MiB.
	const n = 12
	sess, err := e.client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(t.Context())
	pad := strings.Repeat("p", 200<<10)
	if _, err := sess.WithTransaction(t.Context(), func(sctx context.Context) (any, error) {
		for i := range n {
			if _, err := e.coll("items").InsertOne(sctx, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: i}, {Key: "pad", Value: pad}}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	// A later single write, delivered once the transaction is finished.
	if _, err := e.coll("items").InsertOne(t.Context(), bson.D{{Key: "_id", Value: 1000}, {Key: "v", Value: n}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the second part on the wire", func() bool { return len(rcv.requests()) >= 2 })
	first := rcv.requests()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	release()
	parts := first[0][0].Txn.Parts
	if parts < 3 || first[1][0].Txn.Part != 2 {
		t.Fatalf("requests before the kill: %d, first of %d parts: want the second of 3 or more parts held", len(first), parts)
	}
	ids := map[string]int{} // event id -> txn index
	var part1 []string
	for _, env := range first[0] {
		ids[env.ID] = env.Txn.Index
		part1 = append(part1, env.ID)
	}

	rcv.set("refuse2")
	p = startProcess(t, bin, cfgPath)
	var dead []deadletter.Entry
	t.Cleanup(func() {
		if t.Failed() {
			var shape []string
			for _, r := range rcv.requests() {
				if r[0].Txn != nil {
					shape = append(shape, fmt.Sprintf("%d/%d:%d", r[0].Txn.Part, r[0].Txn.Parts, len(r)))
				} else {
					shape = append(shape, "single")
				}
			}
			t.Logf("dead letters %d, requests %v\n%s", len(dead), shape, p.out)
		}
	})
	waitFor(t, 30*time.Second, "the refused parts dead-lettered and the single write delivered", func() bool {
		dead, err = dls.List(t.Context(), deadletter.Filter{Kind: deadletter.KindFailed})
		if err != nil || len(dead) < n-len(part1) {
			return false
		}
		for _, r := range rcv.requests() {
			if len(r) == 1 && r[0].Txn == nil {
				return true
			}
		}
		return false
	})
	second := rcv.requests()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	// The second process sent part 1 again and part 2 (refused), nothing
	// of the later parts, then the single write.
	var sentTxn int
	for _, r := range second {
		if r[0].Txn != nil {
			sentTxn++
			if r[0].Txn.Part > 2 {
				t.Errorf("part %d was sent after part 2 was refused", r[0].Txn.Part)
			}
		}
	}
	if sentTxn != 2 || len(second[0]) != len(part1) || second[0][0].ID != part1[0] {
		t.Errorf("second run: %d transaction requests, first of %d events: want part 1 (%d events, same ids) and part 2", sentTxn, len(second[0]), len(part1))
	}
	if len(dead) != n-len(part1) {
		t.Fatalf("%d dead letters, want %d (every event after part 1)", len(dead), n-len(part1))
	}
	txnID := first[0][0].Txn.ID
	var want []int
	for _, d := range dead {
		if d.Reason != "http_400" || !strings.Contains(d.LastError, "takes no partial transactions") || d.Txn == nil || d.Txn.ID != txnID {
			t.Errorf("dead letter %s: reason %q, error %q, txn %+v: want the receiver's 400 in transaction %s", d.ID, d.Reason, d.LastError, d.Txn, txnID)
			continue
		}
		if slices.Contains(part1, d.EventID) {
			t.Errorf("dead letter %s: an event of the delivered first part", d.ID)
		}
		want = append(want, d.Txn.Index)
	}
	slices.Sort(want)
	for i, idx := range want {
		if idx != len(part1)+i {
			t.Fatalf("dead-lettered indexes %v: want %d..%d", want, len(part1), n-1)
		}
	}
	for _, r := range second {
		for _, env := range r {
			if i, ok := ids[env.ID]; ok && env.Txn.Index != i {
				t.Errorf("event %s: index %d, was %d", env.ID, env.Txn.Index, i)
			}
		}
	}

	// A replay sends the dead-lettered events as one transaction, in
	// index order, and deletes them.
	rcv.set("accept")
	res, err := e.replay(cfg)
	if err != nil || res.Replayed != len(dead) {
		t.Fatalf("replay: %+v, %v: want %d replayed", res, err, len(dead))
	}
	var got []int
	for _, r := range rcv.requests() {
		for _, env := range r {
			if env.Txn == nil || env.Txn.ID != txnID {
				t.Fatalf("replayed %s outside the transaction", env.ID)
			}
			got = append(got, env.Txn.Index)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("replayed indexes %v, want %v", got, want)
	}
	if left, _ := dls.List(t.Context(), deadletter.Filter{Kind: deadletter.KindFailed}); len(left) != 0 {
		t.Fatalf("%d dead letters left after the replay", len(left))
	}
}
