// Package limit paces a sink's requests. Its concurrency limit is AIMD on latency, after Vector's ARC:
// once per window (one smoothed RTT), a window that filled the limit with a mean RTT within 2× the
// baseline (the minimum seen) + min(baseline, 2 ms) adds max(1, limit/32), or in slow start doubles it (quadruples it
// while the latency stays within an eighth of the baseline); back-pressure (429,
// 503, timeout, transport error) or a higher RTT multiplies it by 0.9 (in slow start, back-pressure returns to the
// limit before the last step and a latency rise cuts to at most twice it), within
// [min, max] and the source's cap. Retry-After pauses the sink; 5 failures in a row open a circuit. The
// limit that drew back-pressure is not tried again for 10× what that cost (the pause, or one window).
// A batching sender also reports how full each request was (Outcome.Fill): a window of mostly partial
// batches does not grow the limit, and one of batches less than half full multiplies it by 0.9, down to 2.
// A slow start again from the lowest limit ends at half the limit where the last decreases began (TCP's
// ssthresh), then the limit grows additively.
package limit

import (
	"container/list"
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Clock tells the time and makes timers. Tests inject a fake one.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// SystemClock returns the wall clock.
func SystemClock() Clock { return systemClock{} }

// Class is what the outcome of a request says about the receiver's load.
type Class int

const (
	// Success: the receiver accepted the request. Its latency is an RTT
	// sample.
	Success Class = iota
	// Backpressure: the receiver is overloaded or unreachable (429, 503,
	// a timeout, a transport error). It shrinks the limit and counts
	// towards opening the circuit.
	Backpressure
	// Rejected: the receiver answered but refused the request for a reason
	// that says nothing about load (400, 401, 413 ...). It neither moves the
	// limit nor counts as back-pressure, and proves the receiver is up.
	Rejected
	// Abandoned: the attempt ended without an answer for a reason on our
	// side (shutdown, the caller's context). It only frees the slot.
	Abandoned
)

// Outcome is how a request ended.
type Outcome struct {
	Class Class
	// RetryAfter, when positive, pauses every new request of the sink for
	// that long (see [Limiter.PauseUntil]); capped at Config.MaxPause.
	RetryAfter time.Duration
	// Fill is how full a batching sink's request was, in (0, 1]: the
	// events it carried ÷ the batch size, or 1 when the sender had more
	// to send than it took. 0: not measured (a sink that sends one event
	// per request, a retry). A successful window whose requests were
	// mostly partial says the limit is not what holds the sender back
	// (see fillGrow and fillShrink).
	Fill float64
}

// Defaults of Config.
const (
	DefaultMin              = 1
	DefaultMax              = 1024
	DefaultBreakerThreshold = 5
	DefaultBreakerCooldown  = time.Second
	DefaultBreakerMaxCool   = 10 * time.Second
	DefaultMaxPause         = 5 * time.Minute

	// rttTolerance and rttSlack define "near the baseline": a window whose
	// mean RTT exceeds base*rttTolerance + min(base, rttSlack) shrinks the
	// limit. 2× tolerates the latency a busy sender adds itself (measured
	// on 2 cores: at 50 ms a fixed 1024 in flight ran at 1.7× the
	// receiver's latency and delivered 2.5× what the limit reached with
	// 1.5×), while a receiver that queues still stops the growth at about
	// twice its capacity in flight. The slack keeps scheduling noise from
	// reading as congestion; relative below 2 ms, so that a sub-millisecond
	// receiver is not driven to 5× its latency (which cost a third of the
	// throughput of a zero-latency receiver in CPU per event).
	rttTolerance = 2.0
	rttSlack     = 2 * time.Millisecond
	// decrease is the multiplicative decrease. 0.9 (Vector's default)
	// rather than TCP's 0.5: with +1 per window, halving a limit of 1000
	// takes 500 windows to win back, and against a receiver with a hard
	// slot count a 0.9 sawtooth keeps ~95% of its capacity busy instead of
	// ~75%. Leaving slow start halves: the previous window's limit was the
	// last one known to be good.
	decrease = 0.9
	// minWindow bounds the adjustment window from below so that fast
	// receivers still give each decision a few samples.
	minWindow = 10 * time.Millisecond
	// srttAlpha weighs a new window mean in the smoothed RTT.
	srttAlpha = 0.4
	// holdFactor: after back-pressure at a limit, the limit grows back to
	// just below it and stays there for holdFactor times what the
	// back-pressure cost (its Retry-After pause, at least one window)
	// before it probes that limit again. Without it, +1 per window against
	// a receiver with a hard slot count re-draws a 429 every few windows,
	// and each Retry-After: 1 idles the sink for a second: a 32-slot
	// receiver taking 50 ms per request then got a fifth of its capacity.
	holdFactor = 10
	// fillGrow and fillShrink: a window whose successful batch requests
	// carried on average less than fillGrow of a full batch does not
	// grow the limit, and less than fillShrink shrinks it by decrease. A
	// batching sink whose requests leave nothing behind is limited by
	// what arrives, not by the limit; more requests in flight only split
	// the same events into more, smaller requests, each with its own
	// cost (bench scenario 5, 2 cores, batch 100: 29-60 events per
	// request and 12-14 µs of CPU per event at the limit latency alone
	// chose; 97-99 and 8.8-9.1 µs, and a fifth more throughput, at a fixed
	// 2 in flight). Between the two the limit
	// holds, so that it does not see-saw. TCP's congestion window
	// validation (RFC 7661) holds the window of an application-limited
	// sender in the same way.
	fillGrow   = 0.95
	fillShrink = 0.5
	// fillFloor is the lowest limit sparse batches shrink to (within
	// Min..Max): a second request keeps the next batch going out while
	// one is in flight, and one slow request does not hold every other
	// event of the sink back until it ends.
	fillFloor = 2
)

// Config configures a Limiter. Zero fields take the defaults.
type Config struct {
	// Fixed, when positive, is a fixed concurrency limit (max_in_flight =
	// N): no adaptation. Pauses, the circuit and the rate still apply.
	Fixed int
	// Min and Max bound the adaptive limit (defaults 1 and 1024).
	Min, Max int
	// Initial is the starting adaptive limit (default Min).
	Initial int
	// Cap is an external cap on the limit, e.g. the source's
	// max_in_flight_events (0: none). See [Limiter.SetCap].
	Cap int
	// Rate, when positive, is a token bucket in requests per second that
	// every request waits for after taking its concurrency slot.
	Rate float64
	// Burst is the bucket size (default DefaultBurst(Rate)).
	Burst int
	// BreakerThreshold opens the circuit after that many back-pressure
	// outcomes without a success in between, counting only requests sent
	// after the first failure of the streak (default 5, as gobreaker's):
	// requests already in flight when trouble began, such as a slow-start
	// overshoot refused in one burst, are the limit's business, while
	// requests that keep failing after it backed off mean an outage.
	BreakerThreshold int
	// BreakerCooldown is how long the circuit first stays open (default
	// 1s); it doubles with every failed probe up to BreakerMaxCooldown
	// (default 10s: a receiver that recovered is seen within it; it was
	// 1m, and one chaos run re-delivered 1,520 changes while a recovered
	// receiver waited for the probe).
	BreakerCooldown, BreakerMaxCooldown time.Duration
	// MaxPause caps a single Retry-After pause (default 5m).
	MaxPause time.Duration
	// Clock is the time source (default SystemClock()).
	Clock Clock
	// OnChange, if set, is called on every change of the limit, with the
	// Limiter's lock held: it must be quick (set a gauge, log) and must
	// not call the Limiter.
	OnChange func(Change)
}

// Change describes a change of the concurrency limit.
type Change struct {
	From, To int
	// Reason is "increase", "slow-start", "backpressure", "latency",
	// "batch-fill" or "cap".
	Reason string
	// Notable is true when To differs by more than 2× from the limit at
	// the last notable change (or the initial limit): worth a log line.
	Notable bool
}

// Circuit states reported by Status.
const (
	CircuitClosed   = "closed"
	CircuitOpen     = "open"
	CircuitHalfOpen = "half-open"
)

// Status is a snapshot of a Limiter, for /api/v1/status.
type Status struct {
	Adaptive bool
	Limit    int // current effective limit
	InFlight int
	Waiting  int
	// RTT is the smoothed RTT of successful requests; BaseRTT the baseline
	// it is compared with. Zero before the first sample.
	RTT, BaseRTT time.Duration
	PausedUntil  time.Time // zero when not paused
	Circuit      string
	OpenUntil    time.Time // when an open circuit lets its probe through
}

// Limiter admits a sink's requests: at most Current() at once, not while
// the sink is paused or its circuit is open, and at the configured rate.
// It is safe for concurrent use and starts no goroutines. It never drops
// a request: callers wait.
type Limiter struct {
	clock    Clock
	cfg      Config
	adaptive bool
	bucket   *rate.Limiter

	mu       sync.Mutex
	limit    int // adaptive or fixed limit, before the cap
	capN     int
	inFlight int
	waiters  list.List // of *waiter, FIFO
	kick     chan struct{}
	notable  int

	slowStart    bool
	good         int  // in slow start: the limit before the last step up, the last one known to be good
	ssthresh     int  // a slow start after the first ends here (half the limit where the last decreases began); 0: none yet
	growing      bool // the limit's last move was up
	windowEnd    time.Time
	lastDecrease time.Time
	sum          time.Duration
	samples      int
	fillSum      float64 // Outcome.Fill of the window's measured successes
	fills        int
	backpressure bool
	reached      bool
	base, srtt   time.Duration
	haveBase     bool
	ceiling      int       // limit that last drew back-pressure; 0: none
	holdUntil    time.Time // the limit stays below ceiling until then

	pausedUntil time.Time
	circuit     string
	openUntil   time.Time
	cooldown    time.Duration
	failures    int       // back-pressure outcomes since streakStart, of requests sent after it
	streakStart time.Time // first back-pressure since the last success; zero if none
	probeOut    bool
}

type waiter struct {
	ready chan struct{}
	probe bool // set before ready is closed
}

// New returns a Limiter.
func New(cfg Config) *Limiter {
	if cfg.Min < 1 {
		cfg.Min = DefaultMin
	}
	if cfg.Max < 1 {
		cfg.Max = DefaultMax
	}
	cfg.Max = max(cfg.Max, cfg.Min)
	if cfg.Initial < cfg.Min {
		cfg.Initial = cfg.Min
	}
	cfg.Initial = min(cfg.Initial, cfg.Max)
	if cfg.BreakerThreshold < 1 {
		cfg.BreakerThreshold = DefaultBreakerThreshold
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = DefaultBreakerCooldown
	}
	if cfg.BreakerMaxCooldown <= 0 {
		cfg.BreakerMaxCooldown = DefaultBreakerMaxCool
	}
	cfg.BreakerMaxCooldown = max(cfg.BreakerMaxCooldown, cfg.BreakerCooldown)
	if cfg.MaxPause <= 0 {
		cfg.MaxPause = DefaultMaxPause
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock()
	}
	l := &Limiter{
		clock: cfg.Clock, cfg: cfg, adaptive: cfg.Fixed < 1,
		capN: max(cfg.Cap, 0), kick: make(chan struct{}),
		slowStart: true, circuit: CircuitClosed, cooldown: cfg.BreakerCooldown,
	}
	l.limit = cfg.Initial
	if !l.adaptive {
		l.limit = cfg.Fixed
	}
	l.limit = l.clamp(l.limit)
	l.notable = l.limit
	if cfg.Rate > 0 {
		burst := cfg.Burst
		if burst < 1 {
			burst = DefaultBurst(cfg.Rate)
		}
		l.bucket = rate.NewLimiter(rate.Limit(cfg.Rate), burst)
	}
	return l
}

// DefaultBurst is the token bucket size for a rate without an explicit
// burst: one second's worth of requests, at least 1.
func DefaultBurst(perSecond float64) int {
	if perSecond >= math.MaxInt32 {
		return math.MaxInt32
	}
	return max(1, int(math.Ceil(perSecond)))
}

// upper is the highest limit allowed now; lower the lowest.
func (l *Limiter) upper() int {
	u := l.cfg.Max
	if !l.adaptive {
		u = l.cfg.Fixed
	}
	if l.capN > 0 {
		u = min(u, l.capN)
	}
	return u
}

func (l *Limiter) lower() int { return min(l.cfg.Min, l.upper()) }

func (l *Limiter) clamp(n int) int { return max(min(n, l.upper()), l.lower()) }

// fillFloor is the lowest limit sparse batches shrink the limit to.
func (l *Limiter) fillFloor() int { return l.clamp(fillFloor) }

// Current returns the current concurrency limit.
func (l *Limiter) Current() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// SetCap changes the external cap (0 removes it); the limit is clamped to
// it at once. Requests already in flight are not affected.
func (l *Limiter) SetCap(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.capN = max(n, 0)
	n = l.limit
	if !l.adaptive {
		n = l.cfg.Fixed
	}
	l.setLimit(l.clamp(n), "cap")
	l.grant(l.clock.Now())
}

// PauseUntil holds back every new request of the sink until t (a
// Retry-After); a later pause extends it, an earlier one does not shorten
// it. Requests in flight are not affected.
func (l *Limiter) PauseUntil(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pauseUntil(l.clock.Now(), t)
}

func (l *Limiter) pauseUntil(now, t time.Time) {
	if limit := now.Add(l.cfg.MaxPause); t.After(limit) {
		t = limit
	}
	if t.After(l.pausedUntil) {
		l.pausedUntil = t
		l.wake()
	}
}

// wake tells waiters that a time gate changed, so they recompute their
// timers.
func (l *Limiter) wake() {
	close(l.kick)
	l.kick = make(chan struct{})
}

// Status returns a snapshot.
func (l *Limiter) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	s := Status{
		Adaptive: l.adaptive, Limit: l.limit, InFlight: l.inFlight, Waiting: l.waiters.Len(),
		RTT: l.srtt, BaseRTT: l.base, Circuit: l.circuit,
	}
	if now.Before(l.pausedUntil) {
		s.PausedUntil = l.pausedUntil
	}
	if l.circuit == CircuitOpen {
		s.OpenUntil = l.openUntil
	}
	return s
}

