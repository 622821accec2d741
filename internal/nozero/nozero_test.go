package nozero

import "testing"

func TestBytes(t *testing.T) {
	for _, n := range []int{1, 7, 4096, 40 << 10, 3 << 20} {
		b := Bytes(n)
		if len(b) != 0 || cap(b) < n {
			t.Fatalf("Bytes(%d): len %d cap %d", n, len(b), cap(b))
		}
		// The whole capacity is writable and distinct from another call's.
		b = b[:cap(b)]
		for i := range b {
			b[i] = byte(i)
		}
		c := Bytes(n)[:n]
		for i := range c {
			c[i] = 0xff
		}
		for i := range b {
			if b[i] != byte(i) {
				t.Fatalf("Bytes(%d): byte %d changed by another buffer", n, i)
			}
		}
	}
	if b := Bytes(0); b != nil {
		t.Fatalf("Bytes(0) = %v", b)
	}
}

var sink []byte

func fill(b []byte, n int) []byte {
	for len(b) < n {
		b = append(b, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"...)
	}
	return b
}

func BenchmarkBytes(b *testing.B) {
	for range b.N {
		sink = fill(Bytes(1<<20), 1<<20)
	}
}

func BenchmarkMake(b *testing.B) {
	for range b.N {
		sink = fill(make([]byte, 0, 1<<20), 1<<20)
	}
}
