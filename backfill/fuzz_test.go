package backfill

import (
	"strings"
	"testing"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/query"
)

// FuzzBackfillFilter feeds arbitrary text to the backfill filter parser
// (POST /api/v1/backfills, changegate backfill -filter). It must never
// panic, and whatever it accepts is a valid BSON document that compiles as
// a query and holds none of the operators a query filter may not carry
// ($where, $expr, $function, $accumulator) at any depth, nor a pattern
// MongoDB's regex engine could backtrack on catastrophically.
func FuzzBackfillFilter(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `{"status": "paid"}`, `{"total": {"$gte": 100}}`, `{"$or": [{"a": 1}, {"b": {"$in": [1, 2]}}]}`,
		`{"$where": "sleep(1000)"}`, `{"$expr": {"$gt": ["$a", 1]}}`, `{"a": {"$function": {}}}`,
		`{"a": {"$elemMatch": {"$where": "1"}}}`, `[1]`, `"x"`, `{"a": `, `{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}}`,
		`{"a": {"$regex": "(a+)+$"}}`, `{"name": {"$regex": "^(a+)+$"}}`, `{"name": {"$in": ["x", {"$regex": "^(aa?)+$"}]}}`,
		`{"name": {"$not": {"$regex": "^(a?){25}a{25}$"}}}`, `{"name": {"$regex": {"$regularExpression": {"pattern": "^(a?a?)+$", "options": ""}}}}`,
		`{"name": {"$regularExpression": {"pattern": "(\w|\d)+$", "options": "i"}}}`, `{"$or": [{"a": 1}, {"b": {"$regex": "^(a|)+$", "$options": "x"}}]}`,
		strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := ParseFilter(s)
		if err != nil || raw == nil {
			return
		}
		if err := raw.Validate(); err != nil {
			t.Fatalf("invalid BSON accepted from %q: %v", s, err)
		}
		if _, err := query.Compile(raw); err != nil {
			t.Fatalf("filter that does not compile accepted from %q: %v", s, err)
		}
		if why := query.BacktrackRisk(raw); why != "" {
			t.Fatalf("backtracking pattern accepted from %q: %s", s, why)
		}
		for _, op := range []string{"$where", "$expr", "$function", "$accumulator"} {
			if strings.Contains(bsonraw.DollarPath(raw), op) || strings.Contains(raw.String(), `"`+op+`"`) {
				t.Fatalf("%s accepted from %q", op, s)
			}
		}
	})
}

// TestParseFilterRefusesBacktracking: a backfill filter runs inside
// MongoDB, so a pattern its backtracking engine could take exponential
// time on is refused wherever it sits ($regex, a regex value, $in, $not,
// $or), with an error naming the pattern; plain patterns pass.
func TestParseFilterRefusesBacktracking(t *testing.T) {
	for _, s := range []string{
		`{"name": {"$regex": "^(a+)+$"}}`,
		`{"name": {"$regex": "^(aa?)+$", "$options": "i"}}`,
		`{"name": {"$in": ["x", {"$regularExpression": {"pattern": "^(a+)+$", "options": ""}}]}}`,
		`{"name": {"$not": {"$regularExpression": {"pattern": "^(a?){25}a{25}$", "options": ""}}}}`,
		`{"name": {"$regularExpression": {"pattern": "^(a?a?)+$", "options": ""}}}`,
		`{"$or": [{"a": 1}, {"name": {"$regex": "(x+x+)+y"}}]}`,
		`{"tags": {"$elemMatch": {"$regex": "^(\\w|\\d)+$"}}}`,
	} {
		_, err := ParseFilter(s)
		if err == nil || !strings.Contains(err.Error(), "filter refused: pattern") || !strings.Contains(err.Error(), "exponential time") {
			t.Errorf("ParseFilter(%s) = %v, want a refusal naming the pattern", s, err)
		}
	}
	for _, s := range []string{
		`{"name": {"$regex": "^[a-z]+@example\\.com$"}}`,
		`{"name": {"$in": [{"$regularExpression": {"pattern": "^ab(c|d)$", "options": "i"}}]}}`,
		`{"name": {"$not": {"$regularExpression": {"pattern": "colou?r", "options": ""}}}}`,
	} {
		if _, err := ParseFilter(s); err != nil {
			t.Errorf("ParseFilter(%s) = %v, want accepted", s, err)
		}
	}
}
