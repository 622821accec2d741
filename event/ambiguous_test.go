package event

import (
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestCanonicalRefusesDollarFields: a user document named like an Extended
// JSON wrapper ({"$oid": "x"}) cannot be told from the typed value in JSON;
// canonical mode refuses such an event (naming the field) instead of
// writing something ambiguous, relaxed mode writes it as the drivers do, and
// a real ObjectId is unaffected.
func TestCanonicalRefusesDollarFields(t *testing.T) {
	change := func(full bson.D) *Event {
		raw, err := bson.Marshal(bson.D{
			{Key: "_id", Value: bson.D{{Key: "_data", Value: "8266000000000000000001"}}},
			{Key: "operationType", Value: "insert"},
			{Key: "clusterTime", Value: bson.Timestamp{T: 1_700_000_000, I: 1}},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}},
			{Key: "fullDocument", Value: full},
		})
		if err != nil {
			t.Fatal(err)
		}
		e, err := FromChange("orders", 1, raw)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	odd := change(bson.D{{Key: "_id", Value: 1}, {Key: "ref", Value: bson.A{bson.D{{Key: "$oid", Value: "x"}}}}})
	_, err := odd.Envelope(true)
	if !errors.Is(err, ErrAmbiguousJSON) || !strings.Contains(err.Error(), `"fullDocument.ref.0.$oid"`) {
		t.Fatalf("canonical envelope = %v, want ErrAmbiguousJSON naming fullDocument.ref.0.$oid", err)
	}
	if b, err := odd.Envelope(false); err != nil || !strings.Contains(string(b), `{"$oid":"x"}`) {
		t.Fatalf("relaxed envelope = %s, %v", b, err)
	}
	oid := bson.NewObjectID()
	typed := change(bson.D{{Key: "_id", Value: 1}, {Key: "ref", Value: oid}})
	if b, err := typed.Envelope(true); err != nil || !strings.Contains(string(b), `{"$oid":"`+oid.Hex()+`"}`) {
		t.Fatalf("canonical envelope of an ObjectId = %s, %v", b, err)
	}
}
