package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenario 12 (issue 10) measures scale-out: one source split into
// -partitions units (default 4) delivered by 1, 2 and 3 changegate
// processes in cluster mode (lease_ttl 3s, renew_every 1s, distinct
// instance names and admin ports) on the same mongowire server, to a
// receiver answering after -replica-latency (20 ms). Each replica count
// gets a fresh server (and so a fresh state database).
//
// So that the capacity of each replica is the bottleneck, as with a real
// deployment, and not this machine's cores, every replica has a fixed
// max_in_flight (-replica-max-in-flight, 16: about 16/20ms = 800 events/s
// per replica). The ceilings of the rest are measured in the same run:
//
//   - drain: the Go driver reads the (unpartitioned) stream of the backlog;
//   - http: pre-encoded POSTs to the 20 ms receiver from 4 × 16 workers;
//   - one process: a single changegate with max_in_flight 4 × 16 over the
//     same 4 partitions, i.e. mongowire serving 4 filtered streams and the
//     receiver at more than 3 replicas' worth of concurrency.
//
// The replicas start before the backlog is written (start_at a second
// before) and the backlog is written only once the units are spread: all
// owned, each replica at least one and at most ceil(units/replicas). With
// 4 units over 3 replicas a spread of 2/2/0 is stable under the fair-share
// rule; when it happens, a fourth (helper) replica is started until every
// one owns a unit, then stopped gracefully so that its unit moves to the
// idle one (2/1/1). events/s is the steady rate between 10% and 90% of
// the backlog received.

// replRow is one row of scenario 12.
type replRow struct {
	name      string
	replicas  int // 0: a ceiling row
	mif       int // max_in_flight of each process (ceiling rows: concurrency)
	n         int
	rate      float64 // steady events/s (ceiling rows: events/s)
	elapsed   time.Duration
	spread    string // units per replica, e.g. "2/1/1"
	delivered int
	dups      int64
	cpu       time.Duration // all replicas' CPU from the first write to the last delivery
	spreadIn  time.Duration // start to spread
	helper    bool
	busiest   int // most units run by one process
	note      string
	err       error
}

