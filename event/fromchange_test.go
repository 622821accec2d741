package event

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// fromChangeLookup is FromChange as it was written first, with one
// raw.LookupErr per field: the reference the one-pass version must match.
func fromChangeLookup(source string, seq uint64, raw bson.Raw) (*Event, error) {
	idv, err := raw.LookupErr("_id")
	if err != nil {
		return nil, fmt.Errorf("change event has no _id (resume token)")
	}
	tok, ok := idv.DocumentOK()
	if !ok {
		return nil, fmt.Errorf("change event _id is a %s, not a document", idv.Type)
	}
	e := &Event{Source: source, Seq: seq, Token: tok, Raw: raw}
	e.ID = MakeID(source, tok)
	if v, err := raw.LookupErr("operationType"); err == nil {
		e.OperationType, _ = v.StringValueOK()
	}
	if v, err := raw.LookupErr("ns", "db"); err == nil {
		e.DB, _ = v.StringValueOK()
	}
	if v, err := raw.LookupErr("ns", "coll"); err == nil {
		e.Coll, _ = v.StringValueOK()
	}
	if v, err := raw.LookupErr("documentKey"); err == nil {
		e.DocumentKey, _ = v.DocumentOK()
	}
	if v, err := raw.LookupErr("clusterTime"); err == nil {
		t, i, _ := v.TimestampOK()
		e.ClusterTime = bson.Timestamp{T: t, I: i}
	}
	if v, err := raw.LookupErr("wallTime"); err == nil {
		if dt, ok := v.DateTimeOK(); ok {
			e.WallTime = time.UnixMilli(dt).UTC()
		}
	}
	if e.WallTime.IsZero() && e.ClusterTime.T != 0 {
		e.WallTime = time.Unix(int64(e.ClusterTime.T), 0).UTC()
	}
	return e, nil
}

func sameEvent(t *testing.T, raw bson.Raw) {
	t.Helper()
	want, werr, panicked := lookupNoPanic(raw)
	if panicked {
		// The driver's lookups panic on some malformed documents (an
		// array whose length is wrong); FromChange must not.
		_, _ = FromChange("src", 7, raw)
		return
	}
	got, gerr := FromChange("src", 7, raw)
	if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
		t.Fatalf("error: got %v, want %v (raw %x)", gerr, werr, []byte(raw))
	}
	if werr != nil {
		return
	}
	if got.ID != want.ID || got.Source != want.Source || got.Seq != want.Seq ||
		!bytes.Equal(got.Token, want.Token) || got.OperationType != want.OperationType ||
		got.DB != want.DB || got.Coll != want.Coll || !bytes.Equal(got.DocumentKey, want.DocumentKey) ||
		(got.DocumentKey == nil) != (want.DocumentKey == nil) ||
		got.ClusterTime != want.ClusterTime || !got.WallTime.Equal(want.WallTime) ||
		got.WallTime.Location() != want.WallTime.Location() || !bytes.Equal(got.Raw, want.Raw) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func lookupNoPanic(raw bson.Raw) (e *Event, err error, panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	e, err = fromChangeLookup("src", 7, raw)
	return e, err, false
}

func mustRaw(t testing.TB, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFromChangeMatchesLookups checks that the one-pass FromChange reads
// what one LookupErr per field reads: first occurrences, wrong types,
// missing fields, ns as an array, tokens without _data.
func TestFromChangeMatchesLookups(t *testing.T) {
	tok := bson.D{{Key: "_data", Value: "8266A1"}}
	ts := bson.Timestamp{T: 1772600767, I: 3}
	cases := []bson.D{
		{{Key: "_id", Value: tok}, {Key: "operationType", Value: "insert"},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "clusterTime", Value: ts},
			{Key: "wallTime", Value: bson.DateTime(1772600767123)}},
		// duplicates: the first occurrence wins
		{{Key: "operationType", Value: "update"}, {Key: "_id", Value: tok}, {Key: "operationType", Value: "delete"},
			{Key: "ns", Value: bson.D{{Key: "coll", Value: "c1"}, {Key: "db", Value: "d1"}, {Key: "db", Value: "d2"}}},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "other"}}}, {Key: "_id", Value: "x"}},
		// wrong types
		{{Key: "_id", Value: tok}, {Key: "operationType", Value: int32(1)}, {Key: "ns", Value: "shop.orders"},
			{Key: "documentKey", Value: "k"}, {Key: "clusterTime", Value: int64(5)}, {Key: "wallTime", Value: "now"}},
		{{Key: "_id", Value: tok}, {Key: "ns", Value: bson.A{"db", "coll"}}, {Key: "clusterTime", Value: ts}},
		{{Key: "_id", Value: tok}, {Key: "ns", Value: bson.D{{Key: "db", Value: int32(3)}, {Key: "coll", Value: ""}}}},
		// tokens without a _data string
		{{Key: "_id", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "operationType", Value: "drop"}},
		{{Key: "_id", Value: bson.D{{Key: "_data", Value: int32(1)}}}, {Key: "operationType", Value: "drop"}},
		{{Key: "_id", Value: bson.D{{Key: "_data", Value: ""}}}},
		// non-ASCII strings
		{{Key: "_id", Value: tok}, {Key: "operationType", Value: "insért"},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "bäse"}, {Key: "coll", Value: "a\x00"}}}},
		// errors
		{{Key: "operationType", Value: "insert"}},
		{{Key: "_id", Value: "token"}},
		{},
	}
	for _, d := range cases {
		sameEvent(t, mustRaw(t, d))
	}
	// Truncated and corrupted documents.
	full := mustRaw(t, cases[0])
	for i := 0; i < len(full); i++ {
		sameEvent(t, full[:i])
		c := bytes.Clone(full)
		c[i] ^= 0xff
		sameEvent(t, c)
	}
}

