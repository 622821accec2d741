package source_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/test/mongotest"
	"github.com/changegate/changegate/test/mongowire"
)

// srcApp is the application name of the client the source under test uses,
// so fail points hit its commands and not the test's own.
const srcApp = "source-under-test"

// world is one test's MongoDB (test/mongowire unless
// CHANGEGATE_TEST_MONGODB_URI names a real one), a watched collection, the
// real checkpoint and dead-letter stores, and fresh metrics.
type world struct {
	t      *testing.T
	srv    *mongowire.Server // nil against a real MongoDB
	client *mongo.Client     // the test's own client
	srcCli *mongo.Client     // the source's client (appName srcApp)
	db     string
	coll   *mongo.Collection
	cps    *checkpoint.Store
	dls    *deadletter.Store
	m      *metrics.Metrics
}

func newWorld(t *testing.T) *world {
	t.Helper()
	uri, srv := mongotest.URI(t)
	w := &world{t: t, srv: srv, client: connect(t, uri, ""), srcCli: connect(t, uri, srcApp)}
	w.db = mongotest.UniqueName("cgsrc_")
	w.coll = w.client.Database(w.db).Collection("items")
	state := w.client.Database(w.db + "_state")
	w.cps = checkpoint.NewStore(state, "checkpoints")
	w.dls = deadletter.NewStore(state, "deadletters")
	w.m = metrics.New(prometheus.NewRegistry())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.client.Database(w.db).Drop(ctx)
		_ = state.Drop(ctx)
	})
	return w
}

func connect(t *testing.T, uri, app string) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second)
	if app != "" {
		o.SetAppName(app)
	}
	c, err := mongo.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	})
	return c
}

// needServer skips a test that needs test/mongowire's controls.
func (w *world) needServer() {
	if w.srv == nil {
		w.t.Skip("needs test/mongowire's fault controls; not available against a real MongoDB")
	}
}

// spec is a collection source on the world's collection with short timings.
func (w *world) spec() source.Spec {
	return source.Spec{
		Name: "items", Database: w.db, Collection: "items",
		MaxAwait: 100 * time.Millisecond, CheckpointInterval: 20 * time.Millisecond,
	}
}

func (w *world) insert(ids ...int) {
	w.t.Helper()
	for _, id := range ids {
		if _, err := w.coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: id}}); err != nil {
			w.t.Fatal(err)
		}
	}
}

// tokensOf watches the collection while write runs and returns the resume
// tokens of the n events write causes, so a test can seed a checkpoint with
// a real token from the middle of the history.
func (w *world) tokensOf(n int, write func()) []bson.Raw {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := w.coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetMaxAwaitTime(100*time.Millisecond))
	if err != nil {
		w.t.Fatal(err)
	}
	defer cs.Close(context.Background())
	write()
	var toks []bson.Raw
	for len(toks) < n && cs.Next(ctx) {
		toks = append(toks, slices.Clone(cs.Current.Lookup("_id").Document()))
	}
	if len(toks) < n {
		w.t.Fatalf("read %d of %d events: %v", len(toks), n, cs.Err())
	}
	if w.srv != nil {
		w.srv.ResetCommands() // streamOpens then sees only the source's streams
	}
	return toks
}

func (w *world) saveCheckpoint(tok bson.Raw) {
	w.t.Helper()
	if err := w.cps.Save(context.Background(), checkpoint.Checkpoint{Source: "items", Token: tok}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) checkpoint() (checkpoint.Checkpoint, bool) {
	w.t.Helper()
	cp, ok, err := w.cps.Load(context.Background(), "items")
	if err != nil {
		w.t.Fatal(err)
	}
	return cp, ok
}

// running is a Source.Run in progress.
type running struct {
	src    *source.Source
	cancel context.CancelFunc
	done   chan error
}

// run starts a source with spec, dispatching to rec; it is stopped at cleanup.
func (w *world) run(spec source.Spec, rec *recorder) *running {
	w.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: source.New(spec, w.srcCli, w.cps, w.dls, rec, w.m, nil), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- r.src.Run(ctx) }()
	w.t.Cleanup(func() { r.stop(w.t) })
	return r
}

// stop cancels Run and returns its result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // a second stop (cleanup) sees the same result
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("source did not stop within 15s")
		return nil
	}
}

// waitOpen waits until the source's change stream is open (so writes from
// now on are after its start).
func (r *running) waitOpen(t *testing.T) {
	t.Helper()
	// A snapshot scan of 20,000 documents under -race on a loaded
	// machine takes more than 10 s; this is a deadline, not a wait.
	waitFor(t, 60*time.Second, "the change stream to open", func() bool {
		return r.src.Status().State == source.StateOpen
	})
}

// recorder is the source's Dispatcher: it records every event and acks it
// at once, or holds the acks while hold is set.
type recorder struct {
	mu     sync.Mutex
	events []*event.Event
	hold   bool
	held   []func()
	// holdIf, when set, holds the acks of the events it returns true for.
	holdIf func(*event.Event) bool
}

func (r *recorder) Dispatch(ev *event.Event, ack func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	if r.hold || r.holdIf != nil && r.holdIf(ev) {
		r.held = append(r.held, ack)
		return
	}
	ack()
}

// release acks the held events and stops holding.
func (r *recorder) release() {
	r.mu.Lock()
	held := r.held
	r.held, r.hold = nil, false
	r.mu.Unlock()
	for _, ack := range held {
		ack()
	}
}

func (r *recorder) all() []*event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// summary renders the events read as "op:id" strings ("invalidate" and
// "drop" have no id).
func (r *recorder) summary() []string {
	var out []string
	for _, ev := range r.all() {
		out = append(out, describe(ev))
	}
	return out
}

func describe(ev *event.Event) string {
	if ev.DocumentKey == nil {
		return ev.OperationType
	}
	id, _ := ev.DocumentKey.Lookup("_id").AsInt64OK()
	return fmt.Sprintf("%s:%d", ev.OperationType, id)
}

// waitEvents waits until the recorder has exactly want (in order), failing
// on anything else: a missing, extra or repeated event.
func (r *recorder) waitEvents(t *testing.T, want ...string) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("events %v", want), func() bool {
		got := r.summary()
		if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
			t.Fatalf("events read %v, want %v", got, want)
		}
		return len(got) == len(want)
	})
}

func inserts(ids ...int) []string {
	var out []string
	for _, id := range ids {
		out = append(out, fmt.Sprintf("insert:%d", id))
	}
	return out
}

// waitFor polls cond until it holds or d passes.
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

// streamOpens returns the $changeStream stage of every aggregate the source
// sent for the world's collection, oldest first (mongowire only).
func (w *world) streamOpens() []bson.Raw {
	var out []bson.Raw
	for _, rec := range w.srv.CommandsNamed("aggregate") {
		if rec.DB != w.db {
			continue
		}
		if name, _ := rec.Body.Lookup("aggregate").StringValueOK(); name != "items" {
			continue
		}
		stages, _ := rec.Body.Lookup("pipeline").Array().Values()
		if len(stages) == 0 {
			continue
		}
		if cs, ok := stages[0].Document().Lookup("$changeStream").DocumentOK(); ok {
			out = append(out, cs)
		}
	}
	return out
}

// resumeOption returns the resume option of a $changeStream stage and its
// value: "startAfter", "resumeAfter", "startAtOperationTime" or "".
func resumeOption(cs bson.Raw) (string, bson.RawValue) {
	for _, k := range []string{"startAfter", "resumeAfter", "startAtOperationTime"} {
		if v := cs.Lookup(k); v.Type != 0 {
			return k, v
		}
	}
	return "", bson.RawValue{}
}