// Token is one admitted request. Release it exactly once when the request
// ends; later calls do nothing.
type Token struct {
	l        *Limiter
	start    time.Time
	probe    bool
	released bool // under l.mu
}

// Acquire waits until a request may start: the sink is not paused, its
// circuit lets the request through, fewer than Current() requests are in
// flight and the rate allows it. Waiters are admitted in FIFO order. It
// returns an error only when ctx ends first (ctx.Err()); nothing is then
// held.
func (l *Limiter) Acquire(ctx context.Context) (*Token, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	now := l.clock.Now()
	if l.waiters.Len() == 0 {
		if ok, probe := l.admit(now); ok {
			l.take()
			l.mu.Unlock()
			return l.paced(ctx, probe)
		}
	}
	w := &waiter{ready: make(chan struct{})}
	elem := l.waiters.PushBack(w)
	for {
		var timer <-chan time.Time
		if at := l.gateEnd(now); !at.IsZero() {
			timer = l.clock.After(at.Sub(now))
		}
		kick := l.kick
		l.mu.Unlock()
		select {
		case <-w.ready:
			return l.paced(ctx, w.probe)
		case <-ctx.Done():
			l.mu.Lock()
			select {
			case <-w.ready: // admitted meanwhile: give the slot back
				l.giveBack(w.probe)
			default:
				l.waiters.Remove(elem)
			}
			l.grant(l.clock.Now())
			l.mu.Unlock()
			return nil, ctx.Err()
		case <-timer:
		case <-kick:
		}
		l.mu.Lock()
		now = l.clock.Now()
		l.grant(now)
	}
}

