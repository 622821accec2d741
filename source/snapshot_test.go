package source_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
)

// snapDocs is the number of pre-existing documents of the snapshot tests:
// 20000 by default, CHANGEGATE_SNAPSHOT_DOCS (e.g. 100000) to go bigger.
func snapDocs(t *testing.T) int {
	if v := os.Getenv("CHANGEGATE_SNAPSHOT_DOCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			t.Fatalf("CHANGEGATE_SNAPSHOT_DOCS=%q: want a number >= 100", v)
		}
		return n
	}
	if testing.Short() {
		return 2000
	}
	return 20000
}

func insertMany(t *testing.T, c *mongo.Collection, ids []any) {
	t.Helper()
	for len(ids) > 0 {
		n := min(len(ids), 1000)
		docs := make([]any, n)
		for i, id := range ids[:n] {
			docs[i] = bson.D{{Key: "_id", Value: id}, {Key: "v", Value: 0}, {Key: "pad", Value: "xxxxxxxxxxxxxxxx"}}
		}
		if _, err := c.InsertMany(context.Background(), docs); err != nil {
			t.Fatal(err)
		}
		ids = ids[n:]
	}
}

func intIDs(from, to int) []any {
	out := make([]any, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, int32(i))
	}
	return out
}

// hookRecorder records events and acks them at once, except that it holds
// every ack from the holdFrom-th event on (0: never); onEvent runs in
// Dispatch.
type hookRecorder struct {
	mu       sync.Mutex
	events   []*event.Event
	holdFrom int
	held     []func()
	onEvent  func(n int, ev *event.Event)
}

func (r *hookRecorder) Dispatch(ev *event.Event, ack func()) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	n := len(r.events)
	hold := r.holdFrom > 0 && n >= r.holdFrom
	if hold {
		r.held = append(r.held, ack)
	}
	hook := r.onEvent
	r.mu.Unlock()
	if hook != nil {
		hook(n, ev)
	}
	if !hold {
		ack()
	}
}

func (r *hookRecorder) all() []*event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*event.Event(nil), r.events...)
}

