package console

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/source"
)

// Health colours of the overview.
const (
	healthGreen = "green"
	healthAmber = "amber"
	healthRed   = "red"
)

type consoleOverview struct {
	Ready   bool
	Cluster bool
	Members []string
	Reason  string
	Sources []consoleSource
	Sinks   []consoleSink
	// Memory is the byte budget line: held / budget, where it comes from,
	// and whether reading is held back by it.
	Memory consoleMemory
}

type consoleMemory struct {
	Inflight, Budget, From string
	Percent                int64
	HeldBack               bool
}

type consoleSource struct {
	Name, Source, State, Health, Reason string
	Owner                               string
	CheckpointTime                      time.Time
	LagSeconds                          float64
	EventsPerSec                        float64 // NaN until two samples exist
	InFlight                            int
	Lag, Rate                           spark
}

type consoleSink struct {
	Name, State, Health, Reason, LastError, Circuit string
	Queued, InProgress                              int64
	Parked                                          bool
	ParkedEntries, FailedEntries                    float64
	Adaptive                                        bool
	ConcurrencyLimit, Requests                      int
	DeliveredPerMin, FailedPerMin                   float64 // NaN until two samples exist
	LastSuccess                                     time.Time
	Delivered                                       spark
}

// spark is a sparkline: an SVG polyline's points in a sparkW × sparkH box.
type spark struct {
	Points string
	Max    float64
	Last   float64
	N      int
}

const (
	sparkW = 150
	sparkH = 30
)

// makeSpark scales values into the box; NaN values are skipped.
func makeSpark(values []float64) spark {
	var s spark
	for _, v := range values {
		if !math.IsNaN(v) {
			s.Max = max(s.Max, v)
			s.Last = v
			s.N++
		}
	}
	if s.N == 0 {
		s.Last = math.NaN()
		return s
	}
	var b strings.Builder
	step := float64(sparkW) / float64(max(1, consoleSamples-1))
	x0 := float64(sparkW) - step*float64(len(values)-1)
	for i, v := range values {
		if math.IsNaN(v) {
			continue
		}
		y := float64(sparkH)
		if s.Max > 0 {
			y = float64(sparkH) - v/s.Max*float64(sparkH-2) - 1
		} else {
			y--
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x0+step*float64(i), y)
	}
	s.Points = strings.TrimSpace(b.String())
	return s
}

// sourceHealth is red when the stream is not open, amber when it is open
// but not ready (stalled checkpoint, unanswered getMore), green otherwise.
func sourceHealth(s api.SourceStatus) string {
	switch {
	case s.State != string(source.StateOpen):
		return healthRed
	case !s.Ready:
		return healthAmber
	}
	return healthGreen
}

// sinkState names what a sink is doing, and its colour: red when parked or
// not ready (failing for longer than ready_max_lag), amber while it fails,
// waits out a Retry-After or has its circuit open, green otherwise
// (buildOverview turns it amber too when deliveries failed in the last
// minute).
func sinkState(s api.SinkStatus) (string, string) {
	switch {
	case s.Parked:
		return "parked", healthRed
	case !s.Ready:
		return "not delivering", healthRed
	case s.Failing:
		return "failing", healthAmber
	case !s.PausedUntil.IsZero():
		return "paused (Retry-After)", healthAmber
	case s.Circuit != "" && s.Circuit != "closed":
		return "circuit " + s.Circuit, healthAmber
	}
	return "delivering", healthGreen
}

