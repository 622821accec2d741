package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"github.com/changegate/changegate/test/receiver"
)

const logToken = "s3cret-admin-token"

// mixedReceiver answers by document (its _id, n): n%6 == 1 always 400,
// n%6 == 2 503 on the first request then 2xx, n%6 == 3 after slow, the
// others at once. It remembers the event id of every request it saw, by
// document, whether it answered 2xx or not.
type mixedReceiver struct {
	*receiver.Receiver
	slow time.Duration

	mu    sync.Mutex
	ids   map[int]string // document -> event id (one insert each)
	tries map[int]int    // document -> requests seen
}

func newMixedReceiver(t *testing.T, slow time.Duration) *mixedReceiver {
	m := &mixedReceiver{Receiver: receiver.New(testSecret), slow: slow, ids: map[int]string{}, tries: map[int]int{}}
	t.Cleanup(m.Close)
	m.SetResponder(func(body []byte) *receiver.Response {
		var env struct {
			ID          string `json:"id"`
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}
		if err := json.Unmarshal(body, &env); err != nil {
			return &receiver.Response{Status: http.StatusUnprocessableEntity}
		}
		n := env.DocumentKey.ID
		m.mu.Lock()
		m.ids[n] = env.ID
		m.tries[n]++
		try := m.tries[n]
		m.mu.Unlock()
		switch n % 6 {
		case 1:
			return &receiver.Response{Status: http.StatusBadRequest}
		case 2:
			if try == 1 {
				return &receiver.Response{Status: http.StatusServiceUnavailable}
			}
		case 3:
			time.Sleep(m.slow)
		}
		return nil
	})
	return m
}

// eventIDs returns the event ids the receiver saw, by document.
func (m *mixedReceiver) eventIDs() map[int]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[int]string, len(m.ids))
	for k, v := range m.ids {
		out[k] = v
	}
	return out
}

// received returns the event ids answered 2xx.
func (m *mixedReceiver) received() map[string]bool {
	got := map[string]bool{}
	for _, d := range m.Deliveries() {
		got[d.ID] = true
	}
	return got
}

