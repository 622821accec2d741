package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Scenarios 10 and 11 (issue 11) measure the sinks' concurrency limit
// against receivers that take time: changegate's defaults (max_in_flight =
// "auto") and fixed max_in_flight values swept in the same run, one
// changegate process per setting over a fresh backlog.
//
//   - 10 (latency): a receiver answering every request after a fixed
//     latency (-latencies, default 20ms, 50ms and 200ms).
//   - 11 (slots): a receiver that serves at most 32 requests at once, each
//     in 50 ms, and answers 429 with Retry-After: 1 above that.
//
// The backlog of each setting is sized so that it runs about -run-time at
// the rate the setting can reach (min(max_in_flight/latency, -rate-cap);
// 10,000 for auto: max_in_flight_events, max_in_flight_max being unset),
// and events/s is the steady rate between 10% and 90% of the backlog
// received. A setting that has not delivered its backlog 3×-run-time (at
// least 5 s) after its first request is stopped; its rate is still the one
// between 10% and 90% if 90% had arrived, else what it delivered so far
// over the time.

const (
	slotCount   = 32
	slotLatency = 50 * time.Millisecond
	lateAfter   = 5 * time.Second
)

// limitRow is one setting against one receiver.
type limitRow struct {
	id       int
	receiver string
	fixed    int // 0: the defaults; < 0: auto with max_in_flight_max = -fixed
	n        int // backlog
	// delivered is the number of distinct changes received.
	delivered int
	dups      int64
	rate      float64 // steady events/s (or so far, when !finished && !steady)
	finished  bool
	// steady: rate is the steady rate between 10% and 90% of the backlog
	// received, as for a finished setting, although the cut came before
	// the last changes did.
	steady    bool
	elapsed   time.Duration // first request to the last envelope (or the cut)
	requests  int64
	throttled int64
	lateReqs  int64 // requests 5 s or more after the first
	late429   int64
	dead      int64 // dead letters at the end (not parked entries)
	parked    int64 // parked entries at the end (a failing lane's backlog)
	// From /api/v1/status, sampled every 200 ms between 10% and 90% of the
	// backlog: the median and largest concurrency limit, the median
	// requests in flight and smoothed latency.
	limitMed, limitMax, inFlightMed int
	latencyMed                      float64
	samples                         int
	err                             error
}

func (r *limitRow) setting() string {
	switch {
	case r.fixed == 0:
		return "auto (default)"
	case r.fixed < 0:
		return fmt.Sprintf("auto, max %d", -r.fixed)
	}
	return strconv.Itoa(r.fixed)
}

// settings returns the defaults, auto with -auto-max, then the swept fixed
// values.
func (b *bench) settings() []int {
	s := []int{0}
	if b.o.autoMax > 0 {
		s = append(s, -b.o.autoMax)
	}
	return append(s, b.o.sweep...)
}

// ceiling is the most requests a setting may have in flight.
func ceiling(setting int) int {
	switch {
	case setting == 0:
		// max_in_flight_max unset: the source's max_in_flight_events
		// (10,000 by default; the bench sets none), the open files
		// permitting.
		return 10000
	case setting < 0:
		return -setting
	}
	return setting
}

// sizeBacklog returns the backlog for a setting that can reach perSecond
// events/s: -run-time's worth at that rate, capped at -rate-cap.
func (b *bench) sizeBacklog(perSecond float64) int {
	rate := min(perSecond, float64(b.o.rateCap))
	return max(int(rate*b.o.runTime.Seconds()), 400)
}

func (b *bench) scenarioAdaptiveLatency() []*limitRow {
	var rows []*limitRow
	for _, lat := range b.o.latencies {
		name := fmt.Sprintf("latency %s", lat)
		for _, fixed := range b.settings() {
			n := b.sizeBacklog(float64(ceiling(fixed)) / lat.Seconds())
			r := b.runLimit(10, name, receiverLoad{latency: lat}, fixed, n)
			rows = append(rows, r)
		}
	}
	return rows
}

func (b *bench) scenarioAdaptiveSlots() []*limitRow {
	var rows []*limitRow
	name := fmt.Sprintf("%d slots × %s, 429 above", slotCount, slotLatency)
	capacity := float64(slotCount) / slotLatency.Seconds()
	for _, fixed := range b.settings() {
		r := b.runLimit(11, name, receiverLoad{latency: slotLatency, slots: slotCount, lateAfter: lateAfter}, fixed, b.sizeBacklog(capacity))
		rows = append(rows, r)
	}
	return rows
}

// freeAddr returns a free loopback address for changegate's admin server.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// statusSample is one reading of the sink in /api/v1/status.
type statusSample struct {
	at       int64 // unix nanos
	limit    int
	inFlight int
	latency  float64
}

