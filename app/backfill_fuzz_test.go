package app

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
// ($where, $expr, $function, $accumulator) at any depth.
func FuzzBackfillFilter(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `{"status": "paid"}`, `{"total": {"$gte": 100}}`, `{"$or": [{"a": 1}, {"b": {"$in": [1, 2]}}]}`,
		`{"$where": "sleep(1000)"}`, `{"$expr": {"$gt": ["$a", 1]}}`, `{"a": {"$function": {}}}`,
		`{"a": {"$elemMatch": {"$where": "1"}}}`, `[1]`, `"x"`, `{"a": `, `{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}}`,
		`{"a": {"$regex": "(a+)+$"}}`, strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := ParseBackfillFilter(s)
		if err != nil || raw == nil {
			return
		}
		if err := raw.Validate(); err != nil {
			t.Fatalf("invalid BSON accepted from %q: %v", s, err)
		}
		if _, err := query.Compile(raw); err != nil {
			t.Fatalf("filter that does not compile accepted from %q: %v", s, err)
		}
		for _, op := range []string{"$where", "$expr", "$function", "$accumulator"} {
			if strings.Contains(bsonraw.DollarPath(raw), op) || strings.Contains(raw.String(), `"`+op+`"`) {
				t.Fatalf("%s accepted from %q", op, s)
			}
		}
	})
}