// TryAcquire admits a request if that is possible without waiting.
func (l *Limiter) TryAcquire() (*Token, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	if l.waiters.Len() > 0 {
		return nil, false
	}
	ok, probe := l.admit(now)
	if !ok {
		return nil, false
	}
	if l.bucket != nil && !l.bucket.AllowN(now, 1) {
		if probe {
			l.probeOut = false
		}
		return nil, false
	}
	l.take()
	return &Token{l: l, start: now, probe: probe}, true
}

// paced waits for the rate limit while holding the slot, then starts the
// request's clock.
func (l *Limiter) paced(ctx context.Context, probe bool) (*Token, error) {
	if l.bucket != nil {
		now := l.clock.Now()
		r := l.bucket.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			select {
			case <-l.clock.After(d):
			case <-ctx.Done():
				r.CancelAt(l.clock.Now())
				l.mu.Lock()
				l.giveBack(probe)
				l.grant(l.clock.Now())
				l.mu.Unlock()
				return nil, ctx.Err()
			}
		}
	}
	return &Token{l: l, start: l.clock.Now(), probe: probe}, nil
}

// admit reports whether a request may start now, and whether it is the
// circuit's probe. Admitting a probe marks it out.
func (l *Limiter) admit(now time.Time) (ok, probe bool) {
	if now.Before(l.pausedUntil) {
		return false, false
	}
	if l.inFlight >= l.limit {
		return false, false
	}
	switch l.circuit {
	case CircuitOpen:
		if now.Before(l.openUntil) {
			return false, false
		}
		l.circuit = CircuitHalfOpen
		fallthrough
	case CircuitHalfOpen:
		if l.probeOut {
			return false, false
		}
		l.probeOut = true
		return true, true
	}
	return true, false
}

