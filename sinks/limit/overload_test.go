package limit

import (
	"testing"
	"time"
)

// A sign of overload outside a request's outcome (a slow, refused or reset
// connection attempt) lowers the adaptive limit at once, as back-pressure
// does, and holds the next increases below it; it does not open the
// circuit, however many come, and a sign older than the last decrease does
// not move the limit again.
func TestOverloadLowersTheLimitWithoutTheCircuit(t *testing.T) {
	clk := newFakeClock()
	l := warm(t, clk, Config{Max: 100}, 20)
	sent := clk.Now()
	clk.Advance(time.Second)
	l.Overload(sent)
	if got := l.Current(); got != 18 {
		t.Fatalf("limit %d after a sign of overload, want 18 (20 × 0.9)", got)
	}
	l.Overload(sent) // sent before the decrease: old news
	if got := l.Current(); got != 18 {
		t.Fatalf("limit %d after an old sign, want 18", got)
	}
	for range 10 {
		clk.Advance(time.Second)
		l.Overload(clk.Now())
	}
	if s := l.Status(); s.Circuit != CircuitClosed {
		t.Fatalf("circuit %s after signs of overload, want closed", s.Circuit)
	}
	if got := l.Current(); got >= 18 {
		t.Fatalf("limit %d after more signs, want it lower", got)
	}
}
