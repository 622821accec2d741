package limit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/sinks"
)

// waitFor polls cond until it holds or a real-time deadline passes: it
// waits for another goroutine to reach a state (e.g. blocked on a timer),
// never for virtual time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// acquireAsync starts Acquire in a goroutine; the result arrives on the
// channel.
func acquireAsync(ctx context.Context, l *Limiter) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		tok, err := l.Acquire(ctx)
		ch <- acquired{tok, err}
	}()
	return ch
}

type acquired struct {
	tok *Token
	err error
}

func mustAcquire(t *testing.T, l *Limiter) *Token {
	t.Helper()
	tok, ok := l.TryAcquire()
	if !ok {
		t.Fatalf("TryAcquire refused (status %+v)", l.Status())
	}
	return tok
}

func blocked(t *testing.T, ch <-chan acquired) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("Acquire returned (%v, %v), want it blocked", a.tok, a.err)
	default:
	}
}

func receive(t *testing.T, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire still blocked")
		return acquired{}
	}
}

// fill admits requests until the limit is reached.
func fill(t *testing.T, l *Limiter) []*Token {
	var toks []*Token
	for {
		tok, ok := l.TryAcquire()
		if !ok {
			return toks
		}
		toks = append(toks, tok)
	}
}

// warm returns a limiter that has left slow start at limit n with a 50ms
// baseline.
func warm(t *testing.T, clk *fakeClock, cfg Config, n int) *Limiter {
	t.Helper()
	cfg.Clock, cfg.Initial = clk, n
	l := New(cfg)
	tok := mustAcquire(t, l)
	clk.Advance(50 * time.Millisecond)
	tok.Release(Outcome{Class: Success})
	l.mu.Lock()
	l.slowStart = false
	l.mu.Unlock()
	return l
}

func TestAcquireBlocksAtTheLimitFIFO(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Fixed: 2})
	a, b := mustAcquire(t, l), mustAcquire(t, l)
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("a third request admitted with a limit of 2")
	}
	first := acquireAsync(context.Background(), l)
	waitFor(t, "the first waiter", func() bool { return l.Status().Waiting == 1 })
	second := acquireAsync(context.Background(), l)
	waitFor(t, "the second waiter", func() bool { return l.Status().Waiting == 2 })
	a.Release(Outcome{Class: Success})
	got := receive(t, first)
	blocked(t, second)
	a.Release(Outcome{Class: Success}) // a second release does nothing
	blocked(t, second)
	b.Release(Outcome{Class: Rejected})
	receive(t, second).tok.Release(Outcome{Class: Success})
	got.tok.Release(Outcome{Class: Abandoned})
	if s := l.Status(); s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("status %+v, want nothing in flight or waiting", s)
	}
}

func TestAcquireCancelled(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Fixed: 1})
	tok := mustAcquire(t, l)
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, l)
	waitFor(t, "the waiter", func() bool { return l.Status().Waiting == 1 })
	cancel()
	if a := receive(t, ch); !errors.Is(a.err, context.Canceled) || a.tok != nil {
		t.Fatalf("Acquire = (%v, %v), want context.Canceled", a.tok, a.err)
	}
	tok.Release(Outcome{Class: Success})
	if s := l.Status(); s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("status %+v, want nothing held", s)
	}
	if _, err := l.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context = %v", err)
	}
}

