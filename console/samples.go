package console

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// consoleSample is one sample of the console's ring buffer: the counters
// and gauges the sparklines and per-minute figures are computed from.
type consoleSample struct {
	at          time.Time
	lag         map[string]float64 // unit: checkpoint lag, seconds
	read        map[string]float64 // unit: changegate_events_read_total
	delivered   map[string]float64 // sink: changegate_deliveries_total{outcome="delivered"}
	failed      map[string]float64 // sink: changegate_delivery_failures_total, every reason
	deadLetters map[string]float64 // sink "\x00" kind: changegate_deadletters
}

// consoleRing holds the last consoleSamples samples, oldest first. Its zero
// value is empty and ready; it is safe for concurrent use. Its memory is
// bounded by consoleSamples times the number of units and sinks.
type consoleRing struct {
	mu  sync.Mutex
	buf []consoleSample
}

func (r *consoleRing) add(s consoleSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) == consoleSamples {
		copy(r.buf, r.buf[1:])
		r.buf = r.buf[:consoleSamples-1]
	}
	r.buf = append(r.buf, s)
}

// snapshot returns the samples, oldest first; the caller must not modify
// their maps.
func (r *consoleRing) snapshot() []consoleSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]consoleSample(nil), r.buf...)
}

// Sample samples every SampleEvery, while server.console is set, until
// ctx is done.
func (c *Console) Sample(ctx context.Context) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		if c.gw.Config().Server.Console {
			c.samples.add(c.takeSample(time.Now()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Console) takeSample(now time.Time) consoleSample {
	s := consoleSample{
		at: now, lag: map[string]float64{}, read: map[string]float64{}, delivered: map[string]float64{},
		failed: map[string]float64{}, deadLetters: map[string]float64{},
	}
	st := c.gw.Status()
	for _, src := range st.Sources {
		s.lag[src.Name] = src.CheckpointLagSec
	}
	m := c.metrics
	collect(m.EventsRead, func(l map[string]string, v float64) { s.read[l["source"]] += v })
	collect(m.Deliveries, func(l map[string]string, v float64) {
		if l["outcome"] == "delivered" {
			s.delivered[l["sink"]] += v
		}
	})
	collect(m.DeliveryFailures, func(l map[string]string, v float64) { s.failed[l["sink"]] += v })
	collect(m.DeadLetters, func(l map[string]string, v float64) { s.deadLetters[l["sink"]+"\x00"+l["kind"]] = v })
	// Every sink has a value from its first sample on, so its rates start
	// at the second sample and not at its first delivery.
	for _, k := range st.Sinks {
		for _, mm := range []map[string]float64{s.delivered, s.failed} {
			if _, ok := mm[k.Name]; !ok {
				mm[k.Name] = 0
			}
		}
	}
	for u := range maps.Keys(s.lag) {
		if _, ok := s.read[u]; !ok {
			s.read[u] = 0
		}
	}
	return s
}

// collect calls fn with the labels and value of each counter or gauge c
// holds.
func collect(c prometheus.Collector, fn func(labels map[string]string, v float64)) {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		labels := make(map[string]string, len(d.Label))
		for _, lp := range d.Label {
			labels[lp.GetName()] = lp.GetValue()
		}
		switch {
		case d.Counter != nil:
			fn(labels, d.Counter.GetValue())
		case d.Gauge != nil:
			fn(labels, d.Gauge.GetValue())
		}
	}
}
