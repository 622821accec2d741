package config

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// The configuration is first turned into a tree of values that remember the
// line they were written on and, for tables, the order of their keys. The
// schema is then decoded from that tree by hand, which lets every error name
// its key path and line.

type kind int

const (
	kindString kind = iota
	kindInteger
	kindFloat
	kindBool
	kindDateTime
	kindLocalDateTime
	kindLocalDate
	kindLocalTime
	kindArray
	kindTable
	// kindBSON is a value only a JSON document's filter has (Extended
	// JSON: an ObjectId, a date, a decimal, null, ...), held in raw.
	kindBSON
)

// value is one TOML value with its position.
type value struct {
	kind kind
	// line is where the value is best pointed at: the line of its key for
	// table entries, of its header for [tables] and [[array tables]], of the
	// element itself for array elements.
	line int
	// aot is set on the array created by [[array tables]].
	aot bool
	// dotted is set on a table created implicitly by a dotted key
	// (a.b = 1 creates table a).
	dotted bool

	str string // string; raw text for local date/time kinds
	i   int64
	f   float64
	b   bool
	t   time.Time // datetime; local kinds in UTC
	arr []*value
	tbl *table
	raw any // kindBSON
}

// table is a TOML table with keys in file order.
type table struct {
	keys []string
	m    map[string]*value
}

func newTable() *table { return &table{m: map[string]*value{}} }

func (t *table) get(k string) *value { return t.m[k] }

func (t *table) set(k string, v *value) {
	if _, ok := t.m[k]; !ok {
		t.keys = append(t.keys, k)
	}
	t.m[k] = v
}

// typeName names a value's TOML type in error messages.
func (v *value) typeName() string {
	switch v.kind {
	case kindString:
		return "string"
	case kindInteger:
		return "integer"
	case kindFloat:
		return "float"
	case kindBool:
		return "boolean"
	case kindDateTime:
		return "datetime"
	case kindLocalDateTime:
		return "local datetime"
	case kindLocalDate:
		return "local date"
	case kindLocalTime:
		return "local time"
	case kindArray:
		if v.aot {
			return "array of tables"
		}
		return "array"
	case kindTable:
		return "table"
	case kindBSON:
		return "BSON value"
	}
	return "unknown"
}

// lineIndex maps byte offsets to 1-based line numbers.
type lineIndex []int

func newLineIndex(data []byte) lineIndex {
	idx := lineIndex{0}
	for i, c := range data {
		if c == '\n' {
			idx = append(idx, i+1)
		}
	}
	return idx
}

func (l lineIndex) line(offset int) int {
	return sort.Search(len(l), func(i int) bool { return l[i] > offset })
}

// syntaxError is a TOML syntax or semantic error with its position.
type syntaxError struct {
	msg          string
	line, column int
}

// parseTree parses data into a tree. The document is first decoded by
// go-toml's strict decoder, which checks everything the TOML spec requires
// (duplicate keys, table redefinitions, value syntax) and reports positions;
// the unstable AST, which carries byte ranges, is then walked to build the
// positioned tree.
func parseTree(data []byte) (*table, *syntaxError) {
	var generic map[string]any
	if err := toml.Unmarshal(data, &generic); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, &syntaxError{msg: strings.TrimPrefix(de.Error(), "toml: "), line: row, column: col}
		}
		return nil, &syntaxError{msg: err.Error()}
	}

	b := &treeBuilder{lines: newLineIndex(data)}
	b.p.Reset(data)
	root := newTable()
	cur := root
	for b.p.NextExpression() {
		e := b.p.Expression()
		var err error
		switch e.Kind {
		case unstable.KeyValue:
			err = b.keyValue(cur, e)
		case unstable.Table:
			cur, err = b.header(root, e, false)
		case unstable.ArrayTable:
			cur, err = b.header(root, e, true)
		}
		if err != nil {
			// Not expected after a successful Unmarshal.
			return nil, &syntaxError{msg: err.Error(), line: b.line(e)}
		}
	}
	if err := b.p.Error(); err != nil {
		se := &syntaxError{msg: err.Error()}
		var pe *unstable.ParserError
		if errors.As(err, &pe) && len(pe.Highlight) > 0 {
			pos := b.p.Shape(b.p.Range(pe.Highlight)).Start
			se.line, se.column = pos.Line, pos.Column
		}
		return nil, se
	}
	return root, nil
}

type treeBuilder struct {
	p     unstable.Parser
	lines lineIndex
}

// line returns the line of a node that has a raw range, or 0.
func (b *treeBuilder) line(n *unstable.Node) int {
	if n.Kind == unstable.Array || (n.Raw.Offset == 0 && n.Raw.Length == 0) {
		return 0
	}
	return b.lines.line(int(n.Raw.Offset))
}

// keyParts returns the decoded parts of a dotted key and the line of each.
func (b *treeBuilder) keyParts(n *unstable.Node) ([]string, []int) {
	var parts []string
	var lines []int
	it := n.Key()
	for it.Next() {
		k := it.Node()
		parts = append(parts, string(k.Data))
		lines = append(lines, b.line(k))
	}
	return parts, lines
}

