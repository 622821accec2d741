package router

import (
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// TestExplainIsRoute: Explain gives Route's answer (rules, deduplicated
// sinks), plus each matching rule's own sinks in config order, filters
// included (one pushed down, one evaluated in changegate only); its
// slices are the caller's and do not alias the rules' shared ones.
func TestExplainIsRoute(t *testing.T) {
	filter := func(s string) bson.D {
		var d bson.D
		if err := bson.UnmarshalExtJSON([]byte(s), false, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	rules, err := CompileRules([]RuleSpec{
		{Name: "a", Source: "s", Sinks: []string{"z", "x", "z"}},
		{Name: "paid", Source: "s", Filter: filter(`{"fullDocument.status":"paid"}`), Sinks: []string{"y"}},
		{Name: "regex", Source: "s", Operations: []string{"insert"}, Filter: filter(`{"fullDocument.sku":{"$regex":"^(a+)+$"}}`), Sinks: []string{"x", "y"}},
	}, []string{"x", "y", "z"})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(op, status, sku string) *event.Event {
		raw, err := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: "82"}}}, {Key: "operationType", Value: op},
			{Key: "fullDocument", Value: bson.D{{Key: "status", Value: status}, {Key: "sku", Value: sku}}}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := event.FromChange("s", 1, raw)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for _, tc := range []struct {
		ev   *event.Event
		hits []RuleHit
	}{
		{ev("update", "open", "b"), []RuleHit{{"a", []int{2, 0}, false}}},
		{ev("update", "paid", "aaa"), []RuleHit{{"a", []int{2, 0}, false}, {"paid", []int{1}, false}}},
		{ev("insert", "paid", "aaa"), []RuleHit{{"a", []int{2, 0}, false}, {"paid", []int{1}, false}, {"regex", []int{0, 1}, true}}},
		{ev("insert", "open", "aab"), []RuleHit{{"a", []int{2, 0}, false}}},
	} {
		want := rules.Route(tc.ev)
		m, hits := rules.Explain(tc.ev)
		if !slices.Equal(m.Rules, want.Rules) || !slices.Equal(m.Sinks, want.Sinks) {
			t.Errorf("%s: Explain %v, Route %v", tc.ev.OperationType, m, want)
		}
		if !slices.EqualFunc(hits, tc.hits, func(a, b RuleHit) bool {
			return a.Rule == b.Rule && slices.Equal(a.Sinks, b.Sinks) && a.FilterLocal == b.FilterLocal
		}) {
			t.Errorf("%s: hits %v, want %v", tc.ev.OperationType, hits, tc.hits)
		}
		if len(m.Sinks) > 0 {
			m.Sinks[0], hits[0].Sinks[0] = 99, 99
		}
	}
	if m := rules.Route(ev("update", "open", "b")); !slices.Equal(m.Sinks, []int{0, 2}) {
		t.Errorf("the rules' shared slices were modified through Explain's: %v", m.Sinks)
	}
}
