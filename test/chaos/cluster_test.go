package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/test/receiver"
)

// The high-availability story with real binaries: three changegate
// replicas in cluster mode share one source split into 4 partitions while a
// writer changes 150 documents continuously. One active replica is killed
// (-9) and restarted, another is frozen (SIGSTOP) for longer than the lease
// TTL and thawed, a third is stopped gracefully and started again. The
// receiver must get every change (nothing lost), per-document order must
// hold (a re-delivery only repeats changes, then goes on through the later
// ones), duplicates must carry the same webhook-id, no checkpoint may move
// backwards, a killed replica's units must be delivered again within
// lease_ttl + 5 s and a gracefully stopped replica's within 2 s.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three binaries")
	}
	bin := changegateBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	seed := uint64(time.Now().UnixNano() % 1_000_000)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x636c7573))
	t0 := time.Now()

	srv, client, coll := watchedServer(ctx, t)
	hook, err := newEndpoint(testSecret, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close()

	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "cluster.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	const ttl = 3 * time.Second
	type replica struct {
		name, admin, cfg string
		proc             *gatewayProc
	}
	var mu sync.Mutex
	reps := make([]*replica, 3)
	for i := range reps {
		r := &replica{name: fmt.Sprintf("cg-%d", i), admin: freePort(t)}
		r.cfg = filepath.Join(dir, r.name+".toml")
		if err := os.WriteFile(r.cfg, []byte(clusterConfig(srv.URI(), r.admin, hook.URL(), r.name)), 0o600); err != nil {
			t.Fatal(err)
		}
		reps[i] = r
	}
	env := []string{"TEST_SECRET=" + testSecret}
	start := func(r *replica) error {
		p, err := startGateway(bin, r.cfg, env, logFile)
		if err != nil {
			return err
		}
		mu.Lock()
		r.proc = p
		mu.Unlock()
		return nil
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range reps {
			if r.proc != nil {
				_ = r.proc.cmd.Process.Signal(syscall.SIGCONT)
				r.proc.kill()
			}
		}
	}()
	for _, r := range reps {
		if err := start(r); err != nil {
			t.Fatal(err)
		}
	}
	// Every unit owned, every replica ready, before the writer starts (the
	// first start reads from "now").
	if err := waitUntil(ctx, 60*time.Second, func() bool {
		owned := 0
		for _, r := range reps {
			st, code, err := clusterStatusOf(r.admin)
			if err != nil || code != http.StatusOK {
				return false
			}
			owned += len(st.active())
		}
		return owned == 4
	}); err != nil {
		t.Fatalf("the 4 units were not taken by the 3 replicas: %v (log %s)", err, logFile.Name())
	}

	// Checkpoints must never move backwards: watch them throughout.
	cps := client.Database(stateDB).Collection("checkpoints")
	var backwards []string
	watchDone := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(ctx)
	go func() {
		defer close(watchDone)
		last := map[string]string{}
		for watchCtx.Err() == nil {
			cur, err := cps.Find(watchCtx, bson.D{})
			if err == nil {
				for cur.Next(watchCtx) {
					id, _ := cur.Current.Lookup("_id").StringValueOK()
					pos, _ := cur.Current.Lookup("pos").StringValueOK()
					if pos == "" {
						continue
					}
					if prev := last[id]; pos < prev {
						backwards = append(backwards, fmt.Sprintf("%s: %s after %s", id, pos, prev))
					}
					last[id] = pos
				}
				_ = cur.Close(watchCtx)
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	// Faults while the writer writes 2,500 changes at 100/s.
	type fault struct {
		what  string
		at    time.Time
		units []string
	}
	var faults []fault
	faultsDone := make(chan error, 1)
	jitter := make([]time.Duration, 6) // drawn here: rng also drives the writer
	for i := range jitter {
		jitter[i] = time.Duration(rng.IntN(500)) * time.Millisecond
	}
	w0 := time.Now()
	go func() {
		sleepUntil := func(d time.Duration) bool {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Until(w0.Add(d))):
				return true
			}
		}
		// pick returns the running replica (not excluded) that owns the
		// most units, and those units.
		pick := func(exclude ...*replica) (*replica, []string) {
			var best *replica
			var bestUnits []string
			for _, r := range reps {
				if slices.Contains(exclude, r) {
					continue
				}
				st, _, err := clusterStatusOf(r.admin)
				if err != nil {
					continue
				}
				if u := st.active(); len(u) > len(bestUnits) {
					best, bestUnits = r, u
				}
			}
			return best, bestUnits
		}
		var killed, frozen *replica
		steps := []func() error{
			func() error { // kill -9 the busiest replica
				r, units := pick()
				if r == nil {
					return fmt.Errorf("no replica owns a unit")
				}
				faults = append(faults, fault{"kill " + r.name, time.Now(), units})
				r.proc.kill()
				killed = r
				return nil
			},
			func() error { return start(killed) },
			func() error { // freeze another for longer than the TTL
				r, units := pick(killed)
				if r == nil {
					return fmt.Errorf("no other replica owns a unit")
				}
				faults = append(faults, fault{"stop " + r.name, time.Now(), units})
				frozen = r
				return r.proc.cmd.Process.Signal(syscall.SIGSTOP)
			},
			func() error { return frozen.proc.cmd.Process.Signal(syscall.SIGCONT) },
			func() error { // graceful stop of a third, then start it again
				r, units := pick(killed, frozen)
				if r == nil {
					r, units = pick()
				}
				if r == nil {
					return fmt.Errorf("no replica owns a unit")
				}
				faults = append(faults, fault{"term " + r.name, time.Now(), units})
				if err := r.proc.stop(20 * time.Second); err != nil {
					return fmt.Errorf("graceful stop of %s: %w", r.name, err)
				}
				killed = r
				return nil
			},
			func() error { return start(killed) },
		}
		at := []time.Duration{4 * time.Second, 6 * time.Second, 9 * time.Second, 9*time.Second + ttl + 2*time.Second, 17 * time.Second, 20 * time.Second}
		for i, step := range steps {
			if !sleepUntil(at[i] + jitter[i]) {
				faultsDone <- ctx.Err()
				return
			}
			if err := step(); err != nil {
				faultsDone <- err
				return
			}
		}
		faultsDone <- nil
	}()
	j, werr := workload{docs: 150, changes: 2500, rate: 100}.write(ctx, rng, coll)
	if err := <-faultsDone; err != nil {
		t.Fatalf("faults: %v", err)
	}
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	// Settled: every change delivered at least once and the receiver
	// quiet for 3 s.
	if err := waitUntil(ctx, 90*time.Second, func() bool {
		rs := hook.Requests()
		return len(rs) > 0 && time.Since(rs[len(rs)-1].At) > 3*time.Second && verify(j, hook.rcv.Deliveries(), t0).OK()
	}); err != nil {
		t.Errorf("not settled after the writer ended")
	}
	stopWatch()
	<-watchDone

	r := verify(j, hook.rcv.Deliveries(), t0)
	t.Logf("cluster: %s\n%s", r.Summary(), r.Details(15))
	if !r.OK() {
		t.Errorf("delivery checks failed (seed %d, log %s)", seed, logFile.Name())
	}
	for _, b := range backwards {
		t.Errorf("checkpoint moved backwards: %s", b)
	}
	// Failover and handover: for the units of the replica that went away,
	// from the last delivery before to the first delivery after.
	ds := hook.rcv.Deliveries()
	for _, f := range faults {
		gap, ok := unitGap(ds, f.units, f.at)
		if !ok {
			t.Errorf("%s: no delivery of its units %v before and after it", f.what, f.units)
			continue
		}
		t.Logf("%s (units %v): last delivery before → first after: %v", f.what, f.units, gap.Round(time.Millisecond))
		switch f.what[:4] {
		case "kill", "stop":
			if gap > ttl+5*time.Second {
				t.Errorf("%s: failover took %v, more than lease_ttl + 5 s", f.what, gap)
			}
		case "term":
			if gap > 2*time.Second {
				t.Errorf("%s: graceful handover took %v, more than 2 s", f.what, gap)
			}
		}
	}
	if t.Failed() {
		if b, err := os.ReadFile(logFile.Name()); err == nil && len(b) < 1<<20 {
			t.Logf("changegate log:\n%s", b)
		}
	}
}

func clusterConfig(mongoURI, admin, hookURL, instance string) string {
	return fmt.Sprintf(`
[mongo]
uri = %q
state_database = %q

[server]
listen = %q
shutdown_grace = "5s"
public_read = true

[cluster]
enabled = true
lease_ttl = "3s"
renew_every = "500ms"
instance = %q

[[sources]]
name = "items"
database = %q
collection = "items"
full_document_before_change = "whenAvailable"
partitions = 4

[[sinks]]
name = "hook"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true

[[rules]]
name = "all"
source = "items"
sinks = ["hook"]
`, mongoURI, stateDB, admin, instance, watchedDB, hookURL)
}

// clusterStatus is the part of /api/v1/status the cluster test reads.
type clusterStatus struct {
	Instance string `json:"instance"`
	Units    []struct {
		Name  string `json:"name"`
		Owner string `json:"owner"`
		Role  string `json:"role"`
	} `json:"units"`
	Sources []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"sources"`
}

// open returns how many of the units this replica runs have their change
// stream open: a change written after that is read (one written before a
// unit's first stream opened, with no checkpoint yet, is not).
func (s clusterStatus) open() int {
	n := 0
	for _, src := range s.Sources {
		if src.State == "open" {
			n++
		}
	}
	return n
}

// active returns the units this replica runs.
func (s clusterStatus) active() []string {
	var out []string
	for _, u := range s.Units {
		if u.Role == "active" {
			out = append(out, u.Name)
		}
	}
	return out
}

func clusterStatusOf(admin string) (clusterStatus, int, error) {
	var st clusterStatus
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + admin + "/api/v1/status")
	if err != nil {
		return st, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, resp.StatusCode, err
	}
	return st, resp.StatusCode, json.Unmarshal(b, &st)
}

// unitOf returns the unit ("items#i/4") of the document with _id id, as
// the partition filter computes it: MongoDB's hashed index key of the
// documentKey.
func unitOf(id int32) string {
	raw, err := bson.Marshal(bson.D{{Key: "_id", Value: id}})
	if err != nil {
		panic(err)
	}
	h := mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: raw})
	return fmt.Sprintf("items#%d/4", mhash.Partition(h, 4))
}

// unitGap returns, for the deliveries of documents in units, the time from
// the last one before at to the first one after it.
func unitGap(ds []receiver.Delivery, units []string, at time.Time) (time.Duration, bool) {
	var before, after time.Time
	for _, d := range ds {
		p, err := parseDelivery(d)
		if err != nil || !slices.Contains(units, unitOf(p.Doc)) {
			continue
		}
		if d.At.Before(at) {
			if d.At.After(before) {
				before = d.At
			}
		} else if after.IsZero() || d.At.Before(after) {
			after = d.At
		}
	}
	if before.IsZero() || after.IsZero() {
		return 0, false
	}
	return after.Sub(before), true
}
