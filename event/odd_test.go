package event

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// oddChange is an insert whose fullDocument is {_id: 1, v: <value>}.
func oddChange(t testing.TB, appendV func(*bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder) *Event {
	t.Helper()
	full := appendV(bsoncore.NewDocumentBuilder().AppendInt32("_id", 1)).Build()
	raw := bsoncore.NewDocumentBuilder().
		AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendString("_data", "82").Build()).
		AppendString("operationType", "insert").
		AppendDocument("fullDocument", full).
		Build()
	e, err := FromChange("s", 1, bson.Raw(raw))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func dec(t testing.TB, s string) bsoncore.Value {
	d, err := bson.ParseDecimal128(s)
	if err != nil {
		t.Fatal(err)
	}
	h, l := d.GetBytes()
	return bsoncore.Value{Type: bsoncore.TypeDecimal128, Data: bsoncore.AppendDecimal128(nil, h, l)}
}

func nested(depth int) []byte {
	d := bsoncore.NewDocumentBuilder().AppendInt32("leaf", 1).Build()
	for i := 1; i < depth; i++ {
		d = bsoncore.NewDocumentBuilder().AppendDocument("a", d).Build()
	}
	return d
}

// TestOddValues is the documented Extended JSON form of the BSON values a
// JSON number or string cannot hold. Each is lossless: relaxed Extended JSON
// (the default envelope) keeps its type and value, and canonical Extended
// JSON reads back to the same BSON. Invalid UTF-8 cannot be represented
// losslessly: the envelope is refused (ErrInvalidUTF8) and the sink
// dead-letters the event with its raw BSON.
func TestOddValues(t *testing.T) {
	val := func(v bsoncore.Value) func(*bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
		return func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder { return b.AppendValue("v", v) }
	}
	dbl := func(f float64) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, f)}
	}
	bin := func(sub byte, data []byte) func(*bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
		return func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder { return b.AppendBinary("v", sub, data) }
	}
	date := func(ms int64) func(*bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
		return func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder { return b.AppendDateTime("v", ms) }
	}
	cases := []struct {
		name string
		v    func(*bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder
		want string // relaxed JSON of fullDocument
		err  error
	}{
		{"NaN", val(dbl(math.NaN())), `{"_id":1,"v":{"$numberDouble":"NaN"}}`, nil},
		{"+Inf", val(dbl(math.Inf(1))), `{"_id":1,"v":{"$numberDouble":"Infinity"}}`, nil},
		{"-Inf", val(dbl(math.Inf(-1))), `{"_id":1,"v":{"$numberDouble":"-Infinity"}}`, nil},
		{"-0.0", val(dbl(math.Copysign(0, -1))), `{"_id":1,"v":-0.0}`, nil},
		{"max double", val(dbl(math.MaxFloat64)), `{"_id":1,"v":1.7976931348623157E+308}`, nil},
		{"decimal NaN", val(dec(t, "NaN")), `{"_id":1,"v":{"$numberDecimal":"NaN"}}`, nil},
		{"decimal -Inf", val(dec(t, "-Infinity")), `{"_id":1,"v":{"$numberDecimal":"-Infinity"}}`, nil},
		{"decimal -0", val(dec(t, "-0")), `{"_id":1,"v":{"$numberDecimal":"-0"}}`, nil},
		{"decimal max", val(dec(t, "9.999999999999999999999999999999999E+6144")), `{"_id":1,"v":{"$numberDecimal":"9.999999999999999999999999999999999E+6144"}}`, nil},
		{"decimal tiny", val(dec(t, "1E-6176")), `{"_id":1,"v":{"$numberDecimal":"1E-6176"}}`, nil},
		{"decimal trailing zeros", val(dec(t, "1.000")), `{"_id":1,"v":{"$numberDecimal":"1.000"}}`, nil},
		{"binary generic", bin(0, []byte{0, 1, 0xff}), `{"_id":1,"v":{"$binary":{"base64":"AAH/","subType":"00"}}}`, nil},
		{"binary function", bin(1, []byte("f")), `{"_id":1,"v":{"$binary":{"base64":"Zg==","subType":"01"}}}`, nil},
		{"binary old", bin(2, []byte("old")), `{"_id":1,"v":{"$binary":{"base64":"b2xk","subType":"02"}}}`, nil},
		{"binary uuid", bin(4, make([]byte, 16)), `{"_id":1,"v":{"$binary":{"base64":"AAAAAAAAAAAAAAAAAAAAAA==","subType":"04"}}}`, nil},
		{"binary md5", bin(5, []byte{1}), `{"_id":1,"v":{"$binary":{"base64":"AQ==","subType":"05"}}}`, nil},
		{"binary encrypted", bin(6, []byte{1}), `{"_id":1,"v":{"$binary":{"base64":"AQ==","subType":"06"}}}`, nil},
		{"binary column", bin(7, []byte{1}), `{"_id":1,"v":{"$binary":{"base64":"AQ==","subType":"07"}}}`, nil},
		{"binary sensitive", bin(8, []byte{1}), `{"_id":1,"v":{"$binary":{"base64":"AQ==","subType":"08"}}}`, nil},
		{"binary vector", bin(9, []byte{3, 0}), `{"_id":1,"v":{"$binary":{"base64":"AwA=","subType":"09"}}}`, nil},
		{"binary user", bin(0x80, nil), `{"_id":1,"v":{"$binary":{"base64":"","subType":"80"}}}`, nil},
		{"date before 1970", date(-1), `{"_id":1,"v":{"$date":{"$numberLong":"-1"}}}`, nil},
		{"date year 0", date(-62198755200000), `{"_id":1,"v":{"$date":{"$numberLong":"-62198755200000"}}}`, nil},
		{"date after 9999", date(253402300800000), `{"_id":1,"v":{"$date":{"$numberLong":"253402300800000"}}}`, nil},
		{"date max", date(math.MaxInt64), `{"_id":1,"v":{"$date":{"$numberLong":"9223372036854775807"}}}`, nil},
		{"date min", date(math.MinInt64), `{"_id":1,"v":{"$date":{"$numberLong":"-9223372036854775808"}}}`, nil},
		{"int64 beyond 2^53", val(bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, 1<<53+1)}), `{"_id":1,"v":9007199254740993}`, nil},
		{"duplicate keys", func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
			return b.AppendInt32("k", 1).AppendInt32("k", 2)
		}, `{"_id":1,"k":1,"k":2}`, nil},
		{"100 levels", func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
			return b.AppendDocument("v", nested(100))
		}, `{"_id":1,"v":` + strings.Repeat(`{"a":`, 99) + `{"leaf":1}` + strings.Repeat("}", 99) + `}`, nil},
		{"invalid UTF-8 value", func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
			return b.AppendString("v", "a\xffb")
		}, "", ErrInvalidUTF8},
		{"invalid UTF-8 key", func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
			return b.AppendInt32("k\xc3", 1)
		}, "", ErrInvalidUTF8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := oddChange(t, tc.v)
			env, err := e.Envelope(false)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(env) {
				t.Fatalf("invalid JSON: %s", env)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(env, &m); err != nil {
				t.Fatal(err)
			}
			if got := string(m["fullDocument"]); got != tc.want {
				t.Fatalf("fullDocument\n got %s\nwant %s", got, tc.want)
			}
			// Lossless: canonical Extended JSON reads back to the same BSON.
			canon, err := e.Envelope(true)
			if err != nil {
				t.Fatal(err)
			}
			var cm map[string]json.RawMessage
			if err := json.Unmarshal(canon, &cm); err != nil {
				t.Fatal(err)
			}
			var back bson.Raw
			if err := bson.UnmarshalExtJSON(cm["fullDocument"], true, &back); err != nil {
				t.Fatal(err)
			}
			if want := e.Raw.Lookup("fullDocument").Document(); string(back) != string(want) {
				t.Fatalf("canonical JSON does not read back to the same BSON:\n%s\n%s", back, want)
			}
		})
	}
}

