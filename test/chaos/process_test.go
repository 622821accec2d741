package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The binary is built once per test binary run (as in test/e2e).
var buildOnce struct {
	sync.Once
	dir, path string
	err       error
}

// changegateBinary returns the binary under test: CHANGEGATE_CHAOS_BIN if
// set (e.g. an older release, to see that a campaign catches its faults),
// else one built from this module.
func changegateBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("CHANGEGATE_CHAOS_BIN"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "changegate-chaos-bin")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.dir = dir
		buildOnce.path = filepath.Join(dir, "changegate")
		out, err := exec.Command("go", "build", "-o", buildOnce.path, "github.com/changegate/changegate/cmd/changegate").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
	os.Exit(code)
}

// gatewayProc is one changegate process; its output goes to log (shared by
// all the processes of a run).
type gatewayProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startGateway(bin, cfgPath string, env []string, log *os.File) (*gatewayProc, error) {
	cmd := exec.Command(bin, "run", "-config", cfgPath, "-log-format", "text", "-log-level", "info")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &gatewayProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *gatewayProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop sends SIGTERM and waits up to grace, then kills. It reports whether
// the process exited by itself with status 0.
func (p *gatewayProc) stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if !p.cmd.ProcessState.Success() {
			return fmt.Errorf("exit after SIGTERM: %v", p.cmd.ProcessState)
		}
		return nil
	case <-time.After(grace):
		p.kill()
		return fmt.Errorf("no exit within %v of SIGTERM", grace)
	}
}
