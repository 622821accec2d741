package query

import (
	"fmt"
	"regexp/syntax"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// BacktrackRisk returns why filter should not run inside MongoDB, or "" when
// it can. Compile validates patterns with Go's regexp engine, which runs in
// linear time; MongoDB runs them with PCRE, which backtracks: a pattern with
// a quantifier over a group that itself repeats or alternates, such as
// ^(a+)+$ or (a|aa)*b, takes exponential time on some inputs, per change
// and inside the database. Such a filter is evaluated in changegate only
// (the router leaves it out of the pushed-down $match). Backreferences,
// which PCRE also backtracks on, are refused by Compile already (Go's
// engine has none).
func BacktrackRisk(filter bson.Raw) string {
	return riskIn(filter, "")
}

func riskIn(doc bson.Raw, path string) string {
	elems, err := doc.Elements()
	if err != nil {
		return ""
	}
	for _, el := range elems {
		k, v := el.Key(), el.Value()
		p := k
		if path != "" {
			p = path + "." + k
		}
		switch {
		case v.Type == bson.TypeRegex:
			pat, opts := bsonraw.RegexParts(v.Value)
			if r := patternRisk(string(pat), string(opts)); r != "" {
				return fmt.Sprintf("pattern %q at %s: %s", pat, path, r)
			}
		case k == "$regex" && v.Type == bson.TypeString:
			opts, _ := doc.Lookup("$options").StringValueOK()
			if r := patternRisk(v.StringValue(), opts); r != "" {
				return fmt.Sprintf("pattern %q at %s: %s", v.StringValue(), path, r)
			}
		case v.Type == bson.TypeEmbeddedDocument:
			if r := riskIn(v.Document(), p); r != "" {
				return r
			}
		case v.Type == bson.TypeArray:
			if r := riskIn(bson.Raw(v.Array()), path); r != "" {
				return r
			}
		}
	}
	return ""
}

// patternRisk returns why PCRE could backtrack catastrophically on pattern:
// a repetition whose operand contains another repetition or an alternation.
func patternRisk(pattern, options string) string {
	if strings.ContainsRune(options, 'x') {
		pattern = stripExtended(pattern)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "" // Compile reports it
	}
	if nestedRepeat(re, false) {
		return "a repeated group that itself repeats or alternates (like (a+)+ or (a|b)*) can make MongoDB's backtracking regex engine take exponential time"
	}
	return ""
}

// nestedRepeat reports whether re has a repetition inside a repetition
// (inside reports that re is the operand of one); an alternation inside a
// repetition counts too.
func nestedRepeat(re *syntax.Regexp, inside bool) bool {
	switch re.Op {
	case syntax.OpStar, syntax.OpPlus:
		if inside {
			return true
		}
		return nestedRepeat(re.Sub[0], true)
	case syntax.OpRepeat:
		if re.Max == 1 {
			return nestedRepeat(re.Sub[0], inside)
		}
		if inside {
			return true
		}
		return nestedRepeat(re.Sub[0], true)
	case syntax.OpAlternate:
		if inside {
			return true
		}
	}
	for _, s := range re.Sub {
		if nestedRepeat(s, inside) {
			return true
		}
	}
	return false
}
