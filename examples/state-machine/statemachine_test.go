package statemachine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	sm "github.com/changegate/changegate/examples/state-machine"
	"github.com/changegate/changegate/test/mongotest"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// envJobs sets the number of jobs (default 200), for a bigger run.
const envJobs = "CHANGEGATE_STATEMACHINE_JOBS"

// TestStateMachine runs changegate.toml with the real binary against
// test/mongowire (or CHANGEGATE_TEST_MONGODB_URI) and the step handlers of
// this package: 200 jobs written concurrently, changegate killed with
// SIGKILL mid-run and restarted. Every job must end done (failed for the
// poison ones, through a dead letter), each step must have run exactly once
// per job, and every delivery of an event id must have run its step once and
// only once (re-deliveries answered as duplicates).
func TestStateMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	jobs := 200
	if s := os.Getenv(envJobs); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envJobs, s)
		}
		jobs = n
	}
	bin := buildChangegate(t)

	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	jobsDB, stateDB := mongotest.UniqueName("sm_"), mongotest.UniqueName("smstate_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Database(jobsDB).Drop(ctx)
		_ = client.Database(stateDB).Drop(ctx)
	})
	ctx := t.Context()
	db := client.Database(jobsDB)
	if err := db.CreateCollection(ctx, "jobs", options.CreateCollection().
		SetChangeStreamPreAndPostImages(bson.D{{Key: "enabled", Value: true}})); err != nil {
		t.Fatal(err)
	}
	coll := db.Collection("jobs")

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	h, err := sm.NewHandler(sm.NewWorkflow(coll), log, secret)
	if err != nil {
		t.Fatal(err)
	}
	rcv := httptest.NewServer(h)
	t.Cleanup(rcv.Close)

	env := map[string]string{
		"MONGODB_URI": uri, "WEBHOOK_SECRET": secret, "RECEIVER_URL": rcv.URL,
		"JOBS_DB": jobsDB, "STATE_DB": stateDB, "ADMIN_LISTEN": "127.0.0.1:0",
	}
	// The example's config file itself, as the binary reads it.
	cfgPath, err := filepath.Abs("changegate.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfgText, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(cfgPath, cfgText, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	cps, _ := app.Stores(cfg, client)

	p := startProcess(t, bin, cfgPath, env)
	// The first start begins "now": wait until both streams are open.
	waitFor(t, 30*time.Second, "both sources to open their streams", func() bool {
		_, ok1, _ := cps.Load(ctx, "jobs")
		_, ok2, _ := cps.Load(ctx, "failures")
		return ok1 && ok2
	})

	// 200 jobs from 8 writers: every third express (skips review), every
	// 25th poison (refused by step1: dead letter, then failed), every 7th
	// flaky (step2a answers 503 once per event: retried).
	want := map[string]sm.Job{}
	for i := range jobs {
		j := sm.Job{ID: fmt.Sprintf("job-%04d", i), State: sm.StatePending, Priority: "standard",
			Poison: i%25 == 24, Flaky: i%7 == 3}
		if i%3 == 0 {
			j.Priority = "express"
		}
		want[j.ID] = j
	}
	var wg sync.WaitGroup
	writeErr := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < jobs; i += 8 {
				j := want[fmt.Sprintf("job-%04d", i)]
				if _, err := coll.InsertOne(context.Background(), bson.D{
					{Key: "_id", Value: j.ID}, {Key: "state", Value: j.State}, {Key: "priority", Value: j.Priority},
					{Key: "poison", Value: j.Poison}, {Key: "flaky", Value: j.Flaky},
				}); err != nil {
					writeErr <- err
					return
				}
			}
		})
	}

	// Kill changegate once a sixth of the work is done.
	ran := func() int {
		n := 0
		for _, d := range h.Deliveries() {
			if d.Outcome == sm.Ran {
				n++
			}
		}
		return n
	}
	waitFor(t, 60*time.Second, "the workflow to get going", func() bool { return ran() >= jobs })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	wg.Wait()
	close(writeErr)
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	terminal := func() int {
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{sm.StateDone, sm.StateFailed}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	before := terminal()
	if before == jobs {
		t.Fatal("every job finished before SIGKILL; the test proves nothing")
	}

	p = startProcess(t, bin, cfgPath, env)
	waitFor(t, 120*time.Second, "every job to reach done or failed", func() bool { return terminal() == jobs })

	// Every job's final document.
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID         string   `bson:"_id"`
		State      string   `bson:"state"`
		FailedStep string   `bson:"failedStep"`
		A          string   `bson:"a"`
		B          string   `bson:"b"`
		Runs       []string `bson:"runs"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	if len(docs) != jobs {
		t.Fatalf("%d job documents, want %d", len(docs), jobs)
	}
	committed := map[string]bool{} // "<step>/<webhook-id>" recorded in some job
	poison := 0
	for _, d := range docs {
		j := want[d.ID]
		var steps []string
		for _, r := range d.Runs {
			if committed[r] && !strings.HasPrefix(r, sm.StepMarkFailed+"/") {
				t.Errorf("%s: run %s recorded in two jobs", d.ID, r)
			}
			committed[r] = true
			step, _, _ := strings.Cut(r, "/")
			steps = append(steps, step)
		}
		slices.Sort(steps)
		var wantSteps []string
		switch {
		case j.Poison:
			poison++
			if d.State != sm.StateFailed || d.FailedStep != sm.StepStep1 {
				t.Errorf("poison %s: state %q failedStep %q, want failed at step1", d.ID, d.State, d.FailedStep)
			}
			wantSteps = []string{sm.StepMarkFailed}
		case j.Priority == "express":
			wantSteps = []string{sm.StepFinish, sm.StepJoin, sm.StepStep1, sm.StepStep2a, sm.StepStep2b}
		default:
			wantSteps = []string{sm.StepFinish, sm.StepJoin, sm.StepReview, sm.StepStep1, sm.StepStep2a, sm.StepStep2b}
		}
		if !j.Poison && (d.State != sm.StateDone || d.A == "" || d.B == "") {
			t.Errorf("%s: state %q a %q b %q, want done with both results", d.ID, d.State, d.A, d.B)
		}
		if !slices.Equal(steps, wantSteps) {
			t.Errorf("%s (%s): steps run %v, want each of %v once", d.ID, j.Priority, steps, wantSteps)
		}
	}

	// Every delivered event id ran its step exactly once: one delivery
	// answered "ran", the others (re-deliveries after the SIGKILL, the
	// flaky step's retry) something that did not run it again.
	type key struct{ step, id string }
	outcomes := map[key][]sm.Outcome{}
	dups, retried := 0, 0
	for _, d := range h.Deliveries() {
		k := key{d.Step, d.WebhookID}
		outcomes[k] = append(outcomes[k], d.Outcome)
	}
	for k, outs := range outcomes {
		n := 0
		for _, o := range outs {
			switch o {
			case sm.Ran:
				n++
			case sm.Duplicate:
				dups++
			case sm.Failed:
				retried++
			case sm.Stale:
				if k.step != sm.StepMarkFailed { // a rewritten dead letter of a failed job
					t.Errorf("%s %s: stale delivery (job not in the expected state): %v", k.step, k.id, outs)
				}
			}
		}
		switch {
		case k.step == sm.StepStep1 && slices.Contains(outs, sm.Refused):
			if n != 0 || slices.ContainsFunc(outs, func(o sm.Outcome) bool { return o != sm.Refused }) {
				t.Errorf("step1 %s: %v, want refused every time", k.id, outs)
			}
		case k.step == sm.StepMarkFailed && n == 0:
		case n != 1:
			t.Errorf("%s %s: ran %d times, want once (%v)", k.step, k.id, n, outs)
		}
		if n == 1 && !committed[k.step+"/"+k.id] {
			t.Errorf("%s %s: answered ran but not recorded in its job", k.step, k.id)
		}
	}
	for r := range committed {
		step, id, _ := strings.Cut(r, "/")
		if !slices.Contains(outcomes[key{step, id}], sm.Ran) {
			t.Errorf("run %s recorded without a delivery", r)
		}
	}
	if retried == 0 {
		t.Error("no flaky step was retried")
	}

	// The poison jobs went through the dead-letter collection.
	dlCount, err := client.Database(stateDB).Collection(cfg.Mongo.DeadLetterCollection).CountDocuments(ctx,
		bson.D{{Key: "kind", Value: "failed"}, {Key: "sink", Value: sm.StepStep1}})
	if err != nil {
		t.Fatal(err)
	}
	if int(dlCount) != poison {
		t.Errorf("%d step1 dead letters, want one per poison job (%d)", dlCount, poison)
	}
	t.Logf("%d jobs (%d failed on purpose); %d terminal before SIGKILL; %d re-deliveries answered as duplicates; %d transient failures retried",
		jobs, poison, before, dups, retried)

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, p.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit within 30s of SIGTERM\n%s", p.out)
	}
}

// buildChangegate builds cmd/changegate into a temporary directory.
func buildChangegate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "changegate")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/changegate/changegate/cmd/changegate").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is changegate running as a separate process.
type proc struct {
	cmd *exec.Cmd
	out *syncBuffer
}

func startProcess(t *testing.T, bin, cfgPath string, env map[string]string) *proc {
	t.Helper()
	p := &proc{out: &syncBuffer{}}
	p.cmd = exec.Command(bin, "run", "-config", cfgPath, "-log-format", "text", "-log-level", "warn")
	p.cmd.Env = os.Environ()
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("changegate output:\n%s", p.out)
		}
	})
	return p
}

// syncBuffer is a bytes.Buffer safe for the process's two output streams.
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

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
