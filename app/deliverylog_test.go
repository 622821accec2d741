package app_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/test/mongotest"
)

// The gateway feeds the delivery log (mode "failures" by default): a 503
// then a 200 leave the failed attempt and its retry, and the lifecycle
// answers delivered, derived from the checkpoint; a 400 leaves a dead
// letter, linked; the admin API serves the same.
func TestDeliveryLogThroughRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var n atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch n.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("busy, \x00 later"))
		case 2:
		default:
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	t.Cleanup(hook.Close)
	cfg := e.config(hook.URL, "5s")
	g := start(t, cfg, app.Options{})
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "two requests", func() bool { return n.Load() >= 2 })
	if err := e.insert(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the third request", func() bool { return n.Load() >= 3 })
	client := mongotest.Client(t, e.uri)
	state := client.Database(e.state)
	l := deliverylog.NewLog(state.Collection("deliveries"), cfg.DeliveryLog.Retention, cfg.DeliveryLog.Mode, deliverylog.Deps{
		Checkpoints: e.cps, DeadLetters: deadletter.NewStore(state, "deadletters"),
	})
	ctx := context.Background()
	var p deliverylog.Page
	waitFor(t, 15*time.Second, "four records", func() bool {
		var err error
		p, err = l.List(ctx, deliverylog.Filter{})
		return err == nil && len(p.Records) >= 4
	})
	first, second := p.Records[3], p.Records[1]
	if first.Outcome != deliverylog.OutcomeFailed || first.Status != 503 || !strings.HasPrefix(first.Response, "busy,") || strings.ContainsRune(first.Response, 0) || first.Attempt != 1 ||
		p.Records[2].Outcome != deliverylog.OutcomeRetrying || first.Replica != cfg.Cluster.Instance || first.Sink != "hook" {
		t.Errorf("records of the first change = %+v, %+v", first, p.Records[2])
	}
	if second.Outcome != deliverylog.OutcomeFailed || second.Status != 400 || p.Records[0].Outcome != deliverylog.OutcomeDeadLettered {
		t.Errorf("records of the second change = %+v, %+v", second, p.Records[0])
	}
	waitFor(t, 15*time.Second, "the first change delivered (derived)", func() bool {
		lc, err := l.Lifecycle(ctx, first.EventID)
		return err == nil && len(lc.Sinks) == 1 && lc.Sinks[0].State == deliverylog.StateDelivered && lc.Sinks[0].Derived
	})
	lc, err := l.Lifecycle(ctx, second.EventID)
	if err != nil || len(lc.Sinks) != 1 || lc.Sinks[0].State != deliverylog.StateDeadLettered || lc.Sinks[0].DeadLetter == nil {
		t.Errorf("lifecycle of the refused change = %+v, %v", lc, err)
	}
	// The admin API serves the same.
	get := func(path string, v any) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+g.admin+path, nil)
		req.Header.Set("Authorization", "Bearer s3cret-admin-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if v != nil {
			if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
		return resp.StatusCode
	}
	var ev deliverylog.Lifecycle
	if code := get("/api/v1/events/"+second.EventID, &ev); code != 200 || len(ev.Sinks) != 1 || ev.Sinks[0].State != deliverylog.StateDeadLettered ||
		ev.Sinks[0].DeadLetter == nil || len(ev.Sinks[0].Attempts) != 2 || ev.Sinks[0].Attempts[0].Status != 400 {
		t.Errorf("GET /api/v1/events/{id}: %d %+v", code, ev)
	}
	if code := get("/api/v1/events/items:82FF", nil); code != 404 {
		t.Errorf("GET /api/v1/events/ of an unknown event: %d, want 404", code)
	}
	var list struct {
		Records []map[string]any
		Next    string
	}
	if code := get("/api/v1/deliveries?status=failed&limit=1", &list); code != 200 || len(list.Records) != 1 || list.Next == "" ||
		list.Records[0]["outcome"] != "dead_lettered" {
		t.Errorf("GET /api/v1/deliveries: %d %+v", code, list)
	}
	if code := get("/api/v1/deliveries?status=failed&limit=1&after="+list.Next, &list); code != 200 || len(list.Records) != 1 || list.Records[0]["status"] != 400.0 {
		t.Errorf("GET /api/v1/deliveries, page 2: %d %+v", code, list)
	}
	if code := get(`/api/v1/deliveries?document_key={"_id":{"$ne":1}}`, nil); code != 400 {
		t.Errorf("GET /api/v1/deliveries with an operator key: %d, want 400", code)
	}
	var an deliverylog.Analytics
	if code := get("/api/v1/analytics?window=1h", &an); code != 200 || len(an.Sinks) != 1 || an.Sinks[0].ByOutcome[deliverylog.OutcomeFailed] != 2 ||
		an.Sinks[0].ByOutcome[deliverylog.OutcomeDeadLettered] != 1 || len(an.Covers) == 0 {
		t.Errorf("GET /api/v1/analytics: %d %+v", code, an)
	}
	if code := get("/api/v1/analytics?window=2h", nil); code != 400 {
		t.Errorf("GET /api/v1/analytics?window=2h: %d, want 400", code)
	}
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
