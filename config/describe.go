package config

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

//go:generate go test -run ^TestConfigurationReference$ -update .

// Key describes one configuration key the decoder accepts. [Describe]
// returns them; docs/configuration.md and the checks of config.example.toml
// are built from them, so the reference lists exactly what Parse accepts.
type Key struct {
	// Path is the key's dotted path from the root, with "[]" after an
	// array of tables: "mongo.uri", "sinks[].retry.max_attempts".
	Path string
	// SinkTypes are the sink types this description applies to, in the
	// order of the type list; nil when it applies to every type (and for
	// keys outside [[sinks]]). A sink key whose type, default or range
	// differs between types appears once per distinct description.
	SinkTypes []string
	// Type is what the decoder reads: "string", "integer", "number",
	// "boolean", "duration", "array of strings", "table", "array of
	// tables", or "" when the decoder reads the value by hand (the
	// reference then describes it).
	Type string
	// Default is the default as written in TOML ("10s" quoted, 8, true),
	// or "" when the key has none the decoder knows.
	Default string
	// Range is the accepted range or values, e.g. "1 to 1000", "at least
	// 1ms", `"key", "none", "strict"`; "" when the type says it all.
	Range string
	// Required is set when the decoder reports the key as missing.
	Required bool
	// Secret is set when the value may come from "file:" and is never
	// printed.
	Secret bool
}

// recorder collects the keys the decoder asks for when it runs in
// describe mode (decoder.rec set).
type recorder struct {
	// variant is the sink type being decoded, "" outside [[sinks]].
	variant string
	order   []recKey
	keys    map[recKey]*Key
}

type recKey struct{ path, variant string }

var indexRE = regexp.MustCompile(`\[[0-9]+\]`)

// note records (or refines) the key k of o; set fills in what the getter
// knows. It does nothing outside describe mode.
func (o *obj) note(k string, set func(*Key)) {
	r := o.d.rec
	if r == nil {
		return
	}
	path := indexRE.ReplaceAllString(o.keyPath(k), "[]")
	rk := recKey{path, r.variant}
	key := r.keys[rk]
	if key == nil {
		key = &Key{Path: path}
		r.keys[rk] = key
		r.order = append(r.order, rk)
	}
	if set != nil {
		set(key)
	}
}

func setType(t string) func(*Key) {
	return func(k *Key) { k.Type = t }
}

func tomlString(s string) string { return strconv.Quote(s) }

func durationText(d time.Duration) string {
	if d == 0 {
		return `"0s"`
	}
	s := d.String()
	// time.Duration prints 1m0s; the configuration is written "1m".
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return tomlString(s)
}

func intRangeText(lo, hi int64) string {
	switch {
	case hi == math.MaxInt64 || hi == math.MaxInt32:
		return fmt.Sprintf("at least %d", lo)
	default:
		return fmt.Sprintf("%d to %d", lo, hi)
	}
}

func floatRangeText(lo, hi float64) string {
	if hi > 1e300 {
		return "at least " + fmtFloat(lo)
	}
	return fmtFloat(lo) + " to " + fmtFloat(hi)
}

func floatText(f float64) string {
	s := fmtFloat(f)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}

// Describe returns every key the decoder accepts, in the order Parse reads
// them, with its type, default and range as the decoder declares them. It
// runs the decoder itself over a document with one [[sinks]] entry per
// sink type, where every absent table is decoded as empty, so a key a
// getter asks for cannot be left out.
func Describe() []Key {
	rec := &recorder{keys: map[recKey]*Key{}}
	d := &decoder{file: "describe", lookupEnv: func(string) (string, bool) { return "", false }, sinkTypes: builtinSinkTypes(), rec: rec}
	root := newTable()
	sinks := &value{kind: kindArray, aot: true}
	var types []string
	for _, t := range d.sinkTypes {
		tbl := newTable()
		tbl.set("type", &value{kind: kindString, str: t.name})
		sinks.arr = append(sinks.arr, &value{kind: kindTable, tbl: tbl})
		types = append(types, t.name)
	}
	root.set("sinks", sinks)
	_, _ = d.decodeTree(root) // describe mode: the errors are those of empty tables
	return rec.merge(types)
}

// merge folds the per-sink-type records of one path into one Key when
// they agree, one per distinct description otherwise.
func (r *recorder) merge(types []string) []Key {
	var out []Key
	done := map[string]bool{}
	for _, rk := range r.order {
		if done[rk.path] {
			continue
		}
		done[rk.path] = true
		type group struct {
			key   Key
			types []string
		}
		var groups []*group
		for _, t := range append([]string{""}, types...) {
			k := r.keys[recKey{rk.path, t}]
			if k == nil {
				continue
			}
			var g *group
			for _, h := range groups {
				if h.key.Type == k.Type && h.key.Default == k.Default && h.key.Range == k.Range &&
					h.key.Required == k.Required && h.key.Secret == k.Secret {
					g = h
				}
			}
			if g == nil {
				g = &group{key: *k}
				groups = append(groups, g)
			}
			if t != "" {
				g.types = append(g.types, t)
			}
		}
		for _, g := range groups {
			k := g.key
			if len(g.types) > 0 && len(g.types) < len(types) {
				k.SinkTypes = g.types
			}
			out = append(out, k)
		}
	}
	return out
}