func FuzzFromChangeMatchesLookups(f *testing.F) {
	f.Add([]byte(benchChange(f)))
	f.Add([]byte(mustRaw(f, bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: "x"}}}, {Key: "ns", Value: bson.A{"a"}}})))
	f.Fuzz(func(t *testing.T, raw []byte) {
		sameEvent(t, raw)
	})
}

func TestOrderingKeyHash(t *testing.T) {
	evs := []*Event{
		{},
		{DB: "shop", Coll: "orders", DocumentKey: mustRaw(t, bson.D{{Key: "_id", Value: 1}})},
		{DB: "shop", Coll: "orders", DocumentKey: mustRaw(t, bson.D{{Key: "_id", Value: 2}})},
		{DB: "shop.orders", Coll: ""},
		{DB: "shop", Coll: "orders"},
		{DB: "bäse", Coll: "a\x00b", DocumentKey: bson.Raw{0xff, 0x00}},
	}
	for i, e := range evs {
		h := fnv.New64a()
		h.Write([]byte(e.OrderingKey()))
		if got, want := e.OrderingKeyHash(), fmix64(h.Sum64()); got != want {
			t.Errorf("%d: OrderingKeyHash %x, want fmix64(fnv-1a of OrderingKey) %x", i, got, want)
		}
		for j, o := range evs {
			if got, want := e.SameOrderingKey(o), e.OrderingKey() == o.OrderingKey(); got != want {
				t.Errorf("SameOrderingKey(%d, %d) = %v, want %v", i, j, got, want)
			}
		}
	}
}

// TestOrderingKeyHashSpreads checks that the hash spreads common document
// keys over partitions as random keys would: the router puts a key in
// partition hash % n (n is max_in_flight, or the adaptive ceiling, 10,000 by
// default), and a lane has at most one request in flight per partition. With
// FNV-1a alone, 8,500 sequential int32 _ids took 1,641 of 10,000 partitions
// and a lane allowed 2,048 requests kept about 1,000 in flight.
func TestOrderingKeyHashSpreads(t *testing.T) {
	const keys = 8500
	kinds := map[string]func(i int) any{
		"int32":  func(i int) any { return int32(i) },
		"int64":  func(i int) any { return int64(i) },
		"double": func(i int) any { return float64(i) },
		"string": func(i int) any { return fmt.Sprintf("order-%06d", i) },
		"objectid": func(i int) any {
			var o bson.ObjectID
			binary.BigEndian.PutUint32(o[:], 1795733864)
			binary.BigEndian.PutUint32(o[8:], uint32(i))
			return o
		},
	}
	for name, val := range kinds {
		hashes := make([]uint64, keys)
		for i := range hashes {
			e := &Event{DB: "bench", Coll: "orders", DocumentKey: mustRaw(t, bson.D{{Key: "_id", Value: val(i)}})}
			hashes[i] = e.OrderingKeyHash()
		}
		for _, n := range []int{10, 16, 100, 1000, 1024, 4096, 10000} {
			seen := make(map[uint64]bool, n)
			for _, h := range hashes {
				seen[h%uint64(n)] = true
			}
			// Random keys fill n(1-(1-1/n)^keys) partitions on average;
			// allow 5% below that (the spread of random keys is well
			// under 1% at these sizes).
			want := float64(n) * (1 - math.Pow(1-1/float64(n), keys))
			if got := float64(len(seen)); got < 0.95*want {
				t.Errorf("%s _ids 0..%d: %.0f of %d partitions used, random keys use %.0f", name, keys-1, got, n, want)
			}
		}
	}
}

// BenchmarkOrderingKey compares hashing the ordering key without building
// it (done once per event by the router) with building and hashing it.
func BenchmarkOrderingKey(b *testing.B) {
	e, err := FromChange("orders", 1, benchChange(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hash", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = e.OrderingKeyHash()
		}
	})
	b.Run("string+fnv", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h := fnv.New64a()
			h.Write([]byte(e.OrderingKey()))
			_ = h.Sum64()
		}
	})
}