func TestBacksOffOnBackpressure(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"429", sinks.Retryable("http_429", 0, errors.New("429")), 90},
		{"503", sinks.Retryable("http_503", 0, errors.New("503")), 90},
		{"timeout", context.DeadlineExceeded, 90},
		{"transport", errors.New("connection refused"), 90},
		{"throttled batch entry", &sinks.BatchError{Failed: map[int]error{3: sinks.Retryable("throttled", 0, errors.New("slow down"))}}, 90},
		{"400 says nothing about load", sinks.Permanent("http_400", errors.New("400")), 100},
		{"malformed batch entry", &sinks.BatchError{Failed: map[int]error{0: sinks.Permanent("malformed", errors.New("bad"))}}, 100},
		{"cancelled", context.Canceled, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			l := warm(t, clk, Config{}, 100)
			toks := fill(t, l)
			clk.Advance(10 * time.Millisecond)
			for _, tok := range toks {
				tok.Release(OutcomeOf(tc.err))
			}
			// Once per window: all those outcomes move the limit once.
			if got := l.Current(); got != tc.want {
				t.Fatalf("limit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestDecreaseOncePerWindowAndOldNewsIgnored(t *testing.T) {
	clk := newFakeClock()
	l := warm(t, clk, Config{}, 100)
	old := fill(t, l)
	clk.Advance(60 * time.Millisecond)
	old[0].Release(Outcome{Class: Backpressure})
	if got := l.Current(); got != 90 {
		t.Fatalf("limit = %d, want 90", got)
	}
	// Sent before the decrease: even a window later, old news.
	clk.Advance(60 * time.Millisecond)
	old[1].Release(Outcome{Class: Backpressure})
	if got := l.Current(); got != 90 {
		t.Fatalf("limit = %d after old news, want 90", got)
	}
	for _, tok := range old[2:] {
		tok.Release(Outcome{Class: Success})
	}
	// A request sent after it, failing a window later, decreases again.
	tok := mustAcquire(t, l)
	clk.Advance(60 * time.Millisecond)
	tok.Release(Outcome{Class: Backpressure})
	if got := l.Current(); got != 81 {
		t.Fatalf("limit = %d, want 81", got)
	}
}

// After back-pressure at a limit, the limit grows back to just below it and
// probes it again only after 10× the cost of that back-pressure (here the
// 1s Retry-After pause).
func TestHoldsBelowTheLimitThatDrewBackpressure(t *testing.T) {
	clk := newFakeClock()
	l := warm(t, clk, Config{}, 100)
	toks := fill(t, l)
	clk.Advance(50 * time.Millisecond)
	refusedAt := clk.Now()
	for _, tok := range toks {
		tok.Release(Outcome{Class: Backpressure, RetryAfter: time.Second})
	}
	if got := l.Current(); got != 90 {
		t.Fatalf("limit = %d, want 90", got)
	}
	clk.Advance(time.Second) // the pause
	round := func() {
		toks := fill(t, l)
		clk.Advance(50 * time.Millisecond)
		for _, tok := range toks {
			tok.Release(Outcome{Class: Success})
		}
	}
	for clk.Now().Before(refusedAt.Add(10*time.Second - 100*time.Millisecond)) {
		round()
		if got := l.Current(); got >= 100 {
			t.Fatalf("limit = %d %s after the 429, want < 100 for 10s", got, clk.Now().Sub(refusedAt))
		}
	}
	if got := l.Current(); got != 99 {
		t.Fatalf("limit = %d before the hold ends, want 99", got)
	}
	for clk.Now().Before(refusedAt.Add(10*time.Second + 200*time.Millisecond)) {
		round()
	}
	if got := l.Current(); got < 101 {
		t.Fatalf("limit = %d after the hold, want it past 100 again", got)
	}
}

// A latency rise ends slow start with ×0.9, no higher than twice the last
// good limit after a ×4 step; back-pressure there returns to the last good
// limit.
func TestLeavingSlowStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		last Outcome
		rtt  time.Duration
		want int
	}{
		{"latency", Outcome{Class: Success}, 300 * time.Millisecond, 800}, // 1600 when judged: 2× the last good 400, not 1440
		{"backpressure", Outcome{Class: Backpressure}, 50 * time.Millisecond, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			l := New(Config{Clock: clk, Initial: 100})
			round := func(rtt time.Duration, o Outcome) {
				toks := fill(t, l)
				clk.Advance(rtt)
				for _, tok := range toks {
					tok.Release(o)
				}
			}
			round(50*time.Millisecond, Outcome{Class: Success}) // baseline 50ms
			round(50*time.Millisecond, Outcome{Class: Success}) // flat: x4
			if got := l.Current(); got != 400 {
				t.Fatalf("limit = %d in slow start, want 400", got)
			}
			round(tc.rtt, tc.last)
			if tc.last.Class == Success {
				// The slow round is judged two rounds later (x4 first).
				round(50*time.Millisecond, Outcome{Class: Success})
				round(50*time.Millisecond, Outcome{Class: Success})
			}
			if got := l.Current(); got != tc.want {
				t.Fatalf("limit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLatencyRiseDecreasesAndStableLatencyIncreases(t *testing.T) {
	clk := newFakeClock()
	l := warm(t, clk, Config{}, 100)
	round := func(rtt time.Duration) {
		toks := fill(t, l)
		clk.Advance(rtt)
		for _, tok := range toks {
			tok.Release(Outcome{Class: Success})
		}
	}
	// No demand (the limit was not reached): no increase.
	for i := 0; i < 3; i++ {
		tok := mustAcquire(t, l)
		clk.Advance(50 * time.Millisecond)
		tok.Release(Outcome{Class: Success})
	}
	if got := l.Current(); got != 100 {
		t.Fatalf("limit = %d without demand, want 100", got)
	}
	// A window is evaluated when the first outcome after its end arrives,
	// so a round's latency shows in the next round's verdict.
	for i, r := range []struct {
		rtt  time.Duration
		want int
	}{
		{50 * time.Millisecond, 103},  // demand, and the single requests at 50ms: +100/32
		{70 * time.Millisecond, 106},  // the 50ms round: +103/32
		{120 * time.Millisecond, 109}, // the 70ms round, within 2x + 2ms: +106/32
		{120 * time.Millisecond, 98},  // the previous 120ms round: x0.9
	} {
		round(r.rtt)
		if got := l.Current(); got != r.want {
			t.Fatalf("round %d (%s): limit = %d, want %d", i, r.rtt, got, r.want)
		}
	}
}

func TestBounds(t *testing.T) {
	clk := newFakeClock()
	l := warm(t, clk, Config{Min: 4, Max: 6, BreakerThreshold: 1000}, 5)
	for i := 0; i < 5; i++ {
		toks := fill(t, l)
		clk.Advance(50 * time.Millisecond)
		for _, tok := range toks {
			tok.Release(Outcome{Class: Success})
		}
	}
	if got := l.Current(); got != 6 {
		t.Fatalf("limit = %d, want max 6", got)
	}
	for i := 0; i < 5; i++ {
		toks := fill(t, l)
		clk.Advance(50 * time.Millisecond)
		for _, tok := range toks {
			tok.Release(Outcome{Class: Backpressure})
		}
	}
	if got := l.Current(); got != 4 {
		t.Fatalf("limit = %d, want min 4", got)
	}
	l.SetCap(2)
	if got := l.Current(); got != 2 {
		t.Fatalf("limit = %d with cap 2, want 2 (the cap beats the min)", got)
	}

	fixed := New(Config{Clock: clk, Fixed: 7, Cap: 5})
	if got := fixed.Current(); got != 5 {
		t.Fatalf("fixed 7 with cap 5: limit = %d", got)
	}
	fixed.SetCap(0)
	toks := fill(t, fixed)
	clk.Advance(time.Second)
	for _, tok := range toks {
		tok.Release(Outcome{Class: Backpressure})
	}
	if got := fixed.Current(); got != 7 {
		t.Fatalf("fixed limit moved to %d", got)
	}
}

func TestOnChangeNotable(t *testing.T) {
	clk := newFakeClock()
	var changes []Change
	l := New(Config{Clock: clk, OnChange: func(c Change) { changes = append(changes, c) }})
	simulate(t, l, clk, receiver{latency: 50 * time.Millisecond}, time.Second, 0)
	var notable []string
	for _, c := range changes {
		if c.Notable {
			notable = append(notable, fmt.Sprintf("%d->%d", c.From, c.To))
		}
	}
	// Slow start quadruples against a flat latency: every step is notable.
	want := "[1->4 4->16 16->64 64->256 256->1024]"
	if got := fmt.Sprint(notable); got != want {
		t.Fatalf("notable changes %s, want %s", got, want)
	}
}

func TestPauseUntil(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk})
	l.PauseUntil(clk.Now().Add(2 * time.Second))
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("admitted while paused")
	}
	ch := acquireAsync(context.Background(), l)
	waitFor(t, "the waiter's timer", func() bool { return clk.Timers() == 1 })
	// A shorter pause does not shorten it; a longer one wakes the waiter,
	// which sets a new timer.
	l.PauseUntil(clk.Now().Add(time.Second))
	l.PauseUntil(clk.Now().Add(3 * time.Second))
	waitFor(t, "the waiter's second timer", func() bool { return clk.Timers() == 2 })
	clk.Advance(2 * time.Second)
	blocked(t, ch)
	if s := l.Status(); !s.PausedUntil.Equal(clk.Now().Add(time.Second)) {
		t.Fatalf("status %+v", s)
	}
	clk.Advance(time.Second)
	a := receive(t, ch)
	// Retry-After on an outcome pauses the sink, capped at MaxPause.
	a.tok.Release(Outcome{Class: Backpressure, RetryAfter: time.Hour})
	if s := l.Status(); !s.PausedUntil.Equal(clk.Now().Add(DefaultMaxPause)) {
		t.Fatalf("paused until %v, want now + %v", s.PausedUntil, DefaultMaxPause)
	}
}

func TestCircuitBreaker(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Fixed: 20, BreakerThreshold: 3, BreakerCooldown: time.Second, BreakerMaxCooldown: 3 * time.Second})
	fail := func(n int) {
		for i := 0; i < n; i++ {
			tok := mustAcquire(t, l)
			clk.Advance(time.Millisecond)
			tok.Release(Outcome{Class: Backpressure})
		}
	}
	// The first failure starts the streak; requests in flight then do not
	// count.
	inFlight := fill(t, l)
	clk.Advance(time.Millisecond)
	for _, tok := range inFlight {
		tok.Release(Outcome{Class: Backpressure})
	}
	if s := l.Status(); s.Circuit != CircuitClosed {
		t.Fatalf("circuit %s after a burst of old failures, want closed", s.Circuit)
	}
	fail(2)
	if s := l.Status(); s.Circuit != CircuitClosed {
		t.Fatalf("circuit %s after 2 failures, want closed", s.Circuit)
	}
	fail(1)
	s := l.Status()
	if s.Circuit != CircuitOpen || !s.OpenUntil.Equal(clk.Now().Add(time.Second)) {
		t.Fatalf("status %+v, want open for 1s", s)
	}
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("admitted while open")
	}
	ch1 := acquireAsync(context.Background(), l)
	waitFor(t, "a waiter", func() bool { return clk.Timers() == 1 })
	ch2 := acquireAsync(context.Background(), l)
	waitFor(t, "two waiters", func() bool { return clk.Timers() == 2 })
	clk.Advance(time.Second)
	// Half-open: exactly one probe.
	var probe acquired
	var other <-chan acquired
	select {
	case probe = <-ch1:
		other = ch2
	case probe = <-ch2:
		other = ch1
	case <-time.After(5 * time.Second):
		t.Fatal("no probe let through")
	}
	blocked(t, other)
	if s := l.Status(); s.Circuit != CircuitHalfOpen {
		t.Fatalf("circuit %s, want half-open", s.Circuit)
	}
	// The probe fails: open again, for twice as long.
	probe.tok.Release(Outcome{Class: Backpressure})
	if s := l.Status(); s.Circuit != CircuitOpen || !s.OpenUntil.Equal(clk.Now().Add(2*time.Second)) {
		t.Fatalf("status %+v, want open for 2s", s)
	}
	waitFor(t, "the waiter's new timer", func() bool { return clk.Timers() >= 1 })
	clk.Advance(2 * time.Second)
	probe = receive(t, other)
	probe.tok.Release(Outcome{Class: Backpressure}) // capped at 3s
	if s := l.Status(); !s.OpenUntil.Equal(clk.Now().Add(3 * time.Second)) {
		t.Fatalf("status %+v, want open for 3s (the cap)", s)
	}
	clk.Advance(3 * time.Second)
	probe1 := mustAcquire(t, l)
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("a second request admitted while half-open")
	}
	// An abandoned probe lets another one through.
	probe1.Release(Outcome{Class: Abandoned})
	probe2 := mustAcquire(t, l)
	// A successful probe closes the circuit and resets the cool-down.
	probe2.Release(Outcome{Class: Success})
	if s := l.Status(); s.Circuit != CircuitClosed {
		t.Fatalf("circuit %s after a successful probe, want closed", s.Circuit)
	}
	if toks := fill(t, l); len(toks) != 20 {
		t.Fatalf("%d admitted after closing, want 20", len(toks))
	}
}

