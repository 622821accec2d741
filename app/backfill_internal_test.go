package app

import (
	"context"
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
	b := newBackfiller(client, client.Database(db+"_state"), "test", target,
		func(string) []string { return []string{"hook"} }, nil, nil)
	r, err := b.start(ctx, cfg, BackfillRequest{Source: "items", Rate: 100000})
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
