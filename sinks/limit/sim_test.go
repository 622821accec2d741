package limit

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	return ch
}

// Advance moves the clock and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			keep = append(keep, t)
			continue
		}
		t.ch <- c.now
	}
	c.timers = keep
}

// Timers returns the number of pending timers.
func (c *fakeClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// receiver is a queueing model of a destination: servers requests are
// served at once, each for latency; up to queue more wait in FIFO order
// (their RTT grows); beyond that a request is refused after refuseAfter
// with back-pressure (a 429) and the given Retry-After. servers == 0 means
// unlimited.
type receiver struct {
	latency     time.Duration
	servers     int
	queue       int
	refuseAfter time.Duration
	retryAfter  time.Duration
}

type pending struct {
	tok  *Token
	done time.Time
}

// simResult is what a simulation observed.
type simResult struct {
	served, refused         int // over the whole run
	servedLate, refusedLate int // after the warm-up
	limits                  []int
	maxLimit                int
}

func (r simResult) meanLimit() float64 {
	sum := 0
	for _, n := range r.limits {
		sum += n
	}
	return float64(sum) / float64(len(r.limits))
}

// simulate drives l against rcv with unbounded demand for d of virtual
// time; statistics marked late are counted after warmup. It records the
// limit every 10ms of the late part. Deterministic, single goroutine.
func simulate(t *testing.T, l *Limiter, clk *fakeClock, rcv receiver, d, warmup time.Duration) simResult {
	t.Helper()
	var res simResult
	start := clk.Now()
	end, late := start.Add(d), start.Add(warmup)
	// Served requests finish in FIFO order (fixed latency, FIFO queue);
	// refused ones too: two monotonic queues.
	var served, refused []pending
	var doneAt []time.Time // done times of the admitted requests, in order
	nextSample := late
	for clk.Now().Before(end) {
		now := clk.Now()
		for {
			tok, ok := l.TryAcquire()
			if !ok {
				break
			}
			inSystem := len(served)
			switch {
			case rcv.servers == 0:
				served = append(served, pending{tok, now.Add(rcv.latency)})
			case inSystem >= rcv.servers+rcv.queue:
				refused = append(refused, pending{tok, now.Add(rcv.refuseAfter)})
			default:
				startAt := now
				if n := len(doneAt); n >= rcv.servers && doneAt[n-rcv.servers].After(startAt) {
					startAt = doneAt[n-rcv.servers]
				}
				doneAt = append(doneAt, startAt.Add(rcv.latency))
				if len(doneAt) > 4*rcv.servers+4*rcv.queue+16 {
					doneAt = append([]time.Time(nil), doneAt[len(doneAt)-rcv.servers:]...)
				}
				served = append(served, pending{tok, doneAt[len(doneAt)-1]})
			}
		}
		next := end
		if len(served) > 0 && served[0].done.Before(next) {
			next = served[0].done
		}
		if len(refused) > 0 && refused[0].done.Before(next) {
			next = refused[0].done
		}
		if len(served) == 0 && len(refused) == 0 {
			next = now.Add(time.Millisecond) // paused or circuit open
		}
		if !nextSample.After(now) && nextSample.Before(end) {
			res.limits = append(res.limits, l.Current())
			nextSample = nextSample.Add(10 * time.Millisecond)
		}
		if nextSample.After(now) && nextSample.Before(next) {
			next = nextSample
		}
		if next.After(now) {
			clk.Advance(next.Sub(now))
		}
		now = clk.Now()
		isLate := !now.Before(late)
		for len(served) > 0 && !served[0].done.After(now) {
			served[0].tok.Release(Outcome{Class: Success})
			served = served[1:]
			res.served++
			if isLate {
				res.servedLate++
			}
		}
		for len(refused) > 0 && !refused[0].done.After(now) {
			refused[0].tok.Release(Outcome{Class: Backpressure, RetryAfter: rcv.retryAfter})
			refused = refused[1:]
			res.refused++
			if isLate {
				res.refusedLate++
			}
		}
		res.maxLimit = max(res.maxLimit, l.Current())
	}
	return res
}

func TestConvergesUpAgainstHealthyReceiver(t *testing.T) {
	for _, latency := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			clk := newFakeClock()
			l := New(Config{Clock: clk})
			rcv := receiver{latency: latency}
			// Slow start: hundreds within a second of virtual time.
			first := simulate(t, l, clk, rcv, 20*latency, 0)
			if l.Current() < 512 {
				t.Fatalf("after %s the limit is %d, want >= 512 (slow start)", 20*latency, l.Current())
			}
			res := simulate(t, l, clk, rcv, 5*time.Second, time.Second)
			if l.Current() != DefaultMax {
				t.Errorf("limit = %d, want the max %d", l.Current(), DefaultMax)
			}
			rate := float64(res.servedLate) / 4
			best := float64(DefaultMax) / latency.Seconds()
			if rate < 0.9*best {
				t.Errorf("throughput %.0f/s, want >= 90%% of %.0f/s", rate, best)
			}
			if first.refused+res.refused != 0 {
				t.Errorf("%d refused", first.refused+res.refused)
			}
		})
	}
}

