package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/test/mongowire"
	"github.com/changegate/changegate/test/receiver"
)

// The cluster chaos campaign (issue 25): three replicas in cluster mode
// (partitions = 6, lease_ttl = "5s"), each reaching MongoDB through its own
// cuttable TCP proxy, deliver to a default webhook sink and a parking one
// (park_after = "2s") while the receivers go through outages (503 with
// Retry-After, 503 without, connections refused) and the replicas through
// faults (kill -9 and restart, SIGSTOP past the TTL and SIGCONT, SIGTERM and
// restart, connection cuts of 0.5–5 s). Each sink is checked by verify: no
// change lost, per-document order among first deliveries and replays. Its
// duplicates are counted, and so are stale sends: a request that reached a
// receiver from a replica after that replica's own "lost the lease" (or
// "released unit") line for the document's unit, with no "acquired unit"
// since.

const (
	clusterParts = 6
	clusterTTL   = 5 * time.Second
)

// clusterCampaign is one cluster run's shape; its schedule comes from seed.
type clusterCampaign struct {
	seed                uint64
	work                workload
	kills, stops, terms int // replica faults
	cuts                int // per-replica connection cuts of 0.5–5 s
	outages             int // receiver outages of 2–6 s, kinds in turn: 503 + Retry-After, bare 503, refused
	drain               time.Duration
	// txnLifetime is the server's transactionLifetimeLimitSeconds (zero:
	// MongoDB's default, 60 s): how long a parked write's transaction
	// left open by a killed or paused replica holds its unit's guard.
	txnLifetime time.Duration
	// handovers are SIGTERMs and restarts each 0.2–1 s after the end of
	// an outage (in turn), while the replicas re-drive what they parked
	// during it: the restarted replica takes its share back, so the
	// others hand units over in the middle of their re-drives.
	handovers int
}

// TestClusterChaos is the long campaign, opt-in with
// CHANGEGATE_CHAOS_CLUSTER=1; CHANGEGATE_CHAOS_RUNS and CHANGEGATE_CHAOS_SEED
// choose the number of runs and the schedule, as for TestChaos.
func TestClusterChaos(t *testing.T) {
	seededRuns(t, "CHANGEGATE_CHAOS_CLUSTER", "go test ./test/chaos -run ClusterChaos -v -timeout 60m", func(t *testing.T, bin string, s uint64) {
		runClusterCampaign(t, bin, clusterCampaign{
			seed: s, work: workload{docs: 200, changes: 9000, rate: 50},
			kills: 7, stops: 6, terms: 7, cuts: 10, outages: 6, drain: 4 * time.Minute,
		})
	})
}

// TestClusterChaosShort is a short campaign (about 40 s of writing, about
// 50 s in all) in the default suite, skipped with -short like
// TestChaosSmoke: seed 8 unless CHANGEGATE_CHAOS_SEED says otherwise. The
// server aborts transactions left open after 10 s
// (transactionLifetimeLimitSeconds = 10) so that a replica killed during a
// parked write holds its unit's writes up for at most that long; the long
// campaign keeps MongoDB's default of 60 s.
func TestClusterChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the short cluster chaos campaign takes about a minute")
	}
	seed, err := envInt("CHANGEGATE_CHAOS_SEED", 8)
	if err != nil || seed < 0 {
		t.Fatalf("CHANGEGATE_CHAOS_SEED: want a non-negative integer (%v)", err)
	}
	t.Logf("seed %d", seed)
	runClusterCampaign(t, changegateBinary(t), clusterCampaign{
		seed: uint64(seed), work: workload{docs: 200, changes: 2000, rate: 50},
		kills: 1, stops: 1, terms: 1, cuts: 3, outages: 3, handovers: 2, drain: 2 * time.Minute,
		txnLifetime: 10 * time.Second,
	})
}

// clusterEvent is one scheduled fault, at an offset from the writer's start.
type clusterEvent struct {
	at   time.Duration
	what string // kill, stop, term, cut, outage
	kind hookMode
	dur  time.Duration
}