// pollStatus reads /api/v1/status every 200 ms until stop is closed.
func pollStatus(addr string, stop <-chan struct{}) func() []statusSample {
	var mu sync.Mutex
	var samples []statusSample
	done := make(chan struct{})
	hc := &http.Client{Timeout: time.Second}
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			resp, err := hc.Get("http://" + addr + "/api/v1/status")
			if err != nil {
				continue
			}
			var st struct {
				Sinks []struct {
					Limit    int     `json:"concurrencyLimit"`
					InFlight int     `json:"requestsInFlight"`
					Latency  float64 `json:"latencyMs"`
				} `json:"sinks"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil || len(st.Sinks) == 0 {
				continue
			}
			s := st.Sinks[0]
			mu.Lock()
			samples = append(samples, statusSample{time.Now().UnixNano(), s.Limit, s.InFlight, s.Latency})
			mu.Unlock()
		}
	}()
	return func() []statusSample {
		<-done
		return samples
	}
}

func median[T int | float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// runLimit runs changegate with max_in_flight = fixed (0: the defaults) over
// a backlog of n changes against a receiver with load.
func (b *bench) runLimit(id int, name string, load receiverLoad, fixed, n int) *limitRow {
	r := &limitRow{id: id, receiver: name, fixed: fixed, n: n}
	defer func() {
		if r.err != nil {
			b.logf("  %s, max_in_flight %s: %v", name, r.setting(), r.err)
			return
		}
		b.logf("  %s, max_in_flight %s: %d changes, %.0f events/s%s, limit median %d", name, r.setting(), n, r.rate,
			map[bool]string{true: "", false: " (cut)"}[r.finished], r.limitMed)
	}()
	e, start, err := b.backlogEnv(n)
	if err != nil {
		r.err = err
		return r
	}
	defer e.Close()
	rcv, err := newLoadReceiver(int64(n), n, false, load)
	if err != nil {
		r.err = err
		return r
	}
	defer rcv.Close()
	addr, err := freeAddr()
	if err != nil {
		r.err = err
		return r
	}
	tag := fmt.Sprintf("limit-%d-%s-%d", id, strings.ReplaceAll(load.latency.String(), ".", "_"), fixed)
	gc := gwConf{uri: e.srv.URI(), url: rcv.url, sinks: 1, batch: 1, startAt: start, listen: addr, grace: 2 * time.Second}
	if fixed > 0 {
		gc.maxInFlight = fixed
	} else {
		gc.maxInFlightMax = -fixed
	}
	c, err := b.startGateway(tag, gc, false)
	if err != nil {
		r.err = err
		return r
	}
	defer c.stop()
	stop := make(chan struct{})
	samples := pollStatus(addr, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()
	select {
	case <-rcv.firstReq:
	case <-c.exited:
		r.err = fmt.Errorf("changegate exited: %v\n%s", c.err, c.stderr.String())
		return r
	case <-time.After(60 * time.Second):
		r.err = fmt.Errorf("no request within 60 s; changegate stderr:\n%s", c.stderr.String())
		return r
	}
	limit := max(3*b.o.runTime, 5*time.Second)
	select {
	case <-rcv.Done():
		r.finished = true
	case <-c.exited:
		r.err = fmt.Errorf("changegate exited: %v\n%s", c.err, c.stderr.String())
		return r
	case <-time.After(limit):
	}
	cut := time.Now().UnixNano()
	close(stop)
	r.delivered, r.dups = rcv.distinct(0), rcv.dups.Load()
	r.requests, r.throttled = rcv.requests.Load(), rcv.throttled.Load()
	r.lateReqs, r.late429 = rcv.lateReqs.Load(), rcv.late429.Load()
	first := rcv.firstAt.Load()
	switch {
	case r.finished:
		r.elapsed = time.Duration(rcv.last.Load() - first)
		r.rate = rcv.steadyRate()
	case rcv.steadyRate() > 0:
		// Cut after 90% of the backlog arrived: its steady rate is
		// measured as a finished setting's (at 1 s, auto had 119,993 of
		// 120,000 at the cut, and "all delivered / time" counted its
		// ramp against it where the others' 10%-90% rate did not).
		r.elapsed = time.Duration(cut - first)
		r.rate, r.steady = rcv.steadyRate(), true
	default:
		r.elapsed = time.Duration(cut - first)
		r.rate = float64(rcv.count.Load()) / r.elapsed.Seconds()
	}
	// The collection holds dead letters and parked entries (kind
	// "parked": a failing lane's backlog, re-driven in order): counted
	// apart, since only the first are given up on.
	dlc := e.client.Database("changegate").Collection("deadletters")
	if dl, err := dlc.CountDocuments(context.Background(), bson.D{{Key: "kind", Value: bson.D{{Key: "$ne", Value: "parked"}}}}); err == nil {
		r.dead = dl
	}
	if pk, err := dlc.CountDocuments(context.Background(), bson.D{{Key: "kind", Value: "parked"}}); err == nil {
		r.parked = pk
	}
	from, to := rcv.at10.Load(), rcv.at90.Load()
	if !r.finished && !r.steady {
		from, to = first, cut
	}
	all := samples()
	if fixed <= 0 && len(all) > 0 {
		// The trajectory of the adaptive limit, one sample a second.
		var tr []string
		for i := 0; i < len(all); i += 5 {
			tr = append(tr, fmt.Sprintf("%d@%.0fms", all[i].limit, all[i].latency))
		}
		b.logf("  %s, auto: limit@latency every second: %s", name, strings.Join(tr, " "))
	}
	var lims, infl []int
	var lats []float64
	for _, s := range all {
		if s.at < from || s.at > to {
			continue
		}
		lims, infl, lats = append(lims, s.limit), append(infl, s.inFlight), append(lats, s.latency)
		r.limitMax = max(r.limitMax, s.limit)
	}
	r.samples = len(lims)
	r.limitMed, r.inFlightMed, r.latencyMed = median(lims), median(infl), median(lats)
	return r
}

// parseLatencies parses a comma-separated list of durations.
func parseLatencies(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < 0 {
			return nil, fmt.Errorf("-latencies: bad duration %q", f)
		}
		out = append(out, d)
	}
	return out, nil
}

// parseSweep parses a comma-separated list of max_in_flight values.
func parseSweep(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sweep: bad max_in_flight %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// limitReport renders scenarios 10 and 11.
func (b *bench) limitReport(s *strings.Builder) {
	if len(b.limits) == 0 {
		return
	}
	s.WriteString("\nScenarios 10–11: max_in_flight against receivers that take time (events/s between 10% and 90% of the backlog; " +
		"limit, in flight and latency: medians of /api/v1/status every 200 ms in that window)\n\n")
	s.WriteString("| # | receiver | max_in_flight | changes | events/s | vs best fixed | limit median (max) | in flight | latency ms | requests | 429 | 429 after 5 s | lost | notes |\n")
	s.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	best := map[string]float64{}
	for _, r := range b.limits {
		if r.err == nil && r.fixed > 0 {
			best[r.receiver] = max(best[r.receiver], r.rate)
		}
	}
	for _, r := range b.limits {
		if r.err != nil {
			fmt.Fprintf(s, "| %d | %s | %s | %d | FAILED: %s | | | | | | | | | |\n", r.id, r.receiver, r.setting(), r.n, oneLine(r.err.Error()))
			continue
		}
		vs := ""
		if bb := best[r.receiver]; bb > 0 {
			vs = fmt.Sprintf("%.0f%%", 100*r.rate/bb)
		}
		rate := fmt.Sprintf("%.0f", r.rate)
		lost := "0"
		var notes []string
		switch {
		case !r.finished && r.steady:
			lost = "n/a"
			notes = append(notes, fmt.Sprintf("cut after %s with %d of %d delivered: rate between 10%% and 90%% of the backlog, as for the others (all delivered / time: %.0f)", r.elapsed.Round(time.Second), r.delivered, r.n, float64(r.delivered)/r.elapsed.Seconds()))
		case !r.finished:
			rate = "≤ " + rate
			lost = "n/a"
			notes = append(notes, fmt.Sprintf("cut after %s with %d of %d delivered: rate = all delivered / time", r.elapsed.Round(time.Second), r.delivered, r.n))
		default:
			if l := r.n - r.delivered; l != 0 {
				lost = strconv.Itoa(l)
			}
		}
		if r.dups > 0 {
			notes = append(notes, fmt.Sprintf("%d duplicates", r.dups))
		}
		if r.dead > 0 {
			notes = append(notes, fmt.Sprintf("%d dead letters", r.dead))
		}
		if r.parked > 0 {
			notes = append(notes, fmt.Sprintf("%d parked at the cut", r.parked))
		}
		if r.finished {
			notes = append(notes, fmt.Sprintf("%s in all", r.elapsed.Round(100*time.Millisecond)))
		}
		late := "—"
		if r.id == 11 && r.lateReqs > 0 {
			late = fmt.Sprintf("%.2f%% (%d/%d)", 100*float64(r.late429)/float64(r.lateReqs), r.late429, r.lateReqs)
		} else if r.id == 11 {
			late = "no request after 5 s"
		}
		lim := "—"
		if r.samples > 0 {
			lim = fmt.Sprintf("%d (%d)", r.limitMed, r.limitMax)
		}
		fmt.Fprintf(s, "| %d | %s | %s | %d | %s | %s | %s | %d | %.1f | %d | %d | %s | %s | %s |\n",
			r.id, r.receiver, r.setting(), r.n, rate, vs, lim, r.inFlightMed, r.latencyMed,
			r.requests, r.throttled, late, lost, strings.Join(notes, "; "))
	}
}
