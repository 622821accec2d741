package e2e

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/backfill"
)

// TestProcessRedeliverySIGKILLResumes redelivers a window of the oplog to
// sink b on the real binary, kills the process with SIGKILL part way and
// restarts it: the restart resumes the redelivery from its saved position
// (not from the start) and every change of the window reaches b again,
// with its id; sink a gets nothing beyond the live changes. A resume that
// skipped a change not yet finished at the kill loses it here.
func TestProcessRedeliverySIGKILLResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	ra, rb, addr, cfgPath := backfillProcessConfig(t, e)
	p := startProcess(t, bin, cfgPath)
	waitFor(t, 60*time.Second, "the process serving", func() bool {
		return tryPostJSON(addr, "/api/v1/sinks/b/redeliver", `{}`, &struct{}{}) == http.StatusBadRequest
	})
	// The window: n changes, in seconds of their own (cluster times count
	// seconds), then one change after it.
	const n = 600
	since := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(since) + 20*time.Millisecond)
	insertN(t, e.coll("items"), 0, n)
	until := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(until) + 20*time.Millisecond)
	insertN(t, e.coll("items"), n, 1)
	waitFor(t, 60*time.Second, "every live change at both sinks", func() bool {
		return len(ra.Deliveries()) == n+1 && len(rb.Deliveries()) == n+1
	})
	var window []string
	for _, d := range rb.Deliveries() {
		if d.DocKey != `{"_id":600}` {
			window = append(window, d.ID)
		}
	}

	var st backfill.Status
	body := `{"since": "` + since.Format(time.RFC3339) + `", "until": "` + until.Format(time.RFC3339) + `", "rate": 100}`
	if code := tryPostJSON(addr, "/api/v1/sinks/b/redeliver", body, &st); code != http.StatusAccepted {
		t.Fatalf("POST /api/v1/sinks/b/redeliver: %d %+v", code, st)
	}
	runs := e.client.Database(e.state).Collection("backfill_runs")
	var rec struct {
		State   string
		Scanned int64
		AfterCT bson.Timestamp `bson:"afterClusterTime"`
	}
	waitFor(t, 60*time.Second, "a third of the window redelivered, its progress saved", func() bool {
		return len(rb.Deliveries()) >= n+1+n/3 &&
			runs.FindOne(t.Context(), bson.D{{Key: "_id", Value: st.ID}}).Decode(&rec) == nil && rec.AfterCT.T != 0 && rec.Scanned >= n/4
	})
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before := len(rb.Deliveries()) - (n + 1)
	if err := runs.FindOne(t.Context(), bson.D{{Key: "_id", Value: st.ID}}).Decode(&rec); err != nil || rec.State != "running" {
		t.Fatalf("record after SIGKILL: %+v %v", rec, err)
	}
	if before >= n {
		t.Fatal("the redelivery finished before SIGKILL; the test proves nothing")
	}
	progress := rec.Scanned

	p = startProcess(t, bin, cfgPath)
	// The sink's lock of the killed process expires first (30 s).
	waitFor(t, 120*time.Second, "the redelivery recorded done", func() bool {
		return runs.FindOne(t.Context(), bson.D{{Key: "_id", Value: st.ID}}).Decode(&rec) == nil && rec.State == "done"
	})
	seen := map[string]int{}
	for _, d := range rb.Deliveries() {
		seen[d.ID]++
		if d.WebhookID != d.ID {
			t.Fatalf("delivery with webhook-id %s of event %s", d.WebhookID, d.ID)
		}
	}
	for _, id := range window {
		if seen[id] < 2 {
			t.Fatalf("change %s of the window was not redelivered (seen %d times)", id, seen[id])
		}
	}
	if k := seen[rb.Deliveries()[n].ID]; k != 1 && rb.Deliveries()[n].DocKey == `{"_id":600}` {
		t.Errorf("the change after the window was delivered %d times", k)
	}
	after := len(rb.Deliveries()) - (n + 1) - before
	t.Logf("redelivered before SIGKILL %d, progress saved %d, after the restart %d", before, progress, after)
	if after > n-int(progress)+backfillInFlightSlack {
		t.Fatalf("the restart redelivered %d changes; from the saved progress %d it should be about %d", after, progress, n-int(progress))
	}
	if len(ra.Deliveries()) != n+1 {
		t.Errorf("sink a got %d deliveries, want the %d live ones", len(ra.Deliveries()), n+1)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
}
