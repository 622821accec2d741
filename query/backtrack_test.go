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
