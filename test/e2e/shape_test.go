package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/test/receiver"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const shapeRedactKey = "e2e-redact-key-0123456789"

func shapeConfig(full, doc, dead, keyFile, deadExtra string) string {
	return fmt.Sprintf(`
[mongo]
uri = "%%URI%%"
state_database = "%%STATE%%"

[server]
listen = "127.0.0.1:0"
shutdown_grace = "10s"
admin_token = "s3cret-admin-token"

[[sources]]
name = "users"
database = "%%DB%%"
collection = "users"
checkpoint_interval = "100ms"
max_await = "200ms"

[[sinks]]
name = "full"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
fields = { "fullDocument.card" = 0 }

[[sinks]]
name = "doc"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
envelope = "document"
fields = { "fullDocument.card.number" = 0 }
redact_mode = "hash"
redact = ["fullDocument.ssn"]
redact_key = "file:%s"

[[sinks]]
name = "dead"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
redact = ["fullDocument.card"]
%s
  [sinks.retry]
  max_attempts = 1

[[rules]]
name = "all"
source = "users"
sinks = ["full", "doc", "dead"]
redact = ["fullDocument.**.ssn"]
`, full, doc, keyFile, dead, deadExtra)
}

// TestShapedPayloads: two sinks of one rule get different shapes of the
// same event with the same id; a redacted value appears nowhere: not in
// deliveries, logs, metrics, the admin API's dead letters or the CLI's;
// a replay applies the shaping configured at replay time.
func TestShapedPayloads(t *testing.T) {
	e := newEnv(t)
	full, doc, dead := receiver.New(testSecret), receiver.New(testSecret), receiver.New(testSecret)
	for _, r := range []*receiver.Receiver{full, doc, dead} {
		t.Cleanup(r.Close)
	}
	dead.SetResponder(func([]byte) *receiver.Response { return &receiver.Response{Status: http.StatusBadRequest} })
	keyFile := filepath.Join(t.TempDir(), "redact.key")
	if err := os.WriteFile(keyFile, []byte(shapeRedactKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	text := shapeConfig(full.URL(), doc.URL(), dead.URL(), keyFile, "")
	cfg := e.config(text)
	logs := &syncBuffer{}
	g := e.startWith(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))})

	const n = 5
	secrets := []string{"CARD-SECRET"}
	for i := 0; i < n; i++ {
		ssn := fmt.Sprintf("SSN-SECRET-%d", i)
		secrets = append(secrets, ssn)
		if _, err := e.coll("users").InsertOne(t.Context(), bson.D{
			{Key: "_id", Value: i}, {Key: "name", Value: fmt.Sprintf("user %d", i)}, {Key: "ssn", Value: ssn},
			{Key: "card", Value: bson.D{{Key: "number", Value: "CARD-SECRET"}, {Key: "ssn", Value: ssn}}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	_, dls := e.stores(cfg)
	waitFor(t, 20*time.Second, "deliveries and dead letters", func() bool {
		c, _ := dls.Count(t.Context(), deadletter.Filter{Sink: "dead"})
		return full.Count() >= n && doc.Count() >= n && c == n
	})

	// Same ids, different shapes.
	byDoc := map[string]receiver.Delivery{}
	for _, d := range full.Deliveries() {
		byDoc[d.DocKey] = d
		var env struct {
			ID           string
			FullDocument map[string]any `json:"fullDocument"`
		}
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		if env.FullDocument["card"] != nil || env.FullDocument["ssn"] != "[REDACTED]" || env.FullDocument["name"] == nil {
			t.Fatalf("full sink got %s", d.Envelope)
		}
	}
	ids := map[string]bool{}
	for _, d := range full.Deliveries() {
		ids[d.WebhookID] = true
	}
	for _, d := range doc.Deliveries() {
		if !ids[d.WebhookID] {
			t.Fatalf("doc sink got id %q, which the full sink did not get", d.WebhookID)
		}
		var body map[string]any
		if err := json.Unmarshal(d.Envelope, &body); err != nil {
			t.Fatal(err)
		}
		if body["operationType"] != nil || body["_id"] == nil {
			t.Fatalf("doc sink: the body is not the document: %s", d.Envelope)
		}
		id := int(body["_id"].(float64))
		m := hmac.New(sha256.New, []byte(shapeRedactKey))
		fmt.Fprintf(m, "SSN-SECRET-%d", id)
		if want := hex.EncodeToString(m.Sum(nil)); body["ssn"] != "[REDACTED]" {
			// The rule masks ssn everywhere, which is stricter than the
			// sink's hash: the mask wins.
			t.Fatalf("doc sink ssn = %v (hash would be %s), want the mask", body["ssn"], want)
		}
	}

	// Nothing redacted is shown anywhere.
	check := func(where, s string) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(s, sec) {
				t.Fatalf("%s shows %q:\n%s", where, sec, s)
			}
		}
	}
	for _, r := range []*receiver.Receiver{full, doc} {
		for _, d := range r.Deliveries() {
			check("a delivery", string(d.Envelope))
		}
	}
	var list struct {
		Entries []struct{ ID string } `json:"entries"`
	}
	listBody := apiRaw(t, g.admin, "/api/v1/deadletters?sink=dead", &list)
	check("GET /api/v1/deadletters", listBody)
	if len(list.Entries) != n {
		t.Fatalf("%d dead letters listed", len(list.Entries))
	}
	shown := apiRaw(t, g.admin, "/api/v1/deadletters/"+list.Entries[0].ID, nil)
	check("GET /api/v1/deadletters/{id}", shown)
	if !strings.Contains(shown, `"shaped"`) || strings.Contains(shown, `"change"`) || !strings.Contains(shown, "[REDACTED]") {
		t.Fatalf("dead letter shown: %s", shown)
	}
	check("/metrics", apiRaw(t, g.admin, "/metrics", nil))

	// The CLI.
	if !testing.Short() {
		bin := changegateBinary(t)
		cfgPath := filepath.Join(t.TempDir(), "changegate.toml")
		rendered := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state).Replace(text)
		if err := os.WriteFile(cfgPath, []byte(rendered), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"list", "-sink", "dead"}, {"show", "-id", list.Entries[0].ID}} {
			cmd := exec.Command(bin, append([]string{"deadletters"}, append(args, "-config", cfgPath)...)...)
			cmd.Env = append(os.Environ(), "TEST_SECRET="+testSecret)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("changegate deadletters %v: %v\n%s", args, err, out)
			}
			check("changegate deadletters "+args[0], string(out))
			if args[0] == "show" && !strings.Contains(string(out), "[REDACTED]") {
				t.Fatalf("show: %s", out)
			}
		}
	}
	g.stop(t, false)
	check("the logs", logs.String())

	// Replay with the shaping configured now: the dead sink's envelope is
	// the key form.
	dead.SetResponder(nil)
	cfg2 := e.config(shapeConfig(full.URL(), doc.URL(), dead.URL(), keyFile, `envelope = "key"`))
	res, err := e.replay(cfg2)
	if err != nil || res.Replayed != n {
		t.Fatalf("replay: %+v %v", res, err)
	}
	for _, d := range dead.Deliveries() {
		var env map[string]any
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		if env["fullDocument"] != nil || env["documentKey"] == nil || env["id"] != d.WebhookID {
			t.Fatalf("replayed %s, want the key form", d.Envelope)
		}
		check("a replayed delivery", string(d.Envelope))
	}
}