func (c clusterCampaign) schedule(rng *rand.Rand) []clusterEvent {
	writing := time.Duration(float64(c.work.changes) / c.work.rate * float64(time.Second))
	in := func(from, to time.Duration) time.Duration { return from + time.Duration(rng.Int64N(int64(to-from))) }
	from := min(3*time.Second, writing/5)
	var evs []clusterEvent
	// Replica faults in turn, each in its own slice of the writing time
	// (a stop outlasts the TTL, so it may overlap the next fault).
	var kinds0 []string
	for range c.kills {
		kinds0 = append(kinds0, "kill")
	}
	for range c.stops {
		kinds0 = append(kinds0, "stop")
	}
	for range c.terms {
		kinds0 = append(kinds0, "term")
	}
	rng.Shuffle(len(kinds0), func(i, k int) { kinds0[i], kinds0[k] = kinds0[k], kinds0[i] })
	if n := len(kinds0); n > 0 {
		slice := (writing - from) / time.Duration(n)
		for i, what := range kinds0 {
			var dur time.Duration
			switch what {
			case "kill":
				dur = in(time.Second, 3*time.Second)
			case "stop":
				dur = clusterTTL + in(time.Second, 4*time.Second)
			case "term":
				dur = in(500*time.Millisecond, 2*time.Second)
			}
			evs = append(evs, clusterEvent{at: from + time.Duration(i)*slice + in(0, slice), what: what, dur: dur})
		}
	}
	for range c.cuts {
		evs = append(evs, clusterEvent{at: in(from, writing), what: "cut", dur: in(500*time.Millisecond, 5*time.Second)})
	}
	// Outages one after the other, each in its own slice of the writing time.
	kinds := []hookMode{hookUnavailable, hookUnavailableBare, hookRefusing}
	if c.outages > 0 {
		slice := (writing - from) / time.Duration(c.outages)
		for i := range c.outages {
			dur := in(2*time.Second, 6*time.Second)
			start := from + time.Duration(i)*slice + in(0, max(slice-dur, time.Millisecond))
			evs = append(evs, clusterEvent{at: start, what: "outage", kind: kinds[i%len(kinds)], dur: dur})
		}
	}
	var ends []time.Duration
	for _, ev := range evs {
		if ev.what == "outage" {
			ends = append(ends, ev.at+ev.dur)
		}
	}
	for i := range c.handovers {
		if len(ends) == 0 {
			break
		}
		evs = append(evs, clusterEvent{at: ends[i%len(ends)] + in(200*time.Millisecond, time.Second), what: "term", dur: in(500*time.Millisecond, 2*time.Second)})
	}
	slices.SortStableFunc(evs, func(a, b clusterEvent) int { return int(a.at - b.at) })
	return evs
}

func modeName(m hookMode) string {
	switch m {
	case hookUnavailable:
		return "503 with Retry-After"
	case hookUnavailableBare:
		return "503 without Retry-After"
	case hookRefusing:
		return "receiver down"
	}
	return "normal"
}

// clusterReplica is one changegate replica of the campaign.
type clusterReplica struct {
	name, admin, cfg, logPath string
	px                        *proxy
	log                       *os.File

	mu   sync.Mutex
	proc *gatewayProc
	busy bool // a fault is under way
}

