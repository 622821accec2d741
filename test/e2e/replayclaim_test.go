package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
)

const replayClaimConfig = `
[mongo]
uri = "%URI%"
state_database = "%STATE%"

[server]
listen = "127.0.0.1:0"

[[sources]]
name = "shop"
database = "%DB%"
checkpoint_interval = "100ms"
max_await = "200ms"

[[sinks]]
name = "hook"
type = "webhook"
url = "%URL%"
allow_private_networks = true
timeout = "1m"
  [sinks.retry]
  max_attempts = 1

[[rules]]
name = "all"
source = "shop"
sinks = ["hook"]
`

// A replay killed (SIGKILL) while it delivers an entry leaves its claim on
// the entry; the next replay, run at once from this machine, takes the
// claim over (its owner is dead) and delivers the entry, instead of
// skipping it as "being replayed by another replay" until the claim
// expires (a minute, before claims carried their owner).
func TestProcessReplayKilledClaimTakenOver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	var mu sync.Mutex
	mode, got := "refuse", 0
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		m := mode
		got++
		mu.Unlock()
		switch m {
		case "refuse":
			http.Error(w, "no", http.StatusBadRequest)
		case "hold":
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			http.Error(w, "gone", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hold) })
	setMode := func(m string) {
		mu.Lock()
		mode, got = m, 0
		mu.Unlock()
	}
	requests := func() int {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	tmpl := strings.NewReplacer("%URL%", srv.URL).Replace(replayClaimConfig)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(tmpl)
	_, dls := e.stores(cfg)

	// One dead letter, refused by the receiver.
	g := e.start(cfg)
	if _, err := e.coll("items").InsertOne(t.Context(), bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	failed := func() []deadletter.Entry {
		es, err := dls.List(t.Context(), deadletter.Filter{Kind: deadletter.KindFailed})
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	waitFor(t, 20*time.Second, "a dead letter", func() bool { return len(failed()) == 1 })
	g.stop(t, false)

	// A replay held by the receiver, killed.
	setMode("hold")
	replay := exec.Command(bin, "deadletters", "replay", "-config", cfgPath)
	replay.Env = os.Environ()
	if err := replay.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the replay's request", func() bool { return requests() == 1 })
	if err := replay.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = replay.Wait()
	if es := failed(); len(es) != 1 {
		t.Fatalf("%d dead letters after the kill, want 1 (still claimed)", len(es))
	}

	// The next replay delivers it at once.
	setMode("accept")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, bin, "deadletters", "replay", "-config", cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "replayed 1, failed 0, skipped 0") {
		t.Fatalf("second replay: %v\n%s", err, out)
	}
	if requests() != 1 || len(failed()) != 0 {
		t.Fatalf("second replay: %d requests, %d dead letters left: want the entry delivered and deleted", requests(), len(failed()))
	}
	t.Logf("second replay took %v", time.Since(start))
}
