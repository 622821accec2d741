package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// memCgroup is a memory cgroup this test created (v1 or v2), limited to a
// number of bytes; remove deletes it.
type memCgroup struct {
	dir string
	v2  bool
}

// memCgroupOrSkip returns a new memory cgroup of limit bytes, removed when
// the test ends, or skips the test when none can be made here.
func memCgroupOrSkip(t *testing.T, limit int64) *memCgroup {
	t.Helper()
	cg, err := newMemCgroup(t, limit)
	if err != nil {
		t.Skipf("cannot create a memory cgroup (needs root and a cgroup v1 memory controller or a delegated cgroup v2): %v", err)
	}
	t.Cleanup(cg.remove)
	return cg
}

// newMemCgroup creates a memory cgroup limited to limit bytes below the
// test process's own cgroup (where it may create one), or returns why it
// cannot.
func newMemCgroup(t *testing.T, limit int64) (*memCgroup, error) {
	t.Helper()
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("changegate-e2e-%d-%06d", os.Getpid(), rand.IntN(1000000))
	var v1Path, v2Path string
	hasV2 := false
	for _, l := range strings.Split(string(self), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path, hasV2 = parts[2], true
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1Path = parts[2]
			}
		}
	}
	var errs []error
	if v1Path != "" {
		for _, parent := range []string{filepath.Join("/sys/fs/cgroup/memory", v1Path), "/sys/fs/cgroup/memory"} {
			dir := filepath.Join(parent, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				errs = append(errs, err)
				continue
			}
			cg := &memCgroup{dir: dir}
			if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
				cg.remove()
				errs = append(errs, err)
				continue
			}
			// No swap either, where the kernel accounts it (best effort).
			_ = os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644)
			return cg, nil
		}
	}
	if hasV2 {
		for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
			if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
				continue
			}
			parent := filepath.Join(root, v2Path)
			ctl, _ := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
			if !strings.Contains(string(ctl), "memory") {
				if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0o644); err != nil {
					errs = append(errs, fmt.Errorf("enable the memory controller in %s: %w", parent, err))
					continue
				}
			}
			dir := filepath.Join(parent, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				errs = append(errs, err)
				continue
			}
			cg := &memCgroup{dir: dir, v2: true}
			if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
				cg.remove()
				errs = append(errs, err)
				continue
			}
			_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0o644)
			return cg, nil
		}
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no memory cgroup hierarchy (v1 memory controller or v2) in /proc/self/cgroup"))
	}
	return nil, errors.Join(errs...)
}

// command returns a command running name with args inside the cgroup:
// the shell moves itself in before it execs, so the process never runs
// outside it.
func (c *memCgroup) command(name string, args ...string) *exec.Cmd {
	script := `echo $$ > "$0/cgroup.procs" && exec "$@"`
	return exec.Command("/bin/sh", append([]string{"-c", script, c.dir, name}, args...)...)
}

// cgProcess is changegate running as a child process in a memory cgroup.
type cgProcess struct {
	cg   *memCgroup
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited; err is then its Wait error
	err  error
}

// start runs "changegate run" with cfgPath inside the cgroup, with
// GOMEMLIMIT unset as in a container, and stops it (kill) at the end of the
// test if it still runs.
func (c *memCgroup) start(t *testing.T, bin, cfgPath string) *cgProcess {
	t.Helper()
	p := &cgProcess{cg: c, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = c.command(bin, "run", "-config", cfgPath, "-log-format", "text", "-log-level", "info")
	p.cmd.Env = append(os.Environ(), "GOMEMLIMIT=") // as a container's, unset
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// checkAlive fails the test at once when the process has exited or the
// kernel OOM-killed a process of the cgroup; delivered says how far it got.
func (p *cgProcess) checkAlive(t *testing.T, delivered int) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("changegate exited (%v; OOM kills in the cgroup: %d; cgroup peak %.0f MiB) after %d deliveries\n%s",
			p.err, p.cg.oomKills(), float64(p.cg.peak())/(1<<20), delivered, p.out)
	default:
	}
	if n := p.cg.oomKills(); n > 0 {
		t.Fatalf("%d OOM kills in the cgroup (peak %.0f MiB) after %d deliveries\n%s", n, float64(p.cg.peak())/(1<<20), delivered, p.out)
	}
}

// stop sends SIGTERM and waits up to 60s for a clean exit.
func (p *cgProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v (OOM kills in the cgroup: %d)\n%s", err, p.cg.oomKills(), p.out)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("exit: %v (OOM kills in the cgroup: %d)\n%s", p.err, p.cg.oomKills(), p.out)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit within 60s of SIGTERM\n%s", p.out)
	}
}

