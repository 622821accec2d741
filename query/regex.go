package query

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// regexPred matches strings and symbols against a compiled pattern; a
// candidate that is itself a regex matches when pattern and options are
// identical (MongoDB's behaviour for a regex equality operand).
type regexPred struct {
	re      *regexp.Regexp
	pattern string
	options string
}

// compileRegex translates a MongoDB (PCRE) pattern with options into a Go
// regexp. Options i, m, s and x are supported; u is accepted and ignored
// (Go regexps are always UTF-8).
func compileRegex(pattern, options string) (*regexPred, error) {
	var flags strings.Builder
	extended := false
	for _, o := range options {
		switch o {
		case 'i', 'm', 's':
			if !strings.ContainsRune(flags.String(), o) {
				flags.WriteRune(o)
			}
		case 'x':
			extended = true
		case 'u':
		default:
			return nil, fmt.Errorf("$regex: invalid flag in regex options: %c", o)
		}
	}
	p := pattern
	if extended {
		p = stripExtended(p)
	}
	if flags.Len() > 0 {
		p = "(?" + flags.String() + ")" + p
	}
	re, err := regexp.Compile(p)
	if err != nil {
		return nil, fmt.Errorf("$regex: invalid pattern %q: %s", pattern, strings.TrimPrefix(err.Error(), "error parsing regexp: "))
	}
	return &regexPred{re: re, pattern: pattern, options: options}, nil
}

// stripExtended implements PCRE's x flag: unescaped whitespace outside
// character classes is ignored and # starts a comment to the end of line.
func stripExtended(p string) string {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			b.WriteByte(c)
			b.WriteByte(p[i+1])
			i++
			continue
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[':
			inClass = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			continue
		case c == '#':
			for i < len(p) && p[i] != '\n' {
				i++
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func (r *regexPred) value(t bson.Type, v []byte) bool {
	switch t {
	case bson.TypeString, bson.TypeSymbol:
		return r.re.Match(bsonraw.Str(v))
	case bson.TypeRegex:
		p, o := bsonraw.RegexParts(v)
		return string(p) == r.pattern && string(o) == r.options
	}
	return false
}

func (r *regexPred) missing() bool { return false }
func (r *regexPred) expand() bool  { return true }