func runClusterCampaign(t *testing.T, bin string, c clusterCampaign) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(c.seed, 0x636c6368))
	t0 := time.Now()

	srv, client, coll := watchedServer(ctx, t, mongowire.Options{TransactionLifetimeLimit: c.txnLifetime})
	deadLetters := client.Database(stateDB).Collection("deadletters")
	plain, err := newEndpoint(testSecret, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	parking, err := newEndpoint(testSecret, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer parking.Close()

	dir := os.Getenv("CHANGEGATE_CHAOS_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"TEST_SECRET=" + testSecret}
	reps := make([]*clusterReplica, 3)
	for i := range reps {
		r := &clusterReplica{name: fmt.Sprintf("cg-%d", i), admin: freePort(t)}
		if r.px, err = newProxy(srv.Addr()); err != nil {
			t.Fatal(err)
		}
		defer r.px.Close()
		r.cfg = filepath.Join(dir, fmt.Sprintf("cluster-%d-%s.toml", c.seed, r.name))
		cfg := clusterChaosConfig("mongodb://"+r.px.Addr()+"/?directConnection=true", r.admin, r.name,
			plain.URL()+"/"+r.name, parking.URL()+"/"+r.name)
		if err := os.WriteFile(r.cfg, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		r.logPath = filepath.Join(dir, fmt.Sprintf("cluster-%d-%s.log", c.seed, r.name))
		if r.log, err = os.Create(r.logPath); err != nil {
			t.Fatal(err)
		}
		defer r.log.Close()
		reps[i] = r
	}
	start := func(r *clusterReplica) error {
		p, err := startGateway(bin, r.cfg, env, r.log)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.proc = p
		r.mu.Unlock()
		return nil
	}
	defer func() {
		for _, r := range reps {
			r.mu.Lock()
			if r.proc != nil {
				_ = r.proc.cmd.Process.Signal(syscall.SIGCONT)
				r.proc.kill()
			}
			r.mu.Unlock()
		}
	}()
	for _, r := range reps {
		if err := start(r); err != nil {
			t.Fatal(err)
		}
	}
	// Every unit owned before the writer starts (the first start reads
	// from "now").
	if err := waitUntil(ctx, 90*time.Second, func() bool {
		owned := 0
		for _, r := range reps {
			st, code, err := clusterStatusOf(r.admin)
			if err != nil || code != http.StatusOK {
				return false
			}
			owned += len(st.active())
		}
		return owned == clusterParts
	}); err != nil {
		t.Fatalf("the %d units were not taken by the 3 replicas: %v (logs in %s)", clusterParts, err, dir)
	}

	// Owned is not reading: a unit's first start reads from when its
	// stream opens. A warm-up document in every unit (negative _ids, not in
	// the journal), changed again every 2 s until both sinks got it, shows
	// every stream is open.
	var warm []int32
	for id, seen := int32(-1), map[string]bool{}; len(seen) < clusterParts; id-- {
		if u := unitOfN(id, clusterParts); !seen[u] {
			seen[u] = true
			warm = append(warm, id)
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "seq", Value: int64(0)}}); err != nil {
				t.Fatalf("warm-up: %v", err)
			}
		}
	}
	nudged := time.Now()
	if err := waitUntil(ctx, 90*time.Second, func() bool {
		a, b := warmups(plain.rcv.Deliveries()), warmups(parking.rcv.Deliveries())
		done := true
		for _, id := range warm {
			if a[id] && b[id] {
				continue
			}
			done = false
			if time.Since(nudged) > 2*time.Second {
				if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}}}}); err != nil {
					t.Logf("warm-up: %v", err)
				}
			}
		}
		if time.Since(nudged) > 2*time.Second {
			nudged = time.Now()
		}
		return done
	}); err != nil {
		t.Fatalf("the warm-up documents were not delivered to both sinks: %v (logs in %s)", err, dir)
	}

	evs := c.schedule(rng)
	pick := make([]int, len(evs)) // drawn here: rng also drives the writer
	for i := range pick {
		pick[i] = rng.IntN(len(reps))
	}
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var faultErrs []error
	var counts = map[string]int{}
	fail := func(err error) {
		errMu.Lock()
		faultErrs = append(faultErrs, err)
		errMu.Unlock()
	}
	// claim marks a free replica busy, starting from the drawn one.
	claim := func(i int) *clusterReplica {
		for k := range reps {
			r := reps[(i+k)%len(reps)]
			r.mu.Lock()
			free := !r.busy
			r.busy = true
			r.mu.Unlock()
			if free {
				return r
			}
		}
		return nil
	}
	release := func(r *clusterReplica) {
		r.mu.Lock()
		r.busy = false
		r.mu.Unlock()
	}
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	var outageMu sync.Mutex // outages do not overlap; a late one waits
	w0 := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, ev := range evs {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(w0.Add(ev.at))):
			}
			if ev.what == "outage" {
				wg.Add(1)
				go func() {
					defer wg.Done()
					outageMu.Lock()
					defer outageMu.Unlock()
					t.Logf("%s: receivers: %s for %v", rel(time.Now(), t0), modeName(ev.kind), ev.dur.Round(time.Millisecond))
					if err := errors.Join(plain.setMode(ev.kind), parking.setMode(ev.kind)); err != nil {
						fail(err)
					}
					sleep(ev.dur)
					if err := errors.Join(plain.setMode(hookNormal), parking.setMode(hookNormal)); err != nil {
						fail(err)
					}
					errMu.Lock()
					counts["outage"]++
					errMu.Unlock()
				}()
				continue
			}
			if ev.what == "cut" { // the replica's proxy, whatever its process does
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := reps[pick[i]]
					t.Logf("%s: cut %s for %v", rel(time.Now(), t0), r.name, ev.dur.Round(time.Millisecond))
					r.px.CutFor(ev.dur)
					errMu.Lock()
					counts["cut"]++
					errMu.Unlock()
				}()
				continue
			}
			r := claim(pick[i])
			if r == nil {
				t.Logf("%s: %s skipped: every replica is under a fault", rel(time.Now(), t0), ev.what)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer release(r)
				r.mu.Lock()
				p := r.proc
				r.mu.Unlock()
				t.Logf("%s: %s %s for %v", rel(time.Now(), t0), ev.what, r.name, ev.dur.Round(time.Millisecond))
				switch ev.what {
				case "kill":
					p.kill()
					sleep(ev.dur)
					if err := start(r); err != nil {
						fail(err)
					}
				case "stop":
					if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
						fail(err)
					}
					sleep(ev.dur)
					if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
						fail(err)
					}
				case "term":
					if err := p.stop(30 * time.Second); err != nil {
						fail(fmt.Errorf("graceful stop of %s: %w", r.name, err))
					}
					sleep(ev.dur)
					if err := start(r); err != nil {
						fail(err)
					}
				}
				errMu.Lock()
				counts[ev.what]++
				errMu.Unlock()
			}()
		}
	}()
	j, werr := c.work.write(ctx, rng, coll)
	wg.Wait()
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	for _, err := range faultErrs {
		t.Errorf("fault: %v", err)
	}
	wrote := time.Now()

	lastDelivery := func() time.Time {
		var last time.Time
		for _, e := range []*endpoint{plain, parking} {
			if rs := e.Requests(); len(rs) > 0 && rs[len(rs)-1].At.After(last) {
				last = rs[len(rs)-1].At
			}
		}
		return last
	}
	var why string
	if err := waitUntil(ctx, c.drain, func() bool {
		for _, r := range reps {
			ok, w := settled(ctx, r.admin, deadLetters)
			if !ok {
				why = r.name + ": " + w
				return false
			}
		}
		for _, e := range []*endpoint{plain, parking} {
			if r := verify(j, journaled(e.rcv.Deliveries()), t0); len(r.Lost)+len(r.Final) > 0 {
				why = "not everything delivered yet: " + r.Summary()
				return false
			}
		}
		why = "receivers not quiet"
		return time.Since(lastDelivery()) > 3*time.Second
	}); err != nil {
		t.Errorf("not settled %v after the writer ended: %s (logs in %s)", c.drain, why, dir)
	}
	settledAt := time.Now()
	failed, _ := deadLetters.CountDocuments(ctx, bson.D{{Key: "kind", Value: "failed"}})
	for _, r := range reps {
		r.mu.Lock()
		if err := r.proc.stop(30 * time.Second); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
		r.mu.Unlock()
	}

	t.Logf("run: seed %d, %d changes on %d documents, wrote in %.1f s, settled %.1f s later, %.1f s in all; faults %v; failed dead letters %d; logs in %s",
		c.seed, j.total, len(j.docs), wrote.Sub(w0).Seconds(), settledAt.Sub(wrote).Seconds(), time.Since(t0).Seconds(), counts, failed, dir)
	leases := map[string][]leaseEvent{}
	for _, r := range reps {
		evs, err := readLeaseEvents(r.logPath)
		if err != nil {
			t.Errorf("%s's log: %v", r.name, err)
		}
		leases[r.name] = evs
	}
	for _, s := range []struct {
		name string
		e    *endpoint
	}{{"plain (batch_size 10)", plain}, {"parking (park_after 2s)", parking}} {
		r := verify(j, journaled(s.e.rcv.Deliveries()), t0)
		st := staleSends(s.e.Requests(), leases, func(doc int32) string { return unitOfN(doc, clusterParts) })
		t.Logf("sink %s: %s; %s\n%s", s.name, r.Summary(), st.Summary(), r.Details(15)+st.Details(10, t0))
		if !r.OK() {
			t.Errorf("sink %s: delivery checks failed (seed %d)", s.name, c.seed)
		}
		if n := st.afterRelease(); n > 0 {
			// A handover ends the tenure and waits until no request of
			// the unit is in progress before it releases the lease.
			t.Errorf("sink %s: %d requests reached the receiver after their replica released the unit (seed %d)", s.name, n, c.seed)
		}
		if n := st.lateAfterLoss(staleLate); n > 0 {
			t.Errorf("sink %s: %d requests reached the receiver more than %v after their replica lost the unit (seed %d)", s.name, n, staleLate, c.seed)
		}
	}
	if failed > 0 {
		t.Errorf("%d changes were dead-lettered as failed (seed %d)", failed, c.seed)
	}
	if t.Failed() {
		t.Logf("changegate logs: %s", dir)
	}
}