func TestRateLimit(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Fixed: 100, Rate: 10, Burst: 2})
	for i := 0; i < 2; i++ {
		mustAcquire(t, l).Release(Outcome{Class: Success})
	}
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("admitted beyond the burst")
	}
	ch := acquireAsync(context.Background(), l)
	waitFor(t, "the rate timer", func() bool { return clk.Timers() == 1 })
	if s := l.Status(); s.InFlight != 1 {
		t.Fatalf("in flight %d while waiting for the rate, want 1 (the slot is held)", s.InFlight)
	}
	clk.Advance(99 * time.Millisecond)
	blocked(t, ch)
	clk.Advance(time.Millisecond)
	receive(t, ch).tok.Release(Outcome{Class: Success})

	// Cancelled while waiting for the rate: the slot and the token go back.
	ctx, cancel := context.WithCancel(context.Background())
	ch = acquireAsync(ctx, l)
	waitFor(t, "the rate timer", func() bool { return clk.Timers() == 1 })
	cancel()
	if a := receive(t, ch); !errors.Is(a.err, context.Canceled) {
		t.Fatalf("err = %v", a.err)
	}
	if s := l.Status(); s.InFlight != 0 {
		t.Fatalf("in flight %d after cancel", s.InFlight)
	}
	clk.Advance(100 * time.Millisecond)
	mustAcquire(t, l)

	if got := New(Config{Rate: 500}).bucket.Burst(); got != 500 {
		t.Errorf("default burst of 500/s = %d", got)
	}
	if got := New(Config{Rate: 0.5}).bucket.Burst(); got != 1 {
		t.Errorf("default burst of 30/m = %d", got)
	}
}

