// Command bench measures changegate end to end on this machine, side by side
// with the ceilings of its source and sink sides and with the naive loop it
// replaces, and prints a markdown table:
//
//	go run ./test/cmd/bench [-quick] [-scenarios 1,2,4|all|limits] [-n N] [-backlog N]
//
// Everything runs here: test/mongowire (the in-memory MongoDB wire-protocol
// test server) and a lean loopback webhook receiver run in this process;
// changegate (cmd/changegate, built by the command) and the baselines (the
// drain loop, the HTTP client, the naive loop; this binary re-executed in a
// role) run as child processes, so that their CPU time (/proc/<pid>/stat)
// and peak RSS (VmHWM) are their own.
//
// Scenarios:
//
//  1. drain: the Go driver reads the change stream and discards events.
//  2. http: a client POSTs pre-encoded envelopes to the receiver with
//     -concurrency workers (changegate's max_in_flight).
//  3. naive: for each change, POST it, then save the resume token (upsert).
//  4. single: changegate, one webhook sink, one event per request, key order.
//  5. batch: the same with batch_size = 100.
//  6. fanout: every event to 4 webhook sinks.
//  7. latency: -rate changes/s for -duration; write to receiver 2xx.
//  8. backlog: -backlog changes written while changegate is stopped; then
//     it starts: catch-up time and peak RSS.
//  9. filter: a rule keeping 10% of the changes, pushed down into the change
//     stream ($match) or evaluated client-side only.
//  10. limit: the defaults (max_in_flight = "auto") and fixed max_in_flight
//     values (-sweep) against receivers with a fixed latency (-latencies).
//  11. slots: the same against a receiver serving at most 32 requests at
//     once (50 ms each) and answering 429 with Retry-After: 1 above that.
//  12. replicas: one source with partitions = 4 delivered by 1, 2 and 3
//     changegate processes in cluster mode, each with a fixed
//     max_in_flight, to a receiver with 20 ms latency; with the
//     ceilings of mongowire and the receiver measured in the same run
//     (see replicas.go).
//  13. snapshot: -snapshot-n documents exist before changegate's first
//     start with snapshot = "initial"; a webhook sink with batch_size =
//     100 receives them all as snapshot events: documents/s and peak RSS
//     (see snapshot.go).
//  14. large: 1,000 changes of 1 MiB and 100 of 8 MiB to a webhook
//     (max_request_bytes = 16777216), each next to the bare-POST ceiling
//     of the same bodies: MB/s, and peak RSS next to the byte budget
//     (max_in_flight_bytes; see large.go).
//  15. minimal: the least a consumer does per change to deliver what
//     changegate delivers (read, copy, event.FromChange, encode the
//     envelope, sign, POST from -concurrency workers; no ordering,
//     checkpoints, retries or limits), with 1 event per request and with
//     batches of 100, against the ceilings of 4 and 5: changegate's CPU
//     above it is the cost of its guarantees (the "minimal" role).
//
// "all" runs 1-9; 10 and 11 (about 6 minutes) run when named, or with
// "limits" (see adaptive.go); 12 (about 70 s), 13, 14 and 15 run when named.
//
// Scenarios 1-6 and 9 drain a backlog written before the consumer starts
// (events/s is measured from the first to the last event received), so
// they measure how fast each consumer can go; latency is measured in 7 and
// 8. With -profile DIR, changegate runs as this binary's "gateway" role
// (app.Run, as cmd/changegate) writing CPU and allocation profiles there,
// and the minimal consumer (15) a CPU profile of its own, for a
// differential profile of the two on the same workload.
// With -otlp, changegate's tracing is on: it exports its spans over
// OTLP/HTTP to a receiver in this process (which decodes and counts them,
// its CPU in the mongowire+receiver column), with the sampler this
// environment's OTEL_TRACES_SAMPLER(_ARG) name, e.g.
//
//	OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01 \
//		go run ./test/cmd/bench -scenarios 5 -otlp
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/test/mongowire"
	"github.com/changegate/changegate/test/otlp"
)

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role, os.Args[1:]))
	}
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}

var scenarioNames = []string{"", "drain", "http", "naive", "single", "batch", "fanout", "latency", "backlog", "filter", "limit", "slots", "replicas", "snapshot", "large", "minimal"}

// allScenarios is how many scenarios "all" runs: 10 and 11 (issue 11's
// max_in_flight sweeps, about 6 minutes) only run when named, or with
// "limits".
const allScenarios = 9

