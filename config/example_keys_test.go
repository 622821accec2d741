package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// exampleKey is one key written in config.example.toml, set or commented
// out.
type exampleKey struct {
	path     string // as in Key.Path: "sinks[].retry.max_attempts"
	sinkType string // the type of the [[sinks]] entry it is in, if any
	def      string // the text after "# default", if any
	line     int
}

var (
	exampleHeaderRE = regexp.MustCompile(`^\s*#?\s*(\[\[?)([a-z_.]+)\]\]?\s*$`)
	exampleKeyRE    = regexp.MustCompile(`^\s*#?\s*([a-z_]+)\s*=\s*(.*)$`)
	exampleDefRE    = regexp.MustCompile(`#\s*default\s+(.*)$`)
	inlineKeyRE     = regexp.MustCompile(`[{,]\s*([a-z_]+)\s*=`)
)

// exampleKeys reads the keys of config.example.toml: every line "key =
// ..." or "# key = ...", in the table of the last header (commented out
// or not) above it.
func exampleKeys(text string) []exampleKey {
	var out []exampleKey
	table, sinkType := "", ""
	var sinkStart int // index in out of the current [[sinks]] entry's first key
	for i, line := range strings.Split(text, "\n") {
		if m := exampleHeaderRE.FindStringSubmatch(line); m != nil {
			name := m[2]
			switch {
			case m[1] == "[[":
				table = name + "[]"
			case strings.HasPrefix(name, "sinks."):
				table = "sinks[]." + strings.TrimPrefix(name, "sinks.")
				out = append(out, exampleKey{path: table, sinkType: sinkType, line: i + 1})
				continue
			default:
				table = name
			}
			if table == "sinks[]" {
				sinkType, sinkStart = "", len(out)
			}
			out = append(out, exampleKey{path: strings.TrimSuffix(table, "[]"), sinkType: sinkType, line: i + 1})
			continue
		}
		m := exampleKeyRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		k := exampleKey{path: table + "." + m[1], line: i + 1}
		if table == "" {
			k.path = m[1] // a top-level key, before the first table
		}
		if d := exampleDefRE.FindStringSubmatch(m[2]); d != nil {
			k.def = strings.TrimSpace(d[1])
		}
		if strings.HasPrefix(table, "sinks[]") {
			if k.path == "sinks[].type" {
				sinkType = strings.Trim(strings.Fields(m[2])[0], `"`)
				for j := sinkStart; j < len(out); j++ {
					out[j].sinkType = sinkType
				}
			}
			k.sinkType = sinkType
		}
		out = append(out, k)
		// Keys of an inline table: basic_auth = { username = ..., ... }.
		if strings.HasPrefix(strings.TrimSpace(m[2]), "{") && m[1] != "headers" && m[1] != "fields" && m[1] != "filter" {
			for _, im := range inlineKeyRE.FindAllStringSubmatch(m[2], -1) {
				sub := k
				sub.path, sub.def = k.path+"."+im[1], ""
				out = append(out, sub)
			}
		}
	}
	return out
}

// applies reports whether the description k covers a key written in a
// [[sinks]] entry of type t ("" outside sinks).
func applies(k Key, t string) bool {
	return k.SinkTypes == nil || t == "" || contains(k.SinkTypes, t)
}

// TestExampleHasEveryKey checks config.example.toml against Describe:
// every key the decoder accepts is written there (set or commented out),
// in its table and, for a sink type's key, in an entry of that type; every
// key written there is accepted; and a "# default X" comment agrees with
// the decoder's default.
func TestExampleHasEveryKey(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	written := exampleKeys(string(data))
	keys := Describe()
	isTable := map[string]bool{"mongo": true, "server": true, "cluster": true, "sources": true, "sinks": true, "rules": true, "subscriptions": true}
	for _, k := range keys {
		if isTable[k.Path] && k.Type != "table" || k.Path == "sources" || k.Path == "sinks" || k.Path == "rules" {
			continue
		}
		path := k.Path
		if name, ok := strings.CutPrefix(path, "rules[]."); ok && contains(shapeKeys, name) {
			// The example says a rule takes the shaping keys of [[sinks]].
			path = "sinks[]." + name
		}
		found := false
		for _, w := range written {
			if w.path != path {
				continue
			}
			if k.SinkTypes == nil || contains(k.SinkTypes, w.sinkType) {
				found = true
			}
		}
		if !found {
			where := ""
			if k.SinkTypes != nil {
				where = " in a [[sinks]] entry of type " + strings.Join(k.SinkTypes, " or ")
			}
			t.Errorf("config.example.toml does not show %s%s: add it (set, or as a comment \"# %s = ...\") with its default and range",
				k.Path, where, k.Path[strings.LastIndex(k.Path, ".")+1:])
		}
	}
	for _, w := range written {
		var match *Key
		known := false
		for i, k := range keys {
			if k.Path != w.path {
				continue
			}
			known = true
			if applies(k, w.sinkType) {
				match = &keys[i]
			}
		}
		if !known || match == nil && !strings.HasPrefix(w.path, "sinks[].headers.") {
			t.Errorf("config.example.toml:%d: %s is not a key changegate accepts%s, or config.Describe misses it "+
				"(a decoder that reads a key only under a condition hides it: ask for it unconditionally, see config/describe.go)",
				w.line, w.path, sinkTypeText(w.sinkType))
			continue
		}
		if w.def == "" {
			continue
		}
		ref, _ := refKey(*match)
		want := strings.ReplaceAll(ref.Default, "`", "")
		if want == "" {
			t.Errorf("config.example.toml:%d: %s says \"# default %s\" but the decoder has no default for it", w.line, w.path, w.def)
			continue
		}
		if !strings.HasPrefix(w.def, want) {
			t.Errorf("config.example.toml:%d: %s says \"# default %s\", the decoder's default is %s", w.line, w.path, w.def, want)
		}
	}
}

func sinkTypeText(t string) string {
	if t == "" {
		return ""
	}
	return " in a " + t + " sink"
}
