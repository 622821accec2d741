package config

import (
	"strings"
	"testing"
)

// FuzzParse checks that no input makes Parse panic and that every error it
// returns is in the documented format.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`[mongo]
uri = "${SET}"
[server]
listen = ""
[[sources]]
name = "a"
database = "d"
pipeline = '[{"$match": {"a": 1}}]'
[[sinks]]
name = "s"
type = "webhook"
url = "http://x/"
headers = { "X-A" = "${UNSET:-b}" }
  [sinks.retry]
  jitter = 0.5
[[rules]]
name = "r"
source = "a"
namespaces = ["d.*"]
filter = { "x" = { "$in" = [1, 2.5, "s", true, 2026-01-01T00:00:00Z] } }
sinks = ["s"]
`))
	f.Add([]byte("[mongo]\r\nuri = \"mongodb://x\"\r\n[[sources]]\r\nname = \"a\"\r\n"))
	f.Add([]byte("a.b.c = 1\n[a.b.d]\n[[x.y]]\n[[x.y]]\nz = {q.r = [1, {s = 2}]}\n"))
	f.Add([]byte("[[rules]]\nfilter = { a = [[1], [{b = 1979-05-27}]], c = 07:32:00, d.e = 1 }\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.toml", data, func(k string) (string, bool) { return "v", k == "SET" })
		if err == nil {
			if cfg == nil {
				t.Fatal("nil config without error")
			}
			return
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			if !strings.Contains(line, " at f.toml") {
				t.Fatalf("error line without position: %q", line)
			}
		}
	})
}
