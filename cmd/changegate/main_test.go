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