func clusterChaosConfig(mongoURI, admin, instance, plainURL, parkingURL string) string {
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
lease_ttl = %q
instance = %q

[[sources]]
name = "items"
database = %q
collection = "items"
full_document_before_change = "whenAvailable"
partitions = %d

[[sinks]]
name = "plain"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
# Batches gathered from several document queues, fenced by the leases of
# the units of their events (the endpoint checks each envelope's unit).
batch_size = 10

[[sinks]]
name = "parking"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
park_after = "2s"

[[rules]]
name = "all"
source = "items"
sinks = ["plain", "parking"]
`, mongoURI, stateDB, admin, clusterTTL.String(), instance, watchedDB, clusterParts, plainURL, parkingURL)
}

// warmups returns the distinct warm-up documents (negative _ids) in ds.
func warmups(ds []receiver.Delivery) map[int32]bool {
	out := map[int32]bool{}
	for _, d := range ds {
		if id, ok := docKeyID(d); ok && id < 0 {
			out[id] = true
		}
	}
	return out
}

// journaled leaves out the warm-up documents' deliveries.
func journaled(ds []receiver.Delivery) []receiver.Delivery {
	return slices.DeleteFunc(slices.Clone(ds), func(d receiver.Delivery) bool {
		id, ok := docKeyID(d)
		return ok && id < 0
	})
}

func docKeyID(d receiver.Delivery) (int32, bool) {
	var k struct {
		ID *int32 `json:"_id"`
	}
	if json.Unmarshal([]byte(d.DocKey), &k) != nil || k.ID == nil {
		return 0, false
	}
	return *k.ID, true
}

// unitOfN returns the unit ("items#i/n") of the document with _id id.
func unitOfN(id int32, n int) string {
	raw, err := bson.Marshal(bson.D{{Key: "_id", Value: id}})
	if err != nil {
		panic(err)
	}
	h := mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: raw})
	return fmt.Sprintf("items#%d/%d", mhash.Partition(h, n), n)
}

// leaseEvent is a replica's log line about one of its units.
type leaseEvent struct {
	At   time.Time
	Unit string
	Held bool   // acquired; false: lost or released
	What string // "acquired", "lost" or "released"
}

var (
	leaseLine = regexp.MustCompile(`^time=(\S+) .*msg="?(acquired unit|released unit|lost the lease[^"]*)"? .*\bunit="?([^" ]+)"? epoch=(\d+)`)
	// A unit's source logs (e.g. "resuming from checkpoint") under its new
	// epoch a few milliseconds before the "acquired unit" line.
	unitLine = regexp.MustCompile(`^time=(\S+) .*\bunit="?([^" ]+)"? epoch=(\d+)`)
)

