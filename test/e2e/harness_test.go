// Package e2e runs changegate end to end: the real app, the real MongoDB Go
// driver against test/mongowire (or a real replica set when
// CHANGEGATE_TEST_MONGODB_URI is set) and real HTTP receivers.
package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/test/mongotest"
	"github.com/changegate/changegate/test/mongowire"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// env is one test's world: a MongoDB (mongowire unless a real one is
// configured), a client, and unique database names.
type env struct {
	t      *testing.T
	uri    string
	srv    *mongowire.Server // nil against a real MongoDB
	client *mongo.Client
	db     string // the watched database
	state  string // changegate's state database
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t}
	e.uri, e.srv = mongotest.URI(t)
	c := mongotest.Client(t, e.uri)
	e.client = c
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_"))
	if len(name) > 30 {
		name = name[:30]
	}
	suffix := fmt.Sprintf("%06d", rand.IntN(1000000))
	e.db = "cg_" + name + "_" + suffix
	e.state = "cgstate_" + name + "_" + suffix
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Database(e.db).Drop(ctx)
		_ = c.Database(e.state).Drop(ctx)
	})
	return e
}

// needServer skips tests that need test/mongowire's controls (restart,
// history truncation) when running against a real MongoDB.
func (e *env) needServer() {
	if e.srv == nil {
		e.t.Skip("needs test/mongowire's fault controls; not available against a real MongoDB")
	}
}

func (e *env) coll(name string) *mongo.Collection { return e.client.Database(e.db).Collection(name) }

// config renders a config: %URI%, %DB% and %STATE% are replaced.
func (e *env) config(tmpl string) *config.Config {
	e.t.Helper()
	text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state).Replace(tmpl)
	cfg, err := config.Parse("test.toml", []byte(text), func(k string) (string, bool) {
		if k == "TEST_SECRET" {
			return testSecret, true
		}
		return os.LookupEnv(k)
	})
	if err != nil {
		e.t.Fatalf("config: %v\n%s", err, text)
	}
	return cfg
}

// gateway is a running app.Run.
type gateway struct {
	cancel context.CancelFunc
	hard   chan struct{}
	done   chan error
	admin  string
}

func (e *env) start(cfg *config.Config) *gateway {
	e.t.Helper()
	return e.startWith(cfg, app.Options{})
}

// startWith starts the gateway with extra options (Hard and Started are the
// harness's; Logger too unless set).
func (e *env) startWith(cfg *config.Config, opts app.Options) *gateway {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &gateway{cancel: cancel, hard: make(chan struct{}), done: make(chan error, 1)}
	started := make(chan string, 1)
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		if opts.Logger == nil {
			opts.Logger = log
		}
		opts.Hard, opts.Started = g.hard, func(a string) { started <- a }
		g.done <- app.Run(ctx, cfg, opts)
	}()
	select {
	case g.admin = <-started:
	case err := <-g.done:
		e.t.Fatalf("gateway exited at start: %v", err)
	case <-time.After(20 * time.Second):
		e.t.Fatal("gateway did not start")
	}
	e.t.Cleanup(func() { g.stop(e.t, false) })
	// Changes written before a source's first stream is open are not part of
	// its history: wait until every source is open (readiness).
	if g.admin != "" {
		var last string
		deadline := time.Now().Add(20 * time.Second)
		for {
			select {
			case err := <-g.done:
				g.done <- err // exited at start (e.g. history lost): the test reads it
				return g
			default:
			}
			resp, err := http.Get("http://" + g.admin + "/readyz")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				last = string(b)
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("gateway not ready after 20s: %s", last)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return g
}

// stop stops the gateway: drained (SIGTERM) or hard (no drain at all, like
// a second signal right away).
func (g *gateway) stop(t *testing.T, hard bool) error {
	if g.cancel == nil {
		return nil
	}
	if hard {
		close(g.hard)
	}
	g.cancel()
	g.cancel = nil
	select {
	case err := <-g.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("gateway did not stop within 30s")
		return nil
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// insertN inserts n documents {_id: i, n: i} in batches.
func insertN(t *testing.T, c *mongo.Collection, from, n int) {
	t.Helper()
	if err := insertDocs(c, from, n); err != nil {
		t.Fatal(err)
	}
}

// insertDocs is insertN for other goroutines.
func insertDocs(c *mongo.Collection, from, n int) error {
	ctx := context.Background()
	const batch = 500
	for i := from; i < from+n; i += batch {
		docs := []any{}
		for j := i; j < from+n && j < i+batch; j++ {
			docs = append(docs, bson.D{{Key: "_id", Value: j}, {Key: "n", Value: j}})
		}
		if _, err := c.InsertMany(ctx, docs); err != nil {
			return err
		}
	}
	return nil
}
