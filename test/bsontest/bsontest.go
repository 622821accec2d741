// Package bsontest writes BSON for tests as relaxed extended JSON and
// prints it back the same way, so that test tables read like the MongoDB
// manual. Regex literals are written {"$regularExpression": {...}}.
package bsontest

import (
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ChangeEvent is a typical change event in extended JSON, an update with
// its full document, for benchmarks and fuzz seeds.
const ChangeEvent = `{"_id": {"_data": "8266A1B2C3000000012B042C0100296E5A1004"}, "operationType": "update", "clusterTime": {"$timestamp": {"t": 1721890000, "i": 1}}, "wallTime": {"$date": "2024-07-25T06:46:40Z"}, "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": {"$oid": "66a1b2c3d4e5f60718293a4b"}}, "updateDescription": {"updatedFields": {"status": "paid", "paidAt": {"$date": "2024-07-25T06:46:40Z"}}, "removedFields": [], "truncatedArrays": []}, "fullDocument": {"_id": {"$oid": "66a1b2c3d4e5f60718293a4b"}, "customer": {"id": 42, "email": "someone@example.com", "tier": "gold"}, "status": "paid", "currency": "EUR", "total": 149.9, "items": [{"sku": "A-1", "qty": 1, "price": 99.9}, {"sku": "B-2", "qty": 2, "price": 25}], "createdAt": {"$date": "2024-07-25T06:40:00Z"}, "paidAt": {"$date": "2024-07-25T06:46:40Z"}}}`

// Doc parses relaxed extended JSON into a BSON document, keeping field
// order. Invalid JSON fails the test.
func Doc(t testing.TB, s string) bson.Raw {
	t.Helper()
	var d bson.D
	if err := bson.UnmarshalExtJSON([]byte(s), false, &d); err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatalf("marshal %s: %v", s, err)
	}
	return b
}

// Value parses a single extended JSON value.
func Value(t testing.TB, s string) bson.RawValue {
	t.Helper()
	return Doc(t, `{"v": `+s+`}`).Lookup("v")
}

// JSON renders a document as relaxed extended JSON for messages and golden
// comparisons; nil is "<nil>".
func JSON(b bson.Raw) string {
	if b == nil {
		return "<nil>"
	}
	var d bson.D
	if err := bson.Unmarshal(b, &d); err != nil {
		return fmt.Sprintf("<invalid: %v>", err)
	}
	out, err := bson.MarshalExtJSON(d, false, false)
	if err != nil {
		return fmt.Sprintf("<unprintable: %v>", err)
	}
	return string(out)
}

// ValueJSON renders a single value as the document {"v": value}; the zero
// RawValue (a missing value) is "<missing>".
func ValueJSON(v bson.RawValue) string {
	if v.Type == 0 {
		return "<missing>"
	}
	return JSON(Marshal(bson.D{{Key: "v", Value: v}}))
}

// Marshal is bson.Marshal for values that always marshal; it panics on
// error.
func Marshal(v any) bson.Raw {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// FieldString renders the value of field key of d short, for test
// expectations that name documents by a field: a string as itself, a
// number as its JSON, anything else as [ValueJSON].
func FieldString(t testing.TB, d bson.Raw, key string) string {
	t.Helper()
	v := d.Lookup(key)
	switch v.Type {
	case bson.TypeString:
		return v.StringValue()
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble:
		return strings.TrimSuffix(strings.TrimPrefix(ValueJSON(v), `{"v":`), "}")
	}
	return ValueJSON(v)
}
