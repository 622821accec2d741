package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/limit"
)

// deliveryMode says what the delivery stage does with an outcome.
type deliveryMode int

const (
	modeLive    deliveryMode = iota // ack on success, dead-letter on failure
	modeRedrive                     // retry until delivered; return permanent errors
	modeReplay                      // sink's retry policy; return the final error
)

// Limiter is the hook through which a limiter stage (adaptive concurrency,
// rate limit, circuit breaker) bounds a sink's requests. Acquire blocks
// until one request may start (or ctx is done; then nothing is held) and
// returns the function that ends the request with the error Send returned
// (nil on success; context.Canceled when the lane gave up on it). The
// limiter measures latency from Acquire's return to release.
type Limiter interface {
	Acquire(ctx context.Context) (release func(err error), err error)
}

// finisher takes the items the delivery stage finished in modeLive.
type finisher interface {
	// delivered acks items the sink accepted at now and releases them,
	// observing each one's lag (lag), in one pass over them.
	delivered(items []*item, now time.Time, lag prometheus.Observer)
	// deadLetter durably records items that failed for good, then acks them.
	deadLetter(items []*item, reason string)
	// dropLost returns items without those whose tenure is over (cluster
	// mode), which it drops unacked.
	dropLost(items []*item) []*item
	// waiting is called when the delivery stage starts a timed wait (a
	// backoff, a pause); the function it returns when the wait ends.
	waiting() func()
}

// deliverer is the delivery stage of a lane: it waits for the sink to be
// ready (the sink-wide Retry-After pause, each item's backoff, the
// limiter), makes an attempt, classifies its outcome (delivered, retry,
// permanent; per entry for batch APIs) and backs off. It also keeps the
// sink's health for status and parking. It is safe for concurrent use by
// the lane's workers and its re-drive.
type deliverer struct {
	name   string
	sink   sinks.Sink
	policy sinks.RetryPolicy
	clk    clock
	log    *slog.Logger
	limit  Limiter // nil: none
	// budget is the byte budget request bodies are charged to while they
	// are sent (memory.FromContext in the sinks); nil: none.
	budget *memory.Budget

	// pausedUntil (unix nanos) holds every new request of the sink back:
	// the destination asked for it with Retry-After.
	pausedUntil atomic.Int64

	failingSince atomic.Int64 // unix nanos of the first failure since the last success; 0 when healthy
	lastSuccess  atomic.Int64
	lastErr      atomic.Pointer[string]

	mAttempts, mRetried prometheus.Counter
	mFailures           *prometheus.CounterVec // sink, reason
	mDuration, mLag     prometheus.Observer

	// obs are the sink's edges (observe.go; nil: no observer); an
	// attempt's are its first item's (item.obs).
	obs *laneEdges
}

// failing reports since when the sink has been failing (zero when healthy).
func (d *deliverer) failing() time.Time {
	if fs := d.failingSince.Load(); fs != 0 {
		return time.Unix(0, fs)
	}
	return time.Time{}
}

// readyAt returns when the next attempt for items may start: the latest of
// the sink-wide pause and the items' own backoff.
func (d *deliverer) readyAt(items []*item) time.Time {
	var t time.Time
	if p := d.pausedUntil.Load(); p != 0 {
		t = time.Unix(0, p)
	}
	for _, it := range items {
		if it.retryAt.After(t) {
			t = it.retryAt
		}
	}
	return t
}

// pause holds the sink's new requests back until t (never shortens a
// pause in force).
func (d *deliverer) pause(t time.Time) {
	n := t.UnixNano()
	for {
		cur := d.pausedUntil.Load()
		if cur >= n || d.pausedUntil.CompareAndSwap(cur, n) {
			return
		}
	}
}

// waitReady waits until items may be attempted, telling fin (if any) while
// it waits. It returns false when ctx ended first.
func (d *deliverer) waitReady(ctx context.Context, items []*item, fin finisher) bool {
	for {
		at := d.readyAt(items)
		wait := at.Sub(d.clk.Now())
		if wait <= 0 {
			return ctx.Err() == nil
		}
		var end func()
		if fin != nil {
			end = fin.waiting()
		}
		ok := sleep(ctx, d.clk, wait)
		if end != nil {
			end()
		}
		if !ok {
			return false
		}
		// A pause may have been extended meanwhile: look again.
	}
}

