package query

import (
	"testing"

	"github.com/changegate/changegate/test/bsontest"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// https://www.mongodb.com/docs/manual/reference/bson-type-comparison-order/
// Each inner slice holds values that compare equal; the groups are in
// ascending order.
func TestCompareOrder(t *testing.T) {
	groups := [][]string{
		{`{"$minKey": 1}`},
		{`{"$undefined": true}`},
		{`null`, `<missing>`},
		{`{"$numberDouble": "NaN"}`, `{"$numberDecimal": "NaN"}`},
		{`{"$numberDouble": "-Infinity"}`, `{"$numberDecimal": "-Infinity"}`},
		{`{"$numberLong": "-9223372036854775808"}`},
		{`-1.5`, `{"$numberDecimal": "-1.50"}`},
		{`-1`, `{"$numberLong": "-1"}`, `-1.0`},
		{`0`, `-0.0`, `{"$numberDecimal": "0"}`, `{"$numberDecimal": "-0E+3"}`},
		{`{"$numberDecimal": "0.1"}`},
		{`{"$numberDecimal": "0.1000000000000000055511151231257827"}`},
		{`0.1`},
		{`{"$numberDecimal": "0.1000000000000000055511151231257828"}`},
		{`1`, `1.0`, `{"$numberLong": "1"}`, `{"$numberDecimal": "1.000"}`},
		{`{"$numberLong": "9007199254740993"}`},
		{`9007199254740994.0`},
		{`{"$numberLong": "9223372036854775807"}`},
		{`9223372036854775808.0`},
		{`{"$numberDouble": "Infinity"}`, `{"$numberDecimal": "Infinity"}`},
		{`""`},
		{`"A"`, `{"$symbol": "A"}`},
		{`"a"`},
		{`"ab"`},
		{`"b"`},
		{`{}`},
		{`{"a": null}`},
		{`{"a": 1}`, `{"a": 1.0}`},
		{`{"a": 1, "b": 1}`},
		{`{"b": 0}`},
		// Element type bracket is compared before the field name.
		{`{"a": "x"}`},
		{`[]`},
		{`[1]`},
		{`[1, 2]`},
		{`[2]`},
		{`{"$binary": {"base64": "", "subType": "00"}}`},
		{`{"$binary": {"base64": "AQ==", "subType": "00"}}`},
		{`{"$binary": {"base64": "AA==", "subType": "05"}}`},
		{`{"$binary": {"base64": "AQI=", "subType": "00"}}`},
		{`{"$oid": "000000000000000000000000"}`},
		{`{"$oid": "5234cc89687ea597eabee675"}`},
		{`false`},
		{`true`},
		{`{"$date": {"$numberLong": "-1000"}}`},
		{`{"$date": "2024-01-01T00:00:00Z"}`},
		{`{"$timestamp": {"t": 1, "i": 5}}`},
		{`{"$timestamp": {"t": 2, "i": 1}}`},
		{`{"$timestamp": {"t": 4294967295, "i": 1}}`},
		{`{"$regularExpression": {"pattern": "a", "options": "i"}}`},
		{`{"$regularExpression": {"pattern": "b", "options": ""}}`},
		{`{"$code": "x"}`},
		{`{"$maxKey": 1}`},
	}
	parse := func(s string) bson.RawValue {
		if s == "<missing>" {
			return bson.RawValue{}
		}
		return bsontest.Value(t, s)
	}
	for i, gi := range groups {
		for j, gj := range groups {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			for _, a := range gi {
				for _, b := range gj {
					if got := Compare(parse(a), parse(b)); got != want {
						t.Errorf("Compare(%s, %s) = %d, want %d", a, b, got, want)
					}
				}
			}
		}
	}
}

func TestEqual(t *testing.T) {
	cases := []struct {
		a, b string
		want bool
	}{
		{`1`, `1.0`, true},
		{`{"$numberLong": "1"}`, `{"$numberDecimal": "1"}`, true},
		{`1`, `"1"`, false},
		{`{"a": 1, "b": 2}`, `{"b": 2, "a": 1}`, false},
		{`{"a": [1, {"b": 2}]}`, `{"a": [1.0, {"b": {"$numberLong": "2"}}]}`, true},
		{`[1, 2]`, `[2, 1]`, false},
		{`null`, `{"$undefined": true}`, false},
		{`"abc"`, `{"$symbol": "abc"}`, true},
		{`{"$numberDouble": "NaN"}`, `{"$numberDouble": "NaN"}`, true},
	}
	for _, tc := range cases {
		t.Run(tc.a+" "+tc.b, func(t *testing.T) {
			if got := Equal(bsontest.Value(t, tc.a), bsontest.Value(t, tc.b)); got != tc.want {
				t.Errorf("Equal(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}
