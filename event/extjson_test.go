package event

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// allTypesDoc is a document holding every BSON type, with the values whose
// Extended JSON is easy to get wrong.
func allTypesDoc(t testing.TB) bson.Raw {
	t.Helper()
	dec, err := bson.ParseDecimal128("-1234.5678E-10")
	if err != nil {
		t.Fatal(err)
	}
	decH, decL := dec.GetBytes()
	oid := bson.ObjectID{0x65, 0x5d, 0xc0, 0x01, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44}
	b := bsoncore.NewDocumentBuilder().
		AppendInt32("_id", 7).
		AppendString("plain", "hello").
		AppendString("escapes", "q\" b\\ nl\n cr\r tab\t bs\b ff\f nul\x00 ctl\x1f del\x7f <>&").
		AppendString("unicode", "héllo 世界 \u2028 \u2029 😀").
		AppendString("empty", "").
		AppendDouble("d1", 19.99).
		AppendDouble("d2", 3).
		AppendDouble("d3", math.Copysign(0, -1)).
		AppendDouble("d4", 1e21).
		AppendDouble("d5", 1e-7).
		AppendDouble("d6", 123456789012345680).
		AppendDouble("inf", math.Inf(1)).
		AppendDouble("ninf", math.Inf(-1)).
		AppendDouble("nan", math.NaN()).
		AppendInt32("i32", -2147483648).
		AppendInt64("i64", 9007199254740993).
		AppendInt64("i64neg", -1).
		AppendBoolean("t", true).
		AppendBoolean("f", false).
		AppendNull("null").
		AppendUndefined("undef").
		AppendMinKey("min").
		AppendMaxKey("max").
		AppendObjectID("oid", oid).
		AppendDateTime("date", time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC).UnixMilli()).
		AppendDateTime("date0", 0).
		AppendDateTime("dateNeg", -1).
		AppendDateTime("dateOld", time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC).UnixMilli()).
		AppendDateTime("dateFar", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()).
		AppendDateTime("dateMax", math.MaxInt64).
		AppendTimestamp("ts", 1763805600, 42).
		AppendDecimal128("dec", decH, decL).
		AppendBinary("bin", 0, []byte("binary\x00data")).
		AppendBinary("uuid", 4, bytes.Repeat([]byte{0xab}, 16)).
		AppendBinary("user", 0x80, nil).
		AppendBinary("old", 2, []byte("old binary")).
		AppendRegex("re", "^a.*\"b\\d", "xsmi").
		AppendRegex("re2", "", "").
		AppendDBPointer("dbp", "db.coll", oid).
		AppendJavaScript("js", "function() { return \"x\"; }").
		AppendSymbol("sym", "a symbol\n").
		AppendCodeWithScope("cws", "x + y", bsoncore.NewDocumentBuilder().AppendInt32("y", 2).Build()).
		AppendCodeWithScope("cwsEmpty", "1", bsoncore.NewDocumentBuilder().Build()).
		AppendDocument("emptyDoc", bsoncore.NewDocumentBuilder().Build()).
		AppendArray("emptyArr", bsoncore.NewArrayBuilder().Build()).
		AppendDocument("nested", bsoncore.NewDocumentBuilder().
			AppendString("k\"ey\n", "v").
			AppendArray("a", bsoncore.NewArrayBuilder().
				AppendInt32(1).AppendString("two").AppendDouble(3.5).AppendNull().
				AppendDocument(bsoncore.NewDocumentBuilder().AppendInt64("x", 5).Build()).
				AppendArray(bsoncore.NewArrayBuilder().AppendBoolean(true).Build()).
				Build()).
			Build()).
		AppendString("é clé", "key with non-ASCII")
	return bson.Raw(b.Build())
}

