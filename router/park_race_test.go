package router

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/changegate/changegate/metrics"
)

// Parking and going live again concurrently: whatever the interleaving, a
// live lane has a usable delivery context.
func TestLaneParkAndGoLiveAreAtomic(t *testing.T) {
	l, err := newLane(SinkSpec{Sink: &fakeSink{name: "s"}}, newMemDL(), metrics.New(nil), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); l.stop() }()
	l.start(ctx)
	for i := 0; i < 20000; i++ {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); l.parkLane() }()
		go func() { defer wg.Done(); l.tryGoLive(ctx) }()
		wg.Wait()
		if !l.parked.Load() && l.live().Err() != nil {
			t.Fatalf("iteration %d: lane is live with a cancelled delivery context", i)
		}
		for l.parked.Load() {
			l.tryGoLive(ctx)
		}
	}
}
