package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/test/receiver"
)

const replaySSN = "SSN-123-45-6789"

// replayShapeConfig has source items, one webhook sink "hook" (extra goes
// into its table) and the rules given.
func replayShapeConfig(url, extra, rules string) string {
	return strings.Replace(itemsHead, `shutdown_grace = "10s"`, `shutdown_grace = "10s"
admin_token = "`+backfillToken+`"`, 1) + fmt.Sprintf(`
[[sinks]]
name = "hook"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
%s
`, url, extra) + rules
}

func piiRule(name, filter string) string {
	return fmt.Sprintf(`
[[rules]]
name = %q
source = "items"
sinks = ["hook"]
redact = ["fullDocument.ssn"]
%s
`, name, filter)
}

// ssnOf returns the fullDocument.ssn of the deliveries of document id.
func ssnOf(t *testing.T, r *receiver.Receiver, id int) []string {
	t.Helper()
	var out []string
	for _, d := range r.Deliveries() {
		if d.DocKey != fmt.Sprintf(`{"_id":%d}`, id) {
			continue
		}
		var env struct {
			FullDocument struct{ SSN string } `json:"fullDocument"`
		}
		if err := jsonUnmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		out = append(out, env.FullDocument.SSN)
	}
	return out
}

// TestReplayShapedAfterRuleRename (issue 24): a dead letter replayed after
// the rule that redacted it was renamed (same redact) and the config
// reloaded is still redacted; one that no current rule routes to its sink
// is skipped by a plain replay and delivered, with the strictest shape of
// the sink's rules, only with deliver_unrouted=true.
func TestReplayShapedAfterRuleRename(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	var refuse sync.Map // document keys the receiver refuses (400)
	rcv.SetResponder(func(body []byte) *receiver.Response {
		var env struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}
		_ = jsonUnmarshal(body, &env)
		if v, ok := refuse.Load(env.DocumentKey.ID); ok && v.(bool) {
			return &receiver.Response{Status: 400}
		}
		return nil
	})
	var mu sync.Mutex
	var g *gateway
	text := replayShapeConfig(rcv.URL(), "", piiRule("pii-old", ""))
	load := func() (*config.Config, error) { mu.Lock(); defer mu.Unlock(); return e.config(text), nil }
	setConfig := func(s string) {
		mu.Lock()
		text = s
		mu.Unlock()
		var out map[string]any
		if code := api(t, http.MethodPost, g.admin, "/api/v1/reload", backfillToken, &out); code != http.StatusOK {
			t.Fatalf("reload = %d %v", code, out)
		}
	}
	cfg, _ := load()
	g = e.startWith(cfg, app.Options{LoadConfig: load})
	_, store := e.stores(cfg)
	ctx := context.Background()
	deadLetter := func(id int) {
		t.Helper()
		refuse.Store(id, true)
		if _, err := e.coll("items").InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "ssn", Value: replaySSN}, {Key: "kind", Value: "person"}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, fmt.Sprintf("the dead letter of %d", id), func() bool {
			n, err := store.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed, DocumentKey: mustRaw(t, bson.D{{Key: "_id", Value: id}})})
			return err == nil && n == 1
		})
		refuse.Store(id, false)
	}
	replay := func(query string) (rep struct {
		Replayed, Failed, Skipped int
		Errors                    []string
	}) {
		t.Helper()
		if code := postJSON(t, g.admin, "/api/v1/deadletters/replay"+query, "", &rep); code != http.StatusOK {
			t.Fatalf("replay%s = %d %+v", query, code, rep)
		}
		return rep
	}

	deadLetter(1)
	setConfig(replayShapeConfig(rcv.URL(), "", piiRule("pii-new", "")))
	if rep := replay(""); rep.Replayed != 1 {
		t.Fatalf("replay %+v", rep)
	}
	if got := ssnOf(t, rcv, 1); len(got) != 1 || got[0] != "[REDACTED]" {
		t.Fatalf("document 1 replayed after the rename with ssn %q", got)
	}

	// No current rule routes the change to hook any more.
	deadLetter(2)
	setConfig(replayShapeConfig(rcv.URL(), "", piiRule("pii-other", `filter = { "fullDocument.kind" = "robot" }`)))
	// The command line's replay (app.Replay) skips it too.
	cli, err := app.Replay(ctx, e.config(text), e.client, deadletter.Filter{Kind: deadletter.KindFailed}, app.ReplayOptions{}, nil)
	if err != nil || cli.Replayed != 0 || cli.Skipped != 1 || len(cli.Errors) != 1 || !errors.Is(cli.Errors[0], deadletter.ErrNotRouted) ||
		len(cli.NotRouted) != 1 || cli.NotRouted["hook"] != 1 {
		t.Fatalf("CLI replay of an unrouted change: %+v, %v", cli, err)
	}
	rep := replay("")
	if rep.Replayed != 0 || rep.Skipped != 1 || len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], "no current rule routes this change to the sink") {
		t.Fatalf("plain replay of an unrouted change: %+v", rep)
	}
	if got := ssnOf(t, rcv, 2); len(got) != 0 {
		t.Fatalf("an unrouted change was delivered: %q", got)
	}
	var bad struct{ Error string }
	if code := postJSON(t, g.admin, "/api/v1/deadletters/replay?deliver_unrouted=yes", "", &bad); code != http.StatusBadRequest || !strings.Contains(bad.Error, "deliver_unrouted") {
		t.Fatalf("deliver_unrouted=yes: %d %q", code, bad.Error)
	}
	if rep := replay("?deliver_unrouted=true"); rep.Replayed != 1 {
		t.Fatalf("replay with deliver_unrouted: %+v", rep)
	}
	if got := ssnOf(t, rcv, 2); len(got) != 1 || got[0] != "[REDACTED]" {
		t.Fatalf("document 2 replayed unrouted with ssn %q", got)
	}
}

