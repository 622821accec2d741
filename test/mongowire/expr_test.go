package mongowire_test

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// leaseUpdate is the acquire/renew statement of package lease, written out
// here so that the test server is checked against the exact shape it must
// answer: free, expired or own lease matches; epoch increments unless the
// owner renews; expires = $$NOW + ttl.
func leaseUpdate(unit, owner string, ttl time.Duration) (bson.D, mongo.Pipeline) {
	filter := bson.D{{Key: "_id", Value: unit}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "owner", Value: owner}},
		bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$expires", "$$NOW"}}}}},
	}}}
	pipe := mongo.Pipeline{{{Key: "$set", Value: bson.D{
		{Key: "epoch", Value: bson.D{{Key: "$cond", Value: bson.D{
			{Key: "if", Value: bson.D{{Key: "$eq", Value: bson.A{"$owner", owner}}}},
			{Key: "then", Value: "$epoch"},
			{Key: "else", Value: bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$epoch", int64(0)}}}, int64(1)}}}},
		}}}},
		{Key: "owner", Value: owner},
		{Key: "expires", Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", ttl.Milliseconds()}}}},
	}}}}
	return filter, pipe
}

type leaseDoc struct {
	ID      string    `bson:"_id"`
	Owner   string    `bson:"owner"`
	Epoch   int64     `bson:"epoch"`
	Expires time.Time `bson:"expires"`
}

func TestPipelineUpdateLease(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("state").Collection("leases")
	after := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)

	acquire := func(owner string, ttl time.Duration) (leaseDoc, error) {
		f, p := leaseUpdate("u1", owner, ttl)
		var d leaseDoc
		err := coll.FindOneAndUpdate(ctx, f, p, after).Decode(&d)
		return d, err
	}

	before := time.Now().Add(-time.Second)
	a, err := acquire("a", time.Minute)
	if err != nil {
		t.Fatalf("first acquire (upsert): %v", err)
	}
	if a.ID != "u1" || a.Owner != "a" || a.Epoch != 1 || a.Expires.Before(before.Add(time.Minute)) || a.Expires.After(time.Now().Add(time.Minute+time.Second)) {
		t.Fatalf("upserted lease = %+v", a)
	}
	// Renew by the owner keeps the epoch and moves expires.
	a2, err := acquire("a", 2*time.Minute)
	if err != nil || a2.Epoch != 1 || !a2.Expires.After(a.Expires) {
		t.Fatalf("renew = %+v, %v", a2, err)
	}
	// Another owner: the filter does not match the live lease, the upsert
	// collides on _id: E11000, as from MongoDB.
	_, err = acquire("b", time.Minute)
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("contender on a live lease: err = %v, want a duplicate key error", err)
	}
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 11000 {
		t.Fatalf("contender error = %#v, want CommandError 11000", err)
	}
	// Expire it (set expires in the past with a pipeline and ReturnDocument
	// before), then b takes over with epoch 2.
	var old leaseDoc
	err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "u1"}, {Key: "owner", Value: "a"}},
		mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "expires", Value: bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", int64(1)}}}}}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.Before)).Decode(&old)
	if err != nil || old.Owner != "a" || !old.Expires.Equal(a2.Expires) {
		t.Fatalf("release returned %+v, %v; want the document before", old, err)
	}
	b, err := acquire("b", time.Minute)
	if err != nil || b.Owner != "b" || b.Epoch != 2 {
		t.Fatalf("takeover = %+v, %v", b, err)
	}

	// The update command takes pipelines too (UpdateOne with a pipeline).
	res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "u1"}}, mongo.Pipeline{
		{{Key: "$set", Value: bson.D{{Key: "n", Value: bson.D{{Key: "$toLong", Value: "$epoch"}}}}}},
		{{Key: "$unset", Value: "owner"}},
	})
	if err != nil || res.MatchedCount != 1 || res.ModifiedCount != 1 {
		t.Fatalf("UpdateOne with a pipeline = %+v, %v", res, err)
	}
	var raw bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "u1"}}).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if raw["n"] != int64(2) || raw["owner"] != nil {
		t.Fatalf("after UpdateOne: %v", raw)
	}
	// An _id change is refused.
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "u1"}}, mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "_id", Value: "x"}}}}})
	var we mongo.WriteException
	if !errors.As(err, &we) || len(we.WriteErrors) != 1 || we.WriteErrors[0].Code != 66 {
		t.Fatalf("changing _id: %v", err)
	}
	// A stage that updates cannot use is refused.
	_, err = coll.UpdateOne(ctx, bson.D{}, mongo.Pipeline{{{Key: "$match", Value: bson.D{}}}})
	if !errors.As(err, &we) || we.WriteErrors[0].Code != 72 {
		t.Fatalf("$match in an update: %v", err)
	}
}

