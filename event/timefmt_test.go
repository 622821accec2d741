package event

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestAppendRFC3339UTC compares the fast formatter with AppendFormat on
// edge cases and random instants of years 0 to 9999 (and beyond, where it
// defers to AppendFormat), for each layout the encoder uses.
func TestAppendRFC3339UTC(t *testing.T) {
	layouts := map[int]string{0: time.RFC3339, 3: rfc3339Milli, 9: time.RFC3339Nano}
	times := []time.Time{
		time.Unix(0, 0), time.Unix(0, 1), time.Unix(0, 100e6), time.Unix(0, 120e6), time.Unix(0, 999999999),
		time.Unix(1, 10), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 5e6, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 28, 7, 8, 9, 450e6, time.UTC),
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		sec := r.Int64N(253402300800+62167219200) - 62167219200 // years 0..9999
		ns := r.Int64N(1e9)
		switch r.IntN(4) {
		case 0:
			ns = ns / 1e6 * 1e6 // whole milliseconds, as BSON dates
		case 1:
			ns = 0
		}
		times = append(times, time.Unix(sec, ns))
	}
	for _, tm := range times {
		tm = tm.UTC()
		for digits, layout := range layouts {
			want := tm.AppendFormat([]byte("x"), layout)
			if got := appendRFC3339UTC([]byte("x"), tm, digits); string(got) != string(want) {
				t.Fatalf("%d digits, %v: got %s, want %s", digits, tm, got, want)
			}
		}
	}
}

func BenchmarkAppendRFC3339UTC(b *testing.B) {
	tm := time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC)
	buf := make([]byte, 0, 64)
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			buf = appendRFC3339UTC(buf[:0], tm, 3)
		}
	})
	b.Run("AppendFormat", func(b *testing.B) {
		for b.Loop() {
			buf = tm.AppendFormat(buf[:0], rfc3339Milli)
		}
	})
}