func (r *hookRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func docKey(ev *event.Event) string {
	if id, ok := ev.DocumentKey.Lookup("_id").AsInt64OK(); ok {
		return fmt.Sprintf("%s/%d", ev.Coll, id)
	}
	return ev.Coll + "/" + ev.DocumentKey.Lookup("_id").String()
}

// Every pre-existing document arrives once as a snapshot event, with its
// document, before any change; the updates made while the scan runs (to
// documents already scanned and not yet scanned) all arrive, each after
// its document's snapshot event; the checkpoint ends as a plain stream
// position.
func TestSnapshotThenStream(t *testing.T) {
	w := newWorld(t)
	n := snapDocs(t)
	insertMany(t, w.coll, intIDs(0, n))

	updated := map[int32]int{} // _id -> number of updates made
	var upMu sync.Mutex
	update := func(id int32) {
		if _, err := w.coll.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}}); err != nil {
			t.Error(err)
			return
		}
		upMu.Lock()
		updated[id]++
		upMu.Unlock()
	}
	rec := &hookRecorder{}
	rec.onEvent = func(k int, ev *event.Event) {
		// In the middle of the scan: update documents behind the scan, at
		// it and far ahead of it, and insert a new one.
		if k == n/2 {
			for _, id := range []int32{0, 1, int32(n/2 - 1), int32(n / 2), int32(n/2 + 1), int32(n - 1)} {
				update(id)
			}
			update(int32(n - 1))
			if _, err := w.coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: int32(n)}}); err != nil {
				t.Error(err)
			}
		}
	}
	spec := w.spec()
	spec.Snapshot = source.SnapshotInitial
	spec.BatchSize = 500
	r := w.runWith(spec, rec)

	// Concurrent updates while the snapshot runs, too (from its first
	// event on: an update before the stream position was taken is in the
	// snapshot's document only).
	waitFor(t, 10*time.Second, "the first snapshot event", func() bool { return rec.count() > 0 })
	stopUpd := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	stopUpdates := func() { stopOnce.Do(func() { close(stopUpd) }); wg.Wait() }
	// A failed wait below must not leave the updater calling t.Error
	// after the test has returned (a panic that ends the package's run).
	defer stopUpdates()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := int32(0); ; i = (i + 997) % int32(n) {
			select {
			case <-stopUpd:
				return
			default:
			}
			if st := r.src.Status(); st.State == source.StateOpen {
				return
			}
			update(i)
			time.Sleep(time.Millisecond)
		}
	}()
	r.waitOpen(t)
	stopUpdates()
	upMu.Lock()
	totalUpdates := 0
	for _, c := range updated {
		totalUpdates += c
	}
	upMu.Unlock()
	want := n + totalUpdates + 1 // snapshots, updates, the insert
	for end := time.Now().Add(30 * time.Second); rec.count() < want && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}

	snaps := map[string]int{}   // doc -> index of its snapshot event
	changes := map[string]int{} // doc -> updates seen
	lastSnap, firstChange := -1, -1
	var snapID string
	for i, ev := range rec.all() {
		k := docKey(ev)
		switch ev.OperationType {
		case source.OpSnapshot:
			if _, dup := snaps[k]; dup {
				t.Fatalf("document %s: two snapshot events", k)
			}
			snaps[k] = i
			lastSnap = i
			if fd := ev.Raw.Lookup("fullDocument"); fd.Type != bson.TypeEmbeddedDocument || fd.Document().Lookup("_id").String() != ev.DocumentKey.Lookup("_id").String() {
				t.Fatalf("snapshot of %s without its fullDocument: %s", k, ev.Raw)
			}
			id := strings.Split(ev.ID, ":")
			if len(id) != 4 || id[0] != "items" || id[1] != "snapshot" || (snapID != "" && id[2] != snapID) {
				t.Fatalf("snapshot event id %q", ev.ID)
			}
			snapID = id[2]
		case "update":
			if _, ok := snaps[k]; !ok {
				t.Fatalf("update of %s before its snapshot event", k)
			}
			changes[k]++
			if firstChange < 0 {
				firstChange = i
			}
		case "insert":
			if firstChange < 0 {
				firstChange = i
			}
		default:
			t.Fatalf("unexpected %s event", ev.OperationType)

		}
	}
	if len(snaps) != n {
		t.Fatalf("%d documents arrived as snapshots, want %d", len(snaps), n)
	}
	if firstChange >= 0 && firstChange < lastSnap {
		t.Fatalf("a change (event %d) came before the last snapshot event (%d)", firstChange, lastSnap)
	}
	upMu.Lock()
	for id, c := range updated {
		k := fmt.Sprintf("items/%d", id)
		if changes[k] != c {
			t.Errorf("document %s: %d updates arrived, %d made", k, changes[k], c)
		}
	}
	upMu.Unlock()
	if rec.count() != want {
		t.Fatalf("%d events, want %d", rec.count(), want)
	}
	waitFor(t, 10*time.Second, "the stream checkpoint", func() bool {
		cp, ok := w.checkpoint()
		return ok && cp.Snapshot == nil
	})
	if st := r.src.Status().Snapshot; st == nil || st.State != "done" || st.Scanned != int64(n) {
		t.Fatalf("snapshot status %+v", st)
	}
}

// runWith starts a source dispatching to d (run takes a *recorder).
func (w *world) runWith(spec source.Spec, d source.Dispatcher) *running {
	w.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: source.New(spec, w.srcCli, w.cps, w.dls, d, w.m, nil), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- r.src.Run(ctx) }()
	w.t.Cleanup(func() { r.stop(w.t) })
	return r
}