// gateEnd returns when a time gate (pause, open circuit) that blocks
// requests now will lift, or zero.
func (l *Limiter) gateEnd(now time.Time) time.Time {
	var at time.Time
	if now.Before(l.pausedUntil) {
		at = l.pausedUntil
	}
	if l.circuit == CircuitOpen && now.Before(l.openUntil) && l.openUntil.After(at) {
		at = l.openUntil
	}
	return at
}

func (l *Limiter) take() {
	l.inFlight++
	if l.inFlight >= l.limit {
		l.reached = true
	}
}

func (l *Limiter) giveBack(probe bool) {
	l.inFlight--
	if probe {
		l.probeOut = false
	}
}

// grant admits waiters from the front of the queue while it can.
func (l *Limiter) grant(now time.Time) {
	for e := l.waiters.Front(); e != nil; e = l.waiters.Front() {
		ok, probe := l.admit(now)
		if !ok {
			return
		}
		w := l.waiters.Remove(e).(*waiter)
		l.take()
		w.probe = probe
		close(w.ready)
	}
}

// Release ends the request with its outcome and lets the next one in.
func (t *Token) Release(o Outcome) {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.released {
		return
	}
	t.released = true
	now := l.clock.Now()
	l.inFlight--
	if o.RetryAfter > 0 {
		// Before the back-pressure below: the pause is part of its cost.
		l.pauseUntil(now, now.Add(o.RetryAfter))
	}
	switch o.Class {
	case Success, Rejected:
		if o.Class == Success {
			l.sum += now.Sub(t.start)
			l.samples++
			if o.Fill > 0 {
				l.fillSum += min(o.Fill, 1)
				l.fills++
			}
		}
		l.failures, l.streakStart = 0, time.Time{}
		if t.probe {
			l.circuit, l.probeOut, l.cooldown = CircuitClosed, false, l.cfg.BreakerCooldown
			l.wake()
		}
	case Backpressure:
		l.onBackpressure(now, t.start)
		if l.streakStart.IsZero() {
			l.streakStart = now
		}
		if !t.start.Before(l.streakStart) {
			l.failures++
		}
		switch {
		case t.probe:
			l.cooldown = min(l.cooldown*2, l.cfg.BreakerMaxCooldown)
			l.open(now)
		case l.circuit == CircuitClosed && l.failures >= l.cfg.BreakerThreshold:
			l.open(now)
		}
	case Abandoned:
		if t.probe {
			l.probeOut = false
		}
	}
	l.adjust(now)
	l.grant(now)
}

func (l *Limiter) open(now time.Time) {
	l.circuit, l.probeOut, l.openUntil = CircuitOpen, false, now.Add(l.cooldown)
	l.wake()
}
