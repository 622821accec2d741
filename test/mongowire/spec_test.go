package mongowire_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
)

// The MongoDB specifications' unified-format tests, run by the Go driver's
// own runner (go.mongodb.org/mongo-driver/v2/internal/integration/unified,
// at the version go.mod pins) against a mongowire server. The runner is an
// internal package of the driver module, so the test builds its test binary
// inside the driver's module directory (module cache; GOWORK=off and
// -mod=mod because the driver's test-only dependencies are not in our
// go.sum) and runs it with MONGODB_URI pointing at mongowire and
// PROJECT_DIRECTORY at testdata (the runner reads
// $PROJECT_DIRECTORY/testdata/specifications/source/<dir>). The JSON files
// are vendored from github.com/mongodb/specifications (see
// testdata/specifications/README.md).
//
// Every test of the directories must pass, or be skipped by the runner's
// own rules (server version, topology, unsupported operations), except the
// accepted ones below, which are not run (some would hang: the runner
// iterates a change stream until an event that never comes).

// acceptedFailures maps "<file>/<test description>" to why mongowire does
// not pass it.
var acceptedFailures = map[string]map[string]string{
	"change-streams": {
		"change-streams-disambiguatedPaths.json/disambiguatedPaths is present on updateDescription when an ambiguous path is present":          "updateDescription.disambiguatedPaths (MongoDB 6.1+, only with showExpandedEvents) is not modelled; changegate does not use it",
		"change-streams-disambiguatedPaths.json/disambiguatedPaths returns array indices as integers":                                          "updateDescription.disambiguatedPaths is not modelled; changegate does not use it",
		"change-streams-showExpandedEvents.json/when showExpandedEvents is true, new fields on change stream events are handled appropriately": "showExpandedEvents events and fields (collectionUUID, create, createIndexes, modify, ...) are not modelled; changegate does not use them",
		"change-streams-showExpandedEvents.json/when showExpandedEvents is true, createIndex events are reported":                              "showExpandedEvents events are not modelled (would hang: the runner waits for the event)",
		"change-streams-showExpandedEvents.json/when showExpandedEvents is true, dropIndexes events are reported":                              "showExpandedEvents events are not modelled (would hang)",
		"change-streams-showExpandedEvents.json/when showExpandedEvents is true, create events are reported":                                   "showExpandedEvents events are not modelled (would hang)",
		"change-streams-showExpandedEvents.json/when showExpandedEvents is true, create events on views are reported":                          "showExpandedEvents events and views are not modelled (would hang)",
		"change-streams-showExpandedEvents.json/when showExpandedEvents is true, modify events are reported":                                   "showExpandedEvents events (collMod) are not modelled (would hang)",
	},
	"transactions": {
		"read-pref.json/secondary readPreference":                                          "needs a secondary: the driver selects a server for the read preference before it refuses a non-primary one in a transaction, and a one-node set has none (30 s server selection timeout)",
		"transaction-options.json/readPreference inherited from client":                    "needs a secondary (as read-pref.json/secondary readPreference)",
		"transaction-options.json/readPreference inherited from defaultTransactionOptions": "needs a secondary (as read-pref.json/secondary readPreference)",
		"transaction-options.json/startTransaction overrides readPreference":               "needs a secondary (as read-pref.json/secondary readPreference)",
	},
}

func TestSpecChangeStreams(t *testing.T) { runSpecDir(t, "change-streams") }

func TestSpecTransactions(t *testing.T) { runSpecDir(t, "transactions") }

// goTestName is how `go test` names a subtest.
func goTestName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' {
			return '_'
		}
		return r
	}, s)
}

