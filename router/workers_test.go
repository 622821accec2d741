package router

import (
	"log/slog"
	"testing"

	"github.com/changegate/changegate/metrics"
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
