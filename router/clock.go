package router

import (
	"context"
	"time"
)

// clock is the time source of a lane's stages: waits for batches, backoff,
// Retry-After pauses, the parking watch and the re-drive. The engine uses
// the real clock; tests drive a lane with a fake one, so that interleavings
// are reproduced step by step instead of with sleeps.
type clock interface {
	Now() time.Time
	// After returns a channel that receives once d has elapsed (at once
	// when d <= 0), and a function that releases the timer early.
	After(d time.Duration) (<-chan time.Time, func())
}

// realClock is the system clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) After(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}

// sleep waits d on clk, or until ctx is done, and reports whether d elapsed.
func sleep(ctx context.Context, clk clock, d time.Duration) bool {
	c, stop := clk.After(d)
	defer stop()
	select {
	case <-c:
		return true
	case <-ctx.Done():
		return false
	}
}