// TestParkedRedriveShapedAfterRestart (issue 24): events parked for a
// failing sink under a redacting rule are re-driven after a restart whose
// configuration renamed that rule (same redact): still redacted.
func TestParkedRedriveShapedAfterRestart(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	var down sync.Map
	down.Store("down", true)
	rcv.SetResponder(func([]byte) *receiver.Response {
		if v, _ := down.Load("down"); v.(bool) {
			return &receiver.Response{Status: 503}
		}
		return nil
	})
	sink := `park_after = "500ms"
  [sinks.retry]
  max_attempts = 1000
  initial_interval = "50ms"
  max_interval = "200ms"
  max_elapsed = "0s"`
	cfg := e.config(replayShapeConfig(rcv.URL(), sink, piiRule("pii-old", "")))
	g := e.start(cfg)
	_, store := e.stores(cfg)
	ctx := context.Background()
	const n = 5
	for i := range n {
		if _, err := e.coll("items").InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "ssn", Value: replaySSN}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "every event parked", func() bool {
		c, err := store.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked})
		return err == nil && c == n
	})
	if err := g.stop(t, false); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for i := range n {
		for _, s := range ssnOf(t, rcv, i) {
			t.Fatalf("document %d delivered while the receiver was down: %q", i, s)
		}
	}
	down.Store("down", false)
	e.start(e.config(replayShapeConfig(rcv.URL(), sink, piiRule("pii-renamed", ""))))
	waitFor(t, 30*time.Second, "the parked entries re-driven", func() bool {
		c, err := store.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked})
		return err == nil && c == 0
	})
	for i := range n {
		got := ssnOf(t, rcv, i)
		if len(got) == 0 {
			t.Fatalf("document %d never re-driven", i)
		}
		for _, s := range got {
			if s != "[REDACTED]" {
				t.Fatalf("document %d re-driven after the rename with ssn %q", i, s)
			}
		}
	}
}

func mustRaw(t *testing.T, v any) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
