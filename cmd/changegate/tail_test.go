package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/test/mongotest"
)

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
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

const tailConfig = `
[mongo]
uri = %q
state_database = %q

# tail takes no lease, even in cluster mode.
[cluster]
enabled = true

[[sources]]
name = "orders"
database = %q
collection = "orders"
partitions = 2

[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"

[[rules]]
name = "paid"
source = "orders"
filter = { "fullDocument.status" = "paid" }
sinks = ["hook"]

# Matches everything: nothing is pushed down, so tail reads the unpaid
# orders too and -rule paid must leave them out.
[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`

// startTail runs changegate tail with args in the background and waits
// until its change stream is open; wait returns its exit code and output.
func startTail(t *testing.T, args ...string) (wait func() (int, string, string)) {
	t.Helper()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(append([]string{"tail"}, args...), &out, &errOut) }()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(errOut.String(), "changegate tail: reading source orders") {
		select {
		case code := <-done:
			if !strings.Contains(errOut.String(), "changegate tail: reading source orders") {
				t.Fatalf("tail exited %d before its stream was open: %s", code, errOut.String())
			}
			done <- code // it had opened, and finished already
		case <-deadline:
			t.Fatalf("tail did not open its stream: %s", errOut.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return func() (int, string, string) {
		t.Helper()
		select {
		case code := <-done:
			return code, out.String(), errOut.String()
		case <-time.After(30 * time.Second):
			t.Fatalf("tail did not stop after -n changes; output so far:\n%s\n%s", out.String(), errOut.String())
			return 0, "", ""
		}
	}
}

// TestTail: tail prints the live changes a rule matches as canonical
// Extended JSON lines — the raw change events, which rules test reads back
// — leaves out what -rule does not match, stops after -n, resumes after a
// printed token, and writes nothing to the state database (no checkpoint,
// no lease, no dead letter) although the config runs in cluster mode.
// Against test/mongowire, or a real MongoDB with CHANGEGATE_TEST_MONGODB_URI.
func TestTail(t *testing.T) {
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	dbName, state := mongotest.UniqueName("cgtail_"), mongotest.UniqueName("cgtailstate_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Database(dbName).Drop(ctx)
		_ = client.Database(state).Drop(ctx)
	})
	path := filepath.Join(t.TempDir(), "tail.toml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(tailConfig, uri, state, dbName)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coll := client.Database(dbName).Collection("orders")

	wait := startTail(t, "-config", path, "-source", "orders", "-rule", "paid", "-n", "2")
	for i, status := range []string{"open", "paid", "open", "paid", "paid"} {
		doc := bson.D{{Key: "_id", Value: i + 1}, {Key: "status", Value: status}, {Key: "total", Value: int64(100 + i)}}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := wait()
	if code != 0 {
		t.Fatalf("tail exited %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("tail printed %d lines, want 2 (-n 2):\n%s", len(lines), out)
	}
	for i, want := range []int32{2, 4} {
		var raw bson.Raw
		if err := bson.UnmarshalExtJSON([]byte(lines[i]), true, &raw); err != nil {
			t.Fatalf("line %d is not canonical Extended JSON: %v\n%s", i+1, err, lines[i])
		}
		if op := raw.Lookup("operationType").StringValue(); op != "insert" {
			t.Errorf("line %d: operationType %q", i+1, op)
		}
		if id, ok := raw.Lookup("documentKey", "_id").Int32OK(); !ok || id != want {
			t.Errorf("line %d: document %v, want %d (the paid orders only)", i+1, raw.Lookup("documentKey", "_id"), want)
		}
		if total := raw.Lookup("fullDocument", "total"); total.Type != bson.TypeInt64 {
			t.Errorf("line %d: total is a %s; canonical output keeps the int64", i+1, total.Type)
		}
	}

	// What tail prints, rules test reads: both rules match each.
	events := filepath.Join(t.TempDir(), "tail.jsonl")
	if err := os.WriteFile(events, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	var rout, rerr bytes.Buffer
	if code := run([]string{"rules", "test", "-config", path, "-events", events}, &rout, &rerr); code != 0 {
		t.Fatalf("rules test on tail's output: exit %d: %s", code, rerr.String())
	}
	if n := strings.Count(rout.String(), "rule paid matches"); n != 2 || strings.Count(rout.String(), "rule all matches") != 2 {
		t.Errorf("rules test on tail's output:\n%s", rout.String())
	}

	// -resume-after the first printed change: the next paid one is #4.
	var first bson.Raw
	_ = bson.UnmarshalExtJSON([]byte(lines[0]), true, &first)
	token := first.Lookup("_id", "_data").StringValue()
	code, out, errOut = startTail(t, "-config", path, "-source", "orders", "-rule", "paid", "-n", "1", "-resume-after", token)()
	if code != 0 || !strings.Contains(out, `"documentKey":{"_id":{"$numberInt":"4"}}`) || strings.Count(out, "\n") != 1 {
		t.Errorf("tail -resume-after: exit %d, output %q, stderr %q; want change #4 only", code, out, errOut)
	}

	names, err := client.Database(state).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		cnt, err := client.Database(state).Collection(n).CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if cnt > 0 {
			t.Errorf("tail wrote %d document(s) to %s.%s; it must write nothing", cnt, state, n)
		}
	}
}

// TestTailBadInput: missing flags, an unknown source or rule, a rule of
// another source, a source without rules and conflicting start flags are
// usage errors (2); a config error names its file:line (1). None of them
// connects to MongoDB.
func TestTailBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	if err := os.WriteFile(good, []byte(fmt.Sprintf(tailConfig, "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100", "s", "shop")+`
[[sources]]
name = "quiet"
database = "shop"
collection = "quiet"

[[sources]]
name = "users"
database = "shop"
collection = "users"

[[rules]]
name = "users"
source = "users"
sinks = ["hook"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[mongo]\nuri = \"mongodb://localhost\"\n\n[[sources]]\nname = \"orders\"\ndatabase = \"shop\"\nfull_document = \"sometimes\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-source", "orders"}, 2, "-config is required"},
		{[]string{"-config", good}, 2, "-source is required"},
		{[]string{"-config", good, "-source", "ordres"}, 2, `no source "ordres" in ` + good + " (sources: orders, quiet, users)"},
		{[]string{"-config", good, "-source", "orders", "-rule", "piad"}, 2, `no rule "piad" in ` + good + " (rules of source orders: paid, all)"},
		{[]string{"-config", good, "-source", "orders", "-rule", "users"}, 2, `rule "users" reads source "users", not "orders"`},
		{[]string{"-config", good, "-source", "quiet"}, 2, `source "quiet" has no rules`},
		{[]string{"-config", good, "-source", "orders", "-n", "-1"}, 2, "-n must be 0 or more"},
		{[]string{"-config", good, "-source", "orders", "-resume-after", "82AB", "-start-at", "2026-01-01T00:00:00Z"}, 2, "exclude each other"},
		{[]string{"-config", good, "-source", "orders", "-start-at", "yesterday"}, 2, "-start-at: want an RFC 3339 time"},
		{[]string{"-config", good, "-source", "orders", "-resume-after", "{"}, 2, "-resume-after:"},
		{[]string{"-config", bad, "-source", "orders"}, 1, "bad.toml:7"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"tail"}, tc.args...), &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("tail %v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

// TestTailSplitEvent: a change MongoDB splits with
// $changeStreamSplitLargeEvent (an update of a 6 MiB field, with
// updateLookup and the pre-image: about 18 MiB of change event) is printed
// once, whole, without the fragments' splitEvent field, as run would
// deliver it. Skipped with -short and under the race detector, which
// makes it take 20 s instead of 1 (it runs with go test ./cmd/changegate).
func TestTailSplitEvent(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("-short or -race: skips the 18 MiB change event (run it with go test ./cmd/changegate -run TestTailSplitEvent)")
	}
	uri, _ := mongotest.URI(t)
	client := mongotest.Client(t, uri)
	dbName := mongotest.UniqueName("cgtailsplit_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Database(dbName).Drop(ctx)
	})
	path := filepath.Join(t.TempDir(), "tail.toml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`
[mongo]
uri = %q
[[sources]]
name = "orders"
database = %q
collection = "orders"
full_document = "updateLookup"
full_document_before_change = "required"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "updates"
source = "orders"
operations = ["update"]
sinks = ["hook"]
`, uri, dbName)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := client.Database(dbName).CreateCollection(ctx, "orders",
		options.CreateCollection().SetChangeStreamPreAndPostImages(bson.D{{Key: "enabled", Value: true}})); err != nil {
		t.Fatal(err)
	}
	coll := client.Database(dbName).Collection("orders")
	const size = 6 << 20
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: strings.Repeat("a", size)}}); err != nil {
		t.Fatal(err)
	}
	wait := startTail(t, "-config", path, "-source", "orders", "-n", "1")
	if _, err := coll.UpdateByID(ctx, 1, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: strings.Repeat("b", size)}}}}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := wait()
	if code != 0 {
		t.Fatalf("tail exited %d: %s", code, errOut)
	}
	if strings.Count(out, "\n") != 1 {
		t.Fatalf("tail printed %d lines, want the one update", strings.Count(out, "\n"))
	}
	var raw bson.Raw
	if err := bson.UnmarshalExtJSON([]byte(out), true, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) < 3*size {
		t.Errorf("the change is %d bytes; want the whole event (over %d)", len(raw), 3*size)
	}
	if _, err := raw.LookupErr("splitEvent"); err == nil {
		t.Error("a fragment was printed (it has splitEvent)")
	}
	before, _ := raw.Lookup("fullDocumentBeforeChange", "a").StringValueOK()
	set, _ := raw.Lookup("updateDescription", "updatedFields", "a").StringValueOK()
	after, _ := raw.Lookup("fullDocument", "a").StringValueOK()
	if before != strings.Repeat("a", size) || set != strings.Repeat("b", size) || after != set {
		t.Errorf("update with fullDocumentBeforeChange.a, updatedFields.a, fullDocument.a of %d, %d, %d bytes; want the old and the new %d-byte value",
			len(before), len(set), len(after), size)
	}
}
