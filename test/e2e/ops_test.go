package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/test/receiver"
)

// api calls the admin API and decodes the JSON answer into out (if non-nil).
func api(t *testing.T, method, addr, path, token string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// refuseDocs makes the receiver answer 400 for the given document ids.
func refuseDocs(rcv *receiver.Receiver, ids ...int) {
	rcv.SetResponder(func(body []byte) *receiver.Response {
		for _, id := range ids {
			if strings.Contains(string(body), fmt.Sprintf(`"documentKey":{"_id":%d}`, id)) {
				return &receiver.Response{Status: http.StatusBadRequest}
			}
		}
		return nil
	})
}

// TestAdminAPIDeadLetters lists, filters, replays and purges dead letters
// through the admin API; mutating calls need the bearer token.
func TestAdminAPIDeadLetters(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	refuseDocs(rcv, 1, 2, 3)
	cfg := e.config(strings.Replace(baseConfig(rcv.URL(), ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "s3cret-admin-token"`, 1))
	g := e.start(cfg)
	insertN(t, e.coll("items"), 0, 6)
	waitFor(t, 20*time.Second, "3 deliveries", func() bool { return rcv.Count() >= 3 })

	type page struct {
		Entries []struct {
			ID, EventID, Sink, Reason string
		} `json:"entries"`
		Next string `json:"next"`
	}
	var p page
	waitFor(t, 10*time.Second, "3 dead letters listed", func() bool {
		api(t, "GET", g.admin, "/api/v1/deadletters?sink=hook", "s3cret-admin-token", &p)
		return len(p.Entries) == 3
	})
	if p.Entries[0].Reason != "http_400" {
		t.Fatalf("reason %q", p.Entries[0].Reason)
	}
	api(t, "GET", g.admin, "/api/v1/deadletters?document_key="+url.QueryEscape(`{"_id": 2}`), "s3cret-admin-token", &p)
	if len(p.Entries) != 1 {
		t.Fatalf("document_key filter: %d entries, want 1", len(p.Entries))
	}
	api(t, "GET", g.admin, "/api/v1/deadletters?limit=2", "s3cret-admin-token", &p)
	if len(p.Entries) != 2 || p.Next == "" {
		t.Fatalf("paging: %d entries, next %q", len(p.Entries), p.Next)
	}
	next := p.Next
	p = page{}
	api(t, "GET", g.admin, "/api/v1/deadletters?limit=2&after="+url.QueryEscape(next), "s3cret-admin-token", &p)
	if len(p.Entries) != 1 {
		t.Fatalf("second page: %d entries, want 1", len(p.Entries))
	}
	if code := api(t, "GET", g.admin, "/api/v1/deadletters?since=yesterday", "s3cret-admin-token", nil); code != http.StatusBadRequest {
		t.Fatalf("bad filter: status %d, want 400", code)
	}

	// Reads of data and mutations need the token.
	if code := api(t, "GET", g.admin, "/api/v1/deadletters", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("list without token: %d", code)
	}
	if code := api(t, "POST", g.admin, "/api/v1/deadletters/replay", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("replay without token: %d", code)
	}
	if code := api(t, "DELETE", g.admin, "/api/v1/deadletters?sink=hook", "wrong", nil); code != http.StatusUnauthorized {
		t.Fatalf("purge with a wrong token: %d", code)
	}
	if code := api(t, "POST", g.admin, "/api/v1/deadletters/replay?kind=parked", "s3cret-admin-token", nil); code != http.StatusBadRequest {
		t.Fatalf("replay of parked entries: %d, want 400", code)
	}
	// Replay document 1 only, once the receiver accepts it.
	rcv.SetResponder(nil)
	var rep struct{ Replayed, Failed, Skipped int }
	if code := api(t, "POST", g.admin, "/api/v1/deadletters/replay?document_key="+url.QueryEscape(`{"_id":1}`), "s3cret-admin-token", &rep); code != 200 || rep.Replayed != 1 {
		t.Fatalf("replay: %d %+v", code, rep)
	}
	if code := api(t, "DELETE", g.admin, "/api/v1/deadletters", "s3cret-admin-token", nil); code != http.StatusBadRequest {
		t.Fatalf("unfiltered purge without all=true: %d, want 400", code)
	}
	// limit=0 means no limit: it selects everything and needs all=true too.
	if code := api(t, "DELETE", g.admin, "/api/v1/deadletters?limit=0", "s3cret-admin-token", nil); code != http.StatusBadRequest {
		t.Fatalf("purge with only limit=0 without all=true: %d, want 400", code)
	}
	var purged struct{ Purged int }
	if code := api(t, "DELETE", g.admin, "/api/v1/deadletters?sink=hook", "s3cret-admin-token", &purged); code != 200 || purged.Purged != 2 {
		t.Fatalf("purge: %d %+v", code, purged)
	}
	api(t, "GET", g.admin, "/api/v1/deadletters", "s3cret-admin-token", &p)
	if len(p.Entries) != 0 {
		t.Fatalf("%d entries left", len(p.Entries))
	}
	g.stop(t, false)

	// Without a configured token, mutations are disabled.
	cfg.Server.AdminToken = ""
	g = e.start(cfg)
	if code := api(t, "POST", g.admin, "/api/v1/deadletters/replay", "s3cret-admin-token", nil); code != http.StatusForbidden {
		t.Fatalf("replay with no token configured: %d, want 403", code)
	}
}

// TestReadyzFollowsTheStream: /readyz turns 503 when MongoDB stops answering
// and back to 200 when it recovers.
func TestReadyzFollowsTheStream(t *testing.T) {
	e := newEnv(t)
	e.needServer()
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	g := e.start(e.config(baseConfig(rcv.URL(), "")))
	ready := func() (int, string) {
		resp, err := http.Get("http://" + g.admin + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := ready(); code != 200 {
		t.Fatalf("readyz %d at start: %s", code, body)
	}
	e.srv.Pause()
	var body string
	waitFor(t, 20*time.Second, "readyz 503 while MongoDB does not answer", func() bool {
		var code int
		code, body = ready()
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(body, `"name": "items"`) || !strings.Contains(body, `"reason"`) {
		t.Fatalf("503 body does not say which source and why: %s", body)
	}
	e.srv.Resume()
	waitFor(t, 40*time.Second, "readyz 200 after MongoDB recovers", func() bool {
		code, _ := ready()
		return code == http.StatusOK
	})
	insertN(t, e.coll("items"), 0, 3)
	waitFor(t, 20*time.Second, "deliveries after the recovery", func() bool { return rcv.Count() >= 3 })
}

// TestMetricsMatchWhatHappened runs N deliveries and M dead letters and
// checks the metric families and values.
func TestMetricsMatchWhatHappened(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	refuseDocs(rcv, 3, 7)
	g := e.start(e.config(baseConfig(rcv.URL(), "")))
	insertN(t, e.coll("items"), 0, 20)
	waitFor(t, 20*time.Second, "18 deliveries", func() bool { return rcv.Count() >= 18 })

	var fams map[string]*dto.MetricFamily
	waitFor(t, 10*time.Second, "metrics to count 2 dead letters", func() bool {
		fams = scrape(t, g.admin)
		return value(fams, "changegate_deliveries_total", map[string]string{"sink": "hook", "outcome": "dead_lettered"}) == 2
	})

	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"changegate_events_read_total", map[string]string{"source": "items"}, 20},
		{"changegate_events_matched_total", map[string]string{"source": "items", "rule": "all"}, 20},
		{"changegate_deliveries_total", map[string]string{"sink": "hook", "outcome": "delivered"}, 18},
		{"changegate_deliveries_total", map[string]string{"sink": "hook", "outcome": "dead_lettered"}, 2},
		{"changegate_delivery_attempts_total", map[string]string{"sink": "hook"}, 20},
		{"changegate_events_in_flight", map[string]string{"source": "items"}, 0},
		{"changegate_sink_queue_depth", map[string]string{"sink": "hook"}, 0},
		{"changegate_delivery_failures_total", map[string]string{"sink": "hook", "reason": "http_400"}, 2},
	}
	for _, c := range checks {
		if got := value(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"changegate_delivery_duration_seconds", "changegate_end_to_end_lag_seconds",
		"changegate_checkpoint_lag_seconds", "changegate_stream_reconnects_total", "go_goroutines", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("metric family %s missing", name)
		}
	}
	if n := histCount(fams, "changegate_delivery_duration_seconds", map[string]string{"sink": "hook"}); n != 20 {
		t.Errorf("delivery duration histogram counted %d requests, want 20", n)
	}
	if n := histCount(fams, "changegate_end_to_end_lag_seconds", map[string]string{"sink": "hook"}); n != 18 {
		t.Errorf("end-to-end lag histogram counted %d deliveries, want 18", n)
	}
	// The dead-letter gauge is refreshed periodically (and at start):
	// restart to see it now.
	g.stop(t, false)
	g = e.start(e.config(baseConfig(rcv.URL(), "")))
	waitFor(t, 10*time.Second, "the dead-letter gauge to show 2 failed", func() bool {
		return value(scrape(t, g.admin), "changegate_deadletters", map[string]string{"sink": "hook", "kind": "failed"}) == 2
	})
}

// TestReloadAddsRule: a rule and a sink added by a reload start routing
// while the other rule keeps delivering every event exactly once; an
// invalid reload is rejected and reported, and the old config keeps running.
func TestReloadAddsRule(t *testing.T) {
	e := newEnv(t)
	hookA := receiver.New(testSecret)
	t.Cleanup(hookA.Close)
	hookB := receiver.New(testSecret)
	t.Cleanup(hookB.Close)
	base := strings.Replace(baseConfig(hookA.URL(), ""), `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "s3cret-admin-token"`, 1)
	base = strings.Replace(base, `name = "all"
source = "items"
sinks = ["hook"]`, `name = "kind-a"
source = "items"
filter = { "fullDocument.kind" = "a" }
sinks = ["hook"]`, 1)
	cfg := e.config(base)
	added := base + fmt.Sprintf(`
[[sinks]]
name = "hook-b"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true

[[rules]]
name = "kind-b"
source = "items"
filter = { "fullDocument.kind" = "b" }
sinks = ["hook-b"]
`, hookB.URL())
	var mu sync.Mutex
	next := func() (*config.Config, error) { return cfg, nil }
	load := func() (*config.Config, error) { mu.Lock(); defer mu.Unlock(); return next() }
	reload := make(chan struct{})
	g := e.startWith(cfg, app.Options{Reload: reload, LoadConfig: load})

	c := e.coll("items")
	ctx := context.Background()
	write := func(from, n int) {
		for i := from; i < from+n; i++ {
			kind := "a"
			if i%2 == 1 {
				kind = "b"
			}
			if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "kind", Value: kind}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, 100)
	waitFor(t, 20*time.Second, "50 kind-a events", func() bool { return hookA.Count() >= 50 })

	// An invalid file is rejected, through the API, with its problems.
	mu.Lock()
	next = func() (*config.Config, error) {
		_, err := config.Parse("test.toml", []byte(strings.Replace(added, `sinks = ["hook-b"]`, `sinks = ["hook-c"]`, 1)), nil)
		return nil, err
	}
	mu.Unlock()
	var rej struct {
		Error    string
		Problems []string
	}
	if code := api(t, "POST", g.admin, "/api/v1/reload", "s3cret-admin-token", &rej); code != http.StatusBadRequest ||
		len(rej.Problems) == 0 || !strings.Contains(strings.Join(rej.Problems, "\n"), `unknown sink "hook-c"`) {
		t.Fatalf("invalid reload: %d %+v", code, rej)
	}

	// A valid one by the reload channel (SIGHUP), with writes going on.
	mu.Lock()
	next = func() (*config.Config, error) { return e.config(added), nil }
	mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); write(100, 200) }()
	reload <- struct{}{}
	<-done
	write(300, 100)
	waitFor(t, 30*time.Second, "every kind-a event", func() bool { return hookA.Count() >= 200 })
	waitFor(t, 30*time.Second, "kind-b events after the reload", func() bool {
		for _, d := range hookB.Deliveries() {
			if strings.Contains(d.DocKey, `"_id":399}`) {
				return true
			}
		}
		return false
	})
	time.Sleep(200 * time.Millisecond)
	seen := map[string]bool{}
	for _, d := range hookA.Deliveries() {
		if seen[d.ID] {
			t.Fatalf("kind-a event %s delivered twice across the reload", d.ID)
		}
		seen[d.ID] = true
	}
	if len(seen) != 200 {
		t.Fatalf("hook got %d kind-a events, want 200", len(seen))
	}
	for _, d := range hookB.Deliveries() {
		var env struct {
			FullDocument struct{ Kind string } `json:"fullDocument"`
			Rules        []string              `json:"rules"`
		}
		json.Unmarshal(d.Envelope, &env)
		if env.FullDocument.Kind != "b" || len(env.Rules) != 1 || env.Rules[0] != "kind-b" {
			t.Fatalf("hook-b got %s", d.Envelope)
		}
	}
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// find returns the metric of family name whose labels include labels.
func find(fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// value returns a counter's or gauge's value, -1 when absent.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	m := find(fams, name, labels)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

// histCount returns a histogram's sample count, 0 when absent.
func histCount(fams map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	if m := find(fams, name, labels); m != nil && m.Histogram != nil {
		return m.Histogram.GetSampleCount()
	}
	return 0
}