// send makes one attempt for items through the limiter. ctx is the
// attempt's context, cancelled when a tenure of the items ends. Right after
// the limiter admitted the request, each item's tenure is entered (its
// request is in progress until Send returns, see event.Tenure.Quiesce); if
// one has ended, nothing is sent and errTenureEnded is returned. The sink
// gets a context with the fence, which it checks once more immediately
// before it writes the request (sinks.CheckFence).
//
// fill is the request's Outcome.Fill for the limiter (0: not measured).
func (d *deliverer) send(ctx context.Context, items []*item, evs []*event.Event, fill float64) (err error) {
	obs := items[0].obs
	var att observe.Attempt
	if obs != nil {
		var actx context.Context
		actx, att = obs.attemptStart(ctx, items, evs, d.clk.Now())
		ctx = actx
		defer func() { obs.attemptEnd(actx, &att, err) }()
	}
	// The limiter's hold on the request: the lane's own limiter stage
	// (adaptive) is called directly, without the closure its Acquire
	// allocates per request; another Limiter (tests) through the hook.
	var tok *limit.Token
	var release func(error)
	if a, ok := d.limit.(adaptive); ok {
		t, err := a.l.Acquire(ctx)
		if obs != nil {
			att.Admitted = d.clk.Now()
		}
		if err != nil {
			return err
		}
		tok = t
	} else if d.limit != nil {
		r, err := d.limit.Acquire(ctx)
		if obs != nil {
			att.Admitted = d.clk.Now()
		}
		if err != nil {
			return err
		}
		release = r
	}
	ts := tenuresOf(items)
	for i, t := range ts {
		if !t.Enter() {
			for _, t := range ts[:i] {
				t.Exit()
			}
			endLimit(tok, release, context.Canceled, 0) // not the receiver's doing
			return errTenureEnded
		}
	}
	if len(ts) > 0 {
		ctx = sinks.WithFence(ctx, func() bool { return allHeld(ts) })
	}
	start := d.clk.Now()
	d.mAttempts.Inc()
	if memory.FromContext(ctx) != d.budget {
		ctx = memory.WithBudget(ctx, d.budget) // a lane's workers have it already (Lane.start)
	}
	err = d.sink.Send(ctx, evs)
	dur := d.clk.Now().Sub(start)
	att.Duration = dur
	observeDuration(d.mDuration, dur.Seconds(), obs, evs[0])
	fenced := err != nil && !allHeld(ts)
	for _, t := range ts {
		t.Exit()
	}
	if err != nil && (ctx.Err() != nil || fenced) {
		endLimit(tok, release, context.Canceled, 0) // ours, not the receiver's
	} else {
		endLimit(tok, release, err, fill)
	}
	if fenced {
		return fmt.Errorf("%w: %w", errTenureEnded, err)
	}
	return err
}

// endLimit ends a request's hold on the limiter stage (tok or release, or
// neither without a limiter) with the error Send returned and the
// request's fill (see limit.Outcome.Fill).
func endLimit(tok *limit.Token, release func(error), err error, fill float64) {
	switch {
	case tok != nil:
		o := limit.OutcomeOf(err)
		o.Fill = fill
		tok.Release(o)
	case release != nil:
		release(err)
	}
}

// errTenureEnded reports that an attempt was given up because the tenure of
// one of its items ended (cluster mode).
var errTenureEnded = errors.New("tenure ended")

// tenuresOf returns the distinct tenures of items (none in single process
// mode).
func tenuresOf(items []*item) []*event.Tenure {
	var ts []*event.Tenure
	for _, it := range items {
		t := it.tenure
		if t != nil && !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	return ts
}

func allHeld(ts []*event.Tenure) bool {
	for _, t := range ts {
		if !t.Held() {
			return false
		}
	}
	return true
}

// tenureCtx returns ctx, also cancelled when one of the tenures of items
// ends: every wait of an attempt (pause, backoff, limiter, the request
// itself) ends with the tenure.
func tenureCtx(ctx context.Context, items []*item) (context.Context, context.CancelFunc) {
	ts := tenuresOf(items)
	if len(ts) == 0 {
		return ctx, noop
	}
	return tenuresCtx(ctx, ts)
}

// noop is the CancelFunc of a context tenureCtx did not derive.
func noop() {}

// tenuresCtx is tenureCtx for items with tenures (cluster mode); apart, so
// that the single process path does not move ctx to the heap.
func tenuresCtx(parent context.Context, ts []*event.Tenure) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	stops := make([]chan struct{}, 0, len(ts))
	for _, t := range ts {
		stop := make(chan struct{})
		stops = append(stops, stop)
		go func(done <-chan struct{}) {
			select {
			case <-done:
				cancel()
			case <-stop:
			case <-ctx.Done():
			}
		}(t.Done())
	}
	return ctx, func() {
		for _, s := range stops {
			close(s)
		}
		cancel()
	}
}