// readLeaseEvents reads the lease lines of a replica's text log, in order.
func readLeaseEvents(path string) ([]leaseEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseLeaseEvents(bufio.NewScanner(f))
}

// parseLeaseEvents reads "acquired unit", "released unit" and "lost the
// lease" lines; any other line of a unit under an epoch newer than its last
// release or loss also counts as holding it (the source starts before the
// "acquired unit" line is logged).
func parseLeaseEvents(sc *bufio.Scanner) ([]leaseEvent, error) {
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var out []leaseEvent
	gone := map[string]int64{} // unit → epoch of its last release or loss
	held := map[string]int64{} // unit → epoch held
	for sc.Scan() {
		line := sc.Text()
		var at, unit, what string
		var epoch int64
		if m := leaseLine.FindStringSubmatch(line); m != nil {
			at, unit, what = m[1], m[3], strings.Fields(m[2])[0]
			epoch, _ = strconv.ParseInt(m[4], 10, 64)
		} else if m := unitLine.FindStringSubmatch(line); m != nil {
			at, unit, what = m[1], m[2], "started"
			epoch, _ = strconv.ParseInt(m[3], 10, 64)
		} else {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return out, fmt.Errorf("time %q: %w", at, err)
		}
		switch what {
		case "lost", "released":
			gone[unit] = max(gone[unit], epoch)
			delete(held, unit)
			if what == "lost" {
				what = "lost the lease of"
			}
		default: // acquired, started
			if epoch <= gone[unit] || held[unit] == epoch {
				continue
			}
			held[unit] = epoch
		}
		out = append(out, leaseEvent{At: t, Unit: unit, Held: what == "acquired" || what == "started", What: what})
	}
	return out, sc.Err()
}

