package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/test/receiver"
)

const backfillToken = "s3cret-admin-token"

// postJSON posts body to the admin API and decodes the answer into out.
func postJSON(t *testing.T, addr, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+backfillToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("POST %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// backfillConfig has two webhook sinks, "a" and "b", both routed every
// change of items, and an admin token.
func backfillConfig(urlA, urlB string) string {
	cfg := strings.Replace(baseConfig(urlA, ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "`+backfillToken+`"`, 1)
	cfg = strings.Replace(cfg, `name = "hook"`, `name = "a"`, 1)
	cfg = strings.Replace(cfg, `sinks = ["hook"]`, `sinks = ["a", "b"]`, 1)
	return cfg + fmt.Sprintf(`
[[sinks]]
name = "b"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
`, urlB)
}

func countOps(ds []receiver.Delivery, op string) (n int, ids map[string]bool) {
	ids = map[string]bool{}
	for _, d := range ds {
		if d.Operation == op {
			n++
			ids[d.DocKey] = true
		}
	}
	return n, ids
}

// TestBackfillToOneSink backfills the documents matching a filter to sink
// "b" while both sinks keep streaming live changes: b gets each matching
// document once as a "snapshot" event with a backfill id, a gets none,
// both get every live insert. Then a slow backfill is refused a second
// time on the same sink (409), cancelled, and the bad requests are refused
// with 400 without starting anything.
func TestBackfillToOneSink(t *testing.T) {
	e := newEnv(t)
	ra, rb := receiver.New(testSecret), receiver.New(testSecret)
	t.Cleanup(ra.Close)
	t.Cleanup(rb.Close)
	insertN(t, e.coll("items"), 0, 300)
	g := e.start(e.config(backfillConfig(ra.URL(), rb.URL())))

	var st backfill.Status
	if code := postJSON(t, g.admin, "/api/v1/backfills", `{"source": "items", "sink": "b", "filter": {"n": {"$gte": 100, "$lt": 300}}, "rate": 5000}`, &st); code != http.StatusAccepted {
		t.Fatalf("POST backfill = %d %+v", code, st)
	}
	insertN(t, e.coll("items"), 1000, 50) // live, while the backfill runs
	waitFor(t, 60*time.Second, "the backfill to finish", func() bool {
		var cur backfill.Status
		api(t, http.MethodGet, g.admin, "/api/v1/backfills/"+st.ID, backfillToken, &cur)
		if cur.State == "failed" || cur.State == "cancelled" {
			t.Fatalf("backfill %+v", cur)
		}
		st = cur
		return cur.State == "done"
	})
	if st.Scanned != 200 || st.Sent != 200 || st.Finished != 200 || st.Estimated != 200 || st.Percent != 100 {
		t.Fatalf("backfill status %+v", st)
	}
	waitFor(t, 30*time.Second, "the live inserts at both sinks", func() bool {
		na, _ := countOps(ra.Deliveries(), "insert")
		nb, _ := countOps(rb.Deliveries(), "insert")
		return na == 50 && nb == 50
	})
	n, docs := countOps(rb.Deliveries(), "snapshot")
	if n != 200 || len(docs) != 200 {
		t.Fatalf("sink b got %d snapshot events for %d documents, want 200", n, len(docs))
	}
	for _, d := range rb.Deliveries() {
		if d.Operation == "snapshot" {
			var env struct {
				FullDocument struct{ N int } `json:"fullDocument"`
			}
			_ = json.Unmarshal(d.Envelope, &env)
			if env.FullDocument.N < 100 || env.FullDocument.N >= 300 || !strings.HasPrefix(d.ID, "items:backfill:"+st.ID+":") {
				t.Fatalf("backfill delivery %s: %s", d.ID, d.Envelope)
			}
		}
	}
	if n, _ := countOps(ra.Deliveries(), "snapshot"); n != 0 {
		t.Fatalf("sink a got %d backfill events", n)
	}

	// One backfill per sink at a time; cancel.
	var slow backfill.Status
	if code := postJSON(t, g.admin, "/api/v1/backfills", `{"source": "items", "sink": "b", "rate": 20}`, &slow); code != http.StatusAccepted {
		t.Fatalf("slow backfill = %d", code)
	}
	var apiErr struct{ Error string }
	if code := postJSON(t, g.admin, "/api/v1/backfills", `{"source": "items"}`, &apiErr); code != http.StatusConflict || !strings.Contains(apiErr.Error, `sink "b" runs another backfill`) {
		t.Fatalf("second backfill on a busy sink = %d %q", code, apiErr.Error)
	}
	waitFor(t, 10*time.Second, "a few documents of the slow backfill", func() bool {
		var cur backfill.Status
		api(t, http.MethodGet, g.admin, "/api/v1/backfills/"+slow.ID, backfillToken, &cur)
		return cur.Sent >= 3
	})
	var cancelled backfill.Status
	if code := api(t, http.MethodDelete, g.admin, "/api/v1/backfills/"+slow.ID, backfillToken, &cancelled); code != http.StatusOK || cancelled.State != "cancelled" {
		t.Fatalf("DELETE = %d %+v", code, cancelled)
	}
	if cancelled.Sent >= 350 || cancelled.Finished != cancelled.Sent {
		t.Fatalf("cancelled backfill %+v: should have stopped early with what it sent finished", cancelled)
	}
	// The sink is free again.
	var again backfill.Status
	if code := postJSON(t, g.admin, "/api/v1/backfills", `{"source": "items", "sink": "b", "filter": {"n": 5}}`, &again); code != http.StatusAccepted {
		t.Fatalf("backfill after the cancel = %d", code)
	}

	// Bad input: refused, nothing started.
	before := len(listBackfills(t, g.admin))
	for _, c := range []struct{ body, want string }{
		{`{"source": "nope"}`, `unknown source "nope"`},
		{`{"source": "items", "sink": "zzz"}`, `unknown sink "zzz"`},
		{`{"source": "items", "filter": {"$where": "sleep(100)"}}`, `filter is not a valid query`},
		{`{"source": "items", "filter": "{not json"}`, `filter is not valid Extended JSON`},
		{`{"source": "items", "filter": {"n": {"$bogus": 1}}}`, `filter is not a valid query`},
		{`{"source": "items", "filter": {"name": {"$regex": "^(a+)+$"}}}`, `filter refused: pattern "^(a+)+$"`},
		{`{"source": "items", "filter": {"name": {"$in": ["x", {"$regularExpression": {"pattern": "^(aa?)+$", "options": ""}}]}}}`, `filter refused: pattern "^(aa?)+$"`},
		{`{"source": "items", "filter": {"name": {"$not": {"$regularExpression": {"pattern": "^(a?){25}a{25}$", "options": ""}}}}}`, `filter refused: pattern`},
		{`{"source": "items", "filter": "{\"name\": {\"$regex\": \"^(a?a?)+$\"}}"}`, `filter refused: pattern`},
		{`{"source": "items", "rate": -1}`, `rate -1`},
		{`{"source": "items", "extra": 1}`, `unknown field`},
	} {
		var e struct{ Error string }
		if code := postJSON(t, g.admin, "/api/v1/backfills", c.body, &e); code != http.StatusBadRequest || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s = %d %q, want 400 with %q", c.body, code, e.Error, c.want)
		}
	}
	if after := len(listBackfills(t, g.admin)); after != before {
		t.Fatalf("refused requests started backfills: %d -> %d", before, after)
	}
}

func listBackfills(t *testing.T, addr string) []backfill.Status {
	var out struct{ Backfills []backfill.Status }
	api(t, http.MethodGet, addr, "/api/v1/backfills", backfillToken, &out)
	return out.Backfills
}

// TestBackfillCLI runs the command line's backfill (app.Backfill: direct
// deliveries, no lanes) next to a running gateway: it sends every matching
// document to its sink and reports progress; it is refused while the
// gateway runs a backfill of the same sink, and for bad input.
func TestBackfillCLI(t *testing.T) {
	e := newEnv(t)
	ra, rb := receiver.New(testSecret), receiver.New(testSecret)
	t.Cleanup(ra.Close)
	t.Cleanup(rb.Close)
	insertN(t, e.coll("items"), 0, 120)
	cfg := e.config(backfillConfig(ra.URL(), rb.URL()))
	g := e.start(cfg)

	var progress []backfill.Status
	st, err := app.Backfill(t.Context(), cfg, e.client, backfill.Request{Source: "items", Sink: "a", Filter: `{"n": {"$lt": 100}}`, Rate: 10000}, nil,
		func(s backfill.Status) { progress = append(progress, s) })
	if err != nil || st.State != "done" || st.Sent != 100 || st.Finished != 100 || st.Failed != 0 {
		t.Fatalf("Backfill = %+v, %v", st, err)
	}
	if len(progress) == 0 || progress[len(progress)-1].State != "done" {
		t.Fatalf("progress reports %+v", progress)
	}
	if n, docs := countOps(ra.Deliveries(), "snapshot"); n != 100 || len(docs) != 100 {
		t.Fatalf("sink a got %d snapshot events for %d documents", n, len(docs))
	}
	if n, _ := countOps(rb.Deliveries(), "snapshot"); n != 0 {
		t.Fatalf("sink b got %d", n)
	}

	var slow backfill.Status
	if code := postJSON(t, g.admin, "/api/v1/backfills", `{"source": "items", "sink": "a", "rate": 5}`, &slow); code != http.StatusAccepted {
		t.Fatalf("gateway backfill = %d", code)
	}
	if _, err := app.Backfill(t.Context(), cfg, e.client, backfill.Request{Source: "items", Sink: "a"}, nil, nil); !errors.Is(err, backfill.ErrBusy) {
		t.Fatalf("CLI backfill of a busy sink: %v", err)
	}
	api(t, http.MethodDelete, g.admin, "/api/v1/backfills/"+slow.ID, backfillToken, nil)
	for _, req := range []backfill.Request{
		{Source: "nope"},
		{Source: "items", Sink: "nope"},
		{Source: "items", Filter: `{"$expr": {"$gt": ["$n", 1]}}`},
		{Source: "items", Filter: `[1]`},
		{Source: "items", Filter: `{"name": {"$regex": "^(a+)+$"}}`},
		{Source: "items", Filter: `{"name": {"$in": [{"$regularExpression": {"pattern": "^(aa?)+$", "options": ""}}]}}`},
		{Source: "items", Filter: `{"name": {"$not": {"$regularExpression": {"pattern": "^(a?a?)+$", "options": ""}}}}`},
	} {
		if _, err := app.Backfill(t.Context(), cfg, e.client, req, nil, nil); !errors.Is(err, backfill.ErrInput) {
			t.Errorf("Backfill(%+v) = %v, want backfill.ErrInput", req, err)
		}
	}
}

// TestBackfillOrderedWithLiveUpdates backfills while a writer keeps
// updating the documents: no update made after the backfill read a
// document is delivered before that document's backfill event (each
// update's new counter value is at most the backfill event's), and every
// document is backfilled.
func TestBackfillOrderedWithLiveUpdates(t *testing.T) {
	e := newEnv(t)
	ra, rb := receiver.New(testSecret), receiver.New(testSecret)
	t.Cleanup(ra.Close)
	t.Cleanup(rb.Close)
	const n = 2000
	insertN(t, e.coll("items"), 0, n)
	g := e.start(e.config(backfillConfig(ra.URL(), rb.URL())))

	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		c := e.coll("items")
		for i := 0; ; i = (i + 37) % n {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			if _, err := c.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}}); err != nil {
				writerDone <- err
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var st backfill.Status
	if code := postJSON(t, g.admin, "/api/v1/backfills", `{"source": "items", "sink": "b", "rate": 800}`, &st); code != http.StatusAccepted {
		t.Fatalf("POST backfill = %d", code)
	}
	waitFor(t, 60*time.Second, "the backfill to finish", func() bool {
		api(t, http.MethodGet, g.admin, "/api/v1/backfills/"+st.ID, backfillToken, &st)
		return st.State == "done"
	})
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	type envelope struct {
		FullDocument      struct{ V int } `json:"fullDocument"`
		UpdateDescription struct {
			UpdatedFields struct{ V int } `json:"updatedFields"`
		} `json:"updateDescription"`
	}
	maxUpdate := map[string]int{}
	backfilled := map[string]bool{}
	for _, d := range rb.Deliveries() {
		var env envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		switch d.Operation {
		case "update":
			maxUpdate[d.DocKey] = max(maxUpdate[d.DocKey], env.UpdateDescription.UpdatedFields.V)
		case "snapshot":
			if backfilled[d.DocKey] {
				t.Fatalf("document %s backfilled twice", d.DocKey)
			}
			backfilled[d.DocKey] = true
			if v := env.FullDocument.V; maxUpdate[d.DocKey] > v {
				t.Fatalf("document %s: backfill event with v=%d delivered after the update to v=%d", d.DocKey, v, maxUpdate[d.DocKey])
			}
		}
	}
	if len(backfilled) != n {
		t.Fatalf("%d documents backfilled, want %d", len(backfilled), n)
	}
	t.Logf("backfill: %d re-read, %d unordered, %d updates seen", st.Reread, st.Unordered, len(maxUpdate))
	if st.Unordered != 0 {
		t.Fatalf("%d documents sent unordered", st.Unordered)
	}
}

// TestProcessBackfillSIGKILLResumes starts a backfill on the real binary,
// kills the process with SIGKILL at about a third of it and restarts it:
// the restart resumes the same backfill (same id, so the same event ids)
// from its last acknowledged _id, not from the start, and every document
// arrives.
func TestProcessBackfillSIGKILLResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	const n = 1500
	insertN(t, e.coll("items"), 0, n)
	_, rb, addr, cfgPath := backfillProcessConfig(t, e)
	p := startProcess(t, bin, cfgPath)
	var st backfill.Status
	waitFor(t, 60*time.Second, "the backfill accepted", func() bool {
		return tryPostJSON(addr, "/api/v1/backfills", `{"source": "items", "sink": "b", "rate": 100}`, &st) == http.StatusAccepted
	})
	waitFor(t, 60*time.Second, "a third of the backfill", func() bool {
		k, _ := countOps(rb.Deliveries(), "snapshot")
		return k >= n/3
	})
	// Past a progress save (every second).
	runs := e.client.Database(e.state).Collection("backfill_runs")
	var rec struct {
		State   string
		Scanned int64
		After   bson.RawValue
	}
	deadline := time.Now().Add(10 * time.Second)
	for runs.FindOne(t.Context(), bson.D{{Key: "_id", Value: st.ID}}).Decode(&rec) != nil || rec.After.Type == 0 || rec.Scanned < n/4 {
		if time.Now().After(deadline) {
			raw, err := runs.FindOne(t.Context(), bson.D{}).Raw()
			t.Fatalf("no saved progress of backfill %s: %v %v\n%s", st.ID, raw, err, p.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before, _ := countOps(rb.Deliveries(), "snapshot")
	if err := runs.FindOne(t.Context(), bson.D{{Key: "_id", Value: st.ID}}).Decode(&rec); err != nil || rec.State != "running" {
		t.Fatalf("record after SIGKILL: %+v %v", rec, err)
	}
	if before >= n {
		t.Fatal("the backfill finished before SIGKILL; the test proves nothing")
	}
	progress := rec.Scanned

	p = startProcess(t, bin, cfgPath)
	// The sink's lock of the killed process expires first (30 s).
	waitFor(t, 120*time.Second, "every document after the restart", func() bool {
		_, docs := countOps(rb.Deliveries(), "snapshot")
		return len(docs) >= n
	})
	waitFor(t, 30*time.Second, "the backfill recorded done", func() bool {
		return runs.FindOne(t.Context(), bson.D{{Key: "_id", Value: st.ID}}).Decode(&rec) == nil && rec.State == "done"
	})
	total, _ := countOps(rb.Deliveries(), "snapshot")
	after := total - before
	for _, d := range rb.Deliveries() {
		if d.Operation == "snapshot" && !strings.HasPrefix(d.ID, "items:backfill:"+st.ID+":") {
			t.Fatalf("delivery %s is not of backfill %s: the restart must resume it under the same id", d.ID, st.ID)
		}
	}
	t.Logf("delivered before SIGKILL %d, progress saved %d, delivered after the restart %d", before, progress, after)
	if after > n-int(progress)+backfillInFlightSlack {
		t.Fatalf("the restart delivered %d documents; from the saved progress %d it should be about %d", after, progress, n-int(progress))
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
}

// backfillInFlightSlack is what a restart may send again beyond the saved
// progress: what was read after the last save (one second at the test's
// rate of 100/s) and not yet acknowledged.
const backfillInFlightSlack = 200

// tryPostJSON is postJSON that reports a connection error as 0 (the process
// is still starting).
func tryPostJSON(addr, path, body string, out any) int {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewBufferString(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+backfillToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(out)
	return resp.StatusCode
}

// TestBackfillCLIResume: a command line backfill stopped half way (its
// context cancelled, as SIGINT does) stays recorded as running; -resume
// (app.ResumeBackfill) finishes it with the same id, from the last
// acknowledged document rather than from the start, and every document
// arrives. A gateway started meanwhile does not take it over. The command
// line's backfills were not recorded: a stopped one could only be re-run
// from the start under a new id.
func TestBackfillCLIResume(t *testing.T) {
	e := newEnv(t)
	ra, rb := receiver.New(testSecret), receiver.New(testSecret)
	t.Cleanup(ra.Close)
	t.Cleanup(rb.Close)
	const n = 300
	insertN(t, e.coll("items"), 0, n)
	cfg := e.config(backfillConfig(ra.URL(), rb.URL()))

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	first, err := app.Backfill(ctx, cfg, e.client, backfill.Request{Source: "items", Sink: "a", Rate: 100}, nil,
		func(s backfill.Status) {
			if s.Finished >= 50 {
				stop()
			}
		})
	if err != nil || first.State != "cancelled" || first.Scanned >= n {
		t.Fatalf("stopped backfill = %+v, %v", first, err)
	}
	var rec struct {
		State, Origin, Namespace string
	}
	if err := e.client.Database(e.state).Collection("backfill_runs").FindOne(t.Context(), bson.D{{Key: "_id", Value: first.ID}}).Decode(&rec); err != nil ||
		rec.State != "running" || rec.Origin != "cli" || rec.Namespace == "" {
		t.Fatalf("record of the stopped backfill: %+v, %v", rec, err)
	}
	before := len(ra.Deliveries())

	// A gateway resumes its own backfills at its start, not the command
	// line's (it would list it, and hold its sink's lock).
	g := e.start(cfg)
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if l := listBackfills(t, g.admin); len(l) != 0 {
			t.Fatalf("the gateway took over the command line's backfill: %+v", l)
		}
	}

	st, err := app.ResumeBackfill(t.Context(), cfg, e.client, first.ID, nil, nil)
	if err != nil || st.State != "done" || st.ID != first.ID {
		t.Fatalf("resumed backfill = %+v, %v", st, err)
	}
	total, docs := countOps(ra.Deliveries(), "snapshot")
	if len(docs) != n {
		t.Fatalf("%d of %d documents backfilled", len(docs), n)
	}
	if again := total - n; again >= before {
		t.Fatalf("the resume sent %d documents again of the %d sent before the stop: it started over", again, before)
	}
	for _, d := range ra.Deliveries() {
		if d.Operation == "snapshot" && !strings.Contains(d.ID, ":backfill:"+first.ID+":") {
			t.Fatalf("event %s is not of backfill %s", d.ID, first.ID)
		}
	}
	if _, err := app.ResumeBackfill(t.Context(), cfg, e.client, first.ID, nil, nil); !errors.Is(err, backfill.ErrInput) {
		t.Fatalf("resuming a finished backfill: %v", err)
	}
	if _, err := app.ResumeBackfill(t.Context(), cfg, e.client, "nope", nil, nil); !errors.Is(err, backfill.ErrInput) {
		t.Fatalf("resuming an unknown backfill: %v", err)
	}
}

// backfillProcessConfig writes backfillConfig for a real process: sinks
// a and b to two new receivers, the admin API on a free fixed address
// (the test calls it). It returns the receivers, the address and the
// config's path.
func backfillProcessConfig(t *testing.T, e *env) (ra, rb *receiver.Receiver, addr, cfgPath string) {
	t.Helper()
	ra, rb = receiver.New(testSecret), receiver.New(testSecret)
	t.Cleanup(ra.Close)
	t.Cleanup(rb.Close)
	addr = freeAddr(t)
	cfgText := e.expand(strings.Replace(backfillConfig(ra.URL(), rb.URL()), `listen = "127.0.0.1:0"`, `listen = "`+addr+`"`, 1))
	cfgPath = filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	return ra, rb, addr, cfgPath
}