func runSpecDir(t *testing.T, dir string) {
	if testing.Short() {
		t.Skip("the specification tests build the driver's test runner (about a minute cold); skipped with -short")
	}
	bin := unifiedRunner(t)
	srv := startServer(t, mongowire.Options{CommandLogLimit: -1})
	project, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(project, "testdata", "specifications", "source", dir, "tests", "unified")

	// Every test the JSON files define, by go test name.
	all := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(specDir, "*.json"))
	if len(files) == 0 {
		t.Fatalf("no specification files in %s", specDir)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var spec struct {
			Tests []struct {
				Description string `json:"description"`
			} `json:"tests"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range spec.Tests {
			all[filepath.Base(f)+"/"+goTestName(tc.Description)] = true
		}
	}
	accepted := map[string]string{}
	var skipNames []string
	for name, why := range acceptedFailures[dir] {
		n := goTestName(name)
		if !all[n] {
			t.Errorf("accepted failure %q is not a test of %s", name, dir)
		}
		accepted[n] = why
		_, test, _ := strings.Cut(n, "/")
		skipNames = append(skipNames, regexp.QuoteMeta(test))
	}
	sort.Strings(skipNames)

	// The runner names tests TestUnifiedSpec/<dir>/tests/unified/<file>/<test>;
	// go test matches each slash-separated part separately.
	prefix := "^TestUnifiedSpec$/^" + regexp.QuoteMeta(dir) + "$/^tests$/^unified$"
	args := []string{"-test.v", "-test.timeout", "170s", "-test.run", prefix}
	if len(skipNames) > 0 {
		args = append(args, "-test.skip", prefix+"/.*/^("+strings.Join(skipNames, "|")+")$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "MONGODB_URI="+srv.URI(), "PROJECT_DIRECTORY="+project)
	out, runErr := cmd.CombinedOutput()

	// Parse "--- PASS|FAIL|SKIP: name (d)" lines and each test's log.
	results := map[string]string{}
	logs := map[string]*strings.Builder{}
	var current string
	base := "TestUnifiedSpec/" + dir + "/tests/unified/"
	re := regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "=== RUN   "); ok {
			current = strings.TrimPrefix(name, base)
			continue
		}
		if m := re.FindStringSubmatch(line); m != nil {
			if name, ok := strings.CutPrefix(m[2], base); ok {
				results[name] = m[1] // "<file>" or "<file>/<test>"
			}
			continue
		}
		if current != "" {
			if logs[current] == nil {
				logs[current] = &strings.Builder{}
			}
			logs[current].WriteString(line + "\n")
		}
	}
	counts := map[string]int{}
	for name := range all {
		res, ran := results[name]
		if file, _, _ := strings.Cut(name, "/"); !ran && results[file] == "SKIP" {
			res, ran = "SKIP", true // the runner skipped the whole file
		}
		_, acc := accepted[name]
		switch {
		case acc && ran:
			t.Errorf("%s: ran although accepted as failing", name)
		case acc:
			counts["accepted"]++
		case !ran:
			t.Errorf("%s: no result from the runner", name)
		case res == "FAIL":
			log := ""
			if l := logs[name]; l != nil {
				log = l.String()
			}
			t.Errorf("%s failed:\n%s", name, log)
		default:
			counts[res]++
		}
	}
	t.Logf("%s: %d tests: %d pass, %d skipped by the runner's own rules, %d accepted failures not run",
		dir, len(all), counts["PASS"], counts["SKIP"], counts["accepted"])
	if t.Failed() || runErr != nil && counts["PASS"] == 0 {
		t.Logf("runner: %v\n%s", runErr, tail(out, 4000))
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// unifiedRunner builds the driver's unified-format test binary once per
// test process and returns its path.
func unifiedRunner(t *testing.T) string {
	t.Helper()
	runnerOnce.Do(func() {
		modDir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.mongodb.org/mongo-driver/v2").Output()
		if err != nil {
			runnerErr = err
			return
		}
		dir, err := os.MkdirTemp("", "mongowire-unified-")
		if err != nil {
			runnerErr = err
			return
		}
		runnerPath = filepath.Join(dir, "unified.test")
		build := exec.Command("go", "test", "-c", "-o", runnerPath, "./internal/integration/unified")
		build.Dir = strings.TrimSpace(string(modDir))
		build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := build.CombinedOutput(); err != nil {
			runnerErr = err
			runnerOut = out
		}
	})
	if runnerErr != nil {
		t.Fatalf("building the driver's unified test runner: %v\n%s", runnerErr, runnerOut)
	}
	return runnerPath
}

var (
	runnerOnce sync.Once
	runnerPath string
	runnerErr  error
	runnerOut  []byte
)

// TestMain removes the runner binary after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if runnerPath != "" {
		_ = os.RemoveAll(filepath.Dir(runnerPath))
	}
	os.Exit(code)
}
