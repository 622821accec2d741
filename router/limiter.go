package router

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/limit"
)

// adaptive is the limiter stage of a lane: a sinks/limit.Limiter (adaptive
// or fixed concurrency, Retry-After pause, circuit breaker, rate limit)
// behind the delivery stage's Limiter hook.
type adaptive struct {
	l   *limit.Limiter
	cur *atomic.Int64 // l.Current(), kept by OnChange: read on every schedule
}

var _ Limiter = adaptive{}

// newAdaptive returns the limiter stage for cfg; its limit is reported in
// gauge, and a change by more than 2× is logged.
func newAdaptive(cfg limit.Config, gauge prometheus.Gauge, log *slog.Logger) adaptive {
	cur := new(atomic.Int64)
	cfg.OnChange = func(c limit.Change) {
		cur.Store(int64(c.To))
		gauge.Set(float64(c.To))
		if c.Notable {
			log.Info("sink concurrency limit changed", "from", c.From, "to", c.To, "reason", c.Reason)
		}
	}
	l := limit.New(cfg)
	cur.Store(int64(l.Current()))
	gauge.Set(float64(l.Current()))
	return adaptive{l: l, cur: cur}
}

// current returns the concurrency limit without taking the limiter's lock.
func (a adaptive) current() int { return int(a.cur.Load()) }

func (a adaptive) Acquire(ctx context.Context) (func(error), error) {
	tok, err := a.l.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return func(err error) { tok.Release(limit.OutcomeOf(err)) }, nil
}

// notifyOverload registers lim, when it is the lane's adaptive limiter
// stage, with sink, when the sink reports signs of overload that its
// outcomes do not show (sinks.OverloadNotifier: refused, reset or slow
// connection attempts).
func notifyOverload(sink sinks.Sink, lim Limiter) {
	n, ok := sink.(sinks.OverloadNotifier)
	a, adaptiveStage := lim.(adaptive)
	if ok && adaptiveStage {
		n.NotifyOverload(a.l.Overload)
	}
}
