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
		q[i] = func() *item { it := newItem(ev); it.key = ev.OrderingKeyHash(); return it }()
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
			// The scratch set is empty again: the same keys once more
			// are cut at the same place.
			if got, want := p.distinctKeys(q), distinctKeysRef(q); got != want {
				t.Errorf("n=%d dup at %d, second time: got %d, want %d", n, dupAt, got, want)
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

// TestKeySetGenerations: the set is empty after reset, also when its
// generation counter wraps around, and finds what was added since.
func TestKeySetGenerations(t *testing.T) {
	var s keySet
	// Forced generations before reset (0: none), each round filling the
	// set: the wrap from 1<<32-1 must not revive the slots of generation 1.
	for round, gen := range []uint32{0, 0, 1<<32 - 2, 1<<32 - 1, 0, 0} {
		if gen != 0 {
			s.gen = gen
		}
		s.reset(20)
		for i := range 20 {
			if j := s.add(uint64(i)*1e9, i); j != -1 {
				t.Fatalf("round %d: key %d found at %d in an empty set", round, i, j)
			}
		}
		for i := range 20 {
			if j := s.add(uint64(i)*1e9, 99); j != i {
				t.Fatalf("round %d: key %d: got %d, want %d", round, i, j, i)
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
