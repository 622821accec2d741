package limit

import (
	"testing"
	"time"
)

// fillRounds runs rounds of a batching sender against a receiver that
// takes latency per request: each round takes every slot the limiter
// grants, then every request completes with Fill share.
func fillRounds(t *testing.T, l *Limiter, clk *fakeClock, rounds int, latency time.Duration, share float64) {
	for range rounds {
		toks := fill(t, l)
		clk.Advance(latency)
		for _, tok := range toks {
			tok.Release(Outcome{Class: Success, Fill: share})
		}
	}
}

// TestBatchFillMovesTheLimit: a batching sender whose requests carry full
// batches (or leave events behind) grows the limit as any sender does;
// one whose requests are mostly partial is limited by what arrives, not by
// the limit, and more requests in flight would only split its events into
// smaller batches: below half full the limit shrinks, between half and
// nearly full it holds. Fill 0 (not measured) leaves the limit to latency.
func TestBatchFillMovesTheLimit(t *testing.T) {
	const latency = 20 * time.Millisecond
	start := func() (*Limiter, *fakeClock) {
		clk := newFakeClock()
		l := New(Config{Clock: clk, Max: 1000})
		fillRounds(t, l, clk, 6, latency, 1) // full batches: slow start to 1000
		if l.Current() != 1000 {
			t.Fatalf("full batches: limit %d after slow start, want 1000", l.Current())
		}
		return l, clk
	}

	l, clk := start()
	fillRounds(t, l, clk, 40, latency, 0.2)
	if got := l.Current(); got > 20 {
		t.Errorf("batches 20%% full for 40 windows: limit %d, want it shrunk by 0.9 a window (to below 20)", got)
	}
	// One window mixes the last sparse round with the next one.
	fillRounds(t, l, clk, 1, latency, 0.7)
	shrunk := l.Current()
	fillRounds(t, l, clk, 20, latency, 0.7)
	if got := l.Current(); got != shrunk {
		t.Errorf("batches 70%% full: limit moved from %d to %d, want it held", shrunk, got)
	}
	fillRounds(t, l, clk, 20, latency, 1)
	if got := l.Current(); got <= shrunk {
		t.Errorf("full batches again: limit %d, want it grown from %d", got, shrunk)
	}

	l, clk = start()
	fillRounds(t, l, clk, 40, latency, 0)
	if got := l.Current(); got != 1000 {
		t.Errorf("fill not measured: limit %d, want 1000 (latency is flat)", got)
	}
}

// TestSparseBatchesStopAtTwo: sparse batches shrink the limit to 2, not 1
// (fillFloor), unless max_in_flight_max is 1.
func TestSparseBatchesStopAtTwo(t *testing.T) {
	for _, tc := range []struct{ max, want int }{{1000, 2}, {1, 1}} {
		clk := newFakeClock()
		l := New(Config{Clock: clk, Max: tc.max})
		fillRounds(t, l, clk, 4, 10*time.Millisecond, 1)
		fillRounds(t, l, clk, 80, 10*time.Millisecond, 0.05)
		if got := l.Current(); got != tc.want {
			t.Errorf("max %d: limit %d after sparse batches, want %d", tc.max, got, tc.want)
		}
	}
}

// TestIncreaseStaysWithinMax: the additive increase (max(1, limit/32) a
// window) stops at max_in_flight_max; it overshot it by up to 1/32.
func TestIncreaseStaysWithinMax(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Max: 101})
	for i := 0; l.Current() < 101; i++ {
		if i == 40 {
			t.Fatalf("limit %d after 40 round trips, want 101", l.Current())
		}
		fillRounds(t, l, clk, 1, 10*time.Millisecond, 0)
	}
	fillRounds(t, l, clk, 1, 50*time.Millisecond, 0) // one slow window: ×0.9
	fillRounds(t, l, clk, 1, 10*time.Millisecond, 0)
	if got := l.Current(); got >= 101 {
		t.Fatalf("limit %d after a slow window, want it decreased", got)
	}
	for range 100 {
		fillRounds(t, l, clk, 1, 10*time.Millisecond, 0)
		if got := l.Current(); got > 101 {
			t.Fatalf("limit %d, above the max 101", got)
		}
	}
	if got := l.Current(); got != 101 {
		t.Errorf("limit %d after 100 flat round trips, want the max 101", got)
	}
}

// TestSlowStartAgainStopsAtHalfThePeak: a slow start from the lowest limit
// (after latency drove it there) ends at half the limit where the
// decreases began, and the limit grows additively from there; the first
// slow start has no such bound (bench scenario 6: four sinks on two busy
// cores swung between 2 and 512, each re-learning its latency at 1 while
// the others held the CPU).
func TestSlowStartAgainStopsAtHalfThePeak(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Max: 1000})
	const fast = 2 * time.Millisecond
	fillRounds(t, l, clk, 1, fast, 0) // the baseline
	for i := 0; l.Current() < 256; i++ {
		if i == 50 {
			t.Fatalf("limit %d after 50 fast round trips, want 256", l.Current())
		}
		fillRounds(t, l, clk, 1, fast, 0)
	}
	peak := l.Current()
	for i := 0; l.Current() > 1; i++ {
		if i == 200 {
			t.Fatalf("limit %d after 200 slow windows, want 1", l.Current())
		}
		fillRounds(t, l, clk, 1, 10*fast, 0)
		peak = max(peak, l.Current()) // the window that closes first still grows
	}
	// At 1 the higher latency is learned; slow start again, up to peak/2,
	// then the additive increase.
	for i := 0; l.Current() < peak/2; i++ {
		if i == 20 {
			t.Fatalf("limit %d 20 round trips into the second slow start, want %d", l.Current(), peak/2)
		}
		fillRounds(t, l, clk, 1, 10*fast, 0)
	}
	if got := l.Current(); got != peak/2 {
		t.Fatalf("second slow start ended at %d, want half the peak %d", got, peak/2)
	}
	for range 10 {
		prev := l.Current()
		fillRounds(t, l, clk, 1, 10*fast, 0)
		if got := l.Current(); got > prev+max(1, prev/32) {
			t.Fatalf("after the second slow start the limit went from %d to %d, want at most +%d a window", prev, got, max(1, prev/32))
		}
	}
}