// Many goroutines against a limiter: never more in flight than the limit;
// run with -race.
func TestConcurrentUse(t *testing.T) {
	l := New(Config{Max: 8, BreakerThreshold: 2, BreakerCooldown: time.Millisecond, BreakerMaxCooldown: 2 * time.Millisecond})
	var mu sync.Mutex
	in, peak := 0, 0
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				tok, err := l.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				in++
				peak = max(peak, in)
				mu.Unlock()
				_ = l.Current()
				_ = l.Status()
				mu.Lock()
				in--
				mu.Unlock()
				class := Success
				if i%50 == 49 {
					class = Backpressure
				}
				tok.Release(Outcome{Class: class})
			}
		}()
	}
	wg.Wait()
	if peak > 8 {
		t.Fatalf("peak in flight %d, want <= max 8", peak)
	}
	if s := l.Status(); s.InFlight != 0 || s.Waiting != 0 {
		t.Fatalf("status %+v", s)
	}
}

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  string
	}{
		{in: "500/s", want: 500},
		{in: " 30000 / m ", want: 500},
		{in: "60/m", want: 1},
		{in: "3600/h", want: 1},
		{in: "10/100ms", want: 100},
		{in: "1/2s", want: 0.5},
		{in: "1/1m30s", want: 1.0 / 90},
		{in: "fast", err: `"fast" is not a rate like "500/s"`},
		{in: "", err: `"" is not a rate like "500/s"`},
		{in: "500", err: `"500" is not a rate like "500/s"`},
		{in: "/s", err: `"/s" is not a rate like "500/s"`},
		{in: "x/s", err: `"x/s" is not a rate like "500/s"`},
		{in: "0/s", err: `"0/s": the count must be at least 1`},
		{in: "-5/s", err: `"-5/s": the count must be at least 1`},
		{in: "0.5/s", err: `"0.5/s": the count must be a whole number (write "1/2s" rather than "0.5/s")`},
		{in: "5/0s", err: `"5/0s": the period must be positive`},
		{in: "5/-1s", err: `"5/-1s": the period must be positive`},
		{in: "5/sec", err: `"5/sec" is not a rate like "500/s" (the period is s, m, h or a duration like "100ms")`},
		{in: "5/d", err: `"5/d" is not a rate like "500/s" (the period is s, m, h or a duration like "100ms")`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRate(tc.in)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("ParseRate(%q) = %v, %v; want error %s", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("ParseRate(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestOutcomeOfRetryAfter(t *testing.T) {
	o := OutcomeOf(sinks.Retryable("http_429", 3*time.Second, fmt.Errorf("status %d", http.StatusTooManyRequests)))
	if o != (Outcome{Class: Backpressure, RetryAfter: 3 * time.Second}) {
		t.Fatalf("OutcomeOf(429, Retry-After 3s) = %+v", o)
	}
	be := &sinks.BatchError{Failed: map[int]error{
		0: sinks.Permanent("malformed", errors.New("bad")),
		1: sinks.Retryable("throttled", time.Second, errors.New("slow")),
		2: sinks.Retryable("throttled", 2*time.Second, errors.New("slow")),
	}}
	if o := OutcomeOf(be); o != (Outcome{Class: Backpressure, RetryAfter: 2 * time.Second}) {
		t.Fatalf("OutcomeOf(batch) = %+v", o)
	}
	if o := OutcomeOf(nil); o.Class != Success {
		t.Fatalf("OutcomeOf(nil) = %+v", o)
	}
}

// By default an open circuit probes at least every 10 s however long the
// receiver has been down (it was a minute): a recovered receiver is seen
// within 10 s.
func TestCircuitDefaultCeiling(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Fixed: 4, BreakerThreshold: 1})
	tok := mustAcquire(t, l)
	clk.Advance(time.Millisecond)
	tok.Release(Outcome{Class: Backpressure})
	tok = mustAcquire(t, l)
	clk.Advance(time.Millisecond)
	tok.Release(Outcome{Class: Backpressure})
	var longest time.Duration
	for range 10 { // ten failed probes: 1s, 2s, 4s, 8s, then the ceiling
		s := l.Status()
		if s.Circuit != CircuitOpen {
			t.Fatalf("circuit %s, want open", s.Circuit)
		}
		wait := s.OpenUntil.Sub(clk.Now())
		longest = max(longest, wait)
		clk.Advance(wait)
		probe, ok := l.TryAcquire()
		if !ok {
			t.Fatal("no probe after the cooldown")
		}
		probe.Release(Outcome{Class: Backpressure})
	}
	if longest != 10*time.Second {
		t.Fatalf("longest cooldown %v, want the default ceiling 10s", longest)
	}
}
