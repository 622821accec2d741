package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/test/receiver"
)

// snapshotDocs is the number of pre-existing documents of the snapshot
// tests: 10000 by default (about 15s each under -race on a shared 2-core
// machine), CHANGEGATE_SNAPSHOT_DOCS to run the 100000 or more.
func snapshotDocs(t *testing.T) int {
	if v := os.Getenv("CHANGEGATE_SNAPSHOT_DOCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("CHANGEGATE_SNAPSHOT_DOCS=%q: want a number >= 1000", v)
		}
		return n
	}
	if testing.Short() {
		return 2000
	}
	return 10000
}

// snapshotConfig is baseConfig with snapshot = "initial" and extra source
// keys.
func snapshotConfig(url, sourceExtra string) string {
	return strings.Replace(baseConfig(url, ""), "max_await = \"200ms\"\n",
		"max_await = \"200ms\"\nsnapshot = \"initial\"\n"+sourceExtra, 1)
}

// TestSnapshotThenUpdatesInOrder: pre-existing documents and updates made
// while the snapshot scans. The receiver gets every document exactly once
// as a "snapshot" event (with its fullDocument), every update, and each
// update after its document's snapshot event; rules that list operations
// get snapshot events only when they name "snapshot".
func TestSnapshotThenUpdatesInOrder(t *testing.T) {
	e := newEnv(t)
	n := snapshotDocs(t)
	insertN(t, e.coll("items"), 0, n)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	other := receiver.New(testSecret)
	t.Cleanup(other.Close)
	// Batches of 50 keep the test short under -race (a batch holds a
	// document at most once: per-document order is the lanes' as ever).
	// The receiver holds its first requests until 100 updates were made,
	// and at most 500 events are in flight: the scan is then stuck near
	// its start while documents behind and ahead of it are updated.
	var madeCount atomic.Int64
	holdUntil := time.Now().Add(20 * time.Second)
	rcv.SetResponder(func([]byte) *receiver.Response {
		for madeCount.Load() < 100 && time.Now().Before(holdUntil) {
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	cfg := strings.Replace(snapshotConfig(rcv.URL(), "max_in_flight_events = 500\n"), "max_in_flight = 8\n", "max_in_flight = 8\nbatch_size = 50\n", 1) + fmt.Sprintf(`
[[sinks]]
name = "inserts-only"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true

[[rules]]
name = "no-snapshots"
source = "items"
operations = ["insert", "update"]
sinks = ["inserts-only"]
`, other.URL())
	cfg = strings.Replace(cfg, `shutdown_grace = "10s"`, "shutdown_grace = \"10s\"\npublic_read = true", 1)
	g := e.start(e.config(cfg))

	// Update documents while the scan runs: each update is counted once
	// it returned; every one must arrive after its snapshot event.
	made := map[string]int{}
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := e.coll("items")
		for i := 0; ; i = (i + 7919) % n {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "u", Value: 1}}}}); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			made[fmt.Sprintf(`{"_id":%d}`, i)]++
			mu.Unlock()
			madeCount.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	waitFor(t, 120*time.Second, "half the snapshot", func() bool { return rcv.Count() >= n/2 })
	close(stop)
	wg.Wait()
	mu.Lock()
	updates := 0
	for _, c := range made {
		updates += c
	}
	mu.Unlock()
	if updates == 0 {
		t.Fatal("no update made during the scan; the test proves nothing")
	}
	waitFor(t, 120*time.Second, "every snapshot and update", func() bool { return rcv.Count() >= n+updates })
	time.Sleep(200 * time.Millisecond) // let any extra delivery show
	snap := map[string]bool{}
	got := map[string]int{}
	for _, d := range rcv.Deliveries() {
		switch d.Operation {
		case "snapshot":
			if snap[d.DocKey] {
				t.Fatalf("document %s: a second snapshot event", d.DocKey)
			}
			snap[d.DocKey] = true
			if !strings.HasPrefix(d.ID, "items:snapshot:") || !strings.Contains(string(d.Envelope), `"fullDocument":{"_id":`) {
				t.Fatalf("snapshot delivery %s: %s", d.ID, d.Envelope)
			}
		case "update":
			if !snap[d.DocKey] {
				t.Fatalf("update of %s delivered before its snapshot event", d.DocKey)
			}
			got[d.DocKey]++
		default:
			t.Fatalf("unexpected %s delivery", d.Operation)
		}
	}
	if len(snap) != n {
		t.Fatalf("%d documents arrived as snapshots, want %d", len(snap), n)
	}
	for k, c := range made {
		if got[k] != c {
			t.Errorf("document %s: %d updates delivered, %d made", k, got[k], c)
		}
	}
	waitFor(t, 60*time.Second, "the updates at the update-only sink", func() bool { return other.Count() >= updates })
	for _, d := range other.Deliveries() {
		if d.Operation == "snapshot" {
			t.Fatalf("a rule without \"snapshot\" in operations received %s", d.ID)
		}
	}
	if other.Count() != updates {
		t.Fatalf("the update-only rule's sink got %d events, want the %d updates", other.Count(), updates)
	}

	// Progress in /api/v1/status and the metrics.
	var status struct {
		Sources []struct {
			State    string
			Snapshot *struct {
				ID                        string
				State                     string
				Scanned, Acked, Estimated int64
				Percent                   float64
			}
		}
	}
	api(t, http.MethodGet, g.admin, "/api/v1/status", "", &status)
	if len(status.Sources) != 1 || status.Sources[0].State != "open" {
		t.Fatalf("status %+v", status)
	}
	if sn := status.Sources[0].Snapshot; sn == nil || sn.State != "done" || sn.Scanned != int64(n) || sn.Acked != int64(n) || sn.Estimated != int64(n) || sn.Percent != 100 {
		t.Fatalf("snapshot status %+v", sn)
	}
	fams := scrape(t, g.admin)
	if v := value(fams, "changegate_snapshot_documents_total", map[string]string{"source": "items"}); v != float64(n) {
		t.Fatalf("changegate_snapshot_documents_total = %v, want %d", v, n)
	}
	if v := value(fams, "changegate_snapshot_running", map[string]string{"source": "items"}); v != 0 {
		t.Fatalf("changegate_snapshot_running = %v after the snapshot", v)
	}
}