func TestRespectsCapAndMax(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk, Max: 200, Cap: 5000})
	simulate(t, l, clk, receiver{latency: 50 * time.Millisecond}, 3*time.Second, 0)
	if got := l.Current(); got != 200 {
		t.Fatalf("limit = %d, want max 200", got)
	}
	l.SetCap(64)
	res := simulate(t, l, clk, receiver{latency: 50 * time.Millisecond}, 3*time.Second, 0)
	if got := l.Current(); got != 64 || res.maxLimit != 64 {
		t.Fatalf("limit = %d (max seen %d), want the cap 64", got, res.maxLimit)
	}
	l.SetCap(0)
	simulate(t, l, clk, receiver{latency: 50 * time.Millisecond}, 3*time.Second, 0)
	if got := l.Current(); got != 200 {
		t.Fatalf("limit = %d after the cap was lifted, want 200", got)
	}
}

// A receiver that serves 32 at once and answers 429 beyond: the limit
// settles around 32, and few requests are refused once it has.
func TestConvergesToSlotLimitedReceiver(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration
	}{
		{"no Retry-After", 0},
		{"Retry-After 1s", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			l := New(Config{Clock: clk})
			rcv := receiver{latency: 50 * time.Millisecond, servers: 32, refuseAfter: time.Millisecond, retryAfter: tc.retryAfter}
			res := simulate(t, l, clk, rcv, 60*time.Second, 5*time.Second)
			mean := res.meanLimit()
			t.Logf("mean limit %.1f, served %d, refused %d (late: %d / %d)", mean, res.served, res.refused, res.servedLate, res.refusedLate)
			if mean < 24 || mean > 40 {
				t.Errorf("mean limit %.1f, want near 32", mean)
			}
			for _, n := range res.limits {
				if n < 16 || n > 64 {
					t.Fatalf("limit %d after the warm-up, want within 16..64", n)
				}
			}
			if frac := float64(res.refusedLate) / float64(res.servedLate+res.refusedLate); frac >= 0.05 {
				t.Errorf("%.1f%% of requests refused after 5s, want < 5%%", 100*frac)
			}
			// Each Retry-After idles the sink: probing above the slots
			// must be rare enough to keep most of the capacity busy.
			if rate, capacity := float64(res.servedLate)/55, 32/0.05; rate < 0.85*capacity {
				t.Errorf("throughput %.0f/s after 5s, want >= 85%% of the capacity %.0f/s", rate, capacity)
			}
		})
	}
}

// A receiver with 64 servers and an unbounded queue never refuses, but its
// latency grows with the queue: the limit stops where the latency is about
// twice the baseline, about twice its capacity in flight (the tolerance
// that lets a busy sender's own latency pass).
func TestBacksOffOnRisingLatency(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk})
	rcv := receiver{latency: 50 * time.Millisecond, servers: 64, queue: 1 << 30}
	res := simulate(t, l, clk, rcv, 30*time.Second, 5*time.Second)
	mean := res.meanLimit()
	rate := float64(res.servedLate) / 25
	t.Logf("mean limit %.1f, %.0f/s", mean, rate)
	if mean < 60 || mean > 160 {
		t.Errorf("mean limit %.1f, want between the capacity 64 and 2.5 times it", mean)
	}
	if best := 64 / 0.05; rate < 0.9*best {
		t.Errorf("throughput %.0f/s, want >= 90%% of %.0f/s", rate, best)
	}
}

// A receiver that becomes slower for good (50ms to 200ms): the limit backs
// off, re-learns the baseline at the minimum and grows back to the max.
func TestRelearnsBaselineAfterLatencyShift(t *testing.T) {
	clk := newFakeClock()
	l := New(Config{Clock: clk})
	simulate(t, l, clk, receiver{latency: 50 * time.Millisecond}, 3*time.Second, 0)
	if got := l.Current(); got != DefaultMax {
		t.Fatalf("limit = %d, want %d", got, DefaultMax)
	}
	res := simulate(t, l, clk, receiver{latency: 200 * time.Millisecond}, 30*time.Second, 25*time.Second)
	best := DefaultMax * 5 * 5 // 5s at 1024 in flight, 200ms each
	if got := l.Current(); got != DefaultMax || res.servedLate < best*8/10 {
		t.Fatalf("limit = %d, %d served in the last 5s; want %d and >= 80%% of %d", got, res.servedLate, DefaultMax, best)
	}
	if s := l.Status(); s.BaseRTT != 200*time.Millisecond {
		t.Fatalf("baseline %s, want 200ms", s.BaseRTT)
	}
}
