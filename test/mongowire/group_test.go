package mongowire_test

import (
	"errors"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// $group evaluates its _id and its accumulators' arguments as expressions:
// an object of field paths groups by several fields (an array value is one
// group key, not unwound), and $sum of a path adds the field.
func TestGroupByExpressions(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("attempts")
	if _, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: "sink", Value: "a"}, {Key: "rules", Value: bson.A{"r1", "r2"}}, {Key: "n", Value: 3}},
		bson.D{{Key: "sink", Value: "a"}, {Key: "rules", Value: bson.A{"r1", "r2"}}, {Key: "n", Value: 2}},
		bson.D{{Key: "sink", Value: "a"}, {Key: "rules", Value: bson.A{"r1"}}, {Key: "n", Value: 1}},
		bson.D{{Key: "sink", Value: "b"}, {Key: "n", Value: 1}},
	}); err != nil {
		t.Fatal(err)
	}
	cur, err := coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "sink", Value: "$sink"}, {Key: "rules", Value: "$rules"}}},
			{Key: "requests", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "events", Value: bson.D{{Key: "$sum", Value: "$n"}}},
			{Key: "big", Value: bson.D{{Key: "$sum", Value: bson.D{{Key: "$cond", Value: bson.A{bson.D{{Key: "$gte", Value: bson.A{"$n", 2}}}, 1, 0}}}}}},
		}}},
		{{Key: "$sort", Value: bson.D{{Key: "_id.sink", Value: 1}, {Key: "events", Value: -1}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID struct {
			Sink  string   `bson:"sink"`
			Rules []string `bson:"rules,omitempty"`
		} `bson:"_id"`
		Requests, Events, Big int32
	}
	var got []row
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"a [r1 r2] 2 5 2", "a [r1] 1 1 0", "b [] 1 1 0"}
	if len(got) != len(want) {
		t.Fatalf("groups = %+v", got)
	}
	for i, w := range want {
		g := got[i]
		if s := fmt.Sprintf("%s %v %d %d %d", g.ID.Sink, g.ID.Rules, g.Requests, g.Events, g.Big); s != w {
			t.Errorf("group %d = %s, want %s", i, s, w)
		}
	}
	// A field path that reaches nothing is left out of an object _id.
	raw, err := coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "sink", Value: "b"}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "sink", Value: "$sink"}, {Key: "rules", Value: "$rules"}}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []bson.Raw
	if err := raw.All(ctx, &ids); err != nil || len(ids) != 1 {
		t.Fatalf("groups of b: %v %v", ids, err)
	}
	if id := ids[0].Lookup("_id").Document(); id.Lookup("rules").Type != 0 || id.Lookup("sink").StringValue() != "b" {
		t.Errorf("_id of b = %s, want {sink: b}", id)
	}
	// An error inside an expression fails the command.
	_, err = coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$group", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$mod", Value: bson.A{"$n", 0}}}}}}}})
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 16610 {
		t.Fatalf("$group _id {$mod: [n, 0]}: %v, want code 16610", err)
	}
}

// expireAfterSeconds makes a TTL index: listed with it, refused on a
// compound key or when not a number, and in conflict with the same key
// and another expiry, changed by collMod (the documents are not expired
// by mongowire).
func TestTTLIndex(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("log")
	name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetName("ttl").SetExpireAfterSeconds(3600)})
	if err != nil || name != "ttl" {
		t.Fatalf("create TTL index: %q %v", name, err)
	}
	specs, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ttl *int32
	for _, s := range specs {
		if s.Name == "ttl" {
			ttl = s.ExpireAfterSeconds
		}
	}
	if ttl == nil || *ttl != 3600 {
		t.Fatalf("listed expireAfterSeconds = %v, want 3600", ttl)
	}
	// The same index again is fine; another expiry conflicts.
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetName("ttl").SetExpireAfterSeconds(3600)}); err != nil {
		t.Fatalf("same TTL index again: %v", err)
	}
	for _, c := range []struct {
		name string
		spec bson.D
		code int32
	}{
		{"other expiry", bson.D{{Key: "key", Value: bson.D{{Key: "at", Value: 1}}}, {Key: "name", Value: "ttl"}, {Key: "expireAfterSeconds", Value: 60}}, 85},
		{"compound", bson.D{{Key: "key", Value: bson.D{{Key: "a", Value: 1}, {Key: "b", Value: 1}}}, {Key: "name", Value: "ab"}, {Key: "expireAfterSeconds", Value: 60}}, 67},
		{"not a number", bson.D{{Key: "key", Value: bson.D{{Key: "c", Value: 1}}}, {Key: "name", Value: "c"}, {Key: "expireAfterSeconds", Value: "60"}}, 67},
		{"negative", bson.D{{Key: "key", Value: bson.D{{Key: "d", Value: 1}}}, {Key: "name", Value: "d"}, {Key: "expireAfterSeconds", Value: -1}}, 67},
	} {
		err := client.Database("app").RunCommand(ctx, bson.D{{Key: "createIndexes", Value: "log"}, {Key: "indexes", Value: bson.A{c.spec}}}).Err()
		var ce mongo.CommandError
		if !errors.As(err, &ce) || ce.Code != c.code {
			t.Errorf("%s: %v, want code %d", c.name, err, c.code)
		}
	}
	// collMod changes the expiry.
	var res bson.M
	if err := client.Database("app").RunCommand(ctx, bson.D{{Key: "collMod", Value: "log"}, {Key: "index", Value: bson.D{{Key: "name", Value: "ttl"}, {Key: "expireAfterSeconds", Value: int32(60)}}}}).Decode(&res); err != nil {
		t.Fatalf("collMod: %v", err)
	}
	if res["expireAfterSeconds_old"] != int32(3600) || res["expireAfterSeconds_new"] != int32(60) {
		t.Errorf("collMod reply = %v", res)
	}
	if specs, err = coll.Indexes().ListSpecifications(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if s.Name == "ttl" && (s.ExpireAfterSeconds == nil || *s.ExpireAfterSeconds != 60) {
			t.Errorf("expireAfterSeconds after collMod = %v, want 60", s.ExpireAfterSeconds)
		}
	}
	err = client.Database("app").RunCommand(ctx, bson.D{{Key: "collMod", Value: "log"}, {Key: "index", Value: bson.D{{Key: "name", Value: "nope"}, {Key: "expireAfterSeconds", Value: int32(60)}}}}).Err()
	if ce := (mongo.CommandError{}); !errors.As(err, &ce) || ce.Code != 27 {
		t.Errorf("collMod of a missing index: %v, want code 27", err)
	}
}
