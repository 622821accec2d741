package router

import "testing"

// distinctKeysRef is distinctKeys as first written: the ordering keys
// themselves, pairwise or in a map.
func distinctKeysRef(q []*item) int {
	seen := map[string]bool{}
	for i, it := range q {
		k := it.ev.OrderingKey()
		if seen[k] {
			return i
		}
		seen[k] = true
	}
	return len(q)
}

func keyItems(t testing.TB, docs []int) []*item {
	q := make([]*item, len(docs))
	for i, d := range docs {
		ev := posEvent(t, i, d)
		q[i] = &item{ev: ev, key: ev.OrderingKeyHash()}
	}
	return q
}

func TestDistinctKeys(t *testing.T) {
	p := &partition{}
	for _, n := range []int{1, 2, 5, 16, 17, 40, 100} {
		for dupAt := 0; dupAt <= n; dupAt += max(1, n/7) {
			docs := make([]int, n)
			for i := range docs {
				docs[i] = i
			}
			if dupAt > 0 && dupAt < n {
				docs[dupAt] = dupAt / 2 // a repeat of an earlier document
			}
			q := keyItems(t, docs)
			if got, want := p.distinctKeys(q), distinctKeysRef(q); got != want {
				t.Errorf("n=%d dup at %d: got %d, want %d", n, dupAt, got, want)
			}
			if len(p.seen) != 0 {
				t.Fatalf("scratch map not cleared")
			}
			// Colliding hashes of different keys must not cut the batch.
			for _, it := range q {
				it.key = 42
			}
			if got, want := p.distinctKeys(q), distinctKeysRef(q); got != want {
				t.Errorf("n=%d dup at %d, colliding hashes: got %d, want %d", n, dupAt, got, want)
			}
		}
	}
}

// BenchmarkDistinctKeys measures cutting a batch of 100 items of distinct
// documents (the batching hot path: once per batch taken).
func BenchmarkDistinctKeys(b *testing.B) {
	docs := make([]int, 100)
	for i := range docs {
		docs[i] = i
	}
	q := keyItems(b, docs)
	b.Run("hashes", func(b *testing.B) {
		p := &partition{}
		b.ReportAllocs()
		for b.Loop() {
			if p.distinctKeys(q) != len(q) {
				b.Fatal("cut")
			}
		}
	})
	b.Run("keys", func(b *testing.B) { // as before: a map of the key strings
		b.ReportAllocs()
		for b.Loop() {
			if distinctKeysSlow(q) != len(q) {
				b.Fatal("cut")
			}
		}
	})
}