func changeWith(t testing.TB, full bson.Raw, extra ...bson.E) bson.Raw {
	t.Helper()
	d := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8266A1B2C3000000012B022C0100296E5A1004"}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1763805600, I: 3}},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC))},
		{Key: "fullDocument", Value: full},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "or\"ders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 7}}},
	}
	d = append(d, extra...)
	raw, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func checkSameAsDriver(t *testing.T, e *Event) {
	t.Helper()
	for _, canonical := range []bool{false, true} {
		want, err := e.encodeDriver(canonical)
		if err != nil {
			t.Fatalf("driver (canonical %v): %v", canonical, err)
		}
		got, err := e.encodeFast(canonical)
		if err != nil {
			t.Fatalf("fast (canonical %v): %v", canonical, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("canonical %v:\nfast:   %s\ndriver: %s", canonical, got, want)
		}
	}
}

// TestEnvelopeFastMatchesDriver checks that the direct encoder produces the
// driver's bytes for every BSON type, in every envelope field.
func TestEnvelopeFastMatchesDriver(t *testing.T) {
	full := allTypesDoc(t)
	cases := map[string]bson.Raw{
		"all types": changeWith(t, full,
			bson.E{Key: "fullDocumentBeforeChange", Value: full},
			bson.E{Key: "updateDescription", Value: bson.D{
				{Key: "updatedFields", Value: full},
				{Key: "removedFields", Value: bson.A{"a", "b.c"}},
				{Key: "truncatedArrays", Value: bson.A{bson.D{{Key: "field", Value: "x"}, {Key: "newSize", Value: 2}}}},
			}},
			bson.E{Key: "collectionUUID", Value: bson.Binary{Subtype: 4, Data: bytes.Repeat([]byte{1}, 16)}},
			bson.E{Key: "to", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "archive"}}},
		),
		"bench change": benchChange(t),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			e, err := FromChange("or\"ders\n", 1, raw)
			if err != nil {
				t.Fatal(err)
			}
			checkSameAsDriver(t, e)
			e.Rules = []string{"paid-orders", "é\"x"}
			checkSameAsDriver(t, e)
		})
	}
	// A non-document top-level field value (drop events have no
	// fullDocument; a pipeline may set anything).
	raw := changeWith(t, full, bson.E{Key: "to", Value: "a string"})
	e, err := FromChange("orders", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	checkSameAsDriver(t, e)
	// No wall time, no cluster time.
	raw, _ = bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "82"}}},
		{Key: "operationType", Value: "drop"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
	})
	if e, err = FromChange("orders", 1, raw); err != nil {
		t.Fatal(err)
	}
	checkSameAsDriver(t, e)
}

// FuzzEnvelopeFastMatchesDriver feeds arbitrary bytes as the fullDocument
// value: whenever the driver can encode the envelope, Envelope's result
// (fast path, or fallback) must be the driver's.
func FuzzEnvelopeFastMatchesDriver(f *testing.F) {
	f.Add([]byte(allTypesDoc(f)))
	f.Add([]byte(benchChange(f)))
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, doc []byte) {
		// Splice doc in as a raw embedded document value.
		raw := bsoncore.NewDocumentBuilder().
			AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendString("_data", "82").Build()).
			AppendString("operationType", "insert").
			AppendDocument("fullDocument", doc).
			Build()
		e, err := FromChange("orders", 1, bson.Raw(raw))
		if err != nil {
			return
		}
		for _, canonical := range []bool{false, true} {
			want, werr := e.encodeDriver(canonical)
			got, gerr := e.encode(canonical)
			if errors.Is(gerr, ErrInvalidUTF8) {
				continue // refused on purpose: the driver would replace the bytes
			}
			if werr != nil {
				if fast, ferr := e.encodeFast(canonical); ferr == nil {
					t.Fatalf("fast path accepted what the driver refuses (%v): %s", werr, fast)
				}
				continue
			}
			if gerr != nil || !bytes.Equal(got, want) {
				t.Fatalf("canonical %v: got %s (%v), driver %s", canonical, got, gerr, want)
			}
		}
	})
}