// deliveryLogConfig is baseConfig with an admin token, a fixed listen
// address and [delivery_log] in mode.
func deliveryLogConfig(url, addr, mode string) string {
	cfg := strings.Replace(baseConfig(url, ""), `listen = "127.0.0.1:0"`, fmt.Sprintf(`listen = %q
admin_token = %q`, addr, logToken), 1)
	return cfg + fmt.Sprintf(`
[delivery_log]
mode = %q
`, mode)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type lifecycle struct {
	ID    string `json:"id"`
	Sinks []struct {
		Sink     string `json:"sink"`
		State    string `json:"state"`
		Derived  bool   `json:"derived"`
		Attempts []struct {
			Outcome    string  `json:"outcome"`
			Status     int     `json:"status"`
			DurationMS float64 `json:"duration_ms"`
			Replica    string  `json:"replica"`
		} `json:"attempts"`
		DeadLetter *struct {
			ID string `json:"id"`
		} `json:"dead_letter"`
	} `json:"sinks"`
}

// eventAt returns the event's lifecycle at sink "hook" (the only one).
func eventAt(t *testing.T, addr, id string) (lifecycle, int) {
	t.Helper()
	var lc lifecycle
	code := api(t, "GET", addr, "/api/v1/events/"+url.PathEscape(id), logToken, &lc)
	if code == http.StatusOK && (len(lc.Sinks) != 1 || lc.Sinks[0].Sink != "hook") {
		t.Fatalf("event %s: sinks %+v, want hook only", id, lc.Sinks)
	}
	return lc, code
}

// listIDs pages through GET /api/v1/deliveries?query and returns the event
// ids of its records, with the records' count.
func listIDs(t *testing.T, addr, query string) (map[string]bool, int) {
	t.Helper()
	ids, records := map[string]bool{}, 0
	after := ""
	for page := 0; ; page++ {
		if page > 100 {
			t.Fatalf("deliveries %s: more than 100 pages", query)
		}
		var p struct {
			Records []struct {
				EventIDs []string `json:"event_ids"`
			} `json:"records"`
			Next string `json:"next"`
		}
		q := query + "&limit=50"
		if after != "" {
			q += "&after=" + url.QueryEscape(after)
		}
		if code := api(t, "GET", addr, "/api/v1/deliveries?"+q, logToken, &p); code != http.StatusOK {
			t.Fatalf("deliveries?%s: %d", q, code)
		}
		for _, r := range p.Records {
			records++
			for _, id := range r.EventIDs {
				ids[id] = true
			}
		}
		if p.Next == "" {
			return ids, records
		}
		after = p.Next
	}
}

// refusal checks a refused event's attempts: its requests were answered
// 400 (outcome failed, with the status), and the last record is its dead
// letter (whose status is its last request's, in that request's record).
// A request is never missing before a dead letter when the log is
// complete (no process killed): len >= 2.
func refusal(t *testing.T, id string, attempts []struct {
	Outcome    string  `json:"outcome"`
	Status     int     `json:"status"`
	DurationMS float64 `json:"duration_ms"`
	Replica    string  `json:"replica"`
}, complete bool) {
	t.Helper()
	if complete && (len(attempts) < 2 || attempts[len(attempts)-1].Outcome != "dead_lettered") {
		t.Fatalf("refused %s: attempts %+v, want its requests then its dead letter", id, attempts)
	}
	// After a restart a refused event may be sent (and refused) again.
	for _, a := range attempts {
		if a.Replica == "" || a.Outcome != "dead_lettered" && (a.Outcome != "failed" || a.Status != http.StatusBadRequest) {
			t.Fatalf("refused %s: attempt %+v in %+v, want failed with status 400 or its dead letter, with the replica", id, a, attempts)
		}
	}
}

func sameSet(t *testing.T, what string, got, want map[string]bool) {
	t.Helper()
	var missing, extra []string
	for id := range want {
		if !got[id] {
			missing = append(missing, id)
		}
	}
	for id := range got {
		if !want[id] {
			extra = append(extra, id)
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		slices.Sort(missing)
		slices.Sort(extra)
		t.Fatalf("%s: %d missing %v, %d not expected %v", what, len(missing), missing, len(extra), extra)
	}
}

// TestProcessDeliveryLogLifecycle runs the real binary with mode "all"
// against a receiver that refuses some changes (400), fails some once
// (503) and answers some slowly: each event's lifecycle shows the right
// state and attempts with their status codes; the queries find exactly the
// refused, retried and slow ones; the analytics counts add up to what the
// receiver saw.
func TestProcessDeliveryLogLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const docs, slow = 60, 300 * time.Millisecond
	bin := changegateBinary(t)
	e := newEnv(t)
	rcv := newMixedReceiver(t, slow)
	addr := freeAddr(t)
	tmpl := deliveryLogConfig(rcv.URL(), addr, "all")
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	insertN(t, e.coll("items"), 0, docs)
	refused, retried, slowOnes, fine := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	waitFor(t, 60*time.Second, "every document answered 2xx or dead-lettered", func() bool {
		got := rcv.received()
		ids := rcv.eventIDs()
		if len(ids) < docs {
			return false
		}
		for n, id := range ids {
			if n%6 == 1 {
				if lc, code := eventAt(t, addr, id); code != http.StatusOK || lc.Sinks[0].State != "dead_lettered" {
					return false
				}
			} else if !got[id] {
				return false
			}
		}
		return true
	})
	for n, id := range rcv.eventIDs() {
		switch n % 6 {
		case 1:
			refused[id] = true
		case 2:
			retried[id] = true
		case 3:
			slowOnes[id] = true
		default:
			fine[id] = true
		}
	}
	// Wait for the log to hold the last successes (written every 200 ms).
	waitFor(t, 10*time.Second, "the delivery log to hold every success", func() bool {
		ok, _ := listIDs(t, addr, "sink=hook&status=delivered")
		return len(ok) == docs-len(refused)
	})

	for id := range refused {
		lc, _ := eventAt(t, addr, id)
		s := lc.Sinks[0]
		if s.State != "dead_lettered" || s.DeadLetter == nil || len(s.Attempts) == 0 {
			t.Fatalf("refused %s: %+v, want dead_lettered with its attempts and entry", id, s)
		}
		refusal(t, id, s.Attempts, true)
	}
	for id := range retried {
		s := func() lifecycle { lc, _ := eventAt(t, addr, id); return lc }().Sinks[0]
		statuses := []int{}
		for _, a := range s.Attempts {
			statuses = append(statuses, a.Status)
		}
		if s.State != "delivered" || s.Derived || !slices.Contains(statuses, http.StatusServiceUnavailable) || len(s.Attempts) < 2 {
			t.Fatalf("retried %s: state %s derived %v statuses %v, want delivered (recorded) after a 503", id, s.State, s.Derived, statuses)
		}
	}
	for id := range slowOnes {
		s := func() lifecycle { lc, _ := eventAt(t, addr, id); return lc }().Sinks[0]
		if s.State != "delivered" || len(s.Attempts) != 1 || s.Attempts[0].DurationMS < float64(slow.Milliseconds()) {
			t.Fatalf("slow %s: %+v, want delivered in one attempt of at least %v", id, s, slow)
		}
	}
	for id := range fine {
		s := func() lifecycle { lc, _ := eventAt(t, addr, id); return lc }().Sinks[0]
		if s.State != "delivered" || len(s.Attempts) != 1 || s.Attempts[0].Status == http.StatusServiceUnavailable {
			t.Fatalf("event %s: %+v, want delivered in one attempt", id, s)
		}
	}

	dead, _ := listIDs(t, addr, "sink=hook&status=dead_lettered")
	sameSet(t, "status=dead_lettered", dead, refused)
	failed, _ := listIDs(t, addr, "sink=hook&status=failed")
	want := map[string]bool{}
	for id := range refused {
		want[id] = true
	}
	for id := range retried {
		want[id] = true
	}
	sameSet(t, "status=failed", failed, want)
	retrying, _ := listIDs(t, addr, "sink=hook&status=retrying")
	want = map[string]bool{}
	for id := range retried {
		want[id] = true
	}
	// A refused change's 400 is final at once: never "retrying".
	sameSet(t, "status=retrying", retrying, want)
	slowFound, _ := listIDs(t, addr, fmt.Sprintf("sink=hook&min_duration=%dms", slow.Milliseconds()-20))
	sameSet(t, "min_duration", slowFound, slowOnes)
	twice, _ := listIDs(t, addr, "sink=hook&min_attempts=2")
	sameSet(t, "min_attempts=2", twice, retried)

	var an struct {
		Sinks []struct {
			Name      string           `json:"name"`
			Events    int64            `json:"events"`
			ByOutcome map[string]int64 `json:"by_outcome"`
			Latency   struct {
				Count int64   `json:"count"`
				P99   float64 `json:"p99_ms"`
			} `json:"latency"`
		} `json:"sinks"`
	}
	if code := api(t, "GET", addr, "/api/v1/analytics?window=1h", logToken, &an); code != http.StatusOK {
		t.Fatalf("analytics: %d", code)
	}
	if len(an.Sinks) != 1 || an.Sinks[0].Name != "hook" {
		t.Fatalf("analytics sinks: %+v", an.Sinks)
	}
	g := an.Sinks[0]
	total, _ := rcv.Requests()
	ok := int64(len(rcv.Deliveries()))
	if g.ByOutcome["delivered"] != ok || g.ByOutcome["failed"] != int64(total)-ok ||
		g.ByOutcome["dead_lettered"] != int64(len(refused)) || g.ByOutcome["retrying"] != int64(len(retried)) {
		t.Fatalf("analytics %+v; the receiver answered %d requests, 2xx to %d, refused %d documents, 503 to %d",
			g, total, ok, len(refused), len(retried))
	}
	if g.Latency.P99 < float64(slow.Milliseconds()) {
		t.Fatalf("analytics p99 %.1f ms, want at least the slow answers' %v", g.Latency.P99, slow)
	}
}

// TestProcessDeliveryLogAfterKill runs the real binary in the default mode
// ("failures": successes are derived), kills it with SIGKILL mid-run and
// restarts it: right after the restart no event is shown delivered that
// the receiver never got, and at the end every event is delivered or, for
// the refused ones, dead-lettered with its 400s.
func TestProcessDeliveryLogAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const docs = 1200
	bin := changegateBinary(t)
	e := newEnv(t)
	rcv := newMixedReceiver(t, 50*time.Millisecond)
	addr := freeAddr(t)
	tmpl := deliveryLogConfig(rcv.URL(), addr, "failures")
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	insertN(t, e.coll("items"), 0, docs)
	waitFor(t, 60*time.Second, "some deliveries", func() bool { return rcv.Count() > docs/4 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	if rcv.Count() >= docs-docs/6 {
		t.Fatal("everything was delivered before SIGKILL: the test proves nothing")
	}
	seen := rcv.eventIDs() // every event sent before the kill
	startProcess(t, bin, cfgPath)
	waitFor(t, 20*time.Second, "the API after the restart", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	got := rcv.received()
	shown := 0
	for n, id := range seen {
		lc, code := eventAt(t, addr, id)
		if code != http.StatusOK {
			continue
		}
		if s := lc.Sinks[0]; s.State == "delivered" {
			shown++
			if !got[id] && !rcv.received()[id] {
				t.Fatalf("document %d: event %s shown delivered (%+v) after the restart; the receiver never got it", n, id, s)
			}
		}
	}
	waitFor(t, 90*time.Second, "every document answered 2xx or dead-lettered", func() bool {
		ids := rcv.eventIDs()
		if len(ids) < docs {
			return false
		}
		got := rcv.received()
		for n, id := range ids {
			if n%6 != 1 && !got[id] {
				return false
			}
		}
		for n, id := range ids {
			if n%6 == 1 {
				if lc, code := eventAt(t, addr, id); code != http.StatusOK || lc.Sinks[0].State != "dead_lettered" {
					return false
				}
			}
		}
		return true
	})
	// Checkpoints are saved every 100 ms: wait for the last one to pass
	// the last event, so that every success can be derived.
	ids := rcv.eventIDs()
	last := ids[docs-1]
	waitFor(t, 20*time.Second, "the last event acknowledged", func() bool {
		lc, code := eventAt(t, addr, last)
		return code == http.StatusOK && lc.Sinks[0].State != "in_flight" && lc.Sinks[0].State != "retrying"
	})
	got = rcv.received()
	for n, id := range ids {
		lc, code := eventAt(t, addr, id)
		if code != http.StatusOK {
			t.Fatalf("document %d: event %s: %d", n, id, code)
		}
		s := lc.Sinks[0]
		switch {
		case n%6 == 1:
			// The killed process's queued records are lost with it (the
			// log never holds delivery up): its state comes from the
			// dead-letter store, its attempts are what was written.
			if s.State != "dead_lettered" || s.DeadLetter == nil {
				t.Fatalf("refused document %d: %+v, want dead_lettered with its entry", n, s)
			}
			refusal(t, id, s.Attempts, false)
		case !got[id]:
			t.Fatalf("document %d: event %s never received, state %s", n, id, s.State)
		case s.State != "delivered":
			t.Fatalf("document %d: received, state %+v", n, s)
		}
	}
	t.Logf("%d of %d sent before SIGKILL; %d shown delivered right after the restart", len(seen), docs, shown)
}

// TestDeliveryLogSlowOrCutMongoDB holds every write of changegate's
// delivery log (MongoDB slowed to a standstill for it), then cuts them:
// delivery goes on, every event arrives, /readyz stays ready while the
// writes are held, and the records that could not be written are counted
// as dropped.
func TestDeliveryLogSlowOrCutMongoDB(t *testing.T) {
	e := newEnv(t)
	e.needServer()
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	cfg := e.config(strings.Replace(baseConfig(rcv.URL(), ""), "max_in_flight = 8", "max_in_flight = 32", 1) + `
[delivery_log]
mode = "all"
`)
	g := e.start(cfg)
	dropped := func() float64 {
		var sum float64
		for _, reason := range []string{"queue_full", "write_failed"} {
			if m := find(scrape(t, g.admin), "changegate_delivery_log_dropped_total", map[string]string{"reason": reason}); m != nil {
				sum += m.GetCounter().GetValue()
			}
		}
		return sum
	}
	ready := func() {
		t.Helper()
		resp, err := http.Get("http://" + g.admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/readyz %d while the delivery log cannot write: %s", resp.StatusCode, b)
		}
	}
	count := func() int {
		docs := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			docs[d.DocKey] = true
		}
		return len(docs)
	}

	// Slowed: each insert of changegate's (the log's; nothing is
	// dead-lettered here) waits 15 s, longer than the log's write timeout
	// (10 s).
	const slowDocs = 2000
	start := time.Now()
	e.srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, AppName: "changegate", BlockFor: 15 * time.Second})
	insertN(t, e.coll("items"), 0, slowDocs)
	waitFor(t, 60*time.Second, "every event while the log's writes are held", func() bool { return count() == slowDocs })
	held := time.Since(start)
	ready()
	// The first held write times out: its records are dropped and counted.
	waitFor(t, 30*time.Second, "the records of the timed-out write counted as dropped", func() bool { return dropped() > 0 })
	ready()
	t.Logf("%d events delivered in %v while every write of the log was held", slowDocs, held.Round(time.Millisecond))
	e.srv.ClearFailPoints()

	// Cut: every insert of changegate's closes its connection.
	before := dropped()
	e.srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, AppName: "changegate", CloseConnection: true})
	insertN(t, e.coll("items"), slowDocs, 1000)
	waitFor(t, 60*time.Second, "every event while the log's writes fail", func() bool { return count() == slowDocs+1000 })
	waitFor(t, 20*time.Second, "failed writes counted", func() bool { return dropped() > before })
	// Not ready() here: a connection closed under a write makes the driver
	// clear its pool, so the change stream reopens too (as it would when
	// MongoDB itself is cut); the stream's state, not the log's, is what
	// /readyz says then.
	e.srv.ClearFailPoints()
}
