package mongowire_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// event is the subset of a change event the tests look at.
type event struct {
	ID            bson.Raw       `bson:"_id"`
	OperationType string         `bson:"operationType"`
	ClusterTime   bson.Timestamp `bson:"clusterTime"`
	WallTime      time.Time      `bson:"wallTime"`
	NS            struct {
		DB   string `bson:"db"`
		Coll string `bson:"coll"`
	} `bson:"ns"`
	To struct {
		DB   string `bson:"db"`
		Coll string `bson:"coll"`
	} `bson:"to"`
	DocumentKey              bson.M `bson:"documentKey"`
	FullDocument             bson.M `bson:"fullDocument"`
	FullDocumentBeforeChange bson.M `bson:"fullDocumentBeforeChange"`
	UpdateDescription        *struct {
		UpdatedFields   bson.M   `bson:"updatedFields"`
		RemovedFields   []string `bson:"removedFields"`
		TruncatedArrays bson.A   `bson:"truncatedArrays"`
	} `bson:"updateDescription"`
}

// next returns the next event or fails the test.
func next(t *testing.T, ctx context.Context, cs *mongo.ChangeStream) event {
	t.Helper()
	if !cs.Next(ctx) {
		t.Fatalf("change stream ended: %v", cs.Err())
	}
	var ev event
	if err := cs.Decode(&ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// watchOpts uses a short await time so empty getMores come back quickly.
func watchOpts() *options.ChangeStreamOptionsBuilder {
	return options.ChangeStream().SetMaxAwaitTime(100 * time.Millisecond)
}

func mustInsert(t *testing.T, ctx context.Context, coll *mongo.Collection, docs ...any) {
	t.Helper()
	for _, d := range docs {
		if _, err := coll.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

func doc(kv ...any) bson.D {
	var d bson.D
	for i := 0; i < len(kv); i += 2 {
		d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return d
}

func TestWatchCollection(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("orders")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	other := client.Database("app").Collection("other")

	mustInsert(t, ctx, coll, doc("_id", 1, "a", 1))
	mustInsert(t, ctx, other, doc("_id", 1)) // not on this stream
	if _, err := coll.UpdateOne(ctx, doc("_id", 1), doc("$set", doc("b", 2), "$unset", doc("a", ""))); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.ReplaceOne(ctx, doc("_id", 1), doc("c", 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.DeleteOne(ctx, doc("_id", 1)); err != nil {
		t.Fatal(err)
	}

	ins := next(t, ctx, cs)
	if ins.OperationType != "insert" || ins.NS.DB != "app" || ins.NS.Coll != "orders" || ins.DocumentKey["_id"] != int32(1) || ins.FullDocument["a"] != int32(1) {
		t.Fatalf("insert event = %+v", ins)
	}
	if ins.ClusterTime.T == 0 || ins.WallTime.IsZero() {
		t.Fatalf("insert event times = %v %v", ins.ClusterTime, ins.WallTime)
	}
	upd := next(t, ctx, cs)
	if upd.OperationType != "update" || upd.UpdateDescription == nil || upd.UpdateDescription.UpdatedFields["b"] != int32(2) ||
		len(upd.UpdateDescription.RemovedFields) != 1 || upd.UpdateDescription.RemovedFields[0] != "a" || upd.FullDocument != nil {
		t.Fatalf("update event = %+v", upd)
	}
	if !ins.ClusterTime.Before(upd.ClusterTime) {
		t.Fatalf("cluster times not increasing: %v then %v", ins.ClusterTime, upd.ClusterTime)
	}
	rep := next(t, ctx, cs)
	if rep.OperationType != "replace" || rep.FullDocument["c"] != int32(3) {
		t.Fatalf("replace event = %+v", rep)
	}
	del := next(t, ctx, cs)
	if del.OperationType != "delete" || del.DocumentKey["_id"] != int32(1) || del.FullDocument != nil {
		t.Fatalf("delete event = %+v", del)
	}
	if string(cs.ResumeToken()) != string(del.ID) {
		t.Fatalf("ResumeToken %v != last event _id %v", cs.ResumeToken(), del.ID)
	}

	// Dropping the collection: drop, then invalidate, then the cursor is closed.
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, ctx, cs); ev.OperationType != "drop" {
		t.Fatalf("want drop, got %+v", ev)
	}
	if ev := next(t, ctx, cs); ev.OperationType != "invalidate" {
		t.Fatalf("want invalidate, got %+v", ev)
	}
	if cs.Next(ctx) {
		t.Fatal("stream continued after invalidate")
	}
	if cs.Err() != nil || cs.ID() != 0 {
		t.Fatalf("after invalidate: err %v id %d", cs.Err(), cs.ID())
	}
}

func TestWatchDatabaseAndCluster(t *testing.T) {
	_, client, ctx := setup(t)
	db := client.Database("app")
	dbStream, err := db.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer dbStream.Close(ctx)
	clusterStream, err := client.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer clusterStream.Close(ctx)

	mustInsert(t, ctx, db.Collection("a"), doc("_id", 1))
	mustInsert(t, ctx, client.Database("elsewhere").Collection("b"), doc("_id", 2))
	if err := client.Database("admin").RunCommand(ctx, doc("renameCollection", "app.a", "to", "app.c")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := db.Drop(ctx); err != nil {
		t.Fatal(err)
	}

	for _, want := range []string{"insert:a", "rename:a", "drop:c", "dropDatabase:", "invalidate:"} {
		ev := next(t, ctx, dbStream)
		if got := ev.OperationType + ":" + ev.NS.Coll; got != want {
			t.Fatalf("db stream: got %s, want %s (%+v)", got, want, ev)
		}
		if ev.OperationType == "rename" && (ev.To.DB != "app" || ev.To.Coll != "c") {
			t.Fatalf("rename to = %+v", ev.To)
		}
	}
	if dbStream.Next(ctx) || dbStream.ID() != 0 {
		t.Fatal("db stream not closed after invalidate")
	}
	for _, want := range []string{"insert:app.a", "insert:elsewhere.b", "rename:app.a", "drop:app.c", "dropDatabase:app."} {
		ev := next(t, ctx, clusterStream)
		if got := ev.OperationType + ":" + ev.NS.DB + "." + ev.NS.Coll; got != want {
			t.Fatalf("cluster stream: got %s, want %s", got, want)
		}
	}
}

func TestResumeAfterRestart(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	mustInsert(t, ctx, coll, doc("_id", 1), doc("_id", 2))
	first := next(t, ctx, cs)
	token := first.ID
	// A stream that has seen no event resumes from its post-batch token.
	quiet, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close(ctx)

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	mustInsert(t, ctx, coll, doc("_id", 3))

	// The open stream resumes by itself (the driver reconnects and resumes
	// from its cached token) and misses nothing.
	for _, want := range []int32{2, 3} {
		if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != want {
			t.Fatalf("auto-resumed stream: got %v want %d", ev.DocumentKey["_id"], want)
		}
	}

	if ev := next(t, ctx, quiet); ev.DocumentKey["_id"] != int32(3) {
		t.Fatalf("quiet stream after restart: %+v", ev)
	}

	// A new stream resuming after the first event sees the rest.
	cs2, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(token))
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close(ctx)
	for _, want := range []int32{2, 3} {
		if ev := next(t, ctx, cs2); ev.DocumentKey["_id"] != want {
			t.Fatalf("resumeAfter: got %v want %d", ev.DocumentKey["_id"], want)
		}
	}

	// startAtOperationTime includes the event at that time.
	cs3, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetStartAtOperationTime(&first.ClusterTime))
	if err != nil {
		t.Fatal(err)
	}
	defer cs3.Close(ctx)
	for _, want := range []int32{1, 2, 3} {
		if ev := next(t, ctx, cs3); ev.DocumentKey["_id"] != want {
			t.Fatalf("startAtOperationTime: got %v want %d", ev.DocumentKey["_id"], want)
		}
	}

	// The resume carried the token the test expects.
	var sawResume bool
	for _, rec := range srv.CommandsNamed("aggregate") {
		tok, err := rec.Body.LookupErr("pipeline", "0", "$changeStream", "resumeAfter")
		if err == nil && string(tok.Document()) == string(token) {
			sawResume = true
		}
	}
	if !sawResume {
		t.Fatal("no aggregate with resumeAfter=<first token> in the command log")
	}
}

func TestStartAfterInvalidate(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	mustInsert(t, ctx, coll, doc("_id", 1))
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	mustInsert(t, ctx, coll, doc("_id", 2))
	for _, want := range []string{"insert", "drop", "invalidate"} {
		if ev := next(t, ctx, cs); ev.OperationType != want {
			t.Fatalf("got %s want %s", ev.OperationType, want)
		}
	}
	invalidate := cs.ResumeToken()

	_, err = coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(invalidate))
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 260 {
		t.Fatalf("resumeAfter an invalidate: err = %v, want code 260", err)
	}

	cs2, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetStartAfter(invalidate))
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close(ctx)
	if ev := next(t, ctx, cs2); ev.OperationType != "insert" || ev.DocumentKey["_id"] != int32(2) {
		t.Fatalf("startAfter: %+v", ev)
	}
}

func TestFullDocumentOptions(t *testing.T) {
	_, client, ctx := setup(t)
	db := client.Database("app")
	if err := db.CreateCollection(ctx, "img", options.CreateCollection().SetChangeStreamPreAndPostImages(doc("enabled", true))); err != nil {
		t.Fatal(err)
	}
	coll := db.Collection("img")
	plain := db.Collection("plain")

	lookup, err := db.Watch(ctx, mongo.Pipeline{}, watchOpts().SetFullDocument(options.UpdateLookup).SetFullDocumentBeforeChange(options.WhenAvailable))
	if err != nil {
		t.Fatal(err)
	}
	defer lookup.Close(ctx)

	mustInsert(t, ctx, coll, doc("_id", 1, "v", 1))
	mustInsert(t, ctx, plain, doc("_id", 1, "v", 1))
	for _, c := range []*mongo.Collection{coll, plain} {
		if _, err := c.UpdateOne(ctx, doc("_id", 1), doc("$set", doc("v", 2))); err != nil {
			t.Fatal(err)
		}
		if _, err := c.UpdateOne(ctx, doc("_id", 1), doc("$set", doc("v", 3))); err != nil {
			t.Fatal(err)
		}
	}
	next(t, ctx, lookup)
	next(t, ctx, lookup)
	// With updateLookup the post-image is the current document (v: 3), and
	// the pre-image is recorded only where enabled.
	ev := next(t, ctx, lookup)
	if ev.NS.Coll != "img" || ev.FullDocument["v"] != int32(3) || ev.FullDocumentBeforeChange["v"] != int32(1) {
		t.Fatalf("img update 1 = %+v", ev)
	}
	ev = next(t, ctx, lookup)
	if ev.FullDocumentBeforeChange["v"] != int32(2) {
		t.Fatalf("img update 2 = %+v", ev)
	}
	ev = next(t, ctx, lookup)
	if ev.NS.Coll != "plain" || ev.FullDocument["v"] != int32(3) || ev.FullDocumentBeforeChange != nil {
		t.Fatalf("plain update = %+v", ev)
	}
	raw := lookup.Current
	if v, err := raw.LookupErr("fullDocumentBeforeChange"); err != nil || v.Type != bson.TypeNull {
		t.Fatalf("whenAvailable without pre-images: fullDocumentBeforeChange = %v %v", v, err)
	}

	// Required pre-images fail on a collection without them (the event is
	// already there, so the initial aggregate reports it).
	_, err = plain.Watch(ctx, mongo.Pipeline{}, watchOpts().SetFullDocumentBeforeChange(options.Required).SetStartAtOperationTime(&ev.ClusterTime))
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 47 {
		t.Fatalf("required pre-image missing: err = %v, want code 47", err)
	}

	// whenAvailable post-images come from the write itself.
	post, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetFullDocument(options.WhenAvailable).SetStartAtOperationTime(&bson.Timestamp{T: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer post.Close(ctx)
	next(t, ctx, post)
	if ev := next(t, ctx, post); ev.FullDocument["v"] != int32(2) {
		t.Fatalf("whenAvailable post-image = %+v", ev)
	}
}

func TestFilteredStreamTokenAdvances(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{{{Key: "$match", Value: doc("operationType", "delete")}}}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	start := string(cs.ResumeToken())
	if start == "" {
		t.Fatal("no initial post-batch resume token")
	}
	mustInsert(t, ctx, coll, doc("_id", 1), doc("_id", 2))
	deadline := time.Now().Add(10 * time.Second)
	for string(cs.ResumeToken()) == start {
		if time.Now().After(deadline) {
			t.Fatal("resume token did not advance while $match filtered everything")
		}
		if cs.TryNext(ctx) {
			t.Fatalf("unexpected event %v", cs.Current)
		}
		if cs.Err() != nil {
			t.Fatal(cs.Err())
		}
	}
	advanced := cs.ResumeToken()
	if string(advanced) <= start {
		t.Fatalf("token went backwards: %v -> %v", start, advanced)
	}
	// Resuming from the advanced token skips the filtered inserts.
	if _, err := coll.DeleteOne(ctx, doc("_id", 1)); err != nil {
		t.Fatal(err)
	}
	cs2, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(advanced))
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close(ctx)
	if ev := next(t, ctx, cs2); ev.OperationType != "delete" {
		t.Fatalf("after advanced token: %+v", ev)
	}
}

func TestAutoResumeAfterFaults(t *testing.T) {
	cases := []struct {
		name string
		fp   mongowire.FailPoint
	}{
		{"closed connection", mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, CloseConnection: true}},
		{"resumable error", mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, ErrorCode: 280, ErrorLabels: []string{"ResumableChangeStreamError"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, client, ctx := setup(t)
			coll := client.Database("app").Collection("c")
			cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close(ctx)
			mustInsert(t, ctx, coll, doc("_id", 1))
			first := next(t, ctx, cs)
			srv.ResetCommands()
			srv.FailCommand(tc.fp)
			mustInsert(t, ctx, coll, doc("_id", 2))
			if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != int32(2) {
				t.Fatalf("after resume: %+v", ev)
			}
			aggs := srv.CommandsNamed("aggregate")
			if len(aggs) != 1 {
				t.Fatalf("want one resuming aggregate, got %d", len(aggs))
			}
			tok, err := aggs[0].Body.LookupErr("pipeline", "0", "$changeStream", "resumeAfter")
			if err != nil || string(tok.Document()) != string(first.ID) {
				t.Fatalf("resumed with %v (err %v), want %v", tok, err, first.ID)
			}
		})
	}

	t.Run("history lost is not resumed", func(t *testing.T) {
		srv, client, ctx := setup(t)
		coll := client.Database("app").Collection("c")
		cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close(ctx)
		srv.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, ErrorCode: 286})
		if cs.Next(ctx) {
			t.Fatal("got an event")
		}
		var ce mongo.ServerError
		if !errors.As(cs.Err(), &ce) || !ce.HasErrorCode(286) {
			t.Fatalf("err = %v, want code 286", cs.Err())
		}
		if n := len(srv.CommandsNamed("aggregate")); n != 1 {
			t.Fatalf("driver resumed after 286: %d aggregates", n)
		}
	})
}

func TestHistoryLost(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	mustInsert(t, ctx, coll, doc("_id", 1), doc("_id", 2))
	old := next(t, ctx, cs)
	cs.Close(ctx)

	srv.TruncateHistory(srv.ClusterTime())
	// Token of the first insert is older than the retained history.
	_, err = coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(old.ID))
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 286 || ce.Name != "ChangeStreamHistoryLost" {
		t.Fatalf("resume from truncated history: %v", err)
	}
	_, err = coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetStartAtOperationTime(&old.ClusterTime))
	if !errors.As(err, &ce) || ce.Code != 286 {
		t.Fatalf("startAtOperationTime before history: %v", err)
	}

	srv.DiscardHistory()
	_, err = coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(old.ID))
	if !errors.As(err, &ce) || ce.Code != 286 {
		t.Fatalf("after DiscardHistory: %v", err)
	}
}

