package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/changegate/changegate/test/receiver"
)

// buildBinary builds cmd/changegate once per test binary run.
var buildOnce struct {
	sync.Once
	path string
	err  error
}

func changegateBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "changegate-e2e-bin")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "changegate")
		cmd := exec.Command("go", "build", "-o", buildOnce.path, "github.com/changegate/changegate/cmd/changegate")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

// proc is changegate running as a real process.
type proc struct {
	cmd *exec.Cmd
	out *bytes.Buffer
}

// startProcess starts the binary with cfgPath and the test's environment,
// plus env ("KEY=value").
func startProcess(t *testing.T, bin, cfgPath string, env ...string) *proc {
	t.Helper()
	p := &proc{out: &bytes.Buffer{}}
	p.cmd = exec.Command(bin, "run", "-config", cfgPath, "-log-format", "text", "-log-level", "warn")
	p.cmd.Env = append(append(os.Environ(), "TEST_SECRET="+testSecret), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	return p
}

// TestProcessSIGKILLLosesNothing runs the real binary, kills it with SIGKILL
// in the middle of a stream, restarts it and checks that every event
// arrived, re-deliveries carrying the same webhook-id; then stops it with
// SIGTERM and checks it exits 0.
func TestProcessSIGKILLLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	rcv.SetResponder(func([]byte) *receiver.Response { time.Sleep(time.Millisecond); return nil })
	cfgText := e.expand(baseConfig(rcv.URL(), ""))
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath)
	// The first start begins "now": wait for its checkpoint before writing.
	cps, _ := e.stores(e.config(baseConfig(rcv.URL(), "")))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	const total = 2000
	writeErr := make(chan error, 1)
	go func() { writeErr <- insertDocs(e.coll("items"), 0, total) }()
	waitFor(t, 30*time.Second, "some deliveries", func() bool { return rcv.Count() > 200 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before := rcv.Count()
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	if before >= total {
		t.Fatalf("everything was delivered before SIGKILL; the test proves nothing")
	}

	p = startProcess(t, bin, cfgPath)
	waitFor(t, 60*time.Second, "every event after the restart", func() bool {
		docs := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			docs[d.DocKey] = true
		}
		return len(docs) >= total
	})
	first := map[string]string{}
	dups := 0
	for _, d := range rcv.Deliveries() {
		if id, ok := first[d.DocKey]; ok {
			dups++
			if id != d.WebhookID {
				t.Fatalf("re-delivery of %s with webhook-id %s, first %s", d.DocKey, d.WebhookID, id)
			}
			continue
		}
		first[d.DocKey] = d.WebhookID
	}
	t.Logf("delivered before SIGKILL %d; re-delivered after restart %d", before, dups)

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
	case <-time.After(20 * time.Second):
		t.Fatalf("no exit within 20s of SIGTERM\n%s", p.out)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.path != "" {
		os.RemoveAll(filepath.Dir(buildOnce.path))
	}
	os.Exit(code)
}
