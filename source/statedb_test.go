package source_test

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
)

// A cluster-level source never reads changegate's state database: not in
// its initial snapshot, not in its stream (its checkpoint saves and the
// writes below are not events), and the stream's pipeline leaves the state
// database out on the server with StateFilter as its first stage, whether
// or not a rule is pushed down.
func TestClusterSourceSkipsStateDatabase(t *testing.T) {
	w := newWorld(t)
	state := w.db + "_state" // where w.cps and w.dls write
	ctx := context.Background()
	insertMany(t, w.coll, intIDs(0, 3))
	if _, err := w.client.Database(state).Collection("deadletters").InsertOne(ctx, bson.D{{Key: "_id", Value: "old"}, {Key: "ssn", Value: "123-45-6789"}}); err != nil {
		t.Fatal(err)
	}

	spec := w.spec()
	spec.Name, spec.Database, spec.Collection = "all", "", ""
	spec.StateDatabase = state
	spec.Snapshot = source.SnapshotInitial
	rec := &hookRecorder{}
	r := w.runWith(spec, rec)
	r.waitOpen(t)
	// Writes to the state database while the stream runs, then a marker:
	// once the marker is read, everything before it was.
	for i := range 5 {
		if _, err := w.client.Database(state).Collection("deadletters").InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "ssn", Value: "123-45-6789"}}); err != nil {
			t.Fatal(err)
		}
	}
	w.insert(100)
	mine := func(ev *event.Event) bool { return ev.DB == w.db || ev.DB == state }
	waitFor(t, 20*time.Second, "the marker insert", func() bool {
		for _, ev := range rec.all() {
			if ev.DB == w.db && ev.OperationType == "insert" {
				return true
			}
		}
		return false
	})
	var snap, ins int
	for _, ev := range rec.all() {
		if !mine(ev) {
			continue // another test's, against a shared real MongoDB
		}
		if ev.DB == state {
			t.Fatalf("an event of the state database was dispatched: %s %s.%s %s", ev.OperationType, ev.DB, ev.Coll, ev.Raw)
		}
		switch ev.OperationType {
		case "snapshot":
			snap++
		case "insert":
			ins++
		}
	}
	if snap != 3 || ins != 1 {
		t.Fatalf("%d snapshot events and %d inserts of %s, want 3 and 1", snap, ins, w.db)
	}
	if w.srv != nil {
		var opened int
		for _, rec := range w.srv.CommandsNamed("aggregate") {
			if rec.DB != "admin" {
				continue
			}
			opened++
			first := rec.Body.Lookup("pipeline").Array().Index(1).Document()
			if first.String() != bson.Raw(mustMarshal(t, source.StateFilter(state))).String() {
				t.Fatalf("the cluster stream's first stage after $changeStream is %s, want the state filter", first)
			}
		}
		if opened == 0 {
			t.Fatal("no cluster-level aggregate logged")
		}
	}
}

// StateFilter works on the server by itself (MongoDB and test/mongowire):
// a cluster-level stream with only that stage sees no change of the state
// database, and every other change.
func TestStateFilterOnTheServer(t *testing.T) {
	w := newWorld(t)
	state := w.db + "_state"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := w.client.Watch(ctx, mongo.Pipeline{source.StateFilter(state)}, options.ChangeStream().SetMaxAwaitTime(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())
	for i := range 3 {
		if _, err := w.client.Database(state).Collection("checkpoints").InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.client.Database(state).Collection("checkpoints").UpdateOne(ctx, bson.D{{Key: "_id", Value: 0}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}); err != nil {
		t.Fatal(err)
	}
	w.insert(7)
	for cs.Next(ctx) {
		db := cs.Current.Lookup("ns", "db").StringValue()
		if db == state {
			t.Fatalf("the state database's change passed the filter: %s", cs.Current)
		}
		if db == w.db {
			return // the marker: everything before it was filtered
		}
	}
	t.Fatalf("the marker never arrived: %v", cs.Err())
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
