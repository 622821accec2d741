package router

import (
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestPushdownKeepsBacktrackingRegexInProcess: a filter whose pattern PCRE
// could backtrack on exponentially (^(a+)+$) is not pushed down to MongoDB;
// the rest of the rule (operations) still is, and the router still applies
// the filter.
func TestPushdownKeepsBacktrackingRegexInProcess(t *testing.T) {
	rules, err := CompileRules([]RuleSpec{
		{Name: "risky", Source: "s", Operations: []string{"insert"}, Sinks: []string{"a"},
			Filter: bson.D{{Key: "fullDocument.name", Value: bson.D{{Key: "$regex", Value: `^(a+)+$`}}}}},
		{Name: "safe", Source: "s", Sinks: []string{"a"},
			Filter: bson.D{{Key: "fullDocument.code", Value: bson.D{{Key: "$regex", Value: `^[A-Z]{3}$`}}}}},
	}, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	m, ok := rules.Pushdown("s")
	if !ok {
		t.Fatal("no pushdown")
	}
	text := fmt.Sprint(m)
	if strings.Contains(text, "(a+)+") || !strings.Contains(text, "insert") || !strings.Contains(text, "[A-Z]{3}") {
		t.Errorf("pushdown %s: want the operations and the safe pattern, not the risky one", text)
	}
	for name, want := range map[string]bool{"aaaa": true, "aab": false} {
		raw, _ := bson.Marshal(bson.D{{Key: "operationType", Value: "insert"}, {Key: "ns", Value: bson.D{{Key: "db", Value: "d"}, {Key: "coll", Value: "c"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}}, {Key: "fullDocument", Value: bson.D{{Key: "name", Value: name}}}})
		r := rules.bySource["s"][0]
		if got := r.filter.Match(raw); got != want {
			t.Errorf("in-process match of %q = %v, want %v", name, got, want)
		}
	}
}

// TestPushdownKeepsOptionalInRepetitionInProcess (issue 24): an optional
// element inside a repetition (^(aa?)+$, ^(a?){25}a{25}$, ^(a?a?)+$) is a
// backtracking risk too: such a filter stays out of the pushed-down $match.
func TestPushdownKeepsOptionalInRepetitionInProcess(t *testing.T) {
	for _, p := range []string{`^(aa?)+$`, `^(a?){25}a{25}$`, `^(a?a?)+$`, `^(\w|\d)+$`} {
		rules, err := CompileRules([]RuleSpec{
			{Name: "risky", Source: "s", Operations: []string{"update"}, Sinks: []string{"a"},
				Filter: bson.D{{Key: "fullDocument.name", Value: bson.D{{Key: "$regex", Value: p}}}}},
		}, []string{"a"})
		if err != nil {
			t.Fatal(err)
		}
		m, ok := rules.Pushdown("s")
		if !ok {
			t.Fatalf("%s: no pushdown", p)
		}
		if text := fmt.Sprint(m); strings.Contains(text, "$regex") || !strings.Contains(text, "update") {
			t.Errorf("%s: pushdown %s: want the operations only", p, text)
		}
	}
}
