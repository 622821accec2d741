package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
)

// syncBuffer is a bytes.Buffer safe for the node process's writes and the
// test's reads.
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

// TestDocsNodeReceiver runs the README's Node.js receiver (its ```js block)
// with the npm standardwebhooks package pinned in testdata/node, and sends
// it requests signed as changegate's webhook sink signs them: a genuine one
// is accepted and printed, a tampered one refused. It needs node, npm and,
// the first time, the npm registry, so it runs only when
// CHANGEGATE_NODE_COMPAT=1:
//
//	CHANGEGATE_NODE_COMPAT=1 go test ./cmd/changegate -run DocsNodeReceiver
func TestDocsNodeReceiver(t *testing.T) {
	if os.Getenv("CHANGEGATE_NODE_COMPAT") != "1" {
		t.Skip("set CHANGEGATE_NODE_COMPAT=1 to run the README's Node.js receiver (needs node and npm)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("CHANGEGATE_NODE_COMPAT=1 but node is not installed: %v", err)
	}
	var script string
	blocks, _ := splitDoc(readDoc(t, "README.md"))
	for _, b := range blocks {
		if b.lang == "js" {
			if script != "" {
				t.Fatal("README.md has more than one js block; say which one this test runs")
			}
			script = b.text
		}
	}
	if script == "" {
		t.Fatal("README.md has no js block")
	}
	modDir, err := filepath.Abs(filepath.Join("testdata", "node"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(modDir, "node_modules", "standardwebhooks", "package.json")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Fatalf("node_modules missing and npm is not installed: %v", err)
		}
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = modDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", modDir, err, out)
		}
	}
	// The script runs from a temporary directory whose node_modules is the
	// pinned one.
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(modDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "receiver.mjs"), []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cmd := exec.CommandContext(ctx, node, "receiver.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PORT="+strconv.Itoa(port), "BILLING_WEBHOOK_SECRET="+secret)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	url := fmt.Sprintf("http://127.0.0.1:%d/hooks/orders", port)
	post := func(id, body string, sign func(string) string) int {
		t.Helper()
		now := time.Now()
		sig, err := webhook.Sign([]string{secret}, id, now, []byte(sign(body)))
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const id = "orders:8264F1A000000000012B022C0100"
	body := `{"id":"` + id + `","source":"orders","operationType":"insert","ns":{"db":"shop","coll":"orders"},` +
		`"documentKey":{"_id":{"$oid":"6553f2a0e4b0a1b2c3d4e5f6"}},"fullDocument":{"_id":{"$oid":"6553f2a0e4b0a1b2c3d4e5f6"},"status":"paid","total":120},` +
		`"clusterTime":"2026-11-22T10:00:00Z","rules":["paid-orders"]}`
	same := func(s string) string { return s }
	deadline := time.Now().Add(30 * time.Second)
	code := post(id, body, same)
	for code == -1 && time.Now().Before(deadline) { // the receiver is starting
		time.Sleep(100 * time.Millisecond)
		code = post(id, body, same)
	}
	if code != http.StatusNoContent {
		t.Fatalf("a request signed as changegate signs it: status %d, want 204; receiver output:\n%s", code, out.String())
	}
	if code := post(id, body, func(s string) string { return strings.Replace(s, "120", "121", 1) }); code != http.StatusUnauthorized {
		t.Errorf("a request whose body does not match its signature: status %d, want 401", code)
	}
	want := id + " insert " + `{"_id":{"$oid":"6553f2a0e4b0a1b2c3d4e5f6"}}`
	for !strings.Contains(out.String(), want) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(out.String(), want) {
		t.Errorf("the receiver printed %q, want a line %q", out.String(), want)
	}
}