// FuzzChangeEnvelope feeds arbitrary bytes as a whole change event: Envelope
// never panics, and whatever it returns without error is valid JSON.
func FuzzChangeEnvelope(f *testing.F) {
	f.Add([]byte(oddChange(f, func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder {
		return b.AppendDouble("v", math.NaN()).AppendDateTime("d", math.MaxInt64).AppendString("s", "x\u2028")
	}).Raw))
	f.Add([]byte(benchChange(f)))
	f.Add([]byte(allTypesDoc(f)))
	f.Fuzz(func(t *testing.T, raw []byte) {
		e, err := FromChange("s", 1, bson.Raw(raw))
		if err != nil {
			return
		}
		e.Rules = []string{"r"}
		for _, canonical := range []bool{false, true} {
			env, err := e.Envelope(canonical)
			if err != nil {
				continue
			}
			if !json.Valid(env) {
				t.Fatalf("invalid JSON (canonical %v): %q", canonical, env)
			}
		}
	})
}

func TestStrippedEnvelope(t *testing.T) {
	e := oddChange(t, func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder { return b.AppendString("v", "big") })
	e.Rules = []string{"r"}
	got, err := e.StrippedEnvelope(false, StripDocuments)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"s:82","source":"s","operationType":"insert","rules":["r"],"truncated":true}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	full, _ := e.Envelope(false)
	if !strings.Contains(string(full), `"fullDocument"`) || strings.Contains(string(full), "truncated") {
		t.Fatalf("the cached envelope changed: %s", full)
	}
}
