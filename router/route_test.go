package router

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
)

func TestRouteSharedMatches(t *testing.T) {
	rules, err := CompileRules([]RuleSpec{
		{Name: "a", Source: "s", Sinks: []string{"z", "x", "z"}},
		{Name: "b", Source: "s", Operations: []string{"insert"}, Sinks: []string{"y"}},
		{Name: "c", Source: "s", Operations: []string{"insert", "delete"}, Sinks: []string{"x"}},
		{Name: "none", Source: "s", Operations: []string{"drop"}},
	}, []string{"x", "y", "z"})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(op string) *event.Event { return &event.Event{Source: "s", OperationType: op} }
	for _, tc := range []struct {
		op    string
		rules []string
		sinks []int
	}{
		{"update", []string{"a"}, []int{0, 2}},
		{"insert", []string{"a", "b", "c"}, []int{0, 1, 2}},
		{"delete", []string{"a", "c"}, []int{0, 2}},
		{"drop", []string{"a", "none"}, []int{0, 2}},
		{"update", []string{"a"}, []int{0, 2}}, // the shared slices are intact
	} {
		m := rules.Route(ev(tc.op))
		if !slices.Equal(m.Rules, tc.rules) || !slices.Equal(m.Sinks, tc.sinks) {
			t.Errorf("%s: got %v %v, want %v %v", tc.op, m.Rules, m.Sinks, tc.rules, tc.sinks)
		}
	}
	if m := rules.Route(&event.Event{Source: "other"}); m.Rules != nil || m.Sinks != nil {
		t.Errorf("other source: %+v", m)
	}
}

// The engine's cached counters count what WithLabelValues per event counted,
// also across a reload that renames and reorders the rules.
func TestEngineMatchMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	spec := []RuleSpec{
		{Name: "inserts", Source: "orders", Operations: []string{"insert"}, Sinks: []string{"hook"}},
		{Name: "updates", Source: "orders", Operations: []string{"update"}, Sinks: []string{"hook"}},
	}
	rules, err := CompileRules(spec, []string{"hook"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := NewEngine(rules, []SinkSpec{{Sink: nopSink{"hook", 1}}}, nil, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(source, op string) *event.Event {
		raw, _ := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: "x"}}}, {Key: "operationType", Value: op}})
		e, err := event.FromChange(source, 0, raw)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	acks := 0
	ack := func() { acks++ }
	// Not started: queued events are not delivered, which does not matter here.
	for range 3 {
		eng.Dispatch(mk("orders", "update"), ack)
	}
	eng.Dispatch(mk("orders", "delete"), ack)
	eng.Dispatch(mk("inventory", "insert"), ack)
	eng.Dispatch(mk("inventory", "insert"), ack)
	rules2, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: []string{"hook"}}, spec[1]}, []string{"hook"})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Reload(rules2, []LaneUpdate{{Name: "hook", Keep: true}}); err != nil {
		t.Fatal(err)
	}
	eng.Dispatch(mk("orders", "update"), ack)
	eng.Dispatch(mk("orders", "insert"), ack)
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"orders", "updates"}, 4}, {[]string{"orders", "all"}, 2}, {[]string{"orders", "inserts"}, 0},
	} {
		if got := counterValue(t, m.EventsMatched.WithLabelValues(c.labels...)); got != c.want {
			t.Errorf("matched%v = %v, want %v", c.labels, got, c.want)
		}
	}
	for src, want := range map[string]float64{"orders": 1, "inventory": 2} {
		if got := counterValue(t, m.EventsUnmatched.WithLabelValues(src)); got != want {
			t.Errorf("unmatched[%s] = %v, want %v", src, got, want)
		}
	}
	if acks != 3 {
		t.Errorf("%d immediate acks, want 3 (the unmatched events)", acks)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
