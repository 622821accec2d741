package query

import (
	"testing"

	"github.com/changegate/changegate/test/bsontest"
)

func benchMatch(b *testing.B, filter string) {
	f := MustCompile(bsontest.Doc(b, filter))
	ev := bsontest.Doc(b, bsontest.ChangeEvent)
	if !f.Match(ev) {
		b.Fatal("benchmark filter does not match")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f.Match(ev)
	}
}

// BenchmarkMatch is a typical routing rule against a typical update event.
func BenchmarkMatch(b *testing.B) {
	benchMatch(b, `{"fullDocument.status": "paid", "fullDocument.total": {"$gte": 100}, "operationType": {"$in": ["insert", "update"]}}`)
}

func BenchmarkMatchArrayElemMatch(b *testing.B) {
	benchMatch(b, `{"ns.coll": "orders", "fullDocument.items": {"$elemMatch": {"sku": {"$regex": "^B-"}, "qty": {"$gte": 2}}}}`)
}

func BenchmarkMatchOrNe(b *testing.B) {
	benchMatch(b, `{"$or": [{"fullDocument.customer.tier": "platinum"}, {"fullDocument.items.price": {"$gt": 50}}], "fullDocument.currency": {"$ne": "USD"}}`)
}

func BenchmarkCompile(b *testing.B) {
	filter := bsontest.Doc(b, `{"fullDocument.status": "paid", "fullDocument.total": {"$gte": 100}, "operationType": {"$in": ["insert", "update"]}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(filter); err != nil {
			b.Fatal(err)
		}
	}
}
