package query

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// doc parses relaxed extended JSON into a BSON document, keeping field
// order. Regex literals are written {"$regularExpression": {...}}.
func doc(t testing.TB, s string) bson.Raw {
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

// val parses a single extended JSON value.
func val(t testing.TB, s string) bson.RawValue {
	t.Helper()
	return doc(t, `{"v": `+s+`}`).Lookup("v")
}

// js renders a document as relaxed extended JSON for messages and golden
// comparisons.
func js(b bson.Raw) string {
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

func jsValue(v bson.RawValue) string {
	if v.Type == 0 {
		return "<missing>"
	}
	return js(mustMarshal(bson.D{{Key: "v", Value: v}}))
}

func mustMarshal(v any) bson.Raw {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
