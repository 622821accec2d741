package query

import "testing"

const benchEvent = `{"_id": {"_data": "8266A1B2C3000000012B042C0100296E5A1004"}, "operationType": "update", "clusterTime": {"$timestamp": {"t": 1721890000, "i": 1}}, "wallTime": {"$date": "2024-07-25T06:46:40Z"}, "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": {"$oid": "66a1b2c3d4e5f60718293a4b"}}, "updateDescription": {"updatedFields": {"status": "paid", "paidAt": {"$date": "2024-07-25T06:46:40Z"}}, "removedFields": [], "truncatedArrays": []}, "fullDocument": {"_id": {"$oid": "66a1b2c3d4e5f60718293a4b"}, "customer": {"id": 42, "email": "someone@example.com", "tier": "gold"}, "status": "paid", "currency": "EUR", "total": 149.9, "items": [{"sku": "A-1", "qty": 1, "price": 99.9}, {"sku": "B-2", "qty": 2, "price": 25}], "createdAt": {"$date": "2024-07-25T06:40:00Z"}, "paidAt": {"$date": "2024-07-25T06:46:40Z"}}}`

func benchMatch(b *testing.B, filter string) {
	f := MustCompile(doc(b, filter))
	ev := doc(b, benchEvent)
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
	filter := doc(b, `{"fullDocument.status": "paid", "fullDocument.total": {"$gte": 100}, "operationType": {"$in": ["insert", "update"]}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(filter); err != nil {
			b.Fatal(err)
		}
	}
}