// deliver sends items with retries. In modeLive it finishes every item
// through fin (delivered, or durably dead-lettered) and returns nil, or
// returns ctx's error with the items still pending (their retryAt set when
// a backoff was in force). In the other modes fin is unused and it returns
// nil on delivery or the error that ended the attempts, with the items it
// concerns.
//
// fill is Outcome.Fill of the first attempt (how full the lane's batch
// was; 0: not measured), for the limiter.
func (d *deliverer) deliver(ctx context.Context, items []*item, mode deliveryMode, fin finisher, fill float64) ([]*item, error) {
	policy := d.policy
	if mode == modeRedrive {
		policy.MaxAttempts = 1 << 30
		policy.MaxElapsed = 0
	}
	pending := items
	group := sinks.TxnGroup(ctx) // one transaction: retried whole
	evs := make([]*event.Event, 0, len(items))
	for {
		actx, stop := tenureCtx(ctx, pending)
		if !d.waitReady(actx, pending, fin) {
			stop()
			if ctx.Err() != nil {
				return pending, ctx.Err()
			}
			// A tenure ended while the items waited out a pause or a
			// backoff: its next owner delivers them, not this replica.
			var done bool
			if pending, done = d.dropEnded(pending, mode, fin); done {
				return pending, errTenureEnded
			}
			if len(pending) == 0 {
				return nil, nil
			}
			continue
		}
		now := d.clk.Now()
		evs = evs[:0]
		for _, it := range pending {
			if it.first.IsZero() {
				it.first = now
			}
			it.attempts++
			it.retryAt = time.Time{}
			evs = append(evs, it.ev)
		}
		err := d.send(actx, pending, evs, fill)
		fill = 0 // a retry's batch is what failed, not what the lane had
		stop()
		if err == nil {
			d.succeeded(pending, mode, fin)
			return nil, nil
		}
		if ctx.Err() != nil {
			return pending, ctx.Err()
		}
		if errors.Is(err, errTenureEnded) || !allHeld(tenuresOf(pending)) {
			// Ended while the attempt waited in the limiter (queued
			// behind a concurrency limit or an open circuit), or during
			// the request: nothing more is sent for those items.
			for _, it := range pending {
				it.attempts--
			}
			var done bool
			if pending, done = d.dropEnded(pending, mode, fin); done {
				return pending, errTenureEnded
			}
			if len(pending) == 0 {
				return nil, nil
			}
			continue
		}
		var decision *sinks.Error
		var be *sinks.BatchError
		if group && errors.As(err, &be) {
			// A transaction: entries that failed for good (encode,
			// oversize, or a refused part and the later parts the sink
			// did not send, sinks.NotSent) are dead-lettered together;
			// if any other entry failed, the rest of the transaction is
			// sent again whole, in order (the parts already accepted
			// too, as at-least-once allows), so no part of it overtakes
			// another.
			var dead, rest []*item
			var perm *sinks.Error
			for i, it := range pending {
				ferr, failed := be.Failed[i]
				if !failed {
					rest = append(rest, it)
					continue
				}
				de, _ := sinks.Classify(ferr)
				if de == nil {
					de = &sinks.Error{Err: ferr, Reason: "error"}
				}
				it.noteErr(de)
				d.mFailures.WithLabelValues(d.name, de.Reason).Inc()
				if de.Permanent {
					dead = append(dead, it)
					if perm == nil {
						perm = de
					}
					continue
				}
				if decision == nil || de.RetryAfter > decision.RetryAfter {
					decision = de
				}
				rest = append(rest, it)
			}
			if len(dead) > 0 {
				if mode != modeLive {
					return dead, perm
				}
				d.noteLastErr(perm)
				fin.deadLetter(dead, perm.Reason)
			}
			if decision == nil {
				d.succeeded(rest, mode, fin)
				return nil, nil
			}
			pending = rest
		} else if errors.As(err, &be) {
			var ok, retry []*item
			for i, it := range pending {
				ferr, failed := be.Failed[i]
				if !failed {
					ok = append(ok, it)
					continue
				}
				de, _ := sinks.Classify(ferr)
				if de == nil {
					de = &sinks.Error{Err: ferr, Reason: "error"}
				}
				it.noteErr(de)
				d.mFailures.WithLabelValues(d.name, de.Reason).Inc()
				if de.Permanent {
					if mode != modeLive {
						return []*item{it}, de
					}
					d.noteLastErr(de)
					fin.deadLetter([]*item{it}, de.Reason)
					continue
				}
				if decision == nil || de.RetryAfter > decision.RetryAfter {
					decision = de
				}
				retry = append(retry, it)
			}
			d.succeeded(ok, mode, fin)
			pending = retry
			if len(pending) == 0 {
				return nil, nil
			}
		} else {
			de, ok := sinks.Classify(err)
			if !ok {
				// A cancellation the sink reports while our context is
				// live is the sink's own: retry it like a transport error.
				de = &sinks.Error{Err: err, Reason: "canceled"}
			}
			decision = de
			for _, it := range pending {
				it.noteErr(de)
			}
			d.mFailures.WithLabelValues(d.name, de.Reason).Add(float64(len(pending)))
			if de.Permanent {
				if mode != modeLive {
					return pending, de
				}
				d.noteLastErr(de)
				fin.deadLetter(pending, de.Reason)
				return nil, nil
			}
		}
		d.noteFailure(decision)
		now = d.clk.Now()
		if decision.RetryAfter > 0 {
			// The destination asked every request to wait, not just
			// this one (capped as the policy caps it).
			d.pause(now.Add(min(decision.RetryAfter, policy.MaxInterval)))
		}
		wait, again := policy.Next(int(pending[0].attempts), pending[0].first, now, decision, rand.Float64)
		if !again {
			if mode != modeLive {
				return pending, decision
			}
			fin.deadLetter(pending, "exhausted")
			return nil, nil
		}
		d.mRetried.Add(float64(len(pending)))
		for _, it := range pending {
			it.retryAt = now.Add(wait)
		}
		if x := pending[0].obs; x != nil {
			x.retrying(pending, wait, decision)
		}
	}
}