func TestBoundedOplog(t *testing.T) {
	srv := startServer(t, mongowire.Options{OplogMaxEntries: 3})
	client := connect(t, srv.URI())
	ctx := ctxFor(t, 30*time.Second)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	mustInsert(t, ctx, coll, doc("_id", 1))
	first := next(t, ctx, cs)
	mustInsert(t, ctx, coll, doc("_id", 2), doc("_id", 3), doc("_id", 4))
	_, err = coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(first.ID))
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 286 {
		t.Fatalf("resume beyond capacity: %v", err)
	}
	// The open stream still has everything it needs.
	if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != int32(2) {
		t.Fatalf("open stream: %+v", ev)
	}
	// Once its position is trimmed away, its next getMore reports the loss.
	mustInsert(t, ctx, coll, doc("_id", 5), doc("_id", 6), doc("_id", 7), doc("_id", 8))
	for cs.Next(ctx) {
	}
	if !errors.As(cs.Err(), &ce) || ce.Code != 286 {
		t.Fatalf("open stream behind the oplog: %v", cs.Err())
	}
}

func TestRetryableWriteDedup(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	// The server applies the insert, then the connection drops before the
	// reply; the driver retries with the same lsid/txnNumber.
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, Times: 1, DropReply: true})
	if _, err := coll.InsertOne(ctx, doc("x", 1)); err != nil {
		t.Fatalf("retried insert: %v", err)
	}
	inserts := srv.CommandsNamed("insert")
	if len(inserts) != 2 {
		t.Fatalf("want the insert sent twice, got %d", len(inserts))
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("documents after retried insert = %d %v", n, err)
	}
	for _, rec := range inserts {
		if _, err := rec.Body.LookupErr("txnNumber"); err != nil {
			t.Fatalf("insert without txnNumber: %v", rec.Body)
		}
	}
}
