package router

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/limit"
)

// With max_in_flight = "auto" a lane runs enough workers for the limiter's
// ceiling, within the events that can be in flight, and fewer for a
// batching sink so that its batches still fill; a fixed max_in_flight is
// the worker count, and "strict" ordering one worker.
func TestLaneWorkers(t *testing.T) {
	tests := []struct {
		name  string
		spec  SinkSpec
		batch int
		want  int
	}{
		{"auto", SinkSpec{UseLimit: true, Limit: limit.Config{Max: 1024, Cap: 10000}}, 1, 1024},
		{"auto capped by events in flight", SinkSpec{UseLimit: true, Limit: limit.Config{Max: 1024, Cap: 50}}, 1, 50},
		{"auto batching", SinkSpec{UseLimit: true, Limit: limit.Config{Max: 1024, Cap: 10000}}, 100, 100},
		{"auto batching, small cap", SinkSpec{UseLimit: true, Limit: limit.Config{Max: 1024, Cap: 200}}, 100, 16},
		{"auto default max", SinkSpec{UseLimit: true}, 1, limit.DefaultMax},
		{"fixed", SinkSpec{UseLimit: true, MaxInFlight: 8}, 1, 8},
		{"no limiter stage", SinkSpec{MaxInFlight: 4}, 1, 4},
		{"strict", SinkSpec{UseLimit: true, Ordering: OrderStrict, Limit: limit.Config{Max: 1024, Cap: 10000}}, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := tt.spec
			sp.Sink = &fakeSink{name: "s", max: 1000}
			sp.BatchSize = tt.batch
			l, err := newLane(sp, nil, metrics.New(nil), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if got := len(l.q.parts); got != tt.want {
				t.Fatalf("workers = %d, want %d", got, tt.want)
			}
			if sp.UseLimit != (l.d.limit != nil) {
				t.Fatalf("limiter stage present = %v, want %v", l.d.limit != nil, sp.UseLimit)
			}
		})
	}
}

// TestLaneLimiterPauseCappedAtMaxInterval: a Retry-After longer than the
// retry policy's max_interval pauses the limiter stage for max_interval
// only, as it pauses the delivery stage (docs/delivery.md). The limiter
// used to keep its own 5m cap: a Lambda throttled with Retry-After: 1 held a
// sink with max_interval = "50ms" for a whole second, and its concurrency
// limit below the throttled one for ten.
func TestLaneLimiterPauseCappedAtMaxInterval(t *testing.T) {
	for _, fixed := range []int{0, 4} {
		sp := SinkSpec{
			Sink: &fakeSink{name: "s", max: 1}, UseLimit: true, MaxInFlight: fixed,
			Retry: sinks.RetryPolicy{MaxAttempts: 3, InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		}
		l, err := newLane(sp, nil, metrics.New(nil), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		a := l.d.limit.(adaptive)
		release, err := a.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		release(sinks.Retryable("throttled", time.Second, errors.New("429")))
		st := a.l.Status()
		if st.PausedUntil.IsZero() {
			t.Fatalf("max_in_flight %d: not paused after a Retry-After", fixed)
		}
		if d := st.PausedUntil.Sub(before); d > 50*time.Millisecond+10*time.Millisecond {
			t.Errorf("max_in_flight %d: paused for %v after Retry-After: 1s, want at most max_interval (50ms)", fixed, d)
		}
	}
}
