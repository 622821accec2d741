package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnknownSubcommand: a mistyped subcommand is a usage error (exit 2,
// named), reported before the config is read or MongoDB contacted.
func TestUnknownSubcommand(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("nonsense = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"deadletters", "lsit", "-config", bad},
		{"checkpoints", "rest", "-config", bad, "-source", "orders"},
	} {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), `unknown command "`+args[1]+`"`) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and unknown command", args, code, errOut.String())
		}
	}
}

// TestCheckExplainsPartitions: check accepts partitions and explains what
// changing their number does; without partitions it says nothing of them.
func TestCheckExplainsPartitions(t *testing.T) {
	const base = `
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
%s
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`
	for _, tc := range []struct {
		extra string
		note  bool
	}{{"", false}, {"partitions = 4", true}} {
		path := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(path, []byte(strings.Replace(base, "%s", tc.extra, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if code := run([]string{"check", "-config", path}, &out, &errOut); code != 0 {
			t.Fatalf("%q: exit %d: %s", tc.extra, code, errOut.String())
		}
		got := strings.Contains(out.String(), `note: source "orders" has 4 partitions (units orders#0/4 ... orders#3/4)`) &&
			strings.Contains(out.String(), "starts from the oldest checkpoint")
		if got != tc.note {
			t.Errorf("%q: output %q, note wanted: %v", tc.extra, out.String(), tc.note)
		}
	}
}
