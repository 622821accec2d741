package source_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/test/mongowire"
)

// partitionOf is the partition of a document with _id id among n.
func partitionOf(t *testing.T, id, n int) int {
	t.Helper()
	dk, err := bson.Marshal(bson.D{{Key: "_id", Value: int32(id)}})
	if err != nil {
		t.Fatal(err)
	}
	return mhash.Partition(mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: dk}), n)
}

func partSpec(w *world, i, n int) source.Spec {
	sp := w.spec()
	sp.Unit, sp.Partition, sp.Partitions = source.UnitName("items", i, n), i, n
	return sp
}

// TestPartitionsSplitTheStream: with partitions = 3 every document's
// changes reach exactly one unit, the one its documentKey hashes to, with
// the server's $toHashedIndexKey and with the client-side fallback; a
// drop (no documentKey) is dispatched by partition 0 only, and its
// invalidate reopens every partition's stream.
func TestPartitionsSplitTheStream(t *testing.T) {
	for _, mode := range []string{"server", "client"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t)
			if mode == "client" {
				w.needServer()
			}
			const n, docs = 3, 30
			recs := make([]*recorder, n)
			runs := make([]*running, n)
			for i := range n {
				if mode == "client" {
					// This unit's first open is refused as by a server
					// without $toHashedIndexKey.
					w.srv.FailCommand(mongowire.FailPoint{Commands: []string{"aggregate"}, Times: 1, ErrorCode: 168, AppName: srcApp})
				}
				recs[i] = &recorder{}
				runs[i] = w.run(partSpec(w, i, n), recs[i])
				runs[i].waitOpen(t)
			}
			for id := range docs {
				w.insert(id)
				if _, err := w.coll.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}); err != nil {
					t.Fatal(err)
				}
			}
			total := func() int {
				c := 0
				for _, r := range recs {
					c += len(r.all())
				}
				return c
			}
			waitFor(t, 10*time.Second, "every change", func() bool { return total() >= 2*docs })
			for i, r := range recs {
				for _, ev := range r.all() {
					id, _ := ev.DocumentKey.Lookup("_id").AsInt64OK()
					if p := partitionOf(t, int(id), n); p != i {
						t.Errorf("%s of document %d read by partition %d, it belongs to %d", ev.OperationType, id, i, p)
					}
					if ev.Source != "items" || ev.ID != "items:"+event.TokenData(ev.Token) {
						t.Errorf("event id %q source %q: want items:<token>", ev.ID, ev.Source)
					}
				}
			}
			if got := total(); got != 2*docs {
				t.Fatalf("%d changes read, want %d", got, 2*docs)
			}
			if w.srv != nil {
				hashed := 0
				for _, rec := range w.srv.CommandsNamed("aggregate") {
					if rec.DB == w.db && bytes.Contains(rec.Body, []byte("$toHashedIndexKey")) {
						hashed++
					}
				}
				// Client mode: only the refused first opens asked for it.
				if mode == "client" && hashed != n || mode == "server" && hashed < n {
					t.Fatalf("%d streams opened with $toHashedIndexKey in %s mode", hashed, mode)
				}
			}
			// A drop: every stream is invalidated; partition 0 alone
			// dispatches the drop and the invalidate.
			before := make([]int, n)
			for i, r := range recs {
				before[i] = len(r.all())
			}
			if err := w.coll.Drop(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "drop and invalidate at partition 0", func() bool { return len(recs[0].all()) >= before[0]+2 })
			w.insert(1000, 1001, 1002, 1003, 1004, 1005)
			waitFor(t, 10*time.Second, "the inserts after the drop", func() bool { return total() >= 2*docs+2+6 })
			for i, r := range recs {
				for _, ev := range r.all()[before[i]:] {
					if ev.DocumentKey == nil && i != 0 {
						t.Errorf("partition %d dispatched %s", i, ev.OperationType)
					}
				}
			}
			for i := range n {
				if err := runs[i].stop(t); err != nil {
					t.Fatal(err)
				}
				if _, ok, err := w.cps.Load(context.Background(), source.UnitName("items", i, n)); err != nil || !ok {
					t.Fatalf("no checkpoint for unit %d: %v", i, err)
				}
			}
		})
	}
}

func tok(data string) bson.Raw {
	b, _ := bson.Marshal(bson.D{{Key: "_data", Value: data}})
	return b
}

