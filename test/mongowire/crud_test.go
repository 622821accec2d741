package mongowire_test

import (
	"errors"
	"testing"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
)

func TestConnect(t *testing.T) {
	srv := startServer(t, mongowire.Options{})
	for _, uri := range []string{srv.URI(), "mongodb://" + srv.Addr() + "/?directConnection=true"} {
		t.Run(uri, func(t *testing.T) {
			client := connect(t, uri)
			ctx := ctxFor(t, 20e9)
			if err := client.Ping(ctx, readpref.Primary()); err != nil {
				t.Fatalf("ping: %v", err)
			}
			var info bson.M
			if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
				t.Fatal(err)
			}
			if info["version"] != "7.0.0" {
				t.Fatalf("buildInfo version = %v", info["version"])
			}
			var hello bson.M
			if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
				t.Fatal(err)
			}
			if hello["setName"] != "rs0" || hello["isWritablePrimary"] != true {
				t.Fatalf("hello = %v", hello)
			}
			if hosts, _ := hello["hosts"].(bson.A); len(hosts) != 1 || hosts[0] != srv.Addr() {
				t.Fatalf("hello hosts = %v, want [%s]", hello["hosts"], srv.Addr())
			}
			err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "noSuchCommand", Value: 1}}).Err()
			var ce mongo.CommandError
			if !errors.As(err, &ce) || ce.Code != 59 || ce.Name != "CommandNotFound" {
				t.Fatalf("unknown command error = %v", err)
			}
		})
	}
}

func TestCRUD(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("things")

	res, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "name", Value: "a"}, {Key: "n", Value: 1}})
	if err != nil || res.InsertedID != int32(1) {
		t.Fatalf("insert: %v %v", res, err)
	}
	many, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: "name", Value: "b"}, {Key: "n", Value: 2}},
		bson.D{{Key: "name", Value: "c"}, {Key: "n", Value: 3}, {Key: "tags", Value: bson.A{"x", "y"}}},
	})
	if err != nil || len(many.InsertedIDs) != 2 {
		t.Fatalf("insertMany: %v %v", many, err)
	}

	// Duplicate _id.
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("dup insert err = %v", err)
	}

	// Find with filter, sort, projection, skip, limit.
	cur, err := coll.Find(ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$gte", Value: 2}}}},
		options.Find().SetSort(bson.D{{Key: "n", Value: -1}}).SetProjection(bson.D{{Key: "name", Value: 1}, {Key: "_id", Value: 0}}))
	if err != nil {
		t.Fatal(err)
	}
	var got []bson.M
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0]["name"] != "c" || got[1]["name"] != "b" || got[0]["_id"] != nil {
		t.Fatalf("find = %v", got)
	}
	var one bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "tags", Value: "y"}}).Decode(&one); err != nil || one["name"] != "c" {
		t.Fatalf("findOne on array element = %v %v", one, err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "name", Value: "zzz"}}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("findOne missing = %v", err)
	}

	// Update with operators.
	ur, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "name", Value: "A"}, {Key: "sub.x", Value: 1}}},
		{Key: "$inc", Value: bson.D{{Key: "n", Value: 10}}},
		{Key: "$push", Value: bson.D{{Key: "log", Value: "p"}}},
		{Key: "$currentDate", Value: bson.D{{Key: "at", Value: true}}},
	})
	if err != nil || ur.MatchedCount != 1 || ur.ModifiedCount != 1 {
		t.Fatalf("updateOne: %+v %v", ur, err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(reset(&one)); err != nil {
		t.Fatal(err)
	}
	if one["name"] != "A" || one["n"] != int32(11) || one["sub"].(bson.D)[0].Value != int32(1) || len(one["log"].(bson.A)) != 1 {
		t.Fatalf("after update: %v", one)
	}
	if _, ok := one["at"].(bson.DateTime); !ok {
		t.Fatalf("$currentDate: %T", one["at"])
	}

	// Unset, multi update.
	ur, err = coll.UpdateMany(ctx, bson.D{}, bson.D{{Key: "$unset", Value: bson.D{{Key: "tags", Value: ""}}}, {Key: "$set", Value: bson.D{{Key: "all", Value: true}}}})
	if err != nil || ur.MatchedCount != 3 || ur.ModifiedCount != 3 {
		t.Fatalf("updateMany: %+v %v", ur, err)
	}
	// No-op update: matched but not modified.
	ur, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "all", Value: true}}}})
	if err != nil || ur.MatchedCount != 1 || ur.ModifiedCount != 0 {
		t.Fatalf("no-op update: %+v %v", ur, err)
	}

	// Upsert.
	ur, err = coll.UpdateOne(ctx, bson.D{{Key: "name", Value: "d"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 4}}}, {Key: "$setOnInsert", Value: bson.D{{Key: "new", Value: true}}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil || ur.UpsertedCount != 1 || ur.UpsertedID == nil {
		t.Fatalf("upsert: %+v %v", ur, err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: ur.UpsertedID}}).Decode(reset(&one)); err != nil || one["name"] != "d" || one["new"] != true || one["n"] != int32(4) {
		t.Fatalf("upserted doc = %v %v", one, err)
	}

	// Replace.
	rr, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "replaced", Value: true}})
	if err != nil || rr.ModifiedCount != 1 {
		t.Fatalf("replace: %+v %v", rr, err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(reset(&one)); err != nil || one["replaced"] != true || one["name"] != nil {
		t.Fatalf("replaced doc = %v %v", one, err)
	}
	_, err = coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 2}})
	var we mongo.WriteException
	if !errors.As(err, &we) || len(we.WriteErrors) != 1 || we.WriteErrors[0].Code != 66 {
		t.Fatalf("changing _id: %v", err)
	}

	// FindOneAndUpdate returning the new document.
	var fam bson.M
	err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "name", Value: "b"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(reset(&fam))
	if err != nil || fam["n"] != int32(3) {
		t.Fatalf("findOneAndUpdate: %v %v", fam, err)
	}
	err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "name", Value: "b"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}).Decode(reset(&fam))
	if err != nil || fam["n"] != int32(3) {
		t.Fatalf("findOneAndUpdate (before): %v %v", fam, err)
	}
	if err := coll.FindOneAndDelete(ctx, bson.D{{Key: "name", Value: "d"}}).Decode(reset(&fam)); err != nil || fam["name"] != "d" {
		t.Fatalf("findOneAndDelete: %v %v", fam, err)
	}

	// Counts.
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "all", Value: true}}); err != nil || n != 2 {
		t.Fatalf("countDocuments = %d %v", n, err)
	}
	if n, err := coll.EstimatedDocumentCount(ctx); err != nil || n != 3 {
		t.Fatalf("estimatedDocumentCount = %d %v", n, err)
	}

	// Delete.
	dr, err := coll.DeleteMany(ctx, bson.D{{Key: "all", Value: true}})
	if err != nil || dr.DeletedCount != 2 {
		t.Fatalf("deleteMany: %+v %v", dr, err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{}); n != 1 {
		t.Fatalf("count after delete = %d", n)
	}
}