// dropEnded drops the items whose tenure ended. In modeLive they are dropped
// unacknowledged (fin.dropLost) and the rest returned; in the other modes
// done is true when any tenure ended: the attempts stop.
func (d *deliverer) dropEnded(pending []*item, mode deliveryMode, fin finisher) (rest []*item, done bool) {
	if mode == modeLive {
		return fin.dropLost(pending), false
	}
	return pending, !allHeld(tenuresOf(pending))
}

func (it *item) noteErr(de *sinks.Error) {
	msg := de.Error()
	if it.firstErr == "" {
		it.firstErr = msg
	}
	it.lastErr = msg
}

func (d *deliverer) noteFailure(de *sinks.Error) {
	d.failingSince.CompareAndSwap(0, d.clk.Now().UnixNano())
	msg := de.Error()
	if p := d.lastErr.Load(); p == nil || *p != msg {
		d.lastErr.Store(&msg)
		d.log.Warn("delivery failed", "err", msg, "reason", de.Reason)
	}
}

// noteLastErr keeps a permanent failure as the sink's last error (status,
// console) without making the sink failing: it concerns its event only,
// which the dead-lettering logs.
func (d *deliverer) noteLastErr(de *sinks.Error) {
	msg := de.Error()
	d.lastErr.Store(&msg)
}

// markHealthy clears the failure state (a parked lane going live again).
func (d *deliverer) markHealthy() { d.failingSince.Store(0) }

func (d *deliverer) succeeded(items []*item, mode deliveryMode, fin finisher) {
	if len(items) == 0 {
		return
	}
	now := d.clk.Now()
	d.lastSuccess.Store(now.UnixNano())
	if d.failingSince.Swap(0) != 0 {
		d.log.Info("sink delivering again")
	}
	if mode == modeLive {
		fin.delivered(items, now, d.mLag)
		return
	}
	nowNanos := now.UnixNano()
	for _, it := range items {
		observeLag(d.mLag, it, nowNanos)
	}
}

// observeLag observes the end-to-end lag of it, delivered at now (unix
// nanos).
func observeLag(lag prometheus.Observer, it *item, now int64) {
	if it.wall != noWall {
		lag.Observe(time.Duration(now - it.wall).Seconds())
	}
}
