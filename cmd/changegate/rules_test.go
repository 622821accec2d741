package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestRulesTestGolden: rules test prints, for the recorded events of
// testdata/rules_events.jsonl (insert, update, delete, replace, a rule with
// operations, a pushed-down filter and one evaluated in changegate only, a
// database source with namespaces, events no rule or no source takes,
// malformed lines, odd BSON values), which rules match, which sinks get the
// event and their envelopes, as text and as JSON. It keeps going past bad
// lines, names them, and exits 1. Regenerate with
// go test ./cmd/changegate -run TestRulesTestGolden -update.
func TestRulesTestGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		flags  []string
	}{
		{"rules_events.golden", nil},
		{"rules_events.json.golden", []string{"-json"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			args := append([]string{"rules", "test", "-config", "testdata/rules.toml", "-events", "testdata/rules_events.jsonl"}, tc.flags...)
			var out, errOut bytes.Buffer
			code := run(args, &out, &errOut)
			if code != 1 {
				t.Errorf("exit %d, want 1 (three lines cannot be read); stderr %q", code, errOut.String())
			}
			if want := "testdata/rules_events.jsonl: 3 line(s) could not be read: 15, 17, 30\n"; !strings.HasSuffix(errOut.String(), want) {
				t.Errorf("stderr %q, want it to end with %q", errOut.String(), want)
			}
			path := filepath.Join("testdata", tc.golden)
			if *updateGolden {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got := out.String(); got != string(want) {
				t.Errorf("output differs from %s (run with -update after checking the change):\n%s", path, lineDiff(string(want), got))
			}
		})
	}
}

// TestRulesTestEnvelopesAreTheSinks: every envelope -json prints is, byte
// for byte, what the sinks encode for the event as the router routes it
// (event.Envelope in the sink's json format, rules set by the routing), so
// the printer adds no escaping of its own ("<&>" stays as is).
func TestRulesTestEnvelopesAreTheSinks(t *testing.T) {
	var out, errOut bytes.Buffer
	run([]string{"rules", "test", "-json", "-config", "testdata/rules.toml", "-events", "testdata/rules_events.jsonl"}, &out, &errOut)
	cfg, err := config.Load("testdata/rules.toml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := app.CompileRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, "testdata/rules_events.jsonl")
	checked := 0
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Line   int    `json:"line"`
			Source string `json:"source"`
			Error  string `json:"error"`
			Sinks  []struct {
				Sink     string          `json:"sink"`
				Envelope json.RawMessage `json:"envelope"`
				Error    string          `json:"error"`
			} `json:"sinks"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		if rec.Error != "" || len(rec.Sinks) == 0 {
			continue
		}
		var raw bson.Raw
		if err := bson.UnmarshalExtJSON([]byte(lines[rec.Line-1]), false, &raw); err != nil {
			t.Fatalf("line %d: %v", rec.Line, err)
		}
		ev, err := event.FromChange(rec.Source, 0, raw)
		if err != nil {
			t.Fatal(err)
		}
		ev.Rules = rules.Route(ev).Rules
		for _, s := range rec.Sinks {
			want, err := ev.Envelope(cfg.Sink(s.Sink).JSON == config.JSONCanonical)
			switch {
			case err != nil:
				if s.Error != err.Error() || s.Envelope != nil {
					t.Errorf("line %d sink %s: printed error %q, envelope %s; the sink fails with %v", rec.Line, s.Sink, s.Error, s.Envelope, err)
				}
			case !bytes.Equal(s.Envelope, want):
				t.Errorf("line %d sink %s: printed\n%s\nthe sink encodes\n%s", rec.Line, s.Sink, s.Envelope, want)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Fatalf("only %d envelopes checked; the output is not what this test expects:\n%s", checked, out.String())
	}
}

// TestRulesTestBadInput: missing flags and an unknown source are usage
// errors (2); a config error is reported with its file:line (1); an events
// file that does not exist is named.
func TestRulesTestBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[mongo]\nuri = \"mongodb://localhost\"\n\n[[rules]]\nname = \"r\"\nsource = \"nope\"\nsinks = [\"x\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	events := "testdata/rules_events.jsonl"
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"rules"}, 2, "Usage: changegate rules test"},
		{[]string{"rules", "tset"}, 2, `unknown command "tset"`},
		{[]string{"rules", "test", "-events", events}, 2, "-config is required"},
		{[]string{"rules", "test", "-config", "testdata/rules.toml"}, 2, "-events is required"},
		{[]string{"rules", "test", "-config", "testdata/rules.toml", "-events", events, "-source", "ordres"}, 2, `no source "ordres" in testdata/rules.toml (sources: orders, catalog)`},
		{[]string{"rules", "test", "-config", "testdata/rules.toml", "-events", filepath.Join(dir, "none.jsonl")}, 2, "none.jsonl: no such file"},
		{[]string{"rules", "test", "-config", bad, "-events", events}, 1, "bad.toml:6"},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

// TestRulesTestSource: -source routes every event as that source's, and a
// file whose every line is read exits 0.
func TestRulesTestSource(t *testing.T) {
	lines := readLines(t, "testdata/rules_events.jsonl")
	path := filepath.Join(t.TempDir(), "one.jsonl")
	// line 3 (shop.orders, paid) routed as the catalog source: no rule.
	if err := os.WriteFile(path, []byte(lines[2]+"\r\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"rules", "test", "-config", "testdata/rules.toml", "-events", path, "-source", "catalog"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if got := out.String(); !strings.Contains(got, "source catalog, id catalog:") || !strings.Contains(got, "no rule matches") || strings.Contains(got, "source orders") {
		t.Errorf("output %q: want the event routed by source catalog only, matching nothing", got)
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// lineDiff shows the first lines where want and got differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 5; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			shown++
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
		}
	}
	return b.String()
}