// read returns a cgroup file's value as a number (-1 when absent).
func (c *memCgroup) read(file string) int64 {
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// peak is the cgroup's peak memory use.
func (c *memCgroup) peak() int64 {
	if c.v2 {
		return c.read("memory.peak")
	}
	return c.read("memory.max_usage_in_bytes")
}

// oomKills is the number of processes the kernel killed for the limit.
func (c *memCgroup) oomKills() int64 {
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	b, _ := os.ReadFile(filepath.Join(c.dir, file))
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "oom_kill" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// remove deletes the cgroup (its processes have exited; any left are
// moved to the parent first).
func (c *memCgroup) remove() {
	if procs, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs")); err == nil {
		for _, p := range strings.Fields(string(procs)) {
			_ = os.WriteFile(filepath.Join(filepath.Dir(c.dir), "cgroup.procs"), []byte(p), 0o644)
		}
	}
	for range 50 {
		if err := os.Remove(c.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// slowReceiver is a webhook receiver that answers every request after
// delay and keeps only what identifies each event (not its body).
type slowReceiver struct {
	srv   *httptest.Server
	delay time.Duration
	// hold, when set, is asked about each request before it is answered: a
	// channel it returns holds the answer (and the delivery's record)
	// until it is closed, or until the request ends (the delivery is then
	// not recorded).
	hold  func(memDelivery) <-chan struct{}
	mu    sync.Mutex
	got   []memDelivery
	bytes int64
}

var (
	envelopeHeadRE = regexp.MustCompile(`^\{"id":"([^"]*)".*?"operationType":"([^"]*)"`)
	documentKeyRE  = regexp.MustCompile(`"documentKey":(\{[^{}]*\})`)
)

type memDelivery struct {
	ID, Op, Key string
}

func newSlowReceiver(delay time.Duration, hold func(memDelivery) <-chan struct{}) *slowReceiver {
	r := &slowReceiver{delay: delay, hold: hold}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// The envelope's head (id, operationType, ns, documentKey come
		// before fullDocument): the 6 MiB document itself is not parsed,
		// which under -race would cost more than the delivery.
		head := body[:min(len(body), 4096)]
		m := envelopeHeadRE.FindSubmatch(head)
		k := documentKeyRE.FindSubmatch(head)
		if m == nil || k == nil || !json.Valid(body) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		d := memDelivery{ID: string(m[1]), Op: string(m[2]), Key: string(k[1])}
		if r.hold != nil {
			if ch := r.hold(d); ch != nil {
				select {
				case <-ch:
				case <-req.Context().Done():
					return
				}
			}
		}
		time.Sleep(r.delay)
		r.mu.Lock()
		r.got = append(r.got, d)
		r.bytes += int64(len(body))
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	return r
}

func (r *slowReceiver) deliveries() []memDelivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]memDelivery(nil), r.got...)
}

// vmHWM is a process's peak resident set size in bytes (-1: unknown).
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n * 1024
			}
		}
	}
	return -1
}

// TestProcessMemoryLimitLargeBacklog is issue 23's incident: the real
// binary, in a memory cgroup limited to 512 MiB, catches up a backlog of
// 900 MiB of changes (75 documents of 6 MiB inserted, then each updated,
// with full_document = "updateLookup": 150 changes of 6 MiB) to a webhook
// that answers in 200 ms, with max_request_bytes = 16777216. It must not
// be OOM-killed (before the byte budget it held every change it read and
// was killed after a few deliveries); every change arrives, in order per
// document; the budget comes from the container's limit.
func TestProcessMemoryLimitLargeBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary with 900 MiB of changes")
	}
	const (
		limit   = 512 << 20
		docSize = 6 << 20
		docs    = 75
	)
	cg := memCgroupOrSkip(t, limit)
	bin := changegateBinary(t)
	e := newEnv(t)
	rcv := newSlowReceiver(200*time.Millisecond, nil)
	t.Cleanup(rcv.srv.Close)
	tmpl := hookConfig(itemsHead+`full_document = "updateLookup"
`, rcv.srv.URL, `timeout = "60s"
max_request_bytes = 16777216
`)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The first start opens the stream and saves a checkpoint "now".
	p := cg.start(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 30*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	if !strings.Contains(p.out.String(), "budget_from=\"25% of the container memory limit 512 MiB") {
		t.Fatalf("the start-up log does not name the container's limit as the budget's source:\n%s", p.out)
	}
	p.stop(t)

	// The backlog, written while changegate is down.
	ctx := context.Background()
	c := e.coll("items")
	pad := strings.Repeat("x", docSize)
	for i := range docs {
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: 1}, {Key: "pad", Value: pad}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range docs {
		if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 2}}}}); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	p = cg.start(t, bin, cfgPath)
	var hwm int64
	waitFor(t, 5*time.Minute, "every change of the backlog at the webhook", func() bool {
		p.checkAlive(t, len(rcv.deliveries()))
		hwm = max(hwm, vmHWM(p.cmd.Process.Pid))
		seen := map[string]bool{}
		for _, d := range rcv.deliveries() {
			seen[d.Key+d.Op] = true
		}
		return len(seen) == 2*docs
	})
	took := time.Since(start)
	hwm = max(hwm, vmHWM(p.cmd.Process.Pid))
	p.stop(t)
	if n := cg.oomKills(); n != 0 {
		t.Fatalf("%d OOM kills in the cgroup", n)
	}
	// Per document: the insert, then the update; a re-delivery repeats
	// both in that order.
	last := map[string]string{}
	for _, d := range rcv.deliveries() {
		if d.Op == "insert" {
			last[d.Key] = "insert"
			continue
		}
		if last[d.Key] != "insert" && last[d.Key] != "update" {
			t.Fatalf("document %s: update delivered before its insert", d.Key)
		}
		last[d.Key] = "update"
	}
	rcv.mu.Lock()
	mb := float64(rcv.bytes) / (1 << 20)
	rcv.mu.Unlock()
	t.Logf("caught up %d changes (%.0f MiB of request bodies) in %v (%.1f MiB/s); peak RSS %.0f MiB, cgroup peak %.0f MiB, limit 512 MiB",
		len(rcv.deliveries()), mb, took.Round(time.Millisecond), mb/took.Seconds(), float64(hwm)/(1<<20), float64(cg.peak())/(1<<20))
}

// syncBuffer is a bytes.Buffer safe for a process's output and a test's
// reads at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