// staleReport counts requests sent after their replica gave up the unit.
type staleReport struct {
	Requests   int // requests with a replica and a document
	Stale      []request
	Lag        []time.Duration // for each stale request, the time since its replica's loss
	Why        []string        // for each stale request, the line: "lost the lease of" or "released"
	Unattached int             // requests the verifier could not attribute
}

// staleSends finds, among reqs (in arrival order), the requests that
// reached a receiver from a replica after that replica's last lease line
// for the document's unit said it lost or released it. Log lines have
// millisecond resolution: a request in the same millisecond as the loss is
// not counted.
func staleSends(reqs []request, leases map[string][]leaseEvent, unitOf func(int32) string) *staleReport {
	r := &staleReport{}
	for _, q := range reqs {
		evs, ok := leases[q.Replica]
		if !ok || !q.HasDoc {
			r.Unattached++
			continue
		}
		r.Requests++
		unit := unitOf(q.Doc)
		var last *leaseEvent
		for i := range evs {
			if evs[i].Unit != unit || !evs[i].At.Before(q.At.Truncate(time.Millisecond)) {
				continue
			}
			last = &evs[i]
		}
		if last != nil && !last.Held {
			r.Stale = append(r.Stale, q)
			r.Lag = append(r.Lag, q.At.Sub(last.At))
			r.Why = append(r.Why, last.What)
		}
	}
	return r
}

// staleWire separates, in the summary, stale sends that may be requests
// already on the wire when the line was logged (the receiver sees a request
// when its headers arrive, on a loaded machine tens of milliseconds after
// it was written) from sends that were surely started after the loss.
const staleWire = 100 * time.Millisecond

// staleLate is how long after a replica's lease-loss line a request of
// the unit may still reach a receiver without failing the campaign: one
// written just before the tenure ended, delayed by a loaded machine (a
// SIGSTOP can hold it in between). A send started after the loss comes
// later than that only if nothing cut it off.
const staleLate = time.Second

// afterRelease counts the stale sends after a release line: none may be,
// since the release waits until no request of the unit is in progress.
func (r *staleReport) afterRelease() int {
	n := 0
	for _, w := range r.Why {
		if w == "released" {
			n++
		}
	}
	return n
}

// lateAfterLoss counts the stale sends more than d after a loss line.
func (r *staleReport) lateAfterLoss(d time.Duration) int {
	n := 0
	for i, w := range r.Why {
		if w != "released" && r.Lag[i] > d {
			n++
		}
	}
	return n
}

func (r *staleReport) Summary() string {
	lost := 0
	for _, w := range r.Why {
		if w != "released" {
			lost++
		}
	}
	s := fmt.Sprintf("stale sends %d of %d requests (%d after a loss, %d after a release)", len(r.Stale), r.Requests, lost, len(r.Stale)-lost)
	if len(r.Lag) > 0 {
		late := 0
		for _, d := range r.Lag {
			if d > staleWire {
				late++
			}
		}
		s += fmt.Sprintf(", %d more than %v after the line", late, staleWire)
		l := slices.Clone(r.Lag)
		sort.Slice(l, func(i, k int) bool { return l[i] < l[k] })
		s += fmt.Sprintf(" (since the line: min %v, median %v, max %v)", l[0].Round(time.Millisecond), l[len(l)/2].Round(time.Millisecond), l[len(l)-1].Round(time.Millisecond))
	}
	if r.Unattached > 0 {
		s += fmt.Sprintf("; %d requests not attributed", r.Unattached)
	}
	return s
}

func (r *staleReport) Details(limit int, t0 time.Time) string {
	if len(r.Stale) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  stale sends (%d):\n", len(r.Stale))
	for i, q := range r.Stale {
		if i == limit {
			fmt.Fprintf(&b, "    ... %d more\n", len(r.Stale)-limit)
			break
		}
		fmt.Fprintf(&b, "    %s sent event %s (doc %d) at %s, %v after it %s the unit (answer %d)\n", q.Replica, q.EventID, q.Doc, rel(q.At, t0), r.Lag[i].Round(time.Millisecond), r.Why[i], q.Status)
	}
	return b.String()
}