// A snapshot stopped without a final save (as by kill -9) at about half
// resumes from its checkpointed progress: the second run dispatches only
// documents from near the half on, the union covers every document, and
// the events keep their ids.
func TestSnapshotResumesAfterCrash(t *testing.T) {
	w := newWorld(t)
	n := 4000
	insertMany(t, w.coll, intIDs(0, n))
	spec := w.spec()
	spec.Snapshot = source.SnapshotInitial
	spec.BatchSize = 100
	spec.MaxInFlight = 100

	first := &hookRecorder{holdFrom: n / 2} // acks stop at half
	r1 := w.runWith(spec, first)
	waitFor(t, 20*time.Second, "progress near half saved", func() bool {
		cp, ok := w.checkpoint()
		return ok && cp.Snapshot != nil && cp.Snapshot.Scanned == int64(n/2-1)
	})
	r1.src.Abandon() // no final save: what kill -9 leaves
	if err := r1.stop(t); err != nil {
		t.Fatal(err)
	}
	cp, _ := w.checkpoint()
	firstIDs := map[string]string{}
	for _, ev := range first.all() {
		firstIDs[docKey(ev)] = ev.ID
	}

	second := &hookRecorder{}
	r2 := w.runWith(spec, second)
	r2.waitOpen(t)
	evs := second.all()
	if len(evs) == 0 {
		t.Fatal("the second run delivered nothing")
	}
	if k := docKey(evs[0]); k != fmt.Sprintf("items/%d", n/2-1) {
		t.Fatalf("the second run starts at %s, want items/%d (after the checkpointed progress %d)", k, n/2-1, cp.Snapshot.Scanned)
	}
	seen := map[string]bool{}
	for _, ev := range first.all()[:n/2-1] {
		seen[docKey(ev)] = true
	}
	for _, ev := range evs {
		k := docKey(ev)
		if id, ok := firstIDs[k]; ok && id != ev.ID {
			t.Fatalf("document %s: id %s, was %s", k, ev.ID, id)
		}
		seen[k] = true
	}
	if len(seen) != n {
		t.Fatalf("%d documents delivered over both runs, want %d", len(seen), n)
	}
	if len(evs) != n-(n/2-1) {
		t.Fatalf("second run delivered %d, want %d", len(evs), n-(n/2-1))
	}
}

// A database-level source snapshots each of its collections (sorted by
// name, every document once, mixed _id types in _id order), and two
// partitions of a source share the documents without overlap.
func TestSnapshotDatabaseLevelAndPartitions(t *testing.T) {
	w := newWorld(t)
	db := w.client.Database(w.db)
	insertMany(t, db.Collection("a"), intIDs(0, 300))
	insertMany(t, db.Collection("b"), []any{"x", "y", int64(7), bson.NewObjectID(), 2.5, true})
	insertMany(t, db.Collection("c"), intIDs(1000, 1100))

	spec := w.spec()
	spec.Collection = ""
	spec.Snapshot = source.SnapshotInitial
	spec.BatchSize = 64
	rec := &hookRecorder{}
	r := w.runWith(spec, rec)
	r.waitOpen(t)
	evs := rec.all()
	if len(evs) != 406 {
		t.Fatalf("%d snapshot events, want 406", len(evs))
	}
	var order []string
	for _, ev := range evs {
		if len(order) == 0 || order[len(order)-1] != ev.Coll {
			order = append(order, ev.Coll)
		}
	}
	if fmt.Sprint(order) != "[a b c]" {
		t.Fatalf("collections in order %v, want [a b c]", order)
	}
	var bTypes []string
	for _, ev := range evs {
		if ev.Coll == "b" {
			bTypes = append(bTypes, ev.DocumentKey.Lookup("_id").Type.String())
		}
	}
	if got := fmt.Sprint(bTypes); got != "[double 64-bit integer string string objectID boolean]" {
		t.Fatalf("collection b in order %s", got)
	}

	// Two partitions over the same collections: disjoint, complete.
	w2 := &world{t: t, srv: w.srv, client: w.client, srcCli: w.srcCli, db: w.db, coll: w.coll, cps: w.cps, dls: w.dls, m: w.m}
	got := map[string]int{}
	for i := range 2 {
		ps := spec
		ps.Name = "parts"
		ps.Partition, ps.Partitions = i, 2
		ps.Unit = source.UnitName("parts", i, 2)
		pr := &hookRecorder{}
		p := w2.runWith(ps, pr)
		p.waitOpen(t)
		for _, ev := range pr.all() {
			got[docKey(ev)]++
		}
		if n := len(pr.all()); n == 0 || n == 406 {
			t.Fatalf("partition %d got %d documents", i, n)
		}
	}
	if len(got) != 406 {
		t.Fatalf("partitions delivered %d documents, want 406", len(got))
	}
	for k, c := range got {
		if c != 1 {
			t.Fatalf("document %s delivered %d times", k, c)
		}
	}
}

