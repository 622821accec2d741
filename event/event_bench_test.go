package event

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// benchChange is an update event of a ~300-byte order with updateLookup.
func benchChange(tb testing.TB) bson.Raw {
	tb.Helper()
	now := time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC)
	doc := bson.D{
		{Key: "_id", Value: bson.NewObjectIDFromTimestamp(now)},
		{Key: "customer", Value: "customer-000042"},
		{Key: "status", Value: "paid"},
		{Key: "total", Value: 129.99},
		{Key: "currency", Value: "EUR"},
		{Key: "items", Value: bson.A{
			bson.D{{Key: "sku", Value: "SKU-00017"}, {Key: "qty", Value: int32(2)}, {Key: "price", Value: 19.99}},
			bson.D{{Key: "sku", Value: "SKU-00311"}, {Key: "qty", Value: int32(1)}, {Key: "price", Value: 90.01}},
		}},
		{Key: "shipping", Value: bson.D{{Key: "city", Value: "Lyon"}, {Key: "zip", Value: "69002"}, {Key: "country", Value: "FR"}}},
		{Key: "updatedAt", Value: bson.NewDateTimeFromTime(now)},
	}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8266A1B2C3000000012B022C0100296E5A1004"}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: bson.Timestamp{T: uint32(now.Unix()), I: 1}},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(now)},
		{Key: "fullDocument", Value: doc},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: doc[0].Value}}},
		{Key: "updateDescription", Value: bson.D{
			{Key: "updatedFields", Value: bson.D{{Key: "status", Value: "paid"}, {Key: "updatedAt", Value: bson.NewDateTimeFromTime(now)}}},
			{Key: "removedFields", Value: bson.A{}},
			{Key: "truncatedArrays", Value: bson.A{}},
		}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// BenchmarkFromChange measures building an Event from a raw change (done
// once per change read).
func BenchmarkFromChange(b *testing.B) {
	raw := benchChange(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromChange("orders", 1, raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnvelope measures encoding one envelope (done once per event and
// format; sinks share the cached bytes).
func BenchmarkEnvelope(b *testing.B) {
	for _, tc := range []struct {
		name      string
		canonical bool
	}{{"relaxed", false}, {"canonical", true}} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := FromChange("orders", 1, benchChange(b))
			if err != nil {
				b.Fatal(err)
			}
			e.Rules = []string{"paid-orders"}
			out, err := e.encode(tc.canonical)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.encode(tc.canonical); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkShapedEnvelope measures shaping one event and encoding the
// shaped payload (done once per event and distinct shape): a projection,
// a redaction, and both with the document form.
func BenchmarkShapedEnvelope(b *testing.B) {
	for _, tc := range []struct {
		name string
		spec ShapeSpec
	}{
		{"exclude", ShapeSpec{Fields: []Field{{Path: "fullDocument.items"}, {Path: "fullDocument.shipping.zip"}}}},
		{"redact", ShapeSpec{Redact: []string{"fullDocument.customer", "fullDocument.**.price"}}},
		{"redact-hash", ShapeSpec{Redact: []string{"fullDocument.customer"}, RedactHash: true, RedactKey: []byte("0123456789abcdef")}},
		{"include+document", ShapeSpec{Fields: []Field{{Path: "fullDocument.status", Include: true}, {Path: "fullDocument.total", Include: true}}, Envelope: FormDocument}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := CompileShape(tc.spec)
			if err != nil {
				b.Fatal(err)
			}
			raw := benchChange(b)
			b.ReportAllocs()
			for b.Loop() {
				e, err := FromChange("orders", 1, raw)
				if err != nil {
					b.Fatal(err)
				}
				v, _ := e.Shaped(s)
				if _, err := v.Envelope(false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// largeChange is an insert event whose fullDocument is an order padded
// with one string field to about size bytes (bench scenario 14's
// documents).
func largeChange(tb testing.TB, size int) bson.Raw {
	tb.Helper()
	pad := make([]byte, size)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	doc := bson.D{
		{Key: "_id", Value: int32(7)},
		{Key: "seq", Value: int32(7)},
		{Key: "customer", Value: "customer-000007"},
		{Key: "total", Value: 7.99},
		{Key: "wts", Value: int64(1764150000000000000)},
		{Key: "pad", Value: string(pad)},
	}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8266A1B2C3000000012B022C0100296E5A1004"}}},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1764150000, I: 1}},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.Unix(1764150000, 0))},
		{Key: "fullDocument", Value: doc},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(7)}}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// BenchmarkEnvelopeLarge measures encoding the envelope of a 1 MiB and an
// 8 MiB document (bench scenario 14), relaxed and canonical; b.SetBytes
// is the raw change's size, so MB/s is of BSON read.
func BenchmarkEnvelopeLarge(b *testing.B) {
	for _, size := range []int{1 << 20, 8 << 20} {
		raw := largeChange(b, size)
		for _, canonical := range []bool{false, true} {
			name := fmt.Sprintf("%dMiB/relaxed", size>>20)
			if canonical {
				name = fmt.Sprintf("%dMiB/canonical", size>>20)
			}
			b.Run(name, func(b *testing.B) {
				e, err := FromChange("orders", 1, raw)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(raw)))
				b.ReportAllocs()
				c0 := processCPU()
				for b.Loop() {
					if _, err := e.encode(canonical); err != nil {
						b.Fatal(err)
					}
				}
				// The process's CPU time (garbage collection included) per
				// op: on a shared machine wall time per op says little.
				b.ReportMetric(float64(processCPU()-c0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// processCPU is the process's user+system CPU time in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkFromChangeLarge measures building an Event from a 1 MiB change.
func BenchmarkFromChangeLarge(b *testing.B) {
	raw := largeChange(b, 1<<20)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromChange("orders", 1, raw); err != nil {
			b.Fatal(err)
		}
	}
}
