package router

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/sinks/limit"
)

// adaptive is the limiter stage of a lane: a sinks/limit.Limiter (adaptive
// or fixed concurrency, Retry-After pause, circuit breaker, rate limit)
// behind the delivery stage's Limiter hook.
type adaptive struct{ l *limit.Limiter }

var _ Limiter = adaptive{}

// newAdaptive returns the limiter stage for cfg; its limit is reported in
// gauge, and a change by more than 2× is logged.
func newAdaptive(cfg limit.Config, gauge prometheus.Gauge, log *slog.Logger) adaptive {
	cfg.OnChange = func(c limit.Change) {
		gauge.Set(float64(c.To))
		if c.Notable {
			log.Info("sink concurrency limit changed", "from", c.From, "to", c.To, "reason", c.Reason)
		}
	}
	l := limit.New(cfg)
	gauge.Set(float64(l.Current()))
	return adaptive{l: l}
}

func (a adaptive) Acquire(ctx context.Context) (func(error), error) {
	tok, err := a.l.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return func(err error) { tok.Release(limit.OutcomeOf(err)) }, nil
}
