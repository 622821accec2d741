package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
)

// configText routes every change of %DB%.items to the webhook at %URL%.
const configText = `
[mongo]
uri = "%URI%"
state_database = "%STATE%"

[server]
listen = "127.0.0.1:0"
shutdown_grace = "%GRACE%"
admin_token = "s3cret-admin-token"

[[sources]]
name = "items"
database = "%DB%"
collection = "items"
checkpoint_interval = "50ms"
max_await = "100ms"

[[sinks]]
name = "hook"
type = "webhook"
url = "%URL%"
allow_private_networks = true
  [sinks.retry]
  max_attempts = 2
  initial_interval = "50ms"

[[rules]]
name = "all"
source = "items"
sinks = ["hook"]
`

// env is one test's MongoDB (test/mongowire unless
// CHANGEGATE_TEST_MONGODB_URI is set), unique database names, the
// checkpoint store and a writer to the watched collection.
type env struct {
	t         *testing.T
	uri       string
	db, state string
	cps       *checkpoint.Store
	insert    func() error // inserts the next document into %DB%.items
}

func newEnv(t *testing.T) *env {
	t.Helper()
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	e := &env{t: t, uri: uri, db: mongotest.UniqueName("cgapp_"), state: mongotest.UniqueName("cgappstate_")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Database(e.db).Drop(ctx)
		_ = client.Database(e.state).Drop(ctx)
	})
	e.cps = checkpoint.NewStore(client.Database(e.state), "checkpoints")
	n := 0
	e.insert = func() error {
		n++
		_, err := client.Database(e.db).Collection("items").InsertOne(context.Background(), bson.D{{Key: "_id", Value: n}})
		return err
	}
	return e
}

func (e *env) config(hookURL, grace string) *config.Config {
	e.t.Helper()
	text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state, "%URL%", hookURL, "%GRACE%", grace).Replace(configText)
	cfg, err := config.Parse("test.toml", []byte(text), func(string) (string, bool) { return "", false })
	if err != nil {
		e.t.Fatalf("config: %v", err)
	}
	return cfg
}

// logRecorder is a slog handler that keeps every message.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
	full []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	full := r.Message
	r.Attrs(func(a slog.Attr) bool { full += " " + a.String(); return true })
	l.full = append(l.full, full)
	return nil
}

// text returns every record so far, message and attributes (those of the
// record, not of With).
func (l *logRecorder) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.full, "\n")
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) saw(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// gateway is an app.Run in progress.
type gateway struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // Run's result, once done is closed
	admin  string
	log    *logRecorder
}

