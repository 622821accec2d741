package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
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
