package mongowire

import (
	"math"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestEvalExpression(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_123)
	root, _ := bson.Marshal(bson.D{
		{Key: "i", Value: int32(7)}, {Key: "l", Value: int64(10)}, {Key: "d", Value: 2.5},
		{Key: "t", Value: bson.DateTime(1000)}, {Key: "n", Value: nil},
		{Key: "arr", Value: bson.A{bson.D{{Key: "x", Value: 1}}, 5, bson.D{{Key: "y", Value: 2}}, bson.D{{Key: "x", Value: 3}}}},
	})
	env := &exprEnv{root: root, now: now}
	for _, tc := range []struct {
		name string
		expr any
		want any // nil: missing
	}{
		{"int+int stays int", bson.D{{Key: "$add", Value: bson.A{"$i", int32(1)}}}, int32(8)},
		{"int+long is long", bson.D{{Key: "$add", Value: bson.A{"$i", "$l"}}}, int64(17)},
		{"int+double is double", bson.D{{Key: "$add", Value: bson.A{"$i", "$d"}}}, 9.5},
		{"int overflow widens to long", bson.D{{Key: "$add", Value: bson.A{int32(math.MaxInt32), int32(1)}}}, int64(math.MaxInt32 + 1)},
		{"long overflow widens to double", bson.D{{Key: "$add", Value: bson.A{int64(math.MaxInt64), int64(1)}}}, float64(math.MaxInt64) + 1},
		{"date+millis is a date", bson.D{{Key: "$add", Value: bson.A{"$t", int64(500)}}}, bson.DateTime(1500)},
		{"$$NOW+ttl", bson.D{{Key: "$add", Value: bson.A{"$$NOW", int64(15000)}}}, bson.DateTime(1_700_000_015_123)},
		{"null operand", bson.D{{Key: "$add", Value: bson.A{"$i", "$n"}}}, wantNull},
		{"missing operand", bson.D{{Key: "$add", Value: bson.A{"$i", "$nope"}}}, wantNull},
		{"date-date is long millis", bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", "$t"}}}, int64(1_700_000_000_123 - 1000)},
		{"date-millis is a date", bson.D{{Key: "$subtract", Value: bson.A{"$t", int32(1)}}}, bson.DateTime(999)},
		{"$multiply", bson.D{{Key: "$multiply", Value: bson.A{"$i", "$l"}}}, int64(70)},
		{"$mod int", bson.D{{Key: "$mod", Value: bson.A{int32(-7), int32(3)}}}, int32(-1)},
		{"$mod long", bson.D{{Key: "$mod", Value: bson.A{"$l", int32(4)}}}, int64(2)},
		{"$abs of min int is long", bson.D{{Key: "$abs", Value: int32(math.MinInt32)}}, int64(-math.MinInt32)},
		{"$toLong of a double truncates", bson.D{{Key: "$toLong", Value: -2.7}}, int64(-2)},
		{"$toLong of a string", bson.D{{Key: "$toLong", Value: "42"}}, int64(42)},
		{"$toLong of a date", bson.D{{Key: "$toLong", Value: "$t"}}, int64(1000)},
		{"$cond array form", bson.D{{Key: "$cond", Value: bson.A{bson.D{{Key: "$gt", Value: bson.A{"$i", 5}}}, "big", "small"}}}, "big"},
		{"$cond zero is false", bson.D{{Key: "$cond", Value: bson.D{{Key: "if", Value: 0.0}, {Key: "then", Value: 1}, {Key: "else", Value: 2}}}}, int32(2)},
		{"$ifNull skips null and missing", bson.D{{Key: "$ifNull", Value: bson.A{"$n", "$nope", "$i"}}}, int32(7)},
		{"$ifNull last may be missing", bson.D{{Key: "$ifNull", Value: bson.A{"$n", "$nope"}}}, nil},
		{"$max ignores null", bson.D{{Key: "$max", Value: bson.A{"$n", int32(3), 9.5, "$nope"}}}, 9.5},
		{"$min of an array operand", bson.D{{Key: "$min", Value: bson.A{bson.A{int32(4), int32(2), int32(8)}}}}, int32(2)},
		{"$max across types uses BSON order", bson.D{{Key: "$max", Value: bson.A{int32(1), "a"}}}, "a"},
		{"$eq numbers of different types", bson.D{{Key: "$eq", Value: bson.A{int64(10), 10.0}}}, true},
		{"$eq missing vs null", bson.D{{Key: "$eq", Value: bson.A{"$nope", nil}}}, false},
		{"$lt missing vs date", bson.D{{Key: "$lt", Value: bson.A{"$nope", "$$NOW"}}}, true},
		{"$or", bson.D{{Key: "$or", Value: bson.A{false, "$n", "$i"}}}, true},
		{"$not", bson.D{{Key: "$not", Value: bson.A{"$nope"}}}, true},
		{"field path maps over arrays", "$arr.x", bson.A{int32(1), int32(3)}},
		{"$literal", bson.D{{Key: "$literal", Value: "$i"}}, "$i"},
		{"$$REMOVE", "$$REMOVE", nil},
		{"$$ROOT path", "$$ROOT.l", int64(10)},
		{"object expression drops missing", bson.D{{Key: "a", Value: "$i"}, {Key: "b", Value: "$nope"}}, bson.D{{Key: "a", Value: int32(7)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := evalExpression(env, rawOf(t, tc.expr))
			if err != nil {
				t.Fatal(err)
			}
			switch tc.want {
			case nil:
				if got.Type != 0 {
					t.Fatalf("got %v, want missing", got)
				}
				return
			case wantNull:
				if got.Type != bson.TypeNull {
					t.Fatalf("got %v, want null", got)
				}
				return
			}
			want := rawOf(t, tc.want)
			if got.Type != want.Type || string(got.Value) != string(want.Value) {
				t.Fatalf("got %v (%s), want %v (%s)", got, got.Type, want, want.Type)
			}
		})
	}
	for _, tc := range []struct {
		expr any
		code int32
	}{
		{bson.D{{Key: "$mod", Value: bson.A{1, 0}}}, 16610},
		{bson.D{{Key: "$abs", Value: int64(math.MinInt64)}}, 28680},
		{bson.D{{Key: "$add", Value: bson.A{"$t", "$t"}}}, 16612},
		{bson.D{{Key: "$eq", Value: bson.A{1}}}, 16020},
		{bson.D{{Key: "$ifNull", Value: bson.A{1}}}, 1257300},
		{bson.D{{Key: "$toLong", Value: "x"}}, 241},
		{"$$NOPE", 17276},
		{bson.D{{Key: "$frob", Value: 1}}, 168},
	} {
		_, err := evalExpression(env, rawOf(t, tc.expr))
		if ce, ok := err.(*CommandError); !ok || ce.Code != tc.code {
			t.Errorf("%v: err = %v, want code %d", tc.expr, err, tc.code)
		}
	}
}

// wantNull marks an expected BSON null in TestEvalExpression.
type nullMarker struct{}

var wantNull = nullMarker{}

func rawOf(t *testing.T, v any) bson.RawValue {
	t.Helper()
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bson.RawValue{Type: typ, Value: data}
}