// descend returns the table at key k of t, creating it when absent; for an
// array of tables it returns the last element.
func descend(t *table, k string, line int, dotted bool) (*table, error) {
	v := t.get(k)
	if v == nil {
		v = &value{kind: kindTable, tbl: newTable(), line: line, dotted: dotted}
		t.set(k, v)
	}
	switch v.kind {
	case kindTable:
		return v.tbl, nil
	case kindArray:
		if len(v.arr) > 0 && v.arr[len(v.arr)-1].kind == kindTable {
			return v.arr[len(v.arr)-1].tbl, nil
		}
	}
	return nil, fmt.Errorf("key %s is not a table", k)
}

func (b *treeBuilder) header(root *table, n *unstable.Node, array bool) (*table, error) {
	parts, lines := b.keyParts(n)
	line := lines[0]
	t := root
	for _, k := range parts[:len(parts)-1] {
		var err error
		if t, err = descend(t, k, line, false); err != nil {
			return nil, err
		}
	}
	last := parts[len(parts)-1]
	if !array {
		v := t.get(last)
		if v != nil && v.kind == kindTable {
			v.line = line // implicitly created earlier, now defined
		}
		if v != nil {
			v.dotted = false
		}
		return descend(t, last, line, false)
	}
	v := t.get(last)
	if v == nil {
		v = &value{kind: kindArray, aot: true, line: line}
		t.set(last, v)
	}
	if v.kind != kindArray {
		return nil, fmt.Errorf("key %s is not an array of tables", last)
	}
	elem := &value{kind: kindTable, tbl: newTable(), line: line}
	v.arr = append(v.arr, elem)
	return elem.tbl, nil
}

func (b *treeBuilder) keyValue(t *table, n *unstable.Node) error {
	parts, lines := b.keyParts(n)
	for i, k := range parts[:len(parts)-1] {
		var err error
		if t, err = descend(t, k, lines[i], true); err != nil {
			return err
		}
	}
	line := lines[len(lines)-1]
	v, err := b.value(n.Value(), line)
	if err != nil {
		return err
	}
	v.line = line
	t.set(parts[len(parts)-1], v)
	return nil
}

// value converts an AST value; fallback is the line used when the node has
// no position of its own.
func (b *treeBuilder) value(n *unstable.Node, fallback int) (*value, error) {
	line := b.line(n)
	if line == 0 {
		line = fallback
	}
	v := &value{line: line}
	data := string(n.Data)
	var err error
	switch n.Kind {
	case unstable.String:
		v.kind, v.str = kindString, data
	case unstable.Bool:
		v.kind, v.b = kindBool, data == "true"
	case unstable.Integer:
		v.kind = kindInteger
		v.i, err = strconv.ParseInt(strings.ReplaceAll(data, "_", ""), 0, 64)
	case unstable.Float:
		v.kind = kindFloat
		v.f, err = parseFloat(data)
	case unstable.DateTime:
		v.kind = kindDateTime
		v.t, err = parseDateTime(data)
	case unstable.LocalDateTime:
		v.kind, v.str = kindLocalDateTime, data
		var ldt toml.LocalDateTime
		if err = ldt.UnmarshalText(n.Data); err == nil {
			v.t = ldt.AsTime(time.UTC)
		}
	case unstable.LocalDate:
		v.kind, v.str = kindLocalDate, data
		var ld toml.LocalDate
		if err = ld.UnmarshalText(n.Data); err == nil {
			v.t = ld.AsTime(time.UTC)
		}
	case unstable.LocalTime:
		v.kind, v.str = kindLocalTime, data
	case unstable.Array:
		v.kind = kindArray
		it := n.Children()
		for it.Next() {
			c := it.Node()
			if c.Kind == unstable.Comment {
				continue
			}
			e, err := b.value(c, line)
			if err != nil {
				return nil, err
			}
			v.arr = append(v.arr, e)
			line = e.line // elements without a position follow the previous one
		}
	case unstable.InlineTable:
		v.kind, v.tbl = kindTable, newTable()
		it := n.Children()
		for it.Next() {
			c := it.Node()
			if c.Kind != unstable.KeyValue {
				continue
			}
			if err := b.keyValue(v.tbl, c); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("unexpected TOML node %s", n.Kind)
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

func parseFloat(s string) (float64, error) {
	s = strings.ReplaceAll(s, "_", "")
	switch strings.TrimLeft(s, "+-") {
	case "nan":
		return math.NaN(), nil
	case "inf":
		if strings.HasPrefix(s, "-") {
			return math.Inf(-1), nil
		}
		return math.Inf(1), nil
	}
	return strconv.ParseFloat(s, 64)
}

// parseDateTime parses a TOML offset date-time.
func parseDateTime(s string) (time.Time, error) {
	s = strings.ToUpper(s)
	if len(s) > 10 && s[10] == ' ' {
		s = s[:10] + "T" + s[11:]
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		// TOML 1.1 allows omitting the seconds.
		if t2, err2 := time.Parse("2006-01-02T15:04Z07:00", s); err2 == nil {
			return t2, nil
		}
	}
	return t, err
}
