package mongowire_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
)

// TestNodeCompat runs compat/node/compat.mjs, a check of mongowire with the
// official MongoDB Node.js driver (a second, independent client), against an
// in-process server. It needs node and npm and, the first time, the npm
// registry, so it runs only when CHANGEGATE_NODE_COMPAT=1:
//
//	CHANGEGATE_NODE_COMPAT=1 go test ./test/mongowire -run NodeCompat
func TestNodeCompat(t *testing.T) {
	if os.Getenv("CHANGEGATE_NODE_COMPAT") != "1" {
		t.Skip("set CHANGEGATE_NODE_COMPAT=1 to check mongowire with the MongoDB Node.js driver (needs node and npm)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("CHANGEGATE_NODE_COMPAT=1 but node is not installed: %v", err)
	}
	dir, err := filepath.Abs(filepath.Join("compat", "node"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "mongodb", "package.json")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Fatalf("node_modules missing and npm is not installed: %v", err)
		}
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}

	for _, tc := range []struct {
		name string
		opts mongowire.Options
	}{
		{"polled-hello", mongowire.Options{}},
		{"streaming-hello", mongowire.Options{StreamingHello: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, tc.opts)
			cmd := exec.CommandContext(ctx, node, "compat.mjs", srv.URI())
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("node compat.mjs %s: %v\n%s", srv.URI(), err, out)
			}
			t.Logf("node compat.mjs %s:\n%s", srv.URI(), out)
		})
	}
}
