package eventbridge

import (
	"fmt"
	"strings"

	"github.com/changegate/changegate/event"
)

// Template is a string with placeholders for event fields, compiled once:
// {db}, {coll}, {operationType} and {source}. "{{" and "}}" are literal
// braces. It is immutable and safe for concurrent use.
type Template struct {
	parts []tplPart
	fixed int // bytes of literal text
}

type tplPart struct {
	lit   string
	field tplField
}

type tplField uint8

const (
	fieldNone tplField = iota
	fieldDB
	fieldColl
	fieldOp
	fieldSource
)

var tplFields = map[string]tplField{
	"db": fieldDB, "coll": fieldColl, "operationType": fieldOp, "source": fieldSource,
}

// TemplateFields are the placeholders a Template accepts, for messages.
const TemplateFields = "{db}, {coll}, {operationType}, {source}"

// CompileTemplate parses s. It fails on an unknown placeholder or an
// unbalanced brace.
func CompileTemplate(s string) (*Template, error) {
	t := &Template{}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, tplPart{lit: lit.String()})
			t.fixed += lit.Len()
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{', c == '}' && i+1 < len(s) && s[i+1] == '}':
			lit.WriteByte(c)
			i++
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf(`unterminated "{" (write "{{" for a literal brace)`)
			}
			name := s[i+1 : i+end]
			f, ok := tplFields[name]
			if !ok {
				return nil, fmt.Errorf("unknown placeholder {%s}; allowed: %s", name, TemplateFields)
			}
			flush()
			t.parts = append(t.parts, tplPart{field: f})
			i += end
		case c == '}':
			return nil, fmt.Errorf(`unbalanced "}" (write "}}" for a literal brace)`)
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return t, nil
}

// MustCompileTemplate is CompileTemplate for constant templates; it panics
// on error.
func MustCompileTemplate(s string) *Template {
	t, err := CompileTemplate(s)
	if err != nil {
		panic(err)
	}
	return t
}

func (t *Template) value(f tplField, e *event.Event) string {
	switch f {
	case fieldDB:
		return e.DB
	case fieldColl:
		return e.Coll
	case fieldOp:
		return e.OperationType
	case fieldSource:
		return e.Source
	}
	return ""
}

// Execute returns the template expanded for e. A template without
// placeholders returns its text without allocating.
func (t *Template) Execute(e *event.Event) string {
	switch len(t.parts) {
	case 0:
		return ""
	case 1:
		if t.parts[0].field == fieldNone {
			return t.parts[0].lit
		}
		return t.value(t.parts[0].field, e)
	}
	n := t.fixed
	for _, p := range t.parts {
		if p.field != fieldNone {
			n += len(t.value(p.field, e))
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range t.parts {
		if p.field == fieldNone {
			b.WriteString(p.lit)
		} else {
			b.WriteString(t.value(p.field, e))
		}
	}
	return b.String()
}
