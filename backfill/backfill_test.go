package backfill

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
)

// fakeTarget records what a backfill sends; live is the number of live
// events it reports queued ahead of the backfill's.
type fakeTarget struct {
	live atomic.Int64
	mu   sync.Mutex
	sent []*event.Event
}

func (f *fakeTarget) send(_ context.Context, _ string, ev *event.Event, done func(bool)) bool {
	f.mu.Lock()
	f.sent = append(f.sent, ev)
	f.mu.Unlock()
	done(false)
	return true
}

func (f *fakeTarget) liveQueued([]string, int64) int64 { return f.live.Load() }

func (f *fakeTarget) hasSink(string) bool { return true }

func (f *fakeTarget) deliverNow(ctx context.Context, sink string, ev *event.Event) error {
	f.send(ctx, sink, ev, func(bool) {})
	return nil
}

func (f *fakeTarget) mark(string) any { return nil }

func (f *fakeTarget) sendAfter(ctx context.Context, sink string, ev *event.Event, _ any, done func(bool)) (bool, bool) {
	return f.send(ctx, sink, ev, done), false
}

func (f *fakeTarget) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sent)
}

// A backfill sends nothing while live changes are queued for its sinks,
// and everything (each document once, in _id order) once they are gone.
func TestBackfillYieldsToLiveChanges(t *testing.T) {
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	db := mongotest.UniqueName("cgbf_")
	coll := client.Database(db).Collection("items")
	ctx := context.Background()
	var docs []any
	for i := range 50 {
		docs = append(docs, bson.D{{Key: "_id", Value: int32(i)}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Database(db).Drop(context.Background())
		_ = client.Database(db + "_state").Drop(context.Background())
	})
	cfg := &config.Config{
		Sources: []config.Source{{Name: "items", Database: db, Collection: "items"}},
		Sinks:   []config.Sink{{Name: "hook"}},
	}
	target := &fakeTarget{}
	target.live.Store(3)
	b := New(Options{Client: client, StateDB: client.Database(db + "_state"), Instance: "test", Target: target,
		SinksOf: func(string) []string { return []string{"hook"} }})
	r, err := b.start(ctx, cfg, Request{Source: "items", Rate: 100000})
	if err != nil {
		t.Fatal(err)
	}
	// Let the backfill read its first batch: nothing may be sent while
	// live changes are queued.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := target.count(); n != 0 {
			t.Fatalf("%d documents sent while live changes were queued", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	target.live.Store(0)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatal("backfill did not finish")
	}
	if st := r.status(); st.State != "done" || st.Sent != 50 || st.Finished != 50 {
		t.Fatalf("status %+v", st)
	}
	for i, ev := range target.sent {
		if id, _ := ev.DocumentKey.Lookup("_id").AsInt64OK(); id != int64(i) || ev.OperationType != "snapshot" {
			t.Fatalf("event %d: %s %s", i, ev.OperationType, ev.DocumentKey)
		}
	}
}

// slowSinkTarget is fakeTarget, reporting live changes queued ahead of
// every backfill of sink "slow" (which therefore never sends) and none for
// the others.
type slowSinkTarget struct{ fakeTarget }

func (s *slowSinkTarget) liveQueued(sinks []string, _ int64) int64 {
	if slices.Contains(sinks, "slow") {
		return 1
	}
	return 0
}

// The backfill history is bounded whatever runs: with an old backfill
// still running, 150 later ones that finished (each with a 15 KB filter)
// leave the newest history (20) listed, their filters cut, and the
// running one.
func TestBackfillHistoryBounded(t *testing.T) {
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	db := mongotest.UniqueName("cgbfh_")
	ctx := context.Background()
	if _, err := client.Database(db).Collection("items").InsertMany(ctx, []any{bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 2}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Database(db).Drop(context.Background())
		_ = client.Database(db + "_state").Drop(context.Background())
	})
	cfg := &config.Config{
		Sources: []config.Source{{Name: "items", Database: db, Collection: "items"}},
		Sinks:   []config.Sink{{Name: "slow"}, {Name: "fast"}},
	}
	b := New(Options{Client: client, StateDB: client.Database(db + "_state"), Instance: "test", Target: &slowSinkTarget{},
		SinksOf: func(string) []string { return []string{"slow", "fast"} }})
	old, err := b.start(ctx, cfg, Request{Source: "items", Sink: "slow", Rate: 100000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.Cancel(context.Background(), old.id) })
	filter := `{"pad": {"$ne": "` + strings.Repeat("x", 15000) + `"}}`
	for i := range 150 {
		r, err := b.start(ctx, cfg, Request{Source: "items", Sink: "fast", Filter: filter, Rate: 100000})
		if err != nil {
			t.Fatalf("backfill %d: %v", i, err)
		}
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("backfill %d did not finish", i)
		}
		if st := r.status(); st.State != "done" || st.Sent != 2 {
			t.Fatalf("backfill %d: %+v", i, st)
		}
	}
	list := b.List()
	if len(list) != history+1 || list[0].ID != old.id || list[0].State != "running" {
		t.Fatalf("%d backfills listed (first %s %s), want the running one and the last %d finished", len(list), list[0].ID, list[0].State, history)
	}
	for _, st := range list[1:] {
		if st.State != "done" || len(st.Filter) > keptFilter+len("…") || !strings.HasSuffix(st.Filter, "…") {
			t.Fatalf("finished backfill %s: state %s, filter of %d bytes kept", st.ID, st.State, len(st.Filter))
		}
	}
	b.mu.Lock()
	n := len(b.runs)
	b.mu.Unlock()
	if n != history+1 {
		t.Errorf("%d backfills kept in memory, want %d", n, history+1)
	}
}
