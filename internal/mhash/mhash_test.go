package mhash

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func rawOf(t *testing.T, v any) bson.RawValue {
	t.Helper()
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bson.RawValue{Type: typ, Value: data}
}

func TestHashedIndexKey(t *testing.T) {
	dec42, _ := bson.ParseDecimal128("42")
	dec425, _ := bson.ParseDecimal128("42.5") // ties to even: 42
	for _, tc := range []struct {
		name string
		v    any
		want int64
	}{
		// The documented example (reference/operator/aggregation/toHashedIndexKey).
		{"documented string", "string to hash", 763543691661428748},
		// A $project {$toHashedIndexKey: "$a"} conformance case (a: "hello")
		// found in a public MongoDB-compatibility test suite.
		{"string hello", "hello", 5347277839332858538},
		// hasher.cpp's startup self-check: hash64(BSON("check" << 42)...) with
		// an int32 42; every numeric type of the same integral value hashes alike
		// because numbers share canonical type 10 and are squashed to int64.
		{"int32 42 (hasher.cpp self-check)", int32(42), -944302157085130861},
		{"int64 42", int64(42), -944302157085130861},
		{"double 42.0", 42.0, -944302157085130861},
		{"double 42.9 truncates", 42.9, -944302157085130861},
		{"decimal 42", dec42, -944302157085130861},
		{"decimal 42.5 rounds half to even", dec425, -944302157085130861},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := HashedIndexKey(rawOf(t, tc.v)); got != tc.want {
				t.Fatalf("hash(%v) = %d, want %d", tc.v, got, tc.want)
			}
		})
	}
	// Missing hashes as null (ExpressionToHashedIndexKey).
	if a, b := HashedIndexKey(bson.RawValue{}), HashedIndexKey(bson.RawValue{Type: bson.TypeNull}); a != b {
		t.Fatalf("missing %d != null %d", a, b)
	}
	// safeNumberLongForHash: 2^63 as a double hashes as MinInt64, NaN as 0,
	// +Inf as MaxInt64.
	for _, tc := range []struct {
		d    float64
		want int64
	}{{math.Ldexp(1, 63), math.MinInt64}, {math.NaN(), 0}, {math.Inf(1), math.MaxInt64}, {math.Inf(-1), math.MinInt64}} {
		if got, want := HashedIndexKey(rawOf(t, tc.d)), HashedIndexKey(rawOf(t, tc.want)); got != want {
			t.Errorf("hash(%v) = %d, want hash(int64 %d) = %d", tc.d, got, tc.want, want)
		}
	}
	// Embedded documents hash their field names: {a: 1} and {b: 1} differ,
	// {a: 1} and {a: 1.0} do not.
	a1 := HashedIndexKey(rawOf(t, bson.D{{Key: "a", Value: int32(1)}}))
	if a1 != HashedIndexKey(rawOf(t, bson.D{{Key: "a", Value: 1.0}})) {
		t.Error("{a: 1} and {a: 1.0} hash differently")
	}
	if a1 == HashedIndexKey(rawOf(t, bson.D{{Key: "b", Value: int32(1)}})) {
		t.Error("{a: 1} and {b: 1} hash alike")
	}
	if HashedIndexKey(rawOf(t, "1")) == HashedIndexKey(rawOf(t, int32(1))) {
		t.Error(`"1" and 1 hash alike`)
	}
}

func TestPartition(t *testing.T) {
	for _, tc := range []struct {
		h    int64
		n    int
		want int
	}{
		{0, 4, 0}, {5, 4, 1}, {-1, 4, 3}, {-4, 4, 0}, {-5, 4, 3},
		{math.MinInt64, 4, 0}, {math.MinInt64, 3, 1}, {math.MaxInt64, 3, 1}, {12345, 1, 0},
	} {
		if got := Partition(tc.h, tc.n); got != tc.want {
			t.Errorf("Partition(%d, %d) = %d, want %d", tc.h, tc.n, got, tc.want)
		}
	}
}