func parseReplicas(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 16 {
			return nil, fmt.Errorf("-replicas: bad replica count %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (b *bench) scenarioReplicas() []*replRow {
	var rows []*replRow
	add := func(r *replRow) {
		if r.err != nil {
			b.logf("  %s: %v", r.name, r.err)
		} else {
			b.logf("  %s: %.0f events/s %s", r.name, r.rate, r.spread)
		}
		rows = append(rows, r)
	}
	add(b.replDrain())
	add(b.replHTTP(4 * b.o.replMIF))
	add(b.runReplicas(1, 4*b.o.replMIF, false))
	for _, m := range b.o.replicas {
		add(b.runReplicas(m, b.o.replMIF, true))
	}
	return rows
}

func (b *bench) replDrain() *replRow {
	n := b.o.replN
	r := &replRow{name: "ceiling: drain (driver reads the unpartitioned stream)", n: n}
	e, start, err := b.backlogEnv(n)
	if err != nil {
		r.err = err
		return r
	}
	defer e.Close()
	res, err := b.runRole("drain", "-uri", e.srv.URI(), "-n", strconv.Itoa(n), "-start", strconv.FormatInt(start, 10))
	r.err = err
	r.elapsed, r.cpu = res.Elapsed, res.CPU
	if res.Elapsed > 0 {
		r.rate = float64(res.Events) / res.Elapsed.Seconds()
	}
	return r
}

func (b *bench) replHTTP(conc int) *replRow {
	// About 4 s at the concurrency's rate, no more than the backlog of
	// the other rows (a smoke run's small one: 12,800 POSTs at 64
	// workers took longer than its scenario time limit on a loaded
	// machine) and at least 1000.
	n := max(min(int(float64(conc)/b.o.replLatency.Seconds()*4), b.o.replN), 1000)
	if b.o.replLatency == 0 {
		n = b.o.replN
	}
	r := &replRow{name: fmt.Sprintf("ceiling: receiver (%s), pre-encoded POSTs", b.o.replLatency), mif: conc, n: n}
	rcv, err := newLoadReceiver(int64(n), n, false, receiverLoad{latency: b.o.replLatency})
	if err != nil {
		r.err = err
		return r
	}
	defer rcv.Close()
	res, err := b.runRole("http", "-url", rcv.url+"/s0", "-n", strconv.Itoa(n), "-c", strconv.Itoa(conc))
	r.err = err
	r.elapsed, r.cpu, r.delivered = res.Elapsed, res.CPU, int(rcv.count.Load())
	if res.Elapsed > 0 {
		r.rate = float64(res.Events) / res.Elapsed.Seconds()
	}
	return r
}

// replica is one changegate process of scenario 12.
type replica struct {
	name, admin string
	c           *child
}

// unitsOf returns the units the replica at admin runs (role "active").
func unitsOf(hc *http.Client, admin string) ([]string, error) {
	resp, err := hc.Get("http://" + admin + "/api/v1/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var st struct {
		Units []struct {
			Name string `json:"name"`
			Role string `json:"role"`
		} `json:"units"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	var out []string
	for _, u := range st.Units {
		if u.Role == "active" {
			out = append(out, u.Name)
		}
	}
	return out, nil
}

// runReplicas runs m changegate processes, each with max_in_flight mif, in
// cluster mode (or one process without it when !cluster) over a backlog
// written once the units are spread.
func (b *bench) runReplicas(m, mif int, cluster bool) *replRow {
	n, parts := b.o.replN, b.o.partitions
	r := &replRow{replicas: m, mif: mif, n: n}
	if cluster {
		r.name = fmt.Sprintf("%d replica(s) in cluster mode", m)
	} else {
		r.replicas = 0
		r.name = "ceiling: one process, no cluster, max_in_flight " + strconv.Itoa(mif)
	}
	e, err := newEnv()
	if err != nil {
		r.err = err
		return r
	}
	defer e.Close()
	rcv, err := newLoadReceiver(int64(n), n, false, receiverLoad{latency: b.o.replLatency})
	if err != nil {
		r.err = err
		return r
	}
	defer rcv.Close()
	startAt := time.Now().Unix() - 1
	newReplica := func(name string) (*replica, error) {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		cfg := gwConf{uri: e.srv.URI(), url: rcv.url, sinks: 1, batch: 1, startAt: startAt, maxInFlight: mif,
			listen: addr, grace: 2 * time.Second, partitions: parts, stateDB: fmt.Sprintf("changegate_r%d", m)}
		if cluster {
			cfg.instance = name
		}
		c, err := b.startGateway(fmt.Sprintf("replicas-%d-%s", m, name), cfg, false)
		if err != nil {
			return nil, err
		}
		return &replica{name: name, admin: addr, c: c}, nil
	}
	var reps []*replica
	defer func() {
		var wg sync.WaitGroup
		for _, p := range reps {
			wg.Add(1)
			go func() { defer wg.Done(); p.c.stop() }()
		}
		wg.Wait()
	}()
	t0 := time.Now()
	for i := 0; i < m; i++ {
		p, err := newReplica(fmt.Sprintf("bench-%d", i))
		if err != nil {
			r.err = err
			return r
		}
		reps = append(reps, p)
	}
	hc := &http.Client{Timeout: time.Second}
	share := (parts + m - 1) / m
	// spread returns the units each process runs, and whether they are
	// spread: every unit owned once, each process at least one (when
	// there are enough units) and at most its fair share.
	spread := func(ps []*replica, fair int) ([][]string, bool, error) {
		owned := make([][]string, len(ps))
		seen := map[string]bool{}
		ok := true
		for i, p := range ps {
			select {
			case <-p.c.exited:
				return nil, false, fmt.Errorf("%s exited: %v\n%s", p.name, p.c.err, p.c.stderr.String())
			default:
			}
			u, err := unitsOf(hc, p.admin)
			if err != nil {
				ok = false
				continue
			}
			owned[i] = u
			for _, x := range u {
				if seen[x] {
					ok = false
				}
				seen[x] = true
			}
			if len(u) > fair || (len(u) == 0 && parts >= len(ps)) {
				ok = false
			}
		}
		return owned, ok && len(seen) == parts, nil
	}
	waitSpread := func(ps []*replica, fair int, limit time.Duration) ([][]string, bool, error) {
		deadline := time.Now().Add(limit)
		for {
			owned, ok, err := spread(ps, fair)
			if err != nil || ok || time.Now().After(deadline) {
				return owned, ok, err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	owned, ok, err := waitSpread(reps, share, 15*time.Second)
	if err == nil && !ok && cluster {
		// A stable but uneven spread (2/2/0): a helper replica makes the
		// share 1 each, then leaves gracefully.
		b.logf("  %d replicas: spread %s after 15 s; starting a helper replica", m, fmtSpread(owned))
		var h *replica
		if h, err = newReplica("bench-helper"); err == nil {
			r.helper = true
			all := append(slices.Clone(reps), h)
			if _, ok, err = waitSpread(all, (parts+len(all)-1)/len(all), 30*time.Second); err == nil && ok {
				h.c.stop()
				owned, ok, err = waitSpread(reps, share, 30*time.Second)
			} else {
				h.c.stop()
			}
		}
	}
	if err == nil && !ok {
		err = fmt.Errorf("units not spread over the processes in time: %s", fmtSpread(owned))
	}
	if err != nil {
		r.err = err
		return r
	}
	r.spreadIn = time.Since(t0)
	// Let every stream settle on its open cursor before the writes.
	time.Sleep(500 * time.Millisecond)
	var cpu0 time.Duration
	for _, p := range reps {
		c, _ := procCPU(p.c.pid())
		cpu0 += c
	}
	tw := time.Now()
	if err := writeBacklog(context.Background(), e.coll, 0, n); err != nil {
		r.err = err
		return r
	}
	b.logf("  %s: spread %s in %s, wrote %d changes in %s", r.name, fmtSpread(owned), r.spreadIn.Round(100*time.Millisecond), n, time.Since(tw).Round(time.Millisecond))
	exited := make(chan *replica, len(reps))
	for _, p := range reps {
		go func() {
			<-p.c.exited
			exited <- p
		}()
	}
	select {
	case <-rcv.Done():
	case p := <-exited:
		r.err = fmt.Errorf("%s exited: %v\n%s", p.name, p.c.err, p.c.stderr.String())
		return r
	case <-time.After(max(60*time.Second, time.Duration(n)*5*time.Millisecond)):
		r.err = fmt.Errorf("timed out with %d of %d delivered", rcv.count.Load(), n)
		return r
	}
	// Duplicates count towards the target: wait a little for the rest.
	for end := time.Now().Add(10 * time.Second); rcv.distinct(0) < n && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	var cpu1 time.Duration
	for _, p := range reps {
		c, _ := procCPU(p.c.pid())
		cpu1 += c
	}
	r.cpu = cpu1 - cpu0
	r.rate = rcv.steadyRate()
	r.elapsed = time.Duration(rcv.last.Load() - rcv.firstAt.Load())
	r.delivered, r.dups = rcv.distinct(0), rcv.dups.Load()
	// The spread at the end: it must not have moved during the run.
	after, _, _ := spread(reps, share)
	r.spread = fmtSpread(owned)
	for _, u := range owned {
		r.busiest = max(r.busiest, len(u))
	}
	if a := fmtSpread(after); a != r.spread {
		r.note = "spread at the end " + a
	}
	return r
}

// fmtSpread renders units per process, e.g. "2/1/1".
func fmtSpread(owned [][]string) string {
	var s []string
	for _, u := range owned {
		s = append(s, strconv.Itoa(len(u)))
	}
	return strings.Join(s, "/")
}

// replReport renders scenario 12.
func (b *bench) replReport(s *strings.Builder) {
	if len(b.repl) == 0 {
		return
	}
	fmt.Fprintf(s, "\nScenario 12: one source, partitions = %d, receiver latency %s; changegate replicas in cluster mode "+
		"(lease_ttl 3s, renew_every 1s), each with a fixed max_in_flight = %d (about %.0f events/s per replica); "+
		"events/s between 10%% and 90%% of the backlog; ceilings measured in the same run\n\n",
		b.o.partitions, b.o.replLatency, b.o.replMIF, float64(b.o.replMIF)/max(b.o.replLatency.Seconds(), 1e-9))
	s.WriteString("| run | processes × max_in_flight | units per process | changes | events/s | vs 1 replica | target | changegate CPU µs/event | lost | dups | notes |\n")
	s.WriteString("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	var one float64
	for _, r := range b.repl {
		if r.replicas == 1 && r.err == nil {
			one = r.rate
		}
	}
	targets := map[int]string{1: "", 2: "≥ 1.7×", 3: "≥ 2.4×"}
	for _, r := range b.repl {
		procs := fmt.Sprintf("%d × %d", max(r.replicas, 1), r.mif)
		if r.err != nil {
			fmt.Fprintf(s, "| %s | %s | | %d | FAILED: %s | | | | | | |\n", r.name, procs, r.n, oneLine(r.err.Error()))
			continue
		}
		vs, lost, dups, cpu := "", "", "", "—"
		var notes []string
		if r.note != "" {
			notes = append(notes, r.note)
		}
		switch {
		case strings.HasPrefix(r.name, "ceiling: drain"):
			procs = "driver"
		case strings.HasPrefix(r.name, "ceiling: receiver"):
			procs = fmt.Sprintf("%d workers", r.mif)
		default:
			lost, dups = strconv.Itoa(r.n-r.delivered), strconv.FormatInt(r.dups, 10)
			if r.dups > 0 {
				notes = append(notes, "duplicates count in events/s")
			}
			if r.n > 0 && r.cpu > 0 {
				cpu = fmt.Sprintf("%.0f", float64(r.cpu.Microseconds())/float64(r.n))
			}
			notes = append(notes, fmt.Sprintf("%s first to last delivery; spread in %s", r.elapsed.Round(100*time.Millisecond), r.spreadIn.Round(100*time.Millisecond)))
			if r.replicas > 0 && r.busiest > 0 {
				notes = append(notes, fmt.Sprintf("bound by the busiest process (%d of %d units): %.2f× one", r.busiest, b.o.partitions, float64(b.o.partitions)/float64(r.busiest)))
			}
			if r.helper {
				notes = append(notes, "a helper replica was needed to leave 2/2/0")
			}
		}
		if r.replicas > 0 && one > 0 {
			vs = fmt.Sprintf("%.2f×", r.rate/one)
		}
		fmt.Fprintf(s, "| %s | %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s |\n",
			r.name, procs, r.spread, r.n, r.rate, vs, targets[r.replicas], cpu, lost, dups, strings.Join(notes, "; "))
	}
}
