package query

import (
	"fmt"
	"regexp/syntax"
	"strconv"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// BacktrackRisk returns why filter should not run inside MongoDB, or "" when
// it can. Compile validates patterns with Go's regexp engine, which runs in
// linear time; MongoDB runs them with PCRE, which backtracks: a pattern with
// a quantifier over a group that itself repeats, alternates or has an
// optional part (?, {0,n}, *, an empty alternative), such as ^(a+)+$,
// (a|aa)*b, ^(aa?)+$ or ^(a?){25}a{25}$, takes exponential time on some
// inputs, per change and inside the database. Such a filter is evaluated in changegate only
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

// riskyRepeat is why a pattern is flagged.
const riskyRepeat = "a repeated group that itself repeats, alternates or has an optional part (like (a+)+, (a|b)* or (aa?)+) can make MongoDB's backtracking regex engine take exponential time"

// patternRisk returns why PCRE could backtrack catastrophically on pattern:
// a repetition whose operand contains another repetition, an alternation or
// an optional element (one that can match in more than one way).
func patternRisk(pattern, options string) string {
	if strings.ContainsRune(options, 'x') {
		pattern = stripExtended(pattern)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "" // Compile reports it
	}
	// Go's parser merges alternatives into character classes ((\w|\d)
	// becomes [0-9A-Z_a-z]) where PCRE keeps both branches and tries each:
	// alternations are therefore looked for in the pattern's text.
	if nestedRepeat(re, false) || repeatedAlternation(pattern) {
		return riskyRepeat
	}
	return ""
}

// nestedRepeat reports whether re has a repetition inside a repetition
// (inside reports that re is the operand of one); an alternation, an
// optional element (x?, x{0,n}) or an empty match inside a repetition
// counts too: each lets one iteration's text be split among iterations in
// many ways, which PCRE tries one by one when the match fails.
func nestedRepeat(re *syntax.Regexp, inside bool) bool {
	switch re.Op {
	case syntax.OpStar, syntax.OpPlus:
		if inside {
			return true
		}
		return nestedRepeat(re.Sub[0], true)
	case syntax.OpQuest:
		if inside {
			return true
		}
	case syntax.OpRepeat:
		if inside && (re.Min == 0 || re.Max != 1) {
			return true
		}
		if re.Max == 1 {
			return nestedRepeat(re.Sub[0], inside)
		}
		return nestedRepeat(re.Sub[0], true)
	case syntax.OpAlternate, syntax.OpEmptyMatch:
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

// repeatedAlternation reports whether pattern (PCRE syntax) has an
// alternation inside a group that a quantifier allowing more than one
// iteration applies to, directly or through enclosing groups.
func repeatedAlternation(p string) bool {
	type group struct{ alt bool }
	var stack []group
	top := group{} // the pattern outside every group
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '\\':
			if i+1 < len(p) && p[i+1] == 'Q' {
				end := strings.Index(p[i+2:], `\E`)
				if end < 0 {
					return false
				}
				i += 2 + end + 1
				continue
			}
			i++
		case '[':
			i = classEnd(p, i)
		case '(':
			stack = append(stack, top)
			top = group{}
		case '|':
			top.alt = true
		case ')':
			if len(stack) == 0 {
				return false // Compile reports it
			}
			inner := top
			top = stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if inner.alt && repeats(p[i+1:]) {
				return true
			}
			top.alt = top.alt || inner.alt
		}
	}
	return false
}

// classEnd returns the index of the ] closing the character class opened
// at p[i] (or len(p)).
func classEnd(p string, i int) int {
	j := i + 1
	if j < len(p) && p[j] == '^' {
		j++
	}
	if j < len(p) && p[j] == ']' {
		j++
	}
	for ; j < len(p); j++ {
		switch p[j] {
		case '\\':
			j++
		case '[':
			if j+1 < len(p) && p[j+1] == ':' {
				if end := strings.Index(p[j+2:], ":]"); end >= 0 {
					j += 2 + end + 1
				}
			}
		case ']':
			return j
		}
	}
	return len(p)
}

// repeats reports whether rest starts with a quantifier allowing more than
// one iteration: *, +, {n,}, {n,m} with m > 1, {n} with n > 1.
func repeats(rest string) bool {
	if rest == "" {
		return false
	}
	switch rest[0] {
	case '*', '+':
		return true
	case '{':
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return false
		}
		lo, hi, comma := strings.Cut(rest[1:end], ",")
		n, err := strconv.Atoi(lo)
		if err != nil {
			return false // a literal {
		}
		if !comma {
			return n > 1
		}
		if hi == "" {
			return true
		}
		m, err := strconv.Atoi(hi)
		return err == nil && m > 1
	}
	return false
}
