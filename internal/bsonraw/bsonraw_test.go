package bsonraw_test

import (
	"math"
	"testing"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/test/bsontest"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestArrayIndex(t *testing.T) {
	for s, want := range map[string]int{
		"0": 0, "7": 7, "123456789": 123456789,
		"": -1, "01": -1, "1234567890": -1, "-1": -1, "1a": -1, "a": -1,
	} {
		if got := bsonraw.ArrayIndex(s); got != want {
			t.Errorf("ArrayIndex(%q) = %d, want %d", s, got, want)
		}
	}
	got := bsonraw.SplitPath("items.0.sku")
	want := []bsonraw.PathPart{{Name: "items", Index: -1}, {Name: "0", Index: 0}, {Name: "sku", Index: -1}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("SplitPath = %v, want %v", got, want)
	}
}

func TestNumbers(t *testing.T) {
	tests := []struct {
		value  string
		trunc  int64
		ok     bool
		truthy bool
	}{
		{`{"$numberInt": "-3"}`, -3, true, true},
		{`{"$numberLong": "0"}`, 0, true, false},
		{`{"$numberDouble": "-2.7"}`, -2, true, true},
		{`{"$numberDouble": "1e300"}`, math.MaxInt64, true, true},
		{`{"$numberDouble": "NaN"}`, 0, false, true},
		{`{"$numberDecimal": "12.9"}`, 12, true, true},
		{`{"$numberDecimal": "-Infinity"}`, 0, false, true},
		{`"3"`, 0, false, true},
		{`null`, 0, false, false},
		{`false`, 0, false, false},
	}
	for _, tc := range tests {
		v := bsontest.Value(t, tc.value)
		n, ok := bsonraw.TruncInt(v.Type, v.Value)
		if n != tc.trunc || ok != tc.ok {
			t.Errorf("TruncInt(%s) = %d, %v; want %d, %v", tc.value, n, ok, tc.trunc, tc.ok)
		}
		if got := bsonraw.Truthy(v.Type, v.Value); got != tc.truthy {
			t.Errorf("Truthy(%s) = %v, want %v", tc.value, got, tc.truthy)
		}
	}
}

func TestDocuments(t *testing.T) {
	d := bsontest.Doc(t, `{"a": 1, "b": "x", "c": [1, 2, 3]}`)
	if typ, v, ok := bsonraw.Lookup(d, "b"); !ok || typ != bson.TypeString || string(bsonraw.Str(v)) != "x" {
		t.Errorf("Lookup(b) = %v %q %v", typ, v, ok)
	}
	if _, _, ok := bsonraw.Lookup(d, "z"); ok {
		t.Error("Lookup(z) found a field")
	}
	if _, c, _ := bsonraw.Lookup(d, "c"); bsonraw.CountElems(c) != 3 {
		t.Errorf("CountElems(c) = %d, want 3", bsonraw.CountElems(c))
	}
	if k, typ, _ := bsonraw.FirstElem(d); string(k) != "a" || typ != bson.TypeInt32 {
		t.Errorf("FirstElem = %q %v", k, typ)
	}
	var keys string
	for it := bsonraw.NewIter(d); ; {
		k, _, _, ok := it.Next()
		if !ok {
			break
		}
		keys += string(k)
	}
	if keys != "abc" {
		t.Errorf("Iter keys = %q, want abc", keys)
	}
	// Malformed input ends the iteration instead of failing.
	it := bsonraw.NewIter(d[:len(d)-3])
	if _, _, _, ok := it.Next(); ok {
		t.Error("Iter over a truncated document yielded an element")
	}
}

func TestOperatorDocsAndAliases(t *testing.T) {
	for s, want := range map[string]bool{
		`{"$gt": 1}`:                   true,
		`{"a": 1}`:                     false,
		`{"$ref": "c", "$id": 1}`:      false,
		`{}`:                           false,
		`{"$and": [{"a": 1}], "b": 1}`: true,
	} {
		if got := bsonraw.IsOperatorDoc(bsontest.Doc(t, s)); got != want {
			t.Errorf("IsOperatorDoc(%s) = %v, want %v", s, got, want)
		}
	}
	for _, alias := range []string{"double", "string", "objectId", "decimal", "maxKey"} {
		typ, ok := bsonraw.TypeByAlias(alias)
		if !ok {
			t.Fatalf("TypeByAlias(%s) unknown", alias)
		}
		if back, _ := bsonraw.AliasOf(typ); back != alias {
			t.Errorf("AliasOf(TypeByAlias(%s)) = %s", alias, back)
		}
	}
	if _, ok := bsonraw.TypeByAlias("number"); ok {
		t.Error(`TypeByAlias("number") is known`)
	}
}

func TestDollarPath(t *testing.T) {
	for _, tc := range []struct {
		doc  bson.D
		want string
	}{
		{bson.D{{Key: "_id", Value: 1}}, ""},
		{bson.D{{Key: "_id", Value: bson.D{{Key: "$ne", Value: nil}}}}, "_id.$ne"},
		{bson.D{{Key: "a", Value: bson.A{1, bson.D{{Key: "$oid", Value: "x"}}}}}, "a.1.$oid"},
		{bson.D{{Key: "f", Value: bson.CodeWithScope{Code: "x", Scope: bson.D{{Key: "$s", Value: 1}}}}}, "f.$s"},
		{bson.D{{Key: "$top", Value: 1}}, "$top"},
	} {
		raw, err := bson.Marshal(tc.doc)
		if err != nil {
			t.Fatal(err)
		}
		if got := bsonraw.DollarPath(raw); got != tc.want {
			t.Errorf("DollarPath(%v) = %q, want %q", tc.doc, got, tc.want)
		}
	}
	if got := bsonraw.DollarPath(bson.Raw{1, 2}); got != "" {
		t.Errorf("DollarPath(garbage) = %q", got)
	}
}
