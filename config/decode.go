package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// decoder collects the errors of one Parse call.
type decoder struct {
	file      string
	lookupEnv func(string) (string, bool)
	sinkTypes []sinkType
	errs      []*Error
	// rec, when set, records every key asked for (see Describe); absent
	// tables and arrays of tables are then decoded as one empty table.
	rec *recorder
	// literal takes every string as written: no ${VAR} expansion and no
	// "file:" secrets (a document from a request, not the operator's
	// file; see ParseSubscriptionJSON).
	literal bool
}

func (d *decoder) errorf(path string, line int, format string, args ...any) {
	d.errs = append(d.errs, &Error{Key: path, Msg: fmt.Sprintf(format, args...), File: d.file, Line: line})
}

// err returns the joined errors sorted by line, or nil.
func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	sort.SliceStable(d.errs, func(i, j int) bool { return d.errs[i].Line < d.errs[j].Line })
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// resolvePath resolves a path written in the configuration against the
// configuration file's directory.
func (d *decoder) resolvePath(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(d.file), p)
}

// obj decodes one table. Every getter records its key as known, so that
// done can report the keys nobody asked for.
type obj struct {
	d    *decoder
	t    *table
	path string
	line int
	// known are the keys the schema defines for this table, in the order
	// they were asked for.
	known []string
	seen  map[string]bool
	// bad are keys already reported (wrong type), to avoid a second
	// "missing" error.
	bad map[string]bool
	// foreign, when set, returns a message for a key that belongs to
	// another variant of this table (a sink option of another type).
	foreign func(key string) string
	// noMissing suppresses "required key is missing" errors.
	noMissing bool
}

func (d *decoder) obj(path string, v *value) *obj {
	return &obj{d: d, t: v.tbl, path: path, line: v.line, seen: map[string]bool{}, bad: map[string]bool{}}
}

func (o *obj) keyPath(k string) string { return joinPath(o.path, k) }

// lookup returns the value of key k, or nil when it is absent.
func (o *obj) lookup(k string) *value {
	if !o.seen[k] {
		o.known = append(o.known, k)
	}
	o.seen[k] = true
	o.note(k, nil)
	return o.t.get(k)
}

// typeError reports a value of the wrong type.
func (o *obj) typeError(k string, v *value, want string) {
	o.bad[k] = true
	o.d.errorf(o.keyPath(k), v.line, "expected %s, got %s", want, v.typeName())
}

// missing reports a required key that is absent.
func (o *obj) missing(k string) {
	o.note(k, func(key *Key) { key.Required = true })
	if !o.bad[k] && !o.noMissing {
		o.d.errorf(o.keyPath(k), o.line, "required key is missing")
	}
}

// done reports every key of the table that no getter asked for.
func (o *obj) done() {
	for _, k := range o.t.keys {
		if o.seen[k] {
			continue
		}
		v := o.t.get(k)
		if o.foreign != nil {
			if msg := o.foreign(k); msg != "" {
				o.d.errorf(o.keyPath(k), v.line, "%s", msg)
				continue
			}
		}
		o.d.errorf(o.keyPath(k), v.line, "unknown key%s", didYouMean(k, o.known))
	}
}

// str returns the expanded string at k; ok is false when the key is absent
// or invalid (already reported).
func (o *obj) str(k string) (s string, v *value, ok bool) {
	v = o.lookup(k)
	o.note(k, func(key *Key) {
		if key.Type == "" {
			key.Type = "string"
		}
	})
	if v == nil {
		return "", nil, false
	}
	if v.kind != kindString {
		o.typeError(k, v, "a string")
		return "", v, false
	}
	s, ok = o.d.expand(o.keyPath(k), v.line, v.str)
	if !ok {
		o.bad[k] = true
	}
	return s, v, ok
}

// optString returns the string at k, or def when absent or invalid.
func (o *obj) optString(k, def string) string {
	o.note(k, func(key *Key) { key.Default = tomlString(def) })
	s, v, ok := o.str(k)
	if v == nil || !ok {
		return def
	}
	return s
}

// reqString returns the string at k, reporting it when absent.
func (o *obj) reqString(k string) (string, bool) {
	s, v, ok := o.str(k)
	if v == nil {
		o.missing(k)
	}
	return s, ok
}

// secret returns the secret at k (after ${VAR} expansion and file:
// indirection), or "" when absent or invalid.
func (o *obj) secret(k string) (Secret, *value) {
	o.note(k, func(key *Key) { key.Secret = true })
	s, v, ok := o.str(k)
	if !ok {
		return "", v
	}
	sec, ok := o.d.readSecret(o.keyPath(k), v.line, s)
	if !ok {
		o.bad[k] = true
	}
	return sec, v
}