// overview builds the overview from a status report and the samples.
func buildOverview(r api.Status, samples []consoleSample) *consoleOverview {
	o := &consoleOverview{Ready: r.Ready, Cluster: r.Cluster, Members: r.Members, Reason: r.Reason}
	o.Memory = consoleMemory{
		Inflight: memory.FormatBytes(r.Memory.InflightBytes), Budget: memory.FormatBytes(r.Memory.BudgetBytes),
		From: r.Memory.BudgetFrom, HeldBack: !r.Memory.HeldBackSince.IsZero(),
	}
	if r.Memory.BudgetBytes > 0 {
		o.Memory.Percent = r.Memory.InflightBytes * 100 / r.Memory.BudgetBytes
	}
	owners := map[string]string{}
	for _, u := range r.Units {
		owners[u.Name] = u.Owner
	}
	for _, s := range r.Sources {
		cs := consoleSource{
			Name: s.Name, Source: s.Source, State: s.State, Health: sourceHealth(s), Reason: s.Reason,
			Owner: owners[s.Name], CheckpointTime: s.CheckpointTime, LagSeconds: s.CheckpointLagSec, InFlight: s.InFlight,
		}
		lag := make([]float64, len(samples))
		for i, sm := range samples {
			v, ok := sm.lag[s.Name]
			if !ok {
				v = math.NaN()
			}
			lag[i] = v
		}
		rates := rateSeries(samples, func(sm consoleSample) (float64, bool) { v, ok := sm.read[s.Name]; return v, ok })
		cs.Lag, cs.Rate = makeSpark(lag), makeSpark(rates)
		cs.EventsPerSec = cs.Rate.Last
		o.Sources = append(o.Sources, cs)
	}
	for _, s := range r.Sinks {
		state, health := sinkState(s)
		k := consoleSink{
			Name: s.Name, State: state, Health: health, Reason: s.Reason, LastError: s.LastError, Circuit: s.Circuit,
			Queued: s.Queued, InProgress: s.InProgress, Parked: s.Parked, Adaptive: s.Adaptive,
			ConcurrencyLimit: s.ConcurrencyLimit, Requests: s.Requests, LastSuccess: s.LastSuccess,
			DeliveredPerMin: math.NaN(), FailedPerMin: math.NaN(),
		}
		if n := len(samples); n > 0 {
			last := samples[n-1]
			k.ParkedEntries = last.deadLetters[s.Name+"\x00"+string(deadletter.KindParked)]
			k.FailedEntries = last.deadLetters[s.Name+"\x00"+string(deadletter.KindFailed)]
		}
		del := func(sm consoleSample) (float64, bool) { v, ok := sm.delivered[s.Name]; return v, ok }
		fail := func(sm consoleSample) (float64, bool) { v, ok := sm.failed[s.Name]; return v, ok }
		k.DeliveredPerMin, k.FailedPerMin = perMinute(samples, del), perMinute(samples, fail)
		k.Delivered = makeSpark(rateSeries(samples, del))
		if k.Health == healthGreen && k.FailedPerMin > 0 {
			// A permanent failure dead-letters at once and leaves the lane
			// "delivering": the failure counter tells.
			k.State, k.Health = "failures in the last minute", healthAmber
		}
		o.Sinks = append(o.Sinks, k)
	}
	return o
}

// rateSeries returns the per-second rate of a counter between consecutive
// samples (NaN where a sample lacks it); one value per sample, the first
// NaN.
func rateSeries(samples []consoleSample, get func(consoleSample) (float64, bool)) []float64 {
	out := make([]float64, len(samples))
	for i := range samples {
		out[i] = math.NaN()
		if i == 0 {
			continue
		}
		a, okA := get(samples[i-1])
		b, okB := get(samples[i])
		dt := samples[i].at.Sub(samples[i-1].at).Seconds()
		if okA && okB && dt > 0 {
			out[i] = max(0, b-a) / dt
		}
	}
	return out
}

// perMinute returns a counter's increase over the last minute of samples
// (over all of them when they span less), NaN with fewer than two.
func perMinute(samples []consoleSample, get func(consoleSample) (float64, bool)) float64 {
	n := len(samples)
	if n < 2 {
		return math.NaN()
	}
	last := samples[n-1]
	b, ok := get(last)
	if !ok {
		return math.NaN()
	}
	i := n - 2
	for i > 0 && last.at.Sub(samples[i-1].at) <= time.Minute {
		i--
	}
	a, ok := get(samples[i])
	if !ok {
		return math.NaN()
	}
	return max(0, b-a)
}
