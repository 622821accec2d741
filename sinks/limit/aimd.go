package limit

// The adaptive limit: how back-pressure, latency windows and how full
// batches are move it (AIMD with a slow start, TCP-like).

import (
	"time"
)

// onBackpressure reacts to back-pressure at once, at most once per window:
// waiting for the window to end would let the slots that fast 429s free be
// refilled, and refused, many times over. Back-pressure on a request sent
// before the last decrease is old news and does not move the limit.
func (l *Limiter) onBackpressure(now, sent time.Time) {
	if !l.adaptive || sent.Before(l.lastDecrease) {
		return
	}
	if !l.lastDecrease.IsZero() && now.Sub(l.lastDecrease) < l.window() {
		l.backpressure = true // no increase in this window
		return
	}
	l.decrease(now, "backpressure")
	l.newWindow(now)
}

func (l *Limiter) window() time.Duration { return max(l.srtt, minWindow) }

func (l *Limiter) decrease(now time.Time, reason string) {
	if reason == "backpressure" {
		l.ceiling = l.limit
		l.holdUntil = now.Add(holdFactor * max(l.pausedUntil.Sub(now), l.window()))
	}
	if l.growing || l.ssthresh == 0 {
		// The first decrease after growth: a slow start from the
		// lowest limit stops at half of this one.
		l.ssthresh = max(l.limit/2, l.lower())
		l.growing = false
	}
	n := int(float64(l.limit) * decrease)
	if l.slowStart && l.good > 0 {
		if reason == "backpressure" {
			// The step up overshot: the previous limit was the last
			// good one.
			n = l.good
		} else {
			// A latency rise ends slow start with the usual 0.9: one
			// slow window (a GC pause, a busy CPU) halving a limit of
			// 1024 took minutes to win back at +1 per 200 ms window; if
			// latency stays high, the next windows cut again. After a
			// ×4 step no higher than a doubling would have gone.
			n = min(n, 2*l.good)
		}
	}
	l.slowStart, l.good = false, 0
	if reason == "batch-fill" {
		n = max(n, l.fillFloor())
	}
	l.setLimit(max(n, l.lower()), reason)
	l.lastDecrease = now
}

// grow returns the limit to increase to from the current one, next, held
// below the ceiling until the hold ends; past it the ceiling is forgotten.
func (l *Limiter) grow(now time.Time, next int) int {
	if l.ceiling == 0 || next < l.ceiling {
		return next
	}
	if now.Before(l.holdUntil) {
		return max(min(next, l.ceiling-1), l.limit)
	}
	l.ceiling = 0
	return next
}

// adjust closes the current window when it has ended and moves the limit.
// The first outcome closes a window at once, so its sample sets the
// baseline.
func (l *Limiter) adjust(now time.Time) {
	if !l.windowEnd.IsZero() && now.Before(l.windowEnd) {
		return
	}
	have := l.samples > 0
	var mean time.Duration
	if have {
		mean = l.sum / time.Duration(l.samples)
	}
	if l.adaptive {
		slow := have && l.haveBase && float64(mean) > float64(l.base)*rttTolerance+float64(min(l.base, rttSlack))
		fill := 1.0
		if l.fills > 0 {
			fill = l.fillSum / float64(l.fills)
		}
		switch {
		case l.backpressure || slow:
			reason := "latency"
			if l.backpressure {
				reason = "backpressure"
			}
			l.decrease(now, reason)
		case fill < fillShrink && l.limit > l.fillFloor():
			l.decrease(now, "batch-fill")
		case have && l.haveBase && l.reached && l.limit < l.upper() && fill >= fillGrow:
			if l.slowStart {
				// Slow start doubles the limit per window, or quadruples
				// it while the latency is flat (within an eighth of the
				// baseline, plus the slack): each step costs a round
				// trip, and from 1 a receiver that takes 1 s spent 13 s
				// of a 36 s run doubling its way to 8,192 (bench scenario
				// 10). Latency that rises, but stays within the
				// tolerance, slows the steps to doubling before it stops
				// them.
				f := 2
				if float64(mean) <= float64(l.base)*(1+1.0/8)+float64(min(l.base, rttSlack)) {
					f = 4
				}
				l.good = l.limit
				next := min(l.limit*f, l.upper())
				if l.ssthresh > 0 && next >= l.ssthresh {
					// Slow start again (at the lowest limit) ends at
					// half the limit where the last decrease began, as
					// TCP's ssthresh: from there the limit grows by
					// the additive increase.
					next = max(l.ssthresh, l.limit)
					l.slowStart = false
				}
				l.growing = true
				l.setLimit(l.grow(now, next), "slow-start")
			} else {
				// +1 per window, or 1/32 of the limit when that is more:
				// at hundreds in flight a noise-driven ×0.9 would
				// otherwise take tens of windows to win back.
				l.growing = true
				l.setLimit(l.grow(now, min(l.limit+max(1, l.limit/32), l.upper())), "increase")
			}
		}
	}
	if have {
		switch {
		case !l.haveBase || mean < l.base:
			l.base, l.haveBase = mean, true
		case l.limit <= l.lower() && l.adaptive:
			// At the lowest limit we queue nothing: what we see is the
			// receiver's own latency, perhaps higher for good. Re-learn
			// it and grow again from here quickly.
			l.base, l.slowStart = mean, true
		}
		if l.srtt == 0 {
			l.srtt = mean
		} else {
			l.srtt = time.Duration(srttAlpha*float64(mean) + (1-srttAlpha)*float64(l.srtt))
		}
	}
	l.newWindow(now)
}

func (l *Limiter) newWindow(now time.Time) {
	w := l.window()
	if l.slowStart {
		// A slow-start window's requests go out together and come back
		// together one round trip later: a window of exactly one smoothed
		// RTT ended just after that burst half the time (a little jitter
		// is enough), and the doubling then waited a whole round trip for
		// the next one (a 1 s receiver took 18 s to 2048 instead of 11).
		// Three quarters of it ends before the burst it waits for.
		w = max(w*3/4, minWindow)
	}
	l.windowEnd = now.Add(w)
	l.sum, l.samples, l.backpressure = 0, 0, false
	l.fillSum, l.fills = 0, 0
	l.reached = l.inFlight >= l.limit
}

func (l *Limiter) setLimit(n int, reason string) {
	if n == l.limit {
		return
	}
	c := Change{From: l.limit, To: n, Reason: reason}
	l.limit = n
	if n > 2*l.notable || 2*n < l.notable {
		c.Notable = true
		l.notable = n
	}
	if l.cfg.OnChange != nil {
		l.cfg.OnChange(c)
	}
}
