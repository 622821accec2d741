package sinks

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy is the exponential backoff with jitter that the delivery
// engine applies to every sink. It is a plain value: safe to copy and, being
// read-only, safe for concurrent use.
//
// Zero fields take the defaults of [DefaultRetryPolicy], except MaxElapsed
// (0 means no time limit) and Jitter (0 means no randomisation): a zero
// RetryPolicy is therefore 8 attempts, 500ms doubling up to 1m, no jitter
// and no time limit. Negative or out-of-range values are reported by
// [RetryPolicy.Validate]; Next clamps them to the nearest sensible value.
type RetryPolicy struct {
	// MaxAttempts is the total number of attempts including the first
	// (>= 1; 0 means 8).
	MaxAttempts int
	// InitialInterval is the wait before the second attempt (0 means 500ms).
	InitialInterval time.Duration
	// MaxInterval is a hard ceiling on any single wait, including one
	// requested by the destination with Retry-After (0 means 1m).
	MaxInterval time.Duration
	// MaxElapsed stops retrying once the next attempt would start more than
	// MaxElapsed after the first one; 0 means no limit.
	MaxElapsed time.Duration
	// Multiplier is the growth factor of the wait per attempt (>= 1; 0
	// means 2).
	Multiplier float64
	// Jitter is the randomised fraction of each wait, in [0, 1]: a wait w
	// becomes uniformly distributed in [w*(1-Jitter), w*(1+Jitter)] (then
	// capped at MaxInterval).
	Jitter float64
}

// Defaults of DefaultRetryPolicy, also used for zero RetryPolicy fields.
const (
	defaultMaxAttempts     = 8
	defaultInitialInterval = 500 * time.Millisecond
	defaultMaxInterval     = time.Minute
	defaultMaxElapsed      = 15 * time.Minute
	defaultMultiplier      = 2
	defaultJitter          = 0.2
)

// DefaultRetryPolicy returns the policy used when a sink configures none:
// 8 attempts, 500ms initial wait doubling up to 1m, at most 15m from the
// first attempt, ±20% jitter.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		MaxAttempts:     defaultMaxAttempts,
		InitialInterval: defaultInitialInterval,
		MaxInterval:     defaultMaxInterval,
		MaxElapsed:      defaultMaxElapsed,
		Multiplier:      defaultMultiplier,
		Jitter:          defaultJitter,
	}
}

// MaxPause is the longest one Retry-After may hold a sink's requests back
// under p: its MaxInterval (the default one when zero). The delivery stage
// and the limiter both cap a pause with it (docs/delivery.md: "capped at the
// retry policy's max_interval").
func (p RetryPolicy) MaxPause() time.Duration { return p.normalized().MaxInterval }

// Validate reports every out-of-range field of p at once; zero fields are
// valid (they take defaults, see [RetryPolicy]).
func (p RetryPolicy) Validate() error {
	var errs []error
	if p.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max_attempts must be >= 1, got %d", p.MaxAttempts))
	}
	if p.InitialInterval < 0 {
		errs = append(errs, fmt.Errorf("initial_interval must not be negative, got %s", p.InitialInterval))
	}
	if p.MaxInterval < 0 {
		errs = append(errs, fmt.Errorf("max_interval must not be negative, got %s", p.MaxInterval))
	}
	if p.MaxElapsed < 0 {
		errs = append(errs, fmt.Errorf("max_elapsed must not be negative, got %s", p.MaxElapsed))
	}
	if p.Multiplier != 0 && !(p.Multiplier >= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("multiplier must be >= 1, got %g", p.Multiplier))
	}
	if !(p.Jitter >= 0 && p.Jitter <= 1) {
		errs = append(errs, fmt.Errorf("jitter must be between 0 and 1, got %g", p.Jitter))
	}
	if p.InitialInterval > 0 && p.MaxInterval > 0 && p.MaxInterval < p.InitialInterval {
		errs = append(errs, fmt.Errorf("max_interval %s is less than initial_interval %s", p.MaxInterval, p.InitialInterval))
	}
	return errors.Join(errs...)
}

// normalized returns p with defaults filled in and values clamped to their
// valid ranges.
func (p RetryPolicy) normalized() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = defaultMaxAttempts
	} else if p.MaxAttempts < 1 {
		p.MaxAttempts = 1
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = defaultInitialInterval
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = defaultMaxInterval
	}
	if p.MaxInterval < p.InitialInterval {
		p.MaxInterval = p.InitialInterval
	}
	if p.MaxElapsed < 0 {
		p.MaxElapsed = 0
	}
	if p.Multiplier == 0 || math.IsNaN(p.Multiplier) {
		p.Multiplier = defaultMultiplier
	} else if p.Multiplier < 1 {
		p.Multiplier = 1
	}
	switch {
	case math.IsNaN(p.Jitter) || p.Jitter < 0:
		p.Jitter = 0
	case p.Jitter > 1:
		p.Jitter = 1
	}
	return p
}

// Next decides what happens after failed attempt number attempt (1-based)
// of a delivery whose first attempt started at firstAttempt; now is the
// current time. It returns the wait before the next attempt and true, or
// false when the delivery must be dead-lettered:
//
//   - err is permanent;
//   - attempt >= MaxAttempts;
//   - MaxElapsed > 0 and now+wait would be more than MaxElapsed after
//     firstAttempt.
//
// The wait is InitialInterval*Multiplier^(attempt-1), randomised by ±Jitter
// with rnd (a source of uniform values in [0, 1); nil means math/rand/v2),
// and capped at MaxInterval.
//
// Retry-After: when err carries a RetryAfter larger than that wait, the
// RetryAfter is used instead, without jitter (the destination asked for that
// time), but still capped at MaxInterval. The cap is deliberate: MaxInterval
// is the operator's promise of the longest pause of a lane, and a
// destination cannot park events for longer by sending a huge Retry-After;
// retrying earlier than asked costs at most one more attempt. A nil err is
// treated as a retryable error without RetryAfter.
func (p RetryPolicy) Next(attempt int, firstAttempt, now time.Time, err *Error, rnd func() float64) (time.Duration, bool) {
	p = p.normalized()
	if err != nil && err.Permanent {
		return 0, false
	}
	if attempt < 1 {
		attempt = 1
	}
	if attempt >= p.MaxAttempts {
		return 0, false
	}
	wait := p.backoff(attempt, rnd)
	if err != nil && err.RetryAfter > wait {
		wait = min(err.RetryAfter, p.MaxInterval)
	}
	if p.MaxElapsed > 0 && now.Add(wait).Sub(firstAttempt) > p.MaxElapsed {
		return 0, false
	}
	return wait, true
}

// backoff returns the jittered wait after failed attempt attempt (>= 1) of a
// normalized policy.
func (p RetryPolicy) backoff(attempt int, rnd func() float64) time.Duration {
	maxf := float64(p.MaxInterval)
	// math.Pow overflows to +Inf for huge exponents, which min handles.
	w := math.Min(float64(p.InitialInterval)*math.Pow(p.Multiplier, float64(attempt-1)), maxf)
	if p.Jitter > 0 {
		if rnd == nil {
			rnd = rand.Float64
		}
		r := rnd()
		if !(r >= 0) { // also NaN
			r = 0
		} else if r > 1 {
			r = 1
		}
		w *= 1 + p.Jitter*(2*r-1)
	}
	w = math.Min(w, maxf)
	if w < 0 {
		w = 0
	}
	return time.Duration(w)
}