// apiRaw GETs an admin path with the admin token and returns the body,
// decoding it into out when not nil.
func apiRaw(t *testing.T, addr, path string, out any) string {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer s3cret-admin-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return string(b)
}

// TestSkipEmptyUpdatesCheckpoint: updates a sink skips (skip_empty_updates)
// are acknowledged, so the checkpoint moves past them: after a restart
// nothing is read again (a lost acknowledgement would hold the checkpoint
// before the first skipped update and re-deliver the update that followed
// it), and nothing that should be sent is lost.
func TestSkipEmptyUpdatesCheckpoint(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	cfg := e.config(fmt.Sprintf(`
[mongo]
uri = "%%URI%%"
state_database = "%%STATE%%"

[server]
listen = "127.0.0.1:0"
shutdown_grace = "10s"

[[sources]]
name = "users"
database = "%%DB%%"
collection = "users"
checkpoint_interval = "100ms"
max_await = "200ms"

[[sinks]]
name = "status"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
fields = ["fullDocument.status"]
skip_empty_updates = true

[[rules]]
name = "updates"
source = "users"
operations = ["update"]
sinks = ["status"]
`, rcv.URL()))
	g := e.start(cfg)
	c := e.coll("users")
	ctx := t.Context()
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "status", Value: "new"}, {Key: "note", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	set := func(k string, v any) {
		t.Helper()
		if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: k, Value: v}}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 20; i++ {
		set("note", i) // skipped: nothing of status changes
	}
	set("status", "paid") // sent
	for i := 21; i <= 40; i++ {
		set("note", i) // skipped
	}
	waitFor(t, 20*time.Second, "the status update", func() bool { return rcv.Count() >= 1 })
	if err := g.stop(t, false); err != nil {
		t.Fatal(err)
	}
	g = e.start(cfg)
	set("status", "shipped")
	waitFor(t, 20*time.Second, "the second status update", func() bool { return rcv.Count() >= 2 })
	g.stop(t, false)
	ds := rcv.Deliveries()
	if len(ds) != 2 {
		for _, d := range ds {
			t.Logf("%s %s", d.WebhookID, d.Envelope)
		}
		t.Fatalf("%d deliveries, want 2: the checkpoint did not move past the skipped updates", len(ds))
	}
	for i, want := range []string{"paid", "shipped"} {
		var env struct {
			UpdateDescription struct {
				UpdatedFields map[string]any `json:"updatedFields"`
			} `json:"updateDescription"`
		}
		if err := json.Unmarshal(ds[i].Envelope, &env); err != nil {
			t.Fatal(err)
		}
		if got := env.UpdateDescription.UpdatedFields; len(got) != 1 || got["status"] != want {
			t.Fatalf("delivery %d: %s, want only status = %s", i, ds[i].Envelope, want)
		}
	}
}