type benchOpts struct {
	scenarios   map[int]bool
	n           int
	naiveN      int
	backlog     int
	rate        int
	duration    time.Duration
	concurrency int
	changegate  string // binary; "self": this binary's gateway role; "": build cmd/changegate
	profile     string
	timeout     time.Duration
	out         string
	quick       bool
	latencies   []time.Duration // scenario 10
	sweep       []int           // fixed max_in_flight values of 10 and 11
	autoMax     int             // 10 and 11: an extra auto row with this max_in_flight_max
	runTime     time.Duration   // target run time of one setting in 10 and 11
	rateCap     int             // events/s assumed at most when sizing 10 and 11
	maxInFlight int             // sinks' max_in_flight in 4-9 (0: the default)
	sinkTOML    string          // extra TOML lines for every sink in 4-9 (e.g. payload shaping)
	deliveryLog string          // [delivery_log] mode in 4-9 ("": the config says nothing, changegate's default)
	replicas    []int           // scenario 12: replica counts
	replN       int             // scenario 12: backlog
	replMIF     int             // scenario 12: each replica's max_in_flight
	partitions  int             // scenario 12: partitions of the source
	replLatency time.Duration   // scenario 12: receiver latency
	snapN       int             // scenario 13: pre-existing documents
	otlp        bool            // trace changegate to an in-process OTLP receiver
	cpus        string          // -cpus: "", "auto" or CONSUMER/BENCH CPU lists
}

type bench struct {
	o      benchOpts
	self   string
	cgBin  string
	tmp    string
	log    io.Writer
	drain  float64 // events/s of the ceilings and the naive loop, 0 when not run
	http   float64
	naive  float64
	result []*result
	limits []*limitRow // scenarios 10 and 11
	repl   []*replRow  // scenario 12
	// otlp is the in-process OTLP/HTTP receiver changegate exports its
	// spans to (-otlp), nil without.
	otlp *otlp.Receiver
	// pin is the -cpus option: the consumer's and this process's CPU sets.
	pin pinning
}

// result is one row of the table.
type result struct {
	id         int
	name       string
	events     int           // changes consumed
	deliveries int           // envelopes received
	elapsed    time.Duration // first to last event
	cpu        time.Duration // consumer process CPU during elapsed
	envCPU     time.Duration // this process (mongowire + receiver) CPU
	rss        int64         // consumer peak RSS
	lat        *latStats
	ceiling    float64 // events/s this row is compared with; 0: none
	ceilName   string
	note       string
	err        error

	// pair names the work a changegate row and a minimal consumer's row
	// (minimal set) have in common; the report gives changegate's CPU
	// per event as a multiple of the minimal consumer's in the same run.
	pair    string
	minimal bool
}

func (r *result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.events) / r.elapsed.Seconds()
}

func benchMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scen := fs.String("scenarios", "all", "comma-separated scenario numbers or names: 1 drain, 2 http, 3 naive, 4 single, 5 batch, 6 fanout, 7 latency, 8 backlog, 9 filter, 10 limit, 11 slots, 12 replicas, 13 snapshot, 14 large, 15 minimal; all (1-9), limits (10-11)")
	repls := fs.String("replicas", "1,2,3", "scenario 12: replica counts")
	lats := fs.String("latencies", "20ms,50ms,200ms", "receiver latencies of scenario 10")
	sweep := fs.String("sweep", "16,64,256,1024,4096", "fixed max_in_flight values run next to the defaults in scenarios 10 and 11")
	var o benchOpts
	fs.BoolVar(&o.quick, "quick", false, "small sizes (about a minute in all)")
	fs.IntVar(&o.n, "n", 0, "changes per throughput scenario (default 200000; -quick 20000)")
	fs.IntVar(&o.naiveN, "naive-n", 0, "changes for the naive loop (default n/10; -quick n/10)")
	fs.IntVar(&o.backlog, "backlog", 0, "changes written while changegate is down in scenario 8 (default 1000000; -quick 50000)")
	fs.IntVar(&o.rate, "rate", 2000, "offered changes/s in scenario 7")
	fs.DurationVar(&o.duration, "duration", 0, "length of scenario 7 (default 10s; -quick 3s)")
	fs.IntVar(&o.concurrency, "concurrency", 16, "HTTP concurrency of the ceiling client (changegate uses its defaults, max_in_flight = \"auto\", unless -max-in-flight is given)")
	fs.StringVar(&o.changegate, "changegate", "", `changegate binary to run (default: build ./cmd/changegate; "self": this binary running app.Run)`)
	fs.StringVar(&o.profile, "profile", "", "write CPU and allocation profiles of changegate (runs changegate in-process via app.Run) and a CPU profile of the minimal consumer to this directory")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "time limit of one scenario")
	fs.StringVar(&o.out, "o", "", "also write the report to this file")
	fs.DurationVar(&o.runTime, "run-time", 0, "scenarios 10 and 11: size each setting's backlog to run about this long (default 8s; -quick 2s)")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 0, "scenarios 4-9: the sinks' max_in_flight (default: changegate's default)")
	fs.StringVar(&o.sinkTOML, "sink-toml", "", `scenarios 4-9: TOML added to every sink, e.g. 'redact = ["fullDocument.customer"]' (payload shaping); keep fullDocument.seq and wts, which the receiver reads`)
	fs.StringVar(&o.deliveryLog, "delivery-log", "", `scenarios 4-9: [delivery_log] mode = "off", "failures" (changegate's default) or "all" (default: no [delivery_log] table, for binaries that predate it)`)
	fs.IntVar(&o.autoMax, "auto-max", 0, "scenarios 10 and 11: also run auto with this max_in_flight_max (0: not)")
	fs.IntVar(&o.rateCap, "rate-cap", 12000, "scenarios 10 and 11: the events/s a setting is assumed to reach at most, when sizing its backlog")
	fs.IntVar(&o.replN, "replicas-n", 0, "scenario 12: backlog per replica count (default 16000; -quick 4000)")
	fs.IntVar(&o.replMIF, "replica-max-in-flight", 16, "scenario 12: each replica's fixed max_in_flight")
	fs.IntVar(&o.partitions, "partitions", 4, "scenario 12: partitions of the source")
	fs.DurationVar(&o.replLatency, "replica-latency", 20*time.Millisecond, "scenario 12: receiver latency")
	fs.IntVar(&o.snapN, "snapshot-n", 0, "scenario 13: documents of the initial snapshot (default 1000000; -quick 100000)")
	fs.BoolVar(&o.otlp, "otlp", false, "turn changegate's tracing on: OTEL_EXPORTER_OTLP_ENDPOINT is an OTLP/HTTP receiver in this process (it decodes and counts the spans); the other OTEL_* variables (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_BSP_*) are passed on from this environment")
	fs.StringVar(&o.cpus, "cpus", "", `pin the consumer (changegate or a baseline) and this process (mongowire and the receiver) to disjoint CPU sets: "auto" (the available CPUs halved; unpinned, with a message, below 4 CPUs) or CONSUMER/BENCH lists such as "2-3/0-1"`)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.replN == 0 {
		o.replN = 16000
		if o.quick {
			o.replN = 4000
		}
	}
	if o.snapN == 0 {
		o.snapN = 1000000
		if o.quick {
			o.snapN = 100000
		}
	}
	if o.n == 0 {
		o.n = 200000
		if o.quick {
			o.n = 20000
		}
	}
	if o.naiveN == 0 {
		o.naiveN = max(o.n/10, 100)
	}
	if o.backlog == 0 {
		o.backlog = 1000000
		if o.quick {
			o.backlog = 50000
		}
	}
	if o.duration == 0 {
		o.duration = 10 * time.Second
		if o.quick {
			o.duration = 3 * time.Second
		}
	}
	if o.runTime == 0 {
		o.runTime = 8 * time.Second
		if o.quick {
			o.runTime = 2 * time.Second
		}
	}
	var err error
	if o.latencies, err = parseLatencies(*lats); err == nil {
		o.sweep, err = parseSweep(*sweep)
	}
	if err == nil {
		o.replicas, err = parseReplicas(*repls)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	o.scenarios = map[int]bool{}
	for _, s := range strings.Split(*scen, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "all":
			for i := 1; i <= allScenarios; i++ {
				o.scenarios[i] = true
			}
			continue
		case "limits":
			o.scenarios[10], o.scenarios[11] = true, true
			continue
		}
		i, err := strconv.Atoi(s)
		if err != nil {
			i = slices.Index(scenarioNames, s)
		}
		if i < 1 || i >= len(scenarioNames) {
			fmt.Fprintf(stderr, "bench: unknown scenario %q\n", s)
			return 2
		}
		o.scenarios[i] = true
	}
	b, err := newBench(o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(b.tmp)
	if o.otlp {
		b.otlp = otlp.NewCounter()
		defer b.otlp.Close()
	}
	report := b.run(args)
	fmt.Fprint(stdout, report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	}
	for _, r := range b.result {
		if r.err != nil {
			return 1
		}
	}
	for _, r := range b.limits {
		if r.err != nil {
			return 1
		}
	}
	for _, r := range b.repl {
		if r.err != nil {
			return 1
		}
	}
	return 0
}

func newBench(o benchOpts, log io.Writer) (*bench, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "changegate-bench-")
	if err != nil {
		return nil, err
	}
	b := &bench{o: o, self: self, tmp: tmp, log: log}
	avail, err := availableCPUs()
	if err == nil {
		b.pin, err = parseCPUs(o.cpus, avail)
	}
	if err == nil {
		err = b.pin.pinSelf()
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if o.cpus != "" {
		b.logf("-cpus %s: %s", o.cpus, b.pin.desc)
	}
	switch {
	case o.profile != "" || o.changegate == "self":
	case o.changegate != "":
		b.cgBin = o.changegate
	default:
		b.cgBin = filepath.Join(tmp, "changegate")
		fmt.Fprintln(log, "bench: building ./cmd/changegate")
		cmd := exec.Command("go", "build", "-o", b.cgBin, "github.com/changegate/changegate/cmd/changegate")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("go build ./cmd/changegate: %w", err)
		}
	}
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			os.RemoveAll(tmp)
			return nil, err
		}
	}
	return b, nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