// TestProcessSnapshotSIGKILLResumes kills the real binary with SIGKILL at
// about half of a snapshot and restarts it: the restart resumes from the
// checkpointed progress (near half, not 0), every document arrives, and
// re-deliveries carry the same webhook-id.
func TestProcessSnapshotSIGKILLResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	n := snapshotDocs(t)
	insertN(t, e.coll("items"), 0, n)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	cfgTmpl := snapshotConfig(rcv.URL(), "max_in_flight_events = 200\nbatch_size = 200\n")
	cfgText := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state).Replace(cfgTmpl)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cps, _ := e.stores(e.config(cfgTmpl))
	p := startProcess(t, bin, cfgPath)
	waitFor(t, 120*time.Second, "half the snapshot", func() bool { return rcv.Count() >= n/2 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before := rcv.Count()
	cp, ok, err := cps.Load(t.Context(), "items")
	if err != nil || !ok || cp.Snapshot == nil {
		t.Fatalf("checkpoint after SIGKILL: %+v %v %v", cp, ok, err)
	}
	if before >= n {
		t.Fatal("the snapshot finished before SIGKILL; the test proves nothing")
	}
	progress := int(cp.Snapshot.Scanned)
	if progress < n/4 {
		t.Fatalf("checkpointed progress %d of %d at SIGKILL (delivered %d): not near half", progress, n, before)
	}

	p = startProcess(t, bin, cfgPath)
	waitFor(t, 120*time.Second, "every document after the restart", func() bool {
		docs := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			docs[d.DocKey] = true
		}
		return len(docs) >= n
	})
	waitFor(t, 30*time.Second, "the snapshot to finish", func() bool {
		cp, ok, _ := cps.Load(t.Context(), "items")
		return ok && cp.Snapshot == nil
	})
	first := map[string]string{}
	dups := 0
	for _, d := range rcv.Deliveries() {
		if id, ok := first[d.DocKey]; ok {
			dups++
			if id != d.WebhookID {
				t.Fatalf("re-delivery of %s with webhook-id %s, first %s", d.DocKey, d.WebhookID, id)
			}
			continue
		}
		first[d.DocKey] = d.WebhookID
	}
	after := rcv.Count() - before
	t.Logf("delivered before SIGKILL %d, progress checkpointed %d, delivered after the restart %d (re-deliveries %d)", before, progress, after, dups)
	// The restart re-sends what followed the checkpointed progress only:
	// never the documents before it.
	if after > n-progress+200 {
		t.Fatalf("the restart delivered %d documents; from the progress %d it should be about %d", after, progress, n-progress)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
}
