package mongowire_test

import (
	"errors"
	"testing"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// TestChangeStreamComputedStages: the stages MongoDB allows after
// $changeStream besides $match — $project with computed fields,
// $addFields/$set, $replaceWith/$replaceRoot keeping _id, $redact — shape
// the events; a stage that drops _id fails the stream (280).
func TestChangeStreamComputedStages(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	watch := func(pipeline mongo.Pipeline) *mongo.ChangeStream {
		t.Helper()
		cs, err := coll.Watch(ctx, pipeline, watchOpts())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close(ctx) })
		return cs
	}
	project := watch(mongo.Pipeline{{{Key: "$project", Value: bson.D{{Key: "op", Value: "$operationType"}, {Key: "k", Value: "$documentKey._id"}, {Key: "lit", Value: "x"}}}}})
	replace := watch(mongo.Pipeline{{{Key: "$replaceWith", Value: bson.D{{Key: "_id", Value: "$_id"}, {Key: "doc", Value: "$fullDocument"}}}}})
	redact := watch(mongo.Pipeline{{{Key: "$redact", Value: bson.D{{Key: "$cond", Value: bson.A{
		bson.D{{Key: "$eq", Value: bson.A{"$secret", true}}}, "$$PRUNE", "$$DESCEND"}}}}}})
	dropID := watch(mongo.Pipeline{{{Key: "$replaceWith", Value: "$fullDocument"}}})
	mustInsert(t, ctx, coll, bson.D{{Key: "_id", Value: 1}, {Key: "name", Value: "n"}, {Key: "inner", Value: bson.D{{Key: "secret", Value: true}}}})

	var got bson.M
	if !project.Next(ctx) {
		t.Fatal(project.Err())
	}
	_ = bson.Unmarshal(project.Current, &got)
	if got["op"] != "insert" || got["k"] != int32(1) || got["lit"] != "x" || got["_id"] == nil || got["ns"] != nil {
		t.Fatalf("$project event = %v", got)
	}
	if !replace.Next(ctx) {
		t.Fatal(replace.Err())
	}
	if c := replace.Current; c.Lookup("doc", "name").StringValue() != "n" || c.Lookup("operationType").Type != 0 || c.Lookup("_id", "_data").Type == 0 {
		t.Fatalf("$replaceWith event = %v", c)
	}
	if !redact.Next(ctx) {
		t.Fatal(redact.Err())
	}
	if fd := redact.Current.Lookup("fullDocument").Document(); fd.Lookup("name").StringValue() != "n" || fd.Lookup("inner").Type != 0 {
		t.Fatalf("$redact event fullDocument = %v, want inner pruned", fd)
	}
	if dropID.Next(ctx) {
		t.Fatalf("event %v from a stage that drops _id", dropID.Current)
	}
	var ce mongo.CommandError
	if !errors.As(dropID.Err(), &ce) || ce.Code != 280 {
		t.Fatalf("dropping _id: %v, want ChangeStreamFatalError", dropID.Err())
	}
}

// TestChangeStreamAddFields: $addFields/$set after $changeStream.
func TestChangeStreamAddFields(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "who", Value: "$fullDocument.name"}, {Key: "fullDocument.seen", Value: true}}}}}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	mustInsert(t, ctx, coll, bson.D{{Key: "_id", Value: 1}, {Key: "name", Value: "n"}})
	if !cs.Next(ctx) {
		t.Fatal(cs.Err())
	}
	if cs.Current.Lookup("who").StringValue() != "n" || !cs.Current.Lookup("fullDocument", "seen").Boolean() || cs.Current.Lookup("operationType").StringValue() != "insert" {
		t.Fatalf("event = %v", cs.Current)
	}
}

// TestPipelineUpdateTruncatedArrays: an update pipeline that shortens an
// array reports truncatedArrays, and changed elements as "a.<i>".
func TestPipelineUpdateTruncatedArrays(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	mustInsert(t, ctx, coll, bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: bson.A{"x", bson.D{{Key: "b", Value: 1}}, 3, 4}}})
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "a", Value: bson.A{"y", bson.D{{Key: "b", Value: 2}}}}}}}}); err != nil {
		t.Fatal(err)
	}
	ev := next(t, ctx, cs)
	u := ev.UpdateDescription
	if u == nil || len(u.UpdatedFields) != 2 || u.UpdatedFields["a.0"] != "y" || u.UpdatedFields["a.1.b"] != int32(2) || len(u.TruncatedArrays) != 1 {
		t.Fatalf("updateDescription = %+v", u)
	}
	if tr, _ := u.TruncatedArrays[0].(bson.D); len(tr) != 2 || tr[0].Value != "a" || tr[1].Value != int32(2) {
		t.Fatalf("truncatedArrays = %v, want [{field: a, newSize: 2}]", u.TruncatedArrays)
	}
}

// TestWriteConcernErrors: failCommand's writeConcernError lets the write
// run and reports the error (labelled RetryableWriteError for a retryable
// code on a retryable write, so the driver retries); an unsatisfiable
// write concern on a one-node set is a writeConcernError too.
func TestWriteConcernErrors(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, Times: 1,
		WriteConcernError: &mongowire.WriteConcernError{Code: 64, Message: "waiting for replication timed out"}})
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	var we mongo.WriteException
	if !errors.As(err, &we) || we.WriteConcernError == nil || we.WriteConcernError.Code != 64 {
		t.Fatalf("insert = %v, want writeConcernError 64", err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{}); n != 1 {
		t.Fatalf("documents = %d: the write must run despite the writeConcernError", n)
	}
	// A retryable code: labelled RetryableWriteError, the driver retries
	// and the retry (same txnNumber) is not applied twice.
	srv.ResetCommands()
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, Times: 1,
		WriteConcernError: &mongowire.WriteConcernError{Code: 91, Message: "shutting down"}})
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}}); err != nil {
		t.Fatalf("retried insert: %v", err)
	}
	if n := len(srv.CommandsNamed("insert")); n != 2 {
		t.Fatalf("inserts sent = %d, want 2", n)
	}
	w2 := coll.Database().Collection("c", options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: 2}))
	_, err = w2.InsertOne(ctx, bson.D{{Key: "_id", Value: 3}})
	if !errors.As(err, &we) || we.WriteConcernError == nil || we.WriteConcernError.Code != 100 {
		t.Fatalf("w: 2 insert = %v, want UnsatisfiableWriteConcern", err)
	}
}
