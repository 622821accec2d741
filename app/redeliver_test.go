package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
)

// redeliverConfig is configText (every change of %DB%.items to "hook"),
// its rule shaped by %SHAPE%, plus a sink "other" that no change is routed
// to.
const redeliverConfig = configText + `%SHAPE%

[[sinks]]
name = "other"
type = "webhook"
url = "%OTHER%"
allow_private_networks = true

[[rules]]
name = "none"
source = "items"
filter = { "fullDocument.never" = true }
sinks = ["other"]
`

// recordingHook is a webhook receiver that keeps each request's webhook-id
// and body.
type recordingHook struct {
	*httptest.Server
	mu   sync.Mutex
	ids  []string
	body []string
}

func newRecordingHook(t *testing.T) *recordingHook {
	h := &recordingHook{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.ids = append(h.ids, r.Header.Get("webhook-id"))
		h.body = append(h.body, string(b))
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *recordingHook) got() (ids, bodies []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ids...), append([]string(nil), h.body...)
}

// A change still in the oplog is read again and delivered once more to the
// sink asked for, with the same id and the shape of today's rules (the
// reload redacts a field the first delivery carried); one the oplog no
// longer holds is refused with 410; an unknown sink gets 404, a sink
// today's rules do not route the change to 409; the other sink receives
// nothing.
func TestRedeliverEventFromOplog(t *testing.T) {
	t.Parallel()
	uri, srv := mongotest.URI(t)
	e, _ := newEnvAt(t, uri)
	hook, other := newRecordingHook(t), newRecordingHook(t)
	text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state, "%URL%", hook.URL, "%OTHER%", other.URL, "%GRACE%", "5s").Replace(redeliverConfig)
	parse := func(shape string) *config.Config {
		cfg, err := config.Parse("test.toml", []byte(strings.Replace(text, "%SHAPE%", shape, 1)), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		return cfg
	}
	cfg := parse("")
	redacted := parse(`redact = ["fullDocument.secret"]`)
	g := start(t, cfg, app.Options{LoadConfig: func() (*config.Config, error) { return redacted, nil }})
	client := mongotest.Client(t, uri)
	coll := client.Database(e.db).Collection("items")
	if _, err := coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: 1}, {Key: "secret", Value: "hunter2"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: 2}, {Key: "secret", Value: "swordfish"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "two deliveries", func() bool { ids, _ := hook.got(); return len(ids) == 2 })
	ids, bodies := hook.got()
	if !strings.Contains(bodies[0], "hunter2") {
		t.Fatalf("first delivery %s: want the secret (no shaping yet)", bodies[0])
	}
	id := ids[0]
	if code, body := call(t, "POST", g.admin, "/api/v1/reload", "s3cret-admin-token"); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}

	redeliver := func(id, body string) (int, map[string]any) {
		t.Helper()
		resp, b := do(t, "POST", g.admin, "/api/v1/events/"+id+"/redeliver", "s3cret-admin-token", strings.NewReader(body))
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("answer %s: %v", b, err)
		}
		return resp.StatusCode, out
	}
	code, out := redeliver(id, `{"sink": "hook"}`)
	if code != 200 || out["state"] != "delivered" || out["id"] != id || out["sink"] != "hook" {
		t.Fatalf("redeliver: %d %v", code, out)
	}
	ids, bodies = hook.got()
	if len(ids) != 3 || ids[2] != id {
		t.Fatalf("after the redelivery the receiver got ids %v, want the third %s", ids, id)
	}
	if strings.Contains(bodies[2], "hunter2") || !strings.Contains(bodies[2], `"_id":1`) {
		t.Errorf("redelivered body %s: want the change of _id 1 with today's redaction", bodies[2])
	}
	if code, out := redeliver(id, `{"sink": "nope"}`); code != 404 || !strings.Contains(out["error"].(string), `unknown sink "nope"`) {
		t.Errorf("unknown sink: %d %v", code, out)
	}
	if code, out := redeliver(id, `{"sink": "other"}`); code != 409 || !strings.Contains(out["error"].(string), "no current rule routes") {
		t.Errorf("a sink today's rules do not route it to: %d %v", code, out)
	}
	if code, out := redeliver(id, `{}`); code != 400 {
		t.Errorf("no sink: %d %v", code, out)
	}
	if code, out := redeliver("items:snapshot:1:2", `{"sink": "hook"}`); code != 400 || !strings.Contains(out["error"].(string), "no position in the change stream") {
		t.Errorf("a snapshot event: %d %v", code, out)
	}
	if srv != nil {
		// The oplog rolls past both changes.
		srv.DiscardHistory()
		code, out := redeliver(ids[1], `{"sink": "hook"}`)
		if msg, _ := out["error"].(string); code != 410 || !strings.Contains(msg, "no longer in the oplog") {
			t.Errorf("a change rolled off the oplog: %d %v", code, out)
		}
		if got, _ := hook.got(); len(got) != 3 {
			t.Errorf("the refused redelivery sent something: %v", got)
		}
	}
	if got, _ := other.got(); len(got) != 0 {
		t.Errorf("sink other received %v", got)
	}
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A redelivery of a window of the oplog to one sink delivers exactly the
// window's changes that its filter and today's rules select, once more,
// with their ids, to that sink alone; the other sink gets nothing and the
// source's checkpoint does not move back. Its progress is served as a backfill
// run's.
func TestRedeliverRange(t *testing.T) {
	t.Parallel()
	uri, _ := mongotest.URI(t)
	e, _ := newEnvAt(t, uri)
	hook, other := newRecordingHook(t), newRecordingHook(t)
	text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state, "%URL%", hook.URL, "%OTHER%", other.URL, "%GRACE%", "5s",
		"%SHAPE%", "", `filter = { "fullDocument.never" = true }`, "").Replace(redeliverConfig)
	cfg, err := config.Parse("test.toml", []byte(text), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	g := start(t, cfg, app.Options{})
	coll := mongotest.Client(t, uri).Database(e.db).Collection("items")
	insert := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: i}, {Key: "n", Value: i}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Cluster times count seconds: the window's changes are written in
	// seconds of their own.
	nextSecond := func() time.Time {
		next := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next) + 20*time.Millisecond)
		return next
	}
	insert(0, 3) // before the window
	since := nextSecond()
	insert(3, 9) // the window
	until := nextSecond()
	insert(9, 12) // after it
	waitFor(t, 15*time.Second, "every change at both sinks", func() bool {
		a, _ := hook.got()
		b, _ := other.got()
		return len(a) == 12 && len(b) == 12
	})
	liveIDs, liveBodies := hook.got()
	// The window's changes but that of n = 5, by document (different
	// documents are delivered in parallel: not in stream order).
	var want []string
	for i, b := range liveBodies {
		var ev struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}
		if err := json.Unmarshal([]byte(b), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.DocumentKey.ID >= 3 && ev.DocumentKey.ID < 9 && ev.DocumentKey.ID != 5 {
			want = append(want, liveIDs[i])
		}
	}
	var cp struct{ before, after string }
	waitFor(t, 15*time.Second, "the checkpoint at the last change", func() bool {
		c, ok, err := e.cps.Load(context.Background(), "items")
		cp.before = event.TokenData(c.Token)
		return err == nil && ok && strings.ToUpper(cp.before) >= strings.ToUpper(strings.TrimPrefix(slices.Max(liveIDs), "items:")) // tokens sort in stream order
	})

	body := `{"since": "` + since.Format(time.RFC3339) + `", "until": "` + until.Format(time.RFC3339) + `", "filter": {"fullDocument.n": {"$ne": 5}}, "rate": 1000}`
	resp, b := do(t, "POST", g.admin, "/api/v1/sinks/hook/redeliver", "s3cret-admin-token", strings.NewReader(body))
	var st struct {
		ID, Kind, State, Location string
		Scanned, Sent, Finished   int
		Percent                   float64
	}
	if err := json.Unmarshal(b, &st); err != nil || resp.StatusCode != 202 || st.Kind != "redelivery" || resp.Header.Get("Location") != "/api/v1/backfills/"+st.ID {
		t.Fatalf("POST /api/v1/sinks/hook/redeliver: %d %s", resp.StatusCode, b)
	}
	waitFor(t, 30*time.Second, "the redelivery done", func() bool {
		code, b := call(t, "GET", g.admin, "/api/v1/backfills/"+st.ID, "s3cret-admin-token")
		if err := json.Unmarshal(b, &st); err != nil || code != 200 || st.State == "failed" {
			t.Fatalf("GET the redelivery: %d %s", code, b)
		}
		return st.State == "done"
	})
	if st.Scanned != 6 || st.Sent != 5 || st.Finished != 5 || st.Percent != 100 {
		t.Errorf("status %+v: want 6 changes read, 5 sent and finished", st)
	}
	ids, bodies := hook.got()
	if len(ids) != 12+len(want) {
		t.Fatalf("the hook got %d requests, want 12 live and %d redelivered: %v", len(ids), len(want), ids[12:])
	}
	// Different documents go in parallel: compared as sets.
	got := slices.Clone(ids[12:])
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("redelivered %v, want %v", got, want)
	}
	for _, b := range bodies[12:] {
		if !strings.Contains(b, `"operationType":"insert"`) {
			t.Errorf("redelivered %s", b)
		}
	}
	if got, _ := other.got(); len(got) != 12 {
		t.Errorf("the other sink got %d requests, want the 12 live ones", len(got))
	}
	c, _, err := e.cps.Load(context.Background(), "items")
	// The live stream may move it on past the writes of the state
	// database (post-batch tokens); the redelivery never moves it back,
	// and the other sink's count above shows nothing was read again.
	if cp.after = event.TokenData(c.Token); err != nil || strings.ToUpper(cp.after) < strings.ToUpper(cp.before) {
		t.Errorf("the source's checkpoint moved back: %s -> %s (%v)", cp.before, cp.after, err)
	}
	for _, tc := range []struct {
		path, body string
		want       int
	}{
		{"/api/v1/sinks/nope/redeliver", body, 404},
		{"/api/v1/sinks/hook/redeliver", `{"since": "yesterday", "until": "` + until.Format(time.RFC3339) + `"}`, 400},
		{"/api/v1/sinks/hook/redeliver", `{"until": "` + until.Format(time.RFC3339) + `"}`, 400},
		{"/api/v1/sinks/hook/redeliver", `{"since": "` + until.Format(time.RFC3339) + `", "until": "` + since.Format(time.RFC3339) + `"}`, 400},
		{"/api/v1/sinks/hook/redeliver", `{"since": "` + since.Format(time.RFC3339) + `", "until": "` + time.Now().Add(time.Hour).Format(time.RFC3339) + `"}`, 400},
		{"/api/v1/sinks/hook/redeliver", `{"since": "` + since.Format(time.RFC3339) + `", "until": "` + until.Format(time.RFC3339) + `", "source": "nope"}`, 400},
		{"/api/v1/sinks/hook/redeliver", `{"since": "` + since.Format(time.RFC3339) + `", "until": "` + until.Format(time.RFC3339) + `", "filter": {"$where": "1"}}`, 400},
	} {
		if resp, b := do(t, "POST", g.admin, tc.path, "s3cret-admin-token", strings.NewReader(tc.body)); resp.StatusCode != tc.want {
			t.Errorf("POST %s %s: %d %s, want %d", tc.path, tc.body, resp.StatusCode, b, tc.want)
		}
	}
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
