package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/deadletter"
)

// hostileReason is a reason phrase with terminal escapes: a window title
// change (ESC]0;...BEL) and a screen clear (ESC[2J).
const hostileReason = "Bad\x1b]0;pwned\x07\x1b[2J Request"

// startHostileReceiver answers every request with 400 and hostileReason,
// and a body with a colour escape. It returns the URL.
func startHostileReceiver(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					const body = "no\x1b[31mred"
					if _, err := io.WriteString(c, "HTTP/1.1 400 "+hostileReason+"\r\nContent-Length: 10\r\n\r\n"+body); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/hook"
}

// TestReplayOutputHasNoTerminalEscapes: a receiver's reason phrase with
// terminal escapes reaches neither the dead letter's error text nor the
// output of changegate deadletters replay with its control characters.
func TestReplayOutputHasNoTerminalEscapes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	e := newEnv(t)
	text := baseConfig(startHostileReceiver(t), "")
	cfg := e.config(text)
	g := e.start(cfg)
	insertN(t, e.coll("items"), 0, 1)
	_, dls := e.stores(cfg)
	var entries []deadletter.Entry
	waitFor(t, 20*time.Second, "the dead letter", func() bool {
		entries = entries[:0]
		_ = dls.Summaries(context.Background(), deadletter.Filter{Limit: 10}, nil, func(en deadletter.Entry) error {
			entries = append(entries, en)
			return nil
		})
		return len(entries) == 1
	})
	if err := g.stop(t, false); err != nil {
		t.Fatal(err)
	}
	if le := entries[0].LastError; strings.ContainsAny(le, "\x1b\x07") || !strings.Contains(le, "]0;pwned") {
		t.Fatalf("dead letter's last error %q: want the reason phrase without control characters", le)
	}

	bin := changegateBinary(t)
	cfgPath := filepath.Join(t.TempDir(), "changegate.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(text)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "deadletters", "replay", "-config", cfgPath)
	cmd.Env = append(os.Environ(), "TEST_SECRET="+testSecret)
	out, _ := cmd.CombinedOutput()
	if strings.ContainsAny(string(out), "\x1b\x07") || !strings.Contains(string(out), "]0;pwned") || !strings.Contains(string(out), "failed 1") {
		t.Fatalf("changegate deadletters replay printed %q: want the failure without control characters", out)
	}
}
