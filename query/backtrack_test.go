package query

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestBacktrackRisk: patterns with nested quantifiers (or alternation
// under a quantifier), which PCRE runs in exponential time on some inputs,
// are flagged wherever they sit in a filter; plain patterns are not.
func TestBacktrackRisk(t *testing.T) {
	regex := func(p, o string) bson.D {
		return bson.D{{Key: "f", Value: bson.Regex{Pattern: p, Options: o}}}
	}
	op := func(p string) bson.D {
		return bson.D{{Key: "f", Value: bson.D{{Key: "$regex", Value: p}}}}
	}
	tests := []struct {
		name   string
		filter bson.D
		risky  bool
	}{
		{"nested plus", op(`^(a+)+$`), true},
		{"nested star regex value", regex(`(x*)*y`, ""), true},
		{"alternation repeated", op(`(a|aa)*b`), true},
		{"counted repeat of a star", op(`(a*){2,}`), true},
		{"extended mode", regex(`^( a + ) + $`, "x"), true},
		{"inside $in", bson.D{{Key: "f", Value: bson.D{{Key: "$in", Value: bson.A{"x", bson.Regex{Pattern: `(.+)+z`}}}}}}, true},
		{"inside $or", bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "g", Value: 1}}, op(`([a-z]+)*$`)}}}, true},
		{"inside $not", bson.D{{Key: "f", Value: bson.D{{Key: "$not", Value: bson.Regex{Pattern: `(a+)+`}}}}}, true},
		{"simple", op(`^[a-z]+@example\.com$`), false},
		{"counted group", op(`^(ab){2,3}$`), false},
		{"optional group", op(`^(a+)?b$`), false},
		{"character class alternatives", op(`^(a|b)c+$`), false},
		{"no regex", bson.D{{Key: "total", Value: bson.D{{Key: "$gte", Value: 100}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := bson.Marshal(tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Compile(raw); err != nil {
				t.Fatalf("Compile: %v", err)
			}
			if got := BacktrackRisk(raw); (got != "") != tt.risky {
				t.Errorf("BacktrackRisk = %q, want risky %v", got, tt.risky)
			}
		})
	}
	// Backreferences never compile (Go's engine has none).
	raw, _ := bson.Marshal(op(`^(a)\1$`))
	if _, err := Compile(raw); err == nil {
		t.Error("a backreference compiled")
	}
}

// TestBacktrackRiskPatterns: a table of patterns known to take exponential
// time in a backtracking engine (PCRE, MongoDB's) must all be flagged, and
// a table of everyday patterns that run in linear time there must not be
// (they are pushed down and accepted in backfill filters).
func TestBacktrackRiskPatterns(t *testing.T) {
	catastrophic := []struct{ pattern, options string }{
		{`^(a+)+$`, ""},
		{`(x+x+)+y`, ""},
		{`(a|aa)+`, ""},
		{`(a|a?)+`, ""},
		{`(.*a){12}`, ""},
		{`^(\w+\s?)*$`, ""},
		{`^(a*)*$`, ""},
		// An optional element inside a repetition (issue 24).
		{`^(aa?)+$`, ""},
		{`^(a?){25}a{25}$`, ""},
		{`^(a?a?)+$`, ""},
		{`^(a{0,1})+$`, ""},
		{`^(ab{0,3}b?)+$`, ""},
		{`^(?:a?b?)*c$`, ""},
		{`^(a|)+$`, ""},
		{`^(|a)+$`, ""},
		{`^(a(?:))+$`, ""},
		{`^( a a ? ) + $`, "x"},
		{`^(a # one
		  a?)+$`, "x"},
		// Alternatives Go's parser merges into one class; PCRE tries each.
		{`^(\w|\d)+$`, ""},
		{`^(\d|[0-9])*x$`, ""},
		{`^(?:[a-c]|b)+$`, ""},
		{`^((a|b)c?)+$`, ""},
		{`^(?:(?:a|b)x)+$`, ""},
		{`^((a|b)){2,}$`, ""},
		// OWASP's ReDoS examples.
		{`^(([a-z])+.)+[A-Z]([a-z])+$`, ""},
		{`^[a-zA-Z]+(([\'\,\.\- ][a-zA-Z ])?[a-zA-Z]*)*$`, ""},
		{`^([a-zA-Z0-9])(([\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}(([a-z]{2,3})|([a-z]{2,3}[.]{1}[a-z]{2,3}))$`, ""},
	}
	safe := []struct{ pattern, options string }{
		{`^[a-z]+@example\.com$`, ""},
		{`^(ab){2,3}$`, ""},
		{`^(a+)?b$`, ""},
		{`^(a|b)c+$`, ""},
		{`^\d{3}-\d{4}$`, ""},
		{`^https?://`, ""},
		{`colou?r`, "i"},
		{`^(?:\+?1)?\d{10}$`, ""},
		{`^[^@\s]+@[^@\s]+\.[a-z]{2,}$`, ""},
		{`^abc$|^def$`, ""},
		{`^(?:cat|dog)s?$`, ""},
		{`^(cat|dog)?$`, ""},
		{`^\(a|b\)+$`, ""},
		{`^[(|)]+$`, ""},
		{`^[]|]+$`, ""},
		{`^[[:alpha:]|]+$`, ""},
		{`^\Q(a|b)\E+$`, ""},
		{`^(a|b){1}$`, ""},
		{`^(a|b){0,1}c$`, ""},
		{`^a{2,}b?$`, ""},
		{`^(ab)+$`, ""},
		{`^( a b ) + $`, "x"},
	}
	check := func(pattern, options string, want bool) {
		t.Helper()
		raw, err := bson.Marshal(bson.D{{Key: "f", Value: bson.D{{Key: "$regex", Value: pattern}, {Key: "$options", Value: options}}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Compile(raw); err != nil {
			t.Fatalf("%q: Compile: %v", pattern, err)
		}
		if got := BacktrackRisk(raw); (got != "") != want {
			t.Errorf("%q (options %q): BacktrackRisk = %q, want risky %v", pattern, options, got, want)
		}
	}
	for _, c := range catastrophic {
		check(c.pattern, c.options, true)
	}
	for _, c := range safe {
		check(c.pattern, c.options, false)
	}
}