func (b *bench) run(args []string) string {
	loadBefore := loadAvg()
	started := time.Now()
	steps := []struct {
		id int
		f  func() []*result
	}{
		{1, b.scenarioDrain}, {2, b.scenarioHTTP}, {3, b.scenarioNaive},
		{4, func() []*result { return b.gatewayBacklog(4, 1, 1, false, false) }},
		{5, func() []*result { return b.gatewayBacklog(5, 1, 100, false, false) }},
		{6, func() []*result { return b.gatewayBacklog(6, 4, 1, false, false) }},
		{7, b.scenarioLatency}, {8, b.scenarioBacklog},
		{9, func() []*result {
			return append(b.gatewayBacklog(9, 1, 1, true, false), b.gatewayBacklog(9, 1, 1, true, true)...)
		}},
		{15, b.scenarioMinimal},
	}
	for _, st := range steps {
		if !b.o.scenarios[st.id] {
			continue
		}
		b.logf("scenario %d (%s)", st.id, scenarioNames[st.id])
		rs := st.f()
		for _, r := range rs {
			if r.err != nil {
				b.logf("scenario %d (%s): %v", r.id, r.name, r.err)
			} else {
				b.logf("scenario %d (%s): %.0f events/s", r.id, r.name, r.rate())
			}
			switch r.id {
			case 1:
				b.drain = r.rate()
			case 2:
				b.http = r.rate()
			case 3:
				b.naive = r.rate()
			}
		}
		b.result = append(b.result, rs...)
		runtime.GC()
		debug.FreeOSMemory()
	}
	for _, st := range []struct {
		id int
		f  func() []*limitRow
	}{{10, b.scenarioAdaptiveLatency}, {11, b.scenarioAdaptiveSlots}} {
		if !b.o.scenarios[st.id] {
			continue
		}
		b.logf("scenario %d (%s)", st.id, scenarioNames[st.id])
		b.limits = append(b.limits, st.f()...)
		runtime.GC()
		debug.FreeOSMemory()
	}
	if b.o.scenarios[12] {
		b.logf("scenario 12 (replicas)")
		b.repl = b.scenarioReplicas()
	}
	if b.o.scenarios[13] {
		b.logf("scenario 13 (snapshot)")
		rs := b.scenarioSnapshot()
		for _, r := range rs {
			if r.err != nil {
				b.logf("scenario 13 (snapshot): %v", r.err)
			} else {
				b.logf("scenario 13 (snapshot): %.0f documents/s", r.rate())
			}
		}
		b.result = append(b.result, rs...)
	}
	if b.o.scenarios[14] {
		b.logf("scenario 14 (large)")
		rs := b.scenarioLarge()
		for _, r := range rs {
			if r.err != nil {
				b.logf("scenario 14 (large): %v", r.err)
			} else {
				b.logf("scenario 14 (large): %s: %.1f events/s; %s", r.name, r.rate(), r.note)
			}
		}
		b.result = append(b.result, rs...)
	}
	return b.report(args, started, loadBefore, loadAvg())
}

// env is a fresh mongowire server with a writer client.
type env struct {
	srv    *mongowire.Server
	client *mongo.Client
	coll   *mongo.Collection
}

func newEnv() (*env, error) {
	srv, err := mongowire.Start(mongowire.Options{CommandLogLimit: -1})
	if err != nil {
		return nil, err
	}
	client, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	if err != nil {
		srv.Close()
		return nil, err
	}
	return &env{srv: srv, client: client, coll: client.Database(benchDB).Collection(benchColl)}, nil
}

func (e *env) Close() {
	_ = e.client.Disconnect(context.Background())
	_ = e.srv.Close()
}

// backlogEnv returns a fresh server holding n changes and the stream start
// (unix seconds) before them.
func (b *bench) backlogEnv(n int) (*env, int64, error) {
	e, err := newEnv()
	if err != nil {
		return nil, 0, err
	}
	start := time.Now().Unix() - 1
	t := time.Now()
	if err := writeBacklog(context.Background(), e.coll, 0, n); err != nil {
		e.Close()
		return nil, 0, err
	}
	b.logf("  wrote %d changes in %s", n, time.Since(t).Round(time.Millisecond))
	return e, start, nil
}

// child is a child process.
type child struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr tailBuffer
	exited chan struct{}
	err    error
}