// readSecret resolves a file: reference.
func (d *decoder) readSecret(path string, line int, s string) (Secret, bool) {
	name, ok := strings.CutPrefix(s, "file:")
	if !ok || d.literal {
		return Secret(s), true
	}
	if name == "" {
		d.errorf(path, line, `"file:" needs a path`)
		return "", false
	}
	data, err := os.ReadFile(d.resolvePath(name))
	if err != nil {
		d.errorf(path, line, "cannot read secret file: %v", err)
		return "", false
	}
	return Secret(strings.TrimRight(string(data), "\r\n")), true
}

// enum returns the string at k, which must be one of allowed; def when absent.
func (o *obj) enum(k, def string, allowed []string) string {
	s, v, ok := o.str(k)
	o.note(k, func(key *Key) {
		if def != "" {
			key.Default = tomlString(def)
		}
		key.Range = quoteList(allowed)
	})
	if v == nil || !ok {
		return def
	}
	if !o.d.checkEnum(o.keyPath(k), v.line, s, allowed) {
		o.bad[k] = true
		return def
	}
	return s
}

func (d *decoder) checkEnum(path string, line int, s string, allowed []string) bool {
	for _, a := range allowed {
		if s == a {
			return true
		}
	}
	d.errorf(path, line, "invalid value %q%s; allowed values: %s", s, didYouMean(s, allowed), quoteList(allowed))
	return false
}

// boolean returns the boolean at k, or def.
func (o *obj) boolean(k string, def bool) bool {
	v := o.lookup(k)
	o.note(k, func(key *Key) { key.Type, key.Default = "boolean", strconv.FormatBool(def) })
	if v == nil {
		return def
	}
	if v.kind != kindBool {
		o.typeError(k, v, "a boolean (true or false)")
		return def
	}
	return v.b
}

// integer returns the integer at k, which must be within [lo, hi]; def when
// absent or invalid.
func (o *obj) integer(k string, def, lo, hi int64) int64 {
	v := o.lookup(k)
	o.note(k, func(key *Key) {
		key.Type, key.Range = "integer", intRangeText(lo, hi)
		if def >= lo && def <= hi {
			key.Default = strconv.FormatInt(def, 10)
		}
	})
	if v == nil {
		return def
	}
	if v.kind != kindInteger {
		o.typeError(k, v, "an integer")
		return def
	}
	if v.i < lo || v.i > hi {
		o.bad[k] = true
		o.d.errorf(o.keyPath(k), v.line, "%s, got %d", rangeText(lo, hi), v.i)
		return def
	}
	return v.i
}

func rangeText(lo, hi int64) string {
	const maxInt = 1<<63 - 1
	switch {
	case hi == maxInt || hi == 1<<31-1:
		return fmt.Sprintf("must be at least %d", lo)
	default:
		return fmt.Sprintf("must be between %d and %d", lo, hi)
	}
}