func TestPipelineUpdateReplaceWithAndChangeEvent(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("things")
	mustInsert(t, ctx, coll, doc("_id", 1, "a", doc("x", 1, "y", 2), "gone", true))
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, mongo.Pipeline{
		{{Key: "$replaceWith", Value: bson.D{{Key: "a", Value: bson.D{{Key: "x", Value: 1}, {Key: "y", Value: 3}}}, {Key: "b", Value: "$a.x"}}}},
		{{Key: "$set", Value: bson.D{{Key: "c", Value: bson.D{{Key: "d", Value: bson.D{{Key: "$max", Value: bson.A{1, 7, 3}}}}}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got bson.D
	if err := coll.FindOne(ctx, bson.D{}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := bson.D{{Key: "_id", Value: int32(1)}, {Key: "a", Value: bson.D{{Key: "x", Value: int32(1)}, {Key: "y", Value: int32(3)}}}, {Key: "b", Value: int32(1)}, {Key: "c", Value: bson.D{{Key: "d", Value: int32(7)}}}}
	if !equalD(got, want) {
		t.Fatalf("document = %v, want %v", got, want)
	}
	ev := next(t, ctx, cs)
	if ev.OperationType != "update" || ev.UpdateDescription == nil {
		t.Fatalf("event = %+v", ev)
	}
	ud := ev.UpdateDescription
	if len(ud.UpdatedFields) != 3 || ud.UpdatedFields["a.y"] != int32(3) || ud.UpdatedFields["b"] != int32(1) || ud.UpdatedFields["c"] == nil ||
		len(ud.RemovedFields) != 1 || ud.RemovedFields[0] != "gone" {
		t.Fatalf("updateDescription = %+v", ud)
	}
}

func equalD(a, b bson.D) bool {
	x, _ := bson.Marshal(a)
	y, _ := bson.Marshal(b)
	return string(x) == string(y)
}

func TestExprFilter(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("things")
	mustInsert(t, ctx, coll,
		doc("_id", 1, "a", 5, "b", 3),
		doc("_id", 2, "a", 1, "b", 3),
		doc("_id", 3, "a", 7, "b", 7, "t", time.Now().Add(time.Hour)),
		doc("_id", 4, "a", 9, "t", time.Now().Add(-time.Hour)),
	)
	ids := func(filter bson.D) []int32 {
		t.Helper()
		cur, err := coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			t.Fatalf("find %v: %v", filter, err)
		}
		var docs []struct {
			ID int32 `bson:"_id"`
		}
		if err := cur.All(ctx, &docs); err != nil {
			t.Fatal(err)
		}
		out := []int32{}
		for _, d := range docs {
			out = append(out, d.ID)
		}
		return out
	}
	expr := func(e any) bson.D { return bson.D{{Key: "$expr", Value: e}} }
	for _, tc := range []struct {
		name   string
		filter bson.D
		want   []int32
	}{
		{"field comparison", expr(bson.D{{Key: "$gt", Value: bson.A{"$a", "$b"}}}), []int32{1, 4}},
		{"missing is below null", expr(bson.D{{Key: "$eq", Value: bson.A{"$b", nil}}}), []int32{}},
		{"missing is below everything", expr(bson.D{{Key: "$lt", Value: bson.A{"$b", 0}}}), []int32{4}},
		{"$$NOW", expr(bson.D{{Key: "$lt", Value: bson.A{"$t", "$$NOW"}}}), []int32{1, 2, 4}},
		{"with other clauses", bson.D{{Key: "a", Value: bson.D{{Key: "$gte", Value: 5}}}, {Key: "$expr", Value: bson.D{{Key: "$eq", Value: bson.A{"$a", "$b"}}}}}, []int32{3}},
		{"inside $or", bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "_id", Value: 2}}, expr(bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$mod", Value: bson.A{"$a", 3}}}, 0}}})}}}, []int32{2, 4}},
		{"$and/$not/$abs/$subtract", expr(bson.D{{Key: "$and", Value: bson.A{
			bson.D{{Key: "$not", Value: bson.A{bson.D{{Key: "$eq", Value: bson.A{"$_id", 3}}}}}},
			bson.D{{Key: "$gte", Value: bson.A{bson.D{{Key: "$abs", Value: bson.D{{Key: "$subtract", Value: bson.A{"$b", "$a"}}}}}, 2}}},
		}}}), []int32{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ids(tc.filter)
			if len(got) != len(tc.want) {
				t.Fatalf("ids = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("ids = %v, want %v", got, tc.want)
				}
			}
		})
	}
	// An unknown operator is an error of the command, not a non-match.
	_, err := coll.Find(ctx, expr(bson.D{{Key: "$nope", Value: 1}}))
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 168 {
		t.Fatalf("unknown operator: %v", err)
	}
}

func TestToHashedIndexKeyAggregate(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("vals")
	mustInsert(t, ctx, coll, doc("_id", 1, "val", "string to hash"))
	// The manual's example, with a collection in place of $documents.
	cur, err := coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$addFields", Value: bson.D{{Key: "hashedVal", Value: bson.D{{Key: "$toHashedIndexKey", Value: "$val"}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var out []bson.M
	if err := cur.All(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0]["hashedVal"] != int64(763543691661428748) {
		t.Fatalf("aggregate = %v", out)
	}
}

// TestPartitionMatchOnChangeStream is how a partition of a source filters
// its change stream: {$match: {$expr: {$eq: [{$mod: [{$abs:
// {$toHashedIndexKey: "$documentKey._id"}}, N]}, i]}}}. Every document goes
// to exactly one of the N streams, always the same one.
func TestPartitionMatchOnChangeStream(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("orders")
	const n = 3
	streams := make([]*mongo.ChangeStream, n)
	for i := range streams {
		match := bson.D{{Key: "$match", Value: bson.D{{Key: "$expr", Value: bson.D{{Key: "$eq", Value: bson.A{
			bson.D{{Key: "$mod", Value: bson.A{bson.D{{Key: "$abs", Value: bson.D{{Key: "$toHashedIndexKey", Value: "$documentKey._id"}}}}, int64(n)}}},
			int64(i),
		}}}}}}}
		cs, err := coll.Watch(ctx, mongo.Pipeline{match}, watchOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close(ctx)
		streams[i] = cs
	}
	const docs = 30
	for i := range docs {
		mustInsert(t, ctx, coll, doc("_id", i))
		if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int32]int{}
	total := 0
	deadline := time.Now().Add(10 * time.Second)
	for total < 2*docs && time.Now().Before(deadline) {
		for i, cs := range streams {
			for cs.TryNext(ctx) {
				var ev event
				if err := cs.Decode(&ev); err != nil {
					t.Fatal(err)
				}
				id := ev.DocumentKey["_id"].(int32)
				if p, ok := seen[id]; ok && p != i {
					t.Fatalf("document %d in partitions %d and %d", id, p, i)
				}
				seen[id] = i
				total++
			}
			if cs.Err() != nil {
				t.Fatal(cs.Err())
			}
		}
	}
	if total != 2*docs || len(seen) != docs {
		t.Fatalf("saw %d events of %d documents, want %d of %d", total, len(seen), 2*docs, docs)
	}
	per := map[int]int{}
	for _, p := range seen {
		per[p]++
	}
	if len(per) != n {
		t.Fatalf("documents per partition = %v, want every partition used", per)
	}
}