// tailBuffer keeps the last 8 KiB written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 8<<10 {
		t.b = append(t.b[:0], t.b[len(t.b)-8<<10:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

func (b *bench) start(name string, args []string, role string, env ...string) (*child, error) {
	c := &child{cmd: exec.Command(name, args...), exited: make(chan struct{})}
	c.cmd.Stdout = &c.stdout
	c.cmd.Stderr = &c.stderr
	c.cmd.Env = append(os.Environ(), env...)
	if role != "" {
		c.cmd.Env = append(c.cmd.Env, roleEnv+"="+role)
	}
	if err := b.pin.startPinned(c.cmd.Start); err != nil {
		if c.cmd.Process != nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
		return nil, err
	}
	if b.pin.on {
		b.logf("  %s runs on CPUs %s; this process on %s", filepath.Base(name), allowedCPUs(c.pid()), allowedCPUs(os.Getpid()))
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop sends SIGTERM and waits (then kills) the process.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// runRole runs a baseline role to completion and returns its report.
func (b *bench) runRole(role string, args ...string) (roleResult, error) {
	c, err := b.start(b.self, args, role)
	if err != nil {
		return roleResult{}, err
	}
	select {
	case <-c.exited:
	case <-time.After(b.o.timeout):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return roleResult{}, fmt.Errorf("%s: timed out after %s", role, b.o.timeout)
	}
	var res roleResult
	if err := json.Unmarshal(c.stdout.Bytes(), &res); err != nil {
		return res, fmt.Errorf("%s: %v; stderr: %s", role, c.err, c.stderr.String())
	}
	if res.Err != "" {
		return res, fmt.Errorf("%s: %s", role, res.Err)
	}
	return res, nil
}

func (b *bench) scenarioDrain() []*result {
	r := &result{id: 1, name: "drain ceiling: driver reads the stream, discards"}
	e, start, err := b.backlogEnv(b.o.n)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer e.Close()
	e0 := selfCPU()
	res, err := b.runRole("drain", "-uri", e.srv.URI(), "-n", strconv.Itoa(b.o.n), "-start", strconv.FormatInt(start, 10))
	r.envCPU = selfCPU() - e0
	r.err = err
	r.events, r.elapsed, r.cpu, r.rss = res.Events, res.Elapsed, res.CPU, res.HWM
	r.note = "backlog; mongowire CPU includes serving the stream"
	return []*result{r}
}

func (b *bench) scenarioHTTP() []*result {
	r := &result{id: 2, name: fmt.Sprintf("HTTP ceiling: pre-encoded POSTs, %d concurrent", b.o.concurrency)}
	rcv, err := newReceiver(int64(b.o.n), b.o.n, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer rcv.Close()
	e0 := selfCPU()
	res, err := b.runRole("http", "-url", rcv.url+"/s0", "-n", strconv.Itoa(b.o.n), "-c", strconv.Itoa(b.o.concurrency))
	r.envCPU = selfCPU() - e0
	r.err = err
	r.events, r.deliveries, r.elapsed, r.cpu, r.rss = res.Events, int(rcv.count.Load()), res.Elapsed, res.CPU, res.HWM
	r.note = "receiver CPU in the mongowire+receiver column"
	return []*result{r}
}

// scenarioMinimal (15): the minimal consumer of a backlog of n changes,
// 1 event per request, then batches of 100 (compare with 4 and 5).
func (b *bench) scenarioMinimal() []*result {
	var out []*result
	for _, batch := range []int{1, 100} {
		r := &result{id: 15, name: fmt.Sprintf("minimal consumer: read, encode, sign, POST (%d concurrent), 1 event/request", b.o.concurrency)}
		r.ceiling, r.ceilName = ceil(b.drain, b.http), "min(drain, http)"
		if batch > 1 {
			r.name = fmt.Sprintf("minimal consumer: read, encode, sign, POST (%d concurrent), %d events/request", b.o.concurrency, batch)
			r.ceiling, r.ceilName = b.drain, "drain"
		}
		r.pair, r.minimal = fmt.Sprintf("batch %d", batch), true
		out = append(out, r)
		b.runMinimal(r, b.o.n, batch, nil)
	}
	return out
}

// runMinimal runs the minimal role on a fresh server holding n changes
// (written by write, or the usual backlog when write is nil) into r.
func (b *bench) runMinimal(r *result, n, batch int, write func(*env) error) {
	var e *env
	var start int64
	var err error
	if write == nil {
		e, start, err = b.backlogEnv(n)
	} else if e, err = newEnv(); err == nil {
		start = time.Now().Unix() - 1
		if err = write(e); err != nil {
			e.Close()
		}
	}
	if err != nil {
		r.err = err
		return
	}
	defer e.Close()
	rcv, err := newReceiver(int64(n), n, false)
	if err != nil {
		r.err = err
		return
	}
	defer rcv.Close()
	args := []string{"-uri", e.srv.URI(), "-url", rcv.url + "/s0", "-n", strconv.Itoa(n),
		"-start", strconv.FormatInt(start, 10), "-c", strconv.Itoa(b.o.concurrency), "-batch", strconv.Itoa(batch)}
	if b.o.profile != "" {
		// The same CPU profile as changegate's, for a differential one.
		args = append(args, "-cpuprofile", filepath.Join(b.o.profile, fmt.Sprintf("minimal-%d-%d.cpu.pprof", batch, n)))
	}
	e0 := selfCPU()
	res, err := b.runRole("minimal", args...)
	r.envCPU = selfCPU() - e0
	r.err = err
	// Counted as changegate's rows are: first to last event received.
	r.events, r.deliveries, r.elapsed, r.cpu, r.rss = res.Events, int(rcv.count.Load()), rcv.window(), res.CPU, res.HWM
	if reqs := rcv.requests.Load(); batch > 1 && reqs > 0 {
		r.note = fmt.Sprintf("%.1f events/request", float64(r.deliveries)/float64(reqs))
	}
}

func (b *bench) scenarioNaive() []*result {
	n := b.o.naiveN
	r := &result{id: 3, name: "naive loop: POST, then upsert the resume token"}
	e, start, err := b.backlogEnv(n)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer e.Close()
	rcv, err := newReceiver(int64(n), n, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer rcv.Close()
	e0 := selfCPU()
	res, err := b.runRole("naive", "-uri", e.srv.URI(), "-url", rcv.url+"/s0", "-n", strconv.Itoa(n), "-start", strconv.FormatInt(start, 10))
	r.envCPU = selfCPU() - e0
	r.err = err
	r.events, r.deliveries, r.elapsed, r.cpu, r.rss = res.Events, int(rcv.count.Load()), res.Elapsed, res.CPU, res.HWM
	r.note = fmt.Sprintf("%d changes (sequential: the rate does not depend on n)", n)
	return []*result{r}
}

// gwConf is a generated changegate configuration.
type gwConf struct {
	uri     string
	url     string
	sinks   int
	batch   int
	startAt int64 // unix seconds; 0: from now
	filter  bool
	// maxInFlight is the sinks' max_in_flight (0: the default).
	maxInFlight int
	// maxInFlightMax is the sinks' max_in_flight_max (0: the default).
	maxInFlightMax int
	// listen is the admin server's address ("": none).
	listen string
	// grace is shutdown_grace (0: 10s).
	grace time.Duration
	// partitions splits the source into units (0: not partitioned).
	partitions int
	// instance turns cluster mode on (lease_ttl 3s, renew_every 1s) with
	// this instance name ("": cluster mode off).
	instance string
	// stateDB is the state database ("": the default).
	stateDB string
	// snapshot sets snapshot = "initial" on the source.
	snapshot bool
	// sinkTOML is added to every sink's table.
	sinkTOML string
	// deliveryLog, when set, is the [delivery_log] mode.
	deliveryLog string
}

func (c gwConf) toml() string {
	var s strings.Builder
	grace := c.grace
	if grace == 0 {
		grace = 10 * time.Second
	}
	fmt.Fprintf(&s, "[mongo]\nuri = %q\n", c.uri)
	if c.stateDB != "" {
		fmt.Fprintf(&s, "state_database = %q\n", c.stateDB)
	}
	// public_read: the bench reads /api/v1/status without a token.
	fmt.Fprintf(&s, "\n[server]\nlisten = %q\nshutdown_grace = %q\npublic_read = true\n\n", c.listen, grace.String())
	if c.instance != "" {
		fmt.Fprintf(&s, "[cluster]\nenabled = true\nlease_ttl = \"3s\"\nrenew_every = \"1s\"\ninstance = %q\n\n", c.instance)
	}
	fmt.Fprintf(&s, "[[sources]]\nname = \"orders\"\ndatabase = %q\ncollection = %q\n", benchDB, benchColl)
	if c.partitions > 0 {
		fmt.Fprintf(&s, "partitions = %d\n", c.partitions)
	}
	if c.snapshot {
		s.WriteString("snapshot = \"initial\"\n")
	}
	if c.startAt != 0 {
		fmt.Fprintf(&s, "start_at = %q\n", time.Unix(c.startAt, 0).UTC().Format(time.RFC3339))
	}
	var names []string
	for i := 0; i < c.sinks; i++ {
		name := fmt.Sprintf("s%d", i)
		names = append(names, strconv.Quote(name))
		fmt.Fprintf(&s, "\n[[sinks]]\nname = %q\ntype = \"webhook\"\nurl = \"%s/%s\"\nsecret = %q\nallow_private_networks = true\nbatch_size = %d\n",
			name, c.url, name, benchSecret, max(c.batch, 1))
		if c.maxInFlight > 0 {
			fmt.Fprintf(&s, "max_in_flight = %d\n", c.maxInFlight)
		}
		if c.maxInFlightMax > 0 {
			fmt.Fprintf(&s, "max_in_flight_max = %d\n", c.maxInFlightMax)
		}
		if c.sinkTOML != "" {
			s.WriteString(c.sinkTOML + "\n")
		}
	}
	fmt.Fprintf(&s, "\n[[rules]]\nname = \"all\"\nsource = \"orders\"\nsinks = [%s]\n", strings.Join(names, ", "))
	if c.filter {
		s.WriteString("filter = { \"fullDocument.b\" = 0 }\n")
	}
	if c.deliveryLog != "" {
		fmt.Fprintf(&s, "\n[delivery_log]\nmode = %q\n", c.deliveryLog)
	}
	return s.String()
}

// startGateway starts changegate with the configuration c. self forces this
// binary's gateway role (with extra flags).
func (b *bench) startGateway(tag string, c gwConf, self bool, extra ...string) (*child, error) {
	path := filepath.Join(b.tmp, tag+".toml")
	if err := os.WriteFile(path, []byte(c.toml()), 0o600); err != nil {
		return nil, err
	}
	if b.o.profile != "" {
		self = true
		extra = append(extra, "-cpuprofile", filepath.Join(b.o.profile, tag+".cpu.pprof"),
			"-memprofile", filepath.Join(b.o.profile, tag+".allocs.pprof"))
	}
	var env []string
	if b.otlp != nil {
		// Only changegate is traced: the baselines have no spans to make.
		env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + b.otlp.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_TRACES_EXPORTER=otlp", "OTEL_SDK_DISABLED="}
	}
	if self || b.cgBin == "" {
		return b.start(b.self, append([]string{"-config", path}, extra...), "gateway", env...)
	}
	return b.start(b.cgBin, []string{"run", "-config", path, "-log-level", "warn", "-log-format", "text"}, "", env...)
}

// rssSampler records a process's RSS every 50 ms.
type rssSampler struct {
	mu      sync.Mutex
	max     int64
	samples []rssSample
	stop    chan struct{}
	done    chan struct{}
}

type rssSample struct {
	progress int64
	rss      int64
}

func sampleRSS(pid int, progress func() int64) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			rss, _, err := procMem(pid)
			if err == nil {
				s.mu.Lock()
				s.max = max(s.max, rss)
				s.samples = append(s.samples, rssSample{progress(), rss})
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) Stop() {
	close(s.stop)
	<-s.done
}

// at returns the RSS sampled when progress first reached p.
func (s *rssSampler) at(p int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.samples {
		if x.progress >= p {
			return x.rss
		}
	}
	return 0
}

// measured is what watching a changegate child yields.
type measured struct {
	cpu, envCPU time.Duration
	hwm         int64
	rss         *rssSampler
}

// watchGateway waits until rcv got everything (or the child failed or the
// time limit passed), measuring the child's CPU from the first request
// (fromStart: from now) to the end, and its peak RSS.
func (b *bench) watchGateway(c *child, rcv *receiver, fromStart bool) (measured, error) {
	var m measured
	var c0, e0 time.Duration
	var once sync.Once
	mark := func() {
		once.Do(func() {
			c0, _ = procCPU(c.pid())
			e0 = selfCPU()
		})
	}
	firstSeen := rcv.firstReq
	if fromStart {
		mark()
		firstSeen = nil
	}
	m.rss = sampleRSS(c.pid(), rcv.count.Load)
	defer m.rss.Stop()
	timeout := time.After(b.o.timeout)
	for {
		select {
		case <-firstSeen:
			mark()
			firstSeen = nil
			continue
		case <-rcv.Done():
		case <-c.exited:
			return m, fmt.Errorf("changegate exited: %v\n%s", c.err, c.stderr.String())
		case <-timeout:
			return m, fmt.Errorf("timed out with %d of %d envelopes received; changegate stderr:\n%s", rcv.count.Load(), rcv.target, c.stderr.String())
		}
		break
	}
	mark()
	c1, err := procCPU(c.pid())
	if err != nil {
		return m, err
	}
	m.cpu, m.envCPU = c1-c0, selfCPU()-e0
	_, m.hwm, _ = procMem(c.pid())
	return m, nil
}

// gatewayBacklog runs changegate over a backlog of n changes. filter keeps
// 10% of them; noPushdown evaluates that filter client-side only.
func (b *bench) gatewayBacklog(id, sinks, batch int, filter, noPushdown bool) []*result {
	n := b.o.n
	r := &result{id: id}
	if !filter && sinks == 1 {
		r.pair = fmt.Sprintf("batch %d", batch)
	}
	switch {
	case filter && noPushdown:
		r.name = "rule keeps 10%: client-side filtering only"
	case filter:
		r.name = "rule keeps 10%: filter pushed down ($match)"
	case sinks > 1:
		r.name = fmt.Sprintf("changegate, fan-out to %d webhook sinks", sinks)
	case batch > 1:
		r.name = fmt.Sprintf("changegate, webhook batch_size = %d", batch)
	default:
		r.name = "changegate, 1 webhook sink, 1 event/request, key order"
	}
	e, start, err := b.backlogEnv(n)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer e.Close()
	target := int64(n * sinks)
	if filter {
		target = int64((n + 9) / 10)
	}
	rcv, err := newReceiver(target, n, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer rcv.Close()
	tag := scenarioNames[id]
	var extra []string
	if noPushdown {
		tag += "-clientside"
		extra = append(extra, "-no-pushdown")
	} else if filter {
		tag += "-pushdown"
	}
	c, err := b.startGateway(tag, gwConf{uri: e.srv.URI(), url: rcv.url, sinks: sinks, batch: batch, startAt: start, filter: filter, maxInFlight: b.o.maxInFlight, sinkTOML: b.o.sinkTOML, deliveryLog: b.o.deliveryLog}, filter, extra...)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer c.stop()
	m, err := b.watchGateway(c, rcv, false)
	r.err = err
	r.events, r.deliveries, r.elapsed = n, int(rcv.count.Load()), rcv.window()
	r.cpu, r.envCPU, r.rss = m.cpu, m.envCPU, m.hwm
	if d := rcv.dups.Load(); d > 0 {
		r.note = fmt.Sprintf("%d duplicate deliveries; ", d)
	}
	switch {
	case filter:
		r.ceiling, r.ceilName = b.drain, "drain"
		r.note += fmt.Sprintf("%d of %d changes delivered; events/s counts changes read", r.deliveries, n)
	case sinks > 1:
		r.ceiling, r.ceilName = ceil(b.drain, b.http/float64(sinks)), "min(drain, http/4)"
		r.note += fmt.Sprintf("%d deliveries (%.0f/s)", r.deliveries, float64(r.deliveries)/r.elapsed.Seconds())
	case batch > 1:
		r.ceiling, r.ceilName = b.drain, "drain"
		if reqs := rcv.requests.Load(); reqs > 0 {
			r.note += fmt.Sprintf("%.1f events/request", float64(r.deliveries)/float64(reqs))
		}
	default:
		r.ceiling, r.ceilName = ceil(b.drain, b.http), "min(drain, http)"
	}
	return []*result{r}
}

// ceil returns the smaller of the measured ceilings (0 when unmeasured).
func ceil(a, b float64) float64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// waitCheckpoint waits until changegate persisted its first position: its
// change stream is open.
func waitCheckpoint(e *env, c *child, timeout time.Duration) error {
	coll := e.client.Database("changegate").Collection("checkpoints")
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		n, err := coll.CountDocuments(context.Background(), bson.D{})
		if err == nil && n > 0 {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("changegate exited: %v\n%s", c.err, c.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return errors.New("changegate did not open its change stream in time")
}

func (b *bench) scenarioLatency() []*result {
	count := int(float64(b.o.rate) * b.o.duration.Seconds())
	r := &result{id: 7, name: fmt.Sprintf("changegate, steady %d changes/s for %s", b.o.rate, b.o.duration)}
	e, err := newEnv()
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer e.Close()
	rcv, err := newReceiver(int64(count), count, true)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer rcv.Close()
	c, err := b.startGateway("latency", gwConf{uri: e.srv.URI(), url: rcv.url, sinks: 1, batch: 1}, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer c.stop()
	if r.err = waitCheckpoint(e, c, 30*time.Second); r.err != nil {
		return []*result{r}
	}
	time.Sleep(200 * time.Millisecond)
	werr := make(chan error, 1)
	go func() { werr <- writePaced(context.Background(), e.coll, 0, count, b.o.rate) }()
	m, err := b.watchGateway(c, rcv, true)
	r.err = errors.Join(err, <-werr)
	r.events, r.deliveries, r.elapsed = count, int(rcv.count.Load()), rcv.window()
	r.cpu, r.envCPU, r.rss = m.cpu, m.envCPU, m.hwm
	r.lat = rcv.latencies()
	r.note = "offered rate (InsertOne from 8 writers); CPU/event includes idle polling"
	return []*result{r}
}

func (b *bench) scenarioBacklog() []*result {
	n := b.o.backlog
	r := &result{id: 8, name: fmt.Sprintf("backlog of %d changes written while stopped", n)}
	e, err := newEnv()
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer e.Close()
	rcv, err := newReceiver(int64(n), n, true)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer rcv.Close()
	cfg := gwConf{uri: e.srv.URI(), url: rcv.url, sinks: 1, batch: 1}
	c, err := b.startGateway("backlog-first", cfg, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	err = waitCheckpoint(e, c, 30*time.Second)
	c.stop()
	if err != nil {
		r.err = err
		return []*result{r}
	}
	t := time.Now()
	if err := writeBacklog(context.Background(), e.coll, 0, n); err != nil {
		r.err = err
		return []*result{r}
	}
	b.logf("  wrote %d changes in %s", n, time.Since(t).Round(time.Millisecond))
	t0 := time.Now()
	c, err = b.startGateway("backlog", cfg, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer c.stop()
	m, err := b.watchGateway(c, rcv, true)
	r.err = err
	r.events, r.deliveries = n, int(rcv.count.Load())
	r.elapsed = time.Duration(rcv.last.Load() - t0.UnixNano())
	r.cpu, r.envCPU, r.rss = m.cpu, m.envCPU, m.hwm
	r.lat = rcv.latencies()
	r.ceiling, r.ceilName = ceil(b.drain, b.http), "min(drain, http)"
	mb := func(v int64) string { return fmt.Sprintf("%.0f", float64(v)/(1<<20)) }
	r.note = fmt.Sprintf("catch-up %s from process start; RSS MB at 10/50/90%%: %s/%s/%s; latency = age of the backlog",
		r.elapsed.Round(10*time.Millisecond), mb(m.rss.at(int64(n)/10)), mb(m.rss.at(int64(n)/2)), mb(m.rss.at(int64(n)*9/10)))
	if d := rcv.dups.Load(); d > 0 {
		r.note += fmt.Sprintf("; %d duplicates", d)
	}
	return []*result{r}
}
