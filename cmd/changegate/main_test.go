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

// TestCheckSaysMemoryBudget: check prints the byte budget in force and
// where it comes from (here, when the test runs outside a memory-limited
// cgroup, the configured value and the environment's GOMEMLIMIT).
func TestCheckSaysMemoryBudget(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "1GiB")
	path := filepath.Join(t.TempDir(), "c.toml")
	src := "max_in_flight_bytes = 67108864\n[mongo]\nuri = \"mongodb://localhost:27017\"\n"
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"check", "-config", path}, &out, &errOut)
	if code != 0 {
		// Inside a container limited below 64 MiB the value is refused,
		// naming the key and file:line.
		if !strings.Contains(errOut.String(), "max_in_flight_bytes: must not exceed the container's memory limit") {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
		return
	}
	for _, want := range []string{
		"memory: max_in_flight_bytes: 64 MiB (67108864 bytes), max_in_flight_bytes at " + path + ":1",
		"memory: GOMEMLIMIT: GOMEMLIMIT=1GiB from the environment",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCheckStateDatabase: check notes that a cluster-level source leaves
// the state database out, and refuses a source of the state database with
// its file:line.
func TestCheckStateDatabase(t *testing.T) {
	base := `[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
state_database = "cgstate"
[[sources]]
name = "all"
%s
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "all"
source = "all"
sinks = ["hook"]
`
	for _, tc := range []struct {
		extra, out string
		code       int
	}{
		{"", `note: sources[0] (all) watches the whole cluster except changegate's state database "cgstate" (mongo.state_database)`, 0},
		{`database = "shop"`, `: ok (1 sources`, 0},
		{`database = "cgstate"`, `sources[0].database: "cgstate" is changegate's own state database (mongo.state_database)`, 1},
		{"database = \"cgstate\"\ncollection = \"deadletters\"", `note: sources[0] (all) watches cgstate.deadletters, a collection of changegate's own state database`, 0},
	} {
		path := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(path, []byte(strings.Replace(base, "%s", tc.extra, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := run([]string{"check", "-config", path}, &out, &errOut)
		all := out.String() + errOut.String()
		if code != tc.code || !strings.Contains(all, tc.out) {
			t.Errorf("%q: exit %d, output %q; want exit %d and %q", tc.extra, code, all, tc.code, tc.out)
		}
		if tc.code != 0 && !strings.Contains(all, "c.toml:6") {
			t.Errorf("%q: the error does not name the line: %q", tc.extra, all)
		}
		if tc.extra != "" && strings.Contains(all, "the whole cluster") {
			t.Errorf("%q: a note for a database-level source: %q", tc.extra, all)
		}
	}
}

// TestCleartextCredentialsRefusedByCheckAndRun: basic authentication to an
// http:// URL is refused by check and by run alike, with the key and
// file:line (run before it connects to anything), and accepted by both with
// allow_cleartext_credentials = true.
func TestCleartextCredentialsRefusedByCheckAndRun(t *testing.T) {
	const base = `[mongo]
uri = "mongodb://127.0.0.1:1/?replicaSet=rs0&serverSelectionTimeoutMS=200"
[[sinks]]
name = "hook"
type = "webhook"
url = "http://hooks.internal/x"
basic_auth = { username = "u", password = "p" }
%s`
	path := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(path, []byte(strings.Replace(base, "%s", "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "sinks[0].basic_auth: the password is sent in clear text to an http:// URL; use an https:// URL (or set allow_cleartext_credentials = true on the sink to accept the risk) at " + path + ":7"
	for _, cmd := range []string{"check", "run"} {
		var out, errOut bytes.Buffer
		if code := run([]string{cmd, "-config", path}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), want) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and %q", cmd, code, errOut.String(), want)
		}
	}
	if err := os.WriteFile(path, []byte(strings.Replace(base, "%s", "allow_cleartext_credentials = true\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"check", "-config", path}, &out, &errOut); code != 0 {
		t.Errorf("check with allow_cleartext_credentials: exit %d: %s", code, errOut.String())
	}
}