// float returns the number at k (integer or float) within [lo, hi]; def when
// absent or invalid.
func (o *obj) float(k string, def, lo, hi float64) float64 {
	v := o.lookup(k)
	o.note(k, func(key *Key) { key.Type, key.Default, key.Range = "number", floatText(def), floatRangeText(lo, hi) })
	if v == nil {
		return def
	}
	var f float64
	switch v.kind {
	case kindFloat:
		f = v.f
	case kindInteger:
		f = float64(v.i)
	default:
		o.typeError(k, v, "a number")
		return def
	}
	if !(f >= lo && f <= hi) { // also rejects NaN
		o.bad[k] = true
		if hi > 1e300 {
			o.d.errorf(o.keyPath(k), v.line, "must be at least %s, got %s", fmtFloat(lo), fmtFloat(f))
		} else {
			o.d.errorf(o.keyPath(k), v.line, "must be between %s and %s, got %s", fmtFloat(lo), fmtFloat(hi), fmtFloat(f))
		}
		return def
	}
	return f
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// duration returns the duration string at k, which must be at least min;
// def when absent or invalid. present reports whether the key was set.
func (o *obj) duration(k string, def, min time.Duration) (d time.Duration, present bool) {
	v := o.lookup(k)
	o.note(k, func(key *Key) {
		key.Type, key.Default = "duration", durationText(def)
		if min > 0 {
			key.Range = "at least " + min.String()
		}
	})
	if v == nil {
		return def, false
	}
	if v.kind != kindString {
		o.typeError(k, v, `a duration string like "10s"`)
		return def, true
	}
	s, ok := o.d.expand(o.keyPath(k), v.line, v.str)
	if !ok {
		o.bad[k] = true
		return def, true
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		o.bad[k] = true
		o.d.errorf(o.keyPath(k), v.line, `invalid duration %q: use a number and a unit (ms, s, m, h), e.g. "10s"`, s)
		return def, true
	}
	if d < min {
		o.bad[k] = true
		if min == 0 {
			o.d.errorf(o.keyPath(k), v.line, "must not be negative, got %s", s)
		} else {
			o.d.errorf(o.keyPath(k), v.line, "must be at least %s, got %s", min, s)
		}
		return def, true
	}
	return d, true
}

// strings returns the array of strings at k (each expanded) with the value
// of each element for its line; nil when absent or invalid.
func (o *obj) strings(k string) ([]string, []*value, *value) {
	v := o.lookup(k)
	o.note(k, setType("array of strings"))
	if v == nil {
		return nil, nil, nil
	}
	if v.kind != kindArray {
		o.typeError(k, v, "an array of strings")
		return nil, nil, v
	}
	out := make([]string, 0, len(v.arr))
	elems := make([]*value, 0, len(v.arr))
	okAll := true
	for i, e := range v.arr {
		if e.kind != kindString {
			o.d.errorf(indexPath(o.keyPath(k), i), e.line, "expected a string, got %s", e.typeName())
			okAll = false
			continue
		}
		s, ok := o.d.expand(o.keyPath(k), e.line, e.str)
		if !ok {
			okAll = false
			continue
		}
		out = append(out, s)
		elems = append(elems, e)
	}
	if !okAll {
		o.bad[k] = true
		return nil, nil, v
	}
	return out, elems, v
}

// sub returns the table at k as an obj, or nil when absent or not a table.
func (o *obj) sub(k string) *obj {
	v := o.lookup(k)
	o.note(k, setType("table"))
	if v == nil {
		if o.d.rec != nil {
			return o.d.obj(o.keyPath(k), &value{kind: kindTable, tbl: newTable()})
		}
		return nil
	}
	if v.kind != kindTable {
		o.typeError(k, v, "a table")
		return nil
	}
	return o.d.obj(o.keyPath(k), v)
}

// tables returns the array of tables at k ([[k]] or k = [{...}]).
func (o *obj) tables(k string) []*obj {
	v := o.lookup(k)
	o.note(k, setType("array of tables"))
	if v == nil {
		if o.d.rec != nil {
			return []*obj{o.d.obj(indexPath(o.keyPath(k), 0), &value{kind: kindTable, tbl: newTable()})}
		}
		return nil
	}
	if v.kind != kindArray {
		o.typeError(k, v, fmt.Sprintf("an array of tables ([[%s]])", k))
		return nil
	}
	var out []*obj
	for i, e := range v.arr {
		if e.kind != kindTable {
			o.d.errorf(indexPath(o.keyPath(k), i), e.line, "expected a table, got %s", e.typeName())
			continue
		}
		out = append(out, o.d.obj(indexPath(o.keyPath(k), i), e))
	}
	return out
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// name returns the required name key of a source, sink or rule.
func (o *obj) name() (string, *value) {
	s, v, ok := o.str("name")
	if v == nil {
		o.missing("name")
		return "", nil
	}
	if !ok {
		return "", nil
	}
	if !nameRE.MatchString(s) {
		o.d.errorf(o.keyPath("name"), v.line, `invalid name %q: use only letters, digits, "_", "." and "-"`, s)
		return "", nil
	}
	return s, v
}

// expand replaces ${VAR} and ${VAR:-default} references in s; "$${" is a
// literal "${".
func (d *decoder) expand(path string, line int, s string) (string, bool) {
	if d.literal || !strings.Contains(s, "${") {
		return s, true
	}
	var b strings.Builder
	ok := true
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			break
		}
		if i > 0 && s[i-1] == '$' {
			b.WriteString(s[:i-1])
			b.WriteString("${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			d.errorf(path, line, `unterminated "${" (write "$${" for a literal "${")`)
			return "", false
		}
		ref := s[i+2 : i+end]
		s = s[i+end+1:]
		name, def, hasDef := strings.Cut(ref, ":-")
		if !envNameRE.MatchString(name) {
			d.errorf(path, line, "invalid environment variable reference %q", "${"+ref+"}")
			ok = false
			continue
		}
		val, set := d.lookupEnv(name)
		switch {
		case hasDef && (!set || val == ""):
			b.WriteString(def)
		case set:
			b.WriteString(val)
		default:
			d.errorf(path, line, "environment variable %s is not set", name)
			ok = false
		}
	}
	return b.String(), ok
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
