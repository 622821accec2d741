package e2e

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
)

// TestStopWhileMongoUnreachable: SIGTERM while MongoDB cannot be reached
// (sources still trying to load their checkpoints) is a clean stop: Run
// returns nil (exit 0), not "context canceled" reported as a failure.
func TestStopWhileMongoUnreachable(t *testing.T) {
	cfg, err := config.Parse("test.toml", []byte(`
[mongo]
uri = "mongodb://127.0.0.1:1/?replicaSet=rs0&serverSelectionTimeoutMS=200&connectTimeoutMS=200"
[server]
listen = "127.0.0.1:0"
shutdown_grace = "2s"
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, cfg, app.Options{
			Logger:  slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
			Started: func(a string) { started <- a },
		})
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("exited at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("did not start")
	}
	time.Sleep(300 * time.Millisecond) // let the source fail a checkpoint load
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a clean stop: %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("did not stop")
	}
}