// start runs the app and waits until it is ready (its stream open).
func start(t *testing.T, cfg *config.Config, opts app.Options) *gateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &gateway{cancel: cancel, done: make(chan struct{}), log: &logRecorder{}}
	started := make(chan string, 1)
	opts.Logger = slog.New(g.log)
	opts.Started = func(addr string) { started <- addr }
	go func() {
		defer close(g.done)
		g.err = app.Run(ctx, cfg, opts)
	}()
	t.Cleanup(func() { cancel(); <-g.done })
	select {
	case g.admin = <-started:
	case <-g.done:
		t.Fatalf("Run exited at start: %v", g.err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not start")
	}
	waitFor(t, 15*time.Second, "/readyz 200", func() bool {
		resp, err := http.Get("http://" + g.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return g
}

// stop cancels Run's context and returns its result.
func (g *gateway) stop(t *testing.T, within time.Duration) error {
	t.Helper()
	g.cancel()
	select {
	case <-g.done:
		return g.err
	case <-time.After(within):
		t.Fatalf("Run did not return within %v of the stop", within)
		return nil
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunStartStop: Run starts (admin server up, stream open, initial
// position persisted), refuses a reload that changes [mongo] through the
// admin API, and returns nil promptly on cancel, with the admin server closed.
func TestRunStartStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	cfg := e.config(hook.URL, "5s")
	changed := e.config(hook.URL, "5s")
	changed.Mongo.StateDatabase += "_moved"
	g := start(t, cfg, app.Options{LoadConfig: func() (*config.Config, error) { return changed, nil }})

	if _, ok, err := e.cps.Load(context.Background(), "items"); err != nil || !ok {
		t.Fatalf("no initial checkpoint once ready: %v %v", ok, err)
	}

	req, _ := http.NewRequest(http.MethodPost, "http://"+g.admin+"/api/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer s3cret-admin-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var rej struct {
		Error    string
		Problems []string
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_ = json.Unmarshal(body, &rej)
	if resp.StatusCode != http.StatusBadRequest || len(rej.Problems) != 1 || rej.Problems[0] != "[mongo] changed, which takes a restart" ||
		rej.Error != app.ErrReloadRejected.Error() {
		t.Fatalf("reload changing [mongo]: %d %s", resp.StatusCode, body)
	}

	begin := time.Now()
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatalf("Run after a clean stop = %v, want nil", err)
	}
	if d := time.Since(begin); d > 3*time.Second {
		t.Errorf("an idle gateway took %v to stop", d)
	}
	if c, err := net.DialTimeout("tcp", g.admin, time.Second); err == nil {
		c.Close()
		t.Fatal("admin server still accepts connections after Run returned")
	}
}

// TestRunStartFailure: a gateway that cannot start returns the reason and
// does not hang.
func TestRunStartFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	cfg := e.config("http://127.0.0.1:1/hook", "5s")
	cfg.Server.Listen = busy.Addr().String()
	done := make(chan error, 1)
	go func() { done <- app.Run(context.Background(), cfg, app.Options{}) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "server.listen") {
			t.Fatalf("Run with a busy listen address = %v, want a server.listen error", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
}

// heldHook is a webhook receiver that holds every request until released.
type heldHook struct {
	*httptest.Server
	arrived  chan *http.Request
	release  chan struct{}
	mu       sync.Mutex
	ids      []string // webhook-id of requests answered 200
	canceled []string // webhook-id of requests whose client gave up while held
}

func newHeldHook(t *testing.T) *heldHook {
	h := &heldHook{arrived: make(chan *http.Request, 16), release: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("webhook-id")
		// Read the body: only then does the server notice a client that
		// hangs up (r.Context() is cancelled).
		_, _ = io.ReadAll(r.Body)
		h.arrived <- r
		select {
		case <-h.release:
			h.mu.Lock()
			h.ids = append(h.ids, id)
			h.mu.Unlock()
		case <-r.Context().Done():
			h.mu.Lock()
			h.canceled = append(h.canceled, id)
			h.mu.Unlock()
		}
	}))
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		h.Close()
	})
	return h
}

func (h *heldHook) state() (answered, canceled []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ids...), append([]string(nil), h.canceled...)
}

// TestShutdownDrain: on cancel the gateway stops reading and waits, up to
// shutdown_grace, for deliveries in flight. Within the grace the held
// delivery completes and the checkpoint is persisted at its event; past the
// grace the delivery is cancelled and the checkpoint stays before the event,
// so the next start re-delivers it.
func TestShutdownDrain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		grace     string
		delivered bool
	}{
		{name: "delivered within the grace", grace: "10s", delivered: true},
		{name: "grace expires", grace: "300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			hook := newHeldHook(t)
			g := start(t, e.config(hook.URL, tc.grace), app.Options{})
			if err := e.insert(); err != nil {
				t.Fatal(err)
			}
			var req *http.Request
			select {
			case req = <-hook.arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the event never reached the webhook")
			}
			id := req.Header.Get("webhook-id")

			g.cancel()
			waitFor(t, 5*time.Second, "the drain to begin", func() bool { return g.log.saw("stopping:") })
			if !tc.delivered {
				if err := g.stop(t, 5*time.Second); err != nil {
					t.Fatalf("Run = %v, want nil after the grace period", err)
				}
				// Past the grace the delivery is cancelled, not left running.
				waitFor(t, 5*time.Second, "the held delivery to be cancelled", func() bool {
					_, canceled := hook.state()
					return len(canceled) == 1
				})
				cp, ok, err := e.cps.Load(context.Background(), "items")
				if err != nil || !ok {
					t.Fatalf("checkpoint: %v %v", ok, err)
				}
				if event.MakeID("items", cp.Token) == id {
					t.Fatal("checkpoint covers an event that was never delivered")
				}
				return
			}
			// Draining: the delivery is neither cancelled nor abandoned.
			select {
			case <-req.Context().Done():
				t.Fatal("the delivery in flight was cancelled during the drain")
			case <-g.done:
				t.Fatalf("Run returned (%v) with a delivery in flight and grace left", g.err)
			case <-time.After(300 * time.Millisecond):
			}
			close(hook.release)
			if err := g.stop(t, 10*time.Second); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			if answered, canceled := hook.state(); len(answered) != 1 || answered[0] != id || len(canceled) != 0 {
				t.Fatalf("answered %v, canceled %v; want the held event delivered once", answered, canceled)
			}
			cp, _, err := e.cps.Load(context.Background(), "items")
			if err != nil {
				t.Fatal(err)
			}
			if got := event.MakeID("items", cp.Token); got != id {
				t.Fatalf("checkpoint at %s after the drain, want the delivered event %s", got, id)
			}
		})
	}
}