// AfterIDFilter keeps exactly the documents whose _id sorts after the given
// one in MongoDB's order, across BSON type brackets ($gt alone compares
// within one bracket).
func TestAfterIDFilterAcrossTypes(t *testing.T) {
	w := newWorld(t)
	ids := []any{int32(-5), int32(3), 4.5, int64(10), "a", "b", bson.D{{Key: "k", Value: 1}}, bson.Binary{Data: []byte{1}},
		bson.NewObjectID(), false, true, bson.DateTime(1000), bson.Timestamp{T: 1}, bson.MinKey{}, bson.MaxKey{}}
	insertMany(t, w.coll, ids)
	ctx := context.Background()
	all := func(filter any) []string {
		cur, err := w.coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for cur.Next(ctx) {
			out = append(out, cur.Current.Lookup("_id").String())
		}
		if err := cur.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	sorted := all(bson.D{})
	if len(sorted) != len(ids) {
		t.Fatalf("%d documents", len(sorted))
	}
	cur, _ := w.coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	i := 0
	for cur.Next(ctx) {
		got := all(source.AfterIDFilter(cur.Current.Lookup("_id"), nil))
		if fmt.Sprint(got) != fmt.Sprint(sorted[i+1:]) {
			t.Fatalf("after %s: %v, want %v", sorted[i], got, sorted[i+1:])
		}
		i++
	}
}

// A snapshot event's envelope: operationType "snapshot", the document in
// fullDocument, a stable id from the snapshot id, namespace and _id.
func TestSnapshotEventEnvelope(t *testing.T) {
	docb, _ := bson.Marshal(bson.D{{Key: "_id", Value: int32(7)}, {Key: "status", Value: "paid"}})
	doc := bson.Raw(docb)
	ev, err := source.SnapshotEvent("orders", source.SnapshotPrefix("s1"), "shop", "orders", bson.Timestamp{T: 1800000000, I: 2}, time.Time{}, doc)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := source.SnapshotEvent("orders", source.SnapshotPrefix("s1"), "shop", "orders", bson.Timestamp{T: 1800000000, I: 2}, time.Time{}, doc)
	other, _ := source.SnapshotEvent("orders", source.SnapshotPrefix("s1"), "shop", "other", bson.Timestamp{T: 1800000000, I: 2}, time.Time{}, doc)
	if ev.ID != again.ID || ev.ID == other.ID || !strings.HasPrefix(ev.ID, "orders:snapshot:s1:") ||
		ev.ID != source.SnapshotEventID("orders", "s1", "shop", "orders", bson.RawValue{Type: bson.TypeInt32, Value: doc.Lookup("_id").Value}) {
		t.Fatalf("ids %s %s %s", ev.ID, again.ID, other.ID)
	}
	b, err := ev.Envelope(false)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"` + ev.ID + `","source":"orders","operationType":"snapshot","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":7},"fullDocument":{"_id":7,"status":"paid"},"clusterTime":"2027-01-15T08:00:00Z","wallTime":"2027-01-15T08:00:00Z","rules":[]}`
	if string(b) != want {
		t.Fatalf("envelope\n%s\nwant\n%s", b, want)
	}
}

func (r *hookRecorder) release() {
	r.mu.Lock()
	held := r.held
	r.held, r.holdFrom = nil, 0
	r.mu.Unlock()
	for _, ack := range held {
		ack()
	}
}

// Cluster mode: a snapshot's progress saves are fenced by the lease epoch.
// When a new owner fences the unit mid-snapshot, the old owner's next save
// is refused and it stops (lease lost) without moving the progress; the new
// owner resumes the same snapshot from the progress, and every document is
// delivered.
func TestSnapshotHandoverFenced(t *testing.T) {
	w := newWorld(t)
	n := 3000
	insertMany(t, w.coll, intIDs(0, n))
	ctx := context.Background()
	spec := w.spec()
	spec.Snapshot = source.SnapshotInitial
	spec.BatchSize = 100
	spec.MaxInFlight = 100

	if err := w.cps.Fence(ctx, "items", 1); err != nil {
		t.Fatal(err)
	}
	a := &hookRecorder{holdFrom: 1000}
	specA := spec
	specA.Tenure = event.NewTenure("items", 1, time.Now().Add(time.Hour))
	ra := w.runWith(specA, a)
	waitFor(t, 20*time.Second, "progress saved by the first owner", func() bool {
		cp, ok := w.checkpoint()
		return ok && cp.Snapshot != nil && cp.Snapshot.Scanned == 999
	})
	if err := w.cps.Fence(ctx, "items", 2); err != nil { // a new owner claims the unit
		t.Fatal(err)
	}
	a.release() // the old owner's progress moves: its save is refused
	select {
	case err := <-ra.done:
		ra.done <- err
		if !errors.Is(err, source.ErrLeaseLost) {
			t.Fatalf("old owner's Run = %v, want ErrLeaseLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the old owner did not stop")
	}
	cp, _ := w.checkpoint()
	if cp.Snapshot == nil || cp.Snapshot.Scanned != 999 || cp.Epoch != 2 {
		t.Fatalf("checkpoint after the fenced save: %+v (snapshot %+v)", cp, cp.Snapshot)
	}

	b := &hookRecorder{}
	specB := spec
	specB.Tenure = event.NewTenure("items", 2, time.Now().Add(time.Hour))
	rb := w.runWith(specB, b)
	rb.waitOpen(t)
	evs := b.all()
	if len(evs) != n-999 || docKey(evs[0]) != "items/999" {
		t.Fatalf("new owner delivered %d documents from %s, want %d from items/999", len(evs), docKey(evs[0]), n-999)
	}
	if cp, _ := w.checkpoint(); cp.Snapshot != nil || cp.Epoch != 2 {
		t.Fatalf("checkpoint after the new owner's snapshot: %+v", cp)
	}
}

// TestSnapshotShardedDocumentKey: the snapshot events of a sharded
// collection carry the documentKey its change stream gives (the shard
// key's fields, in the key's order and named by their paths, then _id),
// read from config.collections; they had {_id} only, so their ordering key
// differed from their document's changes'.
func TestSnapshotShardedDocumentKey(t *testing.T) {
	w := newWorld(t)
	ns := w.db + ".items"
	cfgColl := w.client.Database("config").Collection("collections")
	if _, err := cfgColl.InsertOne(context.Background(), bson.D{{Key: "_id", Value: ns},
		{Key: "key", Value: bson.D{{Key: "region", Value: "hashed"}, {Key: "addr.zip", Value: 1}}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = cfgColl.DeleteOne(context.Background(), bson.D{{Key: "_id", Value: ns}}) })
	docs := []any{
		bson.D{{Key: "_id", Value: int32(1)}, {Key: "addr", Value: bson.D{{Key: "zip", Value: "75001"}}}, {Key: "region", Value: "eu"}},
		bson.D{{Key: "_id", Value: int32(2)}, {Key: "region", Value: "us"}, {Key: "addr", Value: bson.D{{Key: "zip", Value: "10001"}}}},
		bson.D{{Key: "_id", Value: int32(3)}, {Key: "addr", Value: bson.D{{Key: "zip", Value: "99999"}}}}, // no region
	}
	if _, err := w.coll.InsertMany(context.Background(), docs); err != nil {
		t.Fatal(err)
	}
	rec := &hookRecorder{}
	spec := w.spec()
	spec.Snapshot = source.SnapshotInitial
	r := w.runWith(spec, rec)
	r.waitOpen(t)
	want := map[string]string{
		"1": `{"region": "eu","addr.zip": "75001","_id": {"$numberInt":"1"}}`,
		"2": `{"region": "us","addr.zip": "10001","_id": {"$numberInt":"2"}}`,
		"3": `{"addr.zip": "99999","_id": {"$numberInt":"3"}}`,
	}
	got := map[string]string{}
	for _, ev := range rec.all() {
		if ev.OperationType == source.OpSnapshot {
			got[fmt.Sprint(ev.DocumentKey.Lookup("_id").Int32())] = ev.DocumentKey.String()
		}
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("document %s: documentKey %s, want %s", id, got[id], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("snapshot events for %v", got)
	}
}

// TestDocumentKey: a shard key that holds _id keeps it in its place; no
// shard key gives {_id}.
func TestDocumentKey(t *testing.T) {
	b, _ := bson.Marshal(bson.D{{Key: "_id", Value: "x"}, {Key: "a", Value: int32(1)}, {Key: "b", Value: bson.D{{Key: "c", Value: true}}}})
	doc := bson.Raw(b)
	for _, tc := range []struct {
		key  []string
		want string
	}{
		{nil, `{"_id": "x"}`},
		{[]string{"_id"}, `{"_id": "x"}`},
		{[]string{"a", "_id"}, `{"a": {"$numberInt":"1"},"_id": "x"}`},
		{[]string{"_id", "a"}, `{"_id": "x","a": {"$numberInt":"1"}}`},
		{[]string{"b.c", "a"}, `{"b.c": true,"a": {"$numberInt":"1"},"_id": "x"}`},
	} {
		if got := source.DocumentKey(doc, tc.key).String(); got != tc.want {
			t.Errorf("DocumentKey(%v) = %s, want %s", tc.key, got, tc.want)
		}
	}
}
