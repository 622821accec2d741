package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackfillBadInput: a backfill with a bad request is refused with exit
// status 2 and a clear message, before anything is read or sent (the
// MongoDB URI points nowhere: nothing may be contacted).
func TestBackfillBadInput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.toml")
	cfg := `
[mongo]
uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"
[[sinks]]
name = "unrouted"
type = "webhook"
url = "https://example.com/other"
[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", path}, "-config and -source are required"},
		{[]string{"-config", path, "-source", "nope"}, `unknown source "nope" (sources: orders)`},
		{[]string{"-config", path, "-source", "orders", "-sink", "nope"}, `unknown sink "nope"`},
		{[]string{"-config", path, "-source", "orders", "-sink", "unrouted"}, `no rule routes source "orders" to sink "unrouted"`},
		{[]string{"-config", path, "-source", "orders", "-filter", `{"$where": "1"}`}, "filter is not a valid query"},
		{[]string{"-config", path, "-source", "orders", "-filter", `{"a": `}, "filter is not valid Extended JSON"},
		{[]string{"-config", path, "-source", "orders", "-rate", "0.5e7"}, "rate 5e+06"},
		{[]string{"-config", path, "-resume", "abc", "-source", "orders"}, "-resume takes -config only"},
		{[]string{"-config", path, "-resume", "abc", "-rate", "5"}, "-resume takes -config only"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"backfill"}, tc.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}
