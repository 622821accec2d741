package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Error is one problem found in a configuration file. Parse and Load join
// every Error they find with errors.Join; use errors.As or the Unwrap()
// []error method of the joined error to inspect them.
type Error struct {
	// Key is the key path, e.g. "rules[2].sinks", with 0-based array
	// indexes; empty for TOML syntax errors.
	Key string
	// Msg describes the problem.
	Msg string
	// File is the file name as given to Load or Parse.
	File string
	// Line is the 1-based line of the key (or of the offending array
	// element); 0 when the problem has no line, such as a missing table.
	Line int
	// Column is the 1-based column, set only for TOML syntax errors.
	Column int
}

// Error formats the problem as "<key>: <msg> at <file>:<line>", e.g.
// `rules[2].sinks: unknown sink "audit-q" (did you mean "audit"?) at config.toml:41`.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	b.WriteString(" at ")
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":")
		b.WriteString(strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteString(":")
			b.WriteString(strconv.Itoa(e.Column))
		}
	}
	return b.String()
}

// joinPath appends a key to a key path, quoting it when it is not a bare
// TOML key.
func joinPath(path, key string) string {
	k := key
	if !isBareKey(key) {
		k = strconv.Quote(key)
	}
	if path == "" {
		return k
	}
	return path + "." + k
}

func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// suggest returns the candidate closest to s when it is close enough to be a
// plausible typo, or "".
func suggest(s string, candidates []string) string {
	best, bestDist := "", -1
	ls := strings.ToLower(s)
	for _, c := range candidates {
		if c == s {
			continue
		}
		d := levenshtein(ls, strings.ToLower(c))
		limit := max(len(c), len(s)) / 3
		if limit < 1 {
			limit = 1
		}
		if limit > 3 {
			limit = 3
		}
		if d > limit {
			continue
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// didYouMean returns ` (did you mean "x"?)` or "".
func didYouMean(s string, candidates []string) string {
	if c := suggest(s, candidates); c != "" {
		return fmt.Sprintf(" (did you mean %q?)", c)
	}
	return ""
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// quoteList formats values as `"a", "b", "c"`.
func quoteList(values []string) string {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}
