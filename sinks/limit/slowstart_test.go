package limit

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSlowStartStepsEveryRoundTrip: in slow start the limit steps up once
// per round trip of the receiver (×4: the latency is flat), also when the
// round trips jitter. All of
// a window's requests complete together, one round trip after they were
// sent; with the window exactly one smoothed RTT long, half of those bursts
// landed just before the window's end and the doubling waited for the next
// burst: against a receiver answering in 1 s ±2%, 2048 took about 17 s
// instead of 11 (bench scenario 10 at 1 s, the limit sampled every second:
// 1 1 2 2 4 4 8 16 …).
func TestSlowStartStepsEveryRoundTrip(t *testing.T) {
	for _, latency := range []time.Duration{200 * time.Millisecond, time.Second} {
		t.Run(latency.String(), func(t *testing.T) {
			clk := newFakeClock()
			l := New(Config{Clock: clk, Max: 10000})
			r := rand.New(rand.NewPCG(7, 9))
			start := clk.Now()
			// Bursts: take every slot the limiter grants, then all of them
			// complete after one jittered round trip.
			for l.Current() < 8192 && clk.Now().Sub(start) < 40*latency {
				toks := fill(t, l)
				jitter := time.Duration((r.Float64()*0.04 - 0.02) * float64(latency))
				clk.Advance(latency + jitter)
				for _, tok := range toks {
					tok.Release(Outcome{Class: Success})
				}
			}
			took := clk.Now().Sub(start)
			// From 1, 8,192 is 7 steps of ×4 after the round trip that
			// sets the baseline: allow 9 round trips (doubling took 14).
			if l.Current() < 8192 || took > 9*latency {
				t.Fatalf("limit %d after %s (%.1f round trips), want >= 8192 within 9", l.Current(), took.Round(time.Millisecond), took.Seconds()/latency.Seconds())
			}
			t.Logf("limit %d after %s", l.Current(), took.Round(time.Millisecond))
		})
	}
}