// TestInherit: a unit without a checkpoint inherits the oldest checkpoint
// of the most recently saved other partitioning of its source, never one
// of its own partitioning (which covers other documents only).
func TestInherit(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cp := func(unit, data string, saved int) checkpoint.Checkpoint {
		return checkpoint.Checkpoint{Source: unit, Token: tok(data), UpdatedAt: t0.Add(time.Duration(saved) * time.Minute)}
	}
	for _, tc := range []struct {
		name string
		cps  []checkpoint.Checkpoint
		n    int
		want string // Source of the inherited checkpoint, "" for none
	}{
		{"nothing saved", nil, 4, ""},
		{"unpartitioned to 4", []checkpoint.Checkpoint{cp("items", "8205", 1), cp("other", "8201", 1)}, 4, "items"},
		{"4 to unpartitioned: oldest of the 4", []checkpoint.Checkpoint{
			cp("items#0/4", "8209", 5), cp("items#1/4", "8203", 6), cp("items#2/4", "8207", 5), cp("items#3/4", "8208", 4),
		}, 1, "items#1/4"},
		{"siblings are never inherited", []checkpoint.Checkpoint{cp("items#0/4", "8209", 5), cp("items#1/4", "8203", 6)}, 4, ""},
		{"the most recent other layout wins over a stale one", []checkpoint.Checkpoint{
			cp("items", "8201", 1), cp("items#0/4", "8209", 50), cp("items#1/4", "8205", 40), cp("items#0/2", "8210", 60),
		}, 2, "items#1/4"},
		{"other sources with a common prefix are not ours", []checkpoint.Checkpoint{cp("items2", "8201", 1), cp("items2#0/2", "8201", 1)}, 4, ""},
		{"malformed suffix ignored", []checkpoint.Checkpoint{cp("items#x", "8201", 1)}, 4, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := source.Inherit(tc.cps, "items", tc.n)
			if !ok && tc.want != "" || ok && got.Source != tc.want {
				t.Fatalf("Inherit = %q, %v; want %q", got.Source, ok, tc.want)
			}
		})
	}
}

// TestChangedPartitionsStartFromOldest: changing partitions loses nothing.
// An unpartitioned source's checkpoint is inherited by its 2 partitions,
// and when one of those lags (held acks), 3 new partitions start from the
// lagging one's checkpoint, so the changes it had not acknowledged are
// read again.
func TestChangedPartitionsStartFromOldest(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ids := func(recs ...*recorder) []int {
		var out []int
		for _, r := range recs {
			for _, ev := range r.all() {
				if ev.OperationType == "insert" {
					id, _ := ev.DocumentKey.Lookup("_id").AsInt64OK()
					out = append(out, int(id))
				}
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	// 1 unit reads 1..3 and checkpoints.
	rec := &recorder{}
	r := w.run(w.spec(), rec)
	r.waitOpen(t)
	w.insert(1, 2, 3)
	rec.waitEvents(t, inserts(1, 2, 3)...)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	w.insert(4, 5, 6) // while nothing runs

	// 2 partitions: together exactly 4..6. Partition 0 then holds its
	// acks while 7..12 are written, so its checkpoint lags.
	recs2 := []*recorder{{}, {}}
	var runs2 []*running
	for i := range 2 {
		runs2 = append(runs2, w.run(partSpec(w, i, 2), recs2[i]))
	}
	waitFor(t, 10*time.Second, "4..6 split over 2 partitions", func() bool { return len(ids(recs2...)) == 3 })
	if got := ids(recs2...); !slices.Equal(got, []int{4, 5, 6}) {
		t.Fatalf("2 partitions read %v, want [4 5 6]", got)
	}
	waitFor(t, 10*time.Second, "both partitions checkpointed", func() bool {
		for i := range 2 {
			if _, ok, _ := w.cps.Load(ctx, source.UnitName("items", i, 2)); !ok {
				return false
			}
		}
		return true
	})
	recs2[0].mu.Lock()
	recs2[0].hold = true
	recs2[0].mu.Unlock()
	w.insert(7, 8, 9, 10, 11, 12)
	waitFor(t, 10*time.Second, "7..12 read", func() bool { return len(ids(recs2...)) == 9 })
	time.Sleep(100 * time.Millisecond) // a few checkpoint intervals: partition 1 moves on
	for _, r := range runs2 {
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
	var lagging []int
	for _, ev := range recs2[0].all() {
		if id, _ := ev.DocumentKey.Lookup("_id").AsInt64OK(); id >= 7 {
			lagging = append(lagging, int(id))
		}
	}
	if len(lagging) == 0 {
		t.Skip("no document of 7..12 hashed to partition 0; the test needs one")
	}

	// 3 partitions start from partition 0/2's checkpoint: they read again
	// at least what it had not acknowledged, and nothing before 7.
	recs3 := []*recorder{{}, {}, {}}
	for i := range 3 {
		w.run(partSpec(w, i, 3), recs3[i])
	}
	waitFor(t, 10*time.Second, "the unacknowledged changes read again", func() bool {
		got := ids(recs3...)
		for _, id := range lagging {
			if !slices.Contains(got, id) {
				return false
			}
		}
		return true
	})
	for _, id := range ids(recs3...) {
		if id < 7 {
			t.Fatalf("3 partitions read %d again, before the oldest checkpoint", id)
		}
	}
}