func TestUniqueIndex(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("users")
	name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "email", Value: 1}}, Options: options.Index().SetUnique(true)})
	if err != nil || name != "email_1" {
		t.Fatalf("createIndex: %q %v", name, err)
	}
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "email", Value: "a@x"}}); err != nil {
		t.Fatal(err)
	}
	_, err = coll.InsertOne(ctx, bson.D{{Key: "email", Value: "a@x"}})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("unique violation err = %v", err)
	}
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "email", Value: "b@x"}}); err != nil {
		t.Fatal(err)
	}
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "email", Value: "b@x"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "email", Value: "a@x"}}}})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("unique violation by update err = %v", err)
	}
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var specs []bson.M
	if err := cur.All(ctx, &specs); err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 || specs[1]["name"] != "email_1" || specs[1]["unique"] != true {
		t.Fatalf("listIndexes = %v", specs)
	}
}

func TestAggregateAndCursors(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("nums")
	docs := make([]any, 250)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}, {Key: "even", Value: i%2 == 0}}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	// Find across several getMores.
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(7))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for cur.Next(ctx) {
		if got := cur.Current.Lookup("_id").Int32(); got != int32(n) {
			t.Fatalf("doc %d has _id %d", n, got)
		}
		n++
	}
	if cur.Err() != nil || n != 250 {
		t.Fatalf("iterated %d docs, err %v", n, cur.Err())
	}
	// Aggregate.
	cur, err = coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "even", Value: true}}}},
		{{Key: "$sort", Value: bson.D{{Key: "_id", Value: -1}}}},
		{{Key: "$skip", Value: 1}},
		{{Key: "$limit", Value: 3}},
		{{Key: "$project", Value: bson.D{{Key: "even", Value: 0}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []bson.M
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0]["_id"] != int32(246) || got[0]["even"] != nil {
		t.Fatalf("aggregate = %v", got)
	}
	cur, err = coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "even", Value: false}}}}, {{Key: "$count", Value: "odd"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &got); err != nil || len(got) != 1 || got[0]["odd"] != int32(125) {
		t.Fatalf("$count = %v %v", got, err)
	}
	// Collection and database listing, drop.
	names, err := client.Database("app").ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) != 1 || names[0] != "nums" {
		t.Fatalf("listCollections = %v %v", names, err)
	}
	dbs, err := client.ListDatabaseNames(ctx, bson.D{})
	if err != nil || !contains(dbs, "app") {
		t.Fatalf("listDatabases = %v %v", dbs, err)
	}
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{}); n != 0 {
		t.Fatalf("count after drop = %d", n)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// reset clears *m before decoding into it (Decode merges into a non-nil map).
func reset(m *bson.M) *bson.M {
	*m = nil
	return m
}
