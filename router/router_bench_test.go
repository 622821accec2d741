package router

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// benchRules is a routing table of a few typical rules for source "orders".
func benchRules(b *testing.B) *Rules {
	b.Helper()
	rules, err := CompileRules([]RuleSpec{
		{Name: "paid-orders", Source: "orders", Operations: []string{"insert", "update", "replace"},
			Filter: bson.D{{Key: "fullDocument.status", Value: "paid"}, {Key: "fullDocument.total", Value: bson.D{{Key: "$gte", Value: 100}}}},
			Sinks:  []string{"billing", "bus"}},
		{Name: "big-orders", Source: "orders", Filter: bson.D{{Key: "fullDocument.total", Value: bson.D{{Key: "$gt", Value: 1000}}}}, Sinks: []string{"audit"}},
		{Name: "shop-only", Source: "orders", Namespaces: []string{"shop.orders"},
			Filter: bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "update"}}}}}, Sinks: []string{"audit"}},
		{Name: "deletes", Source: "orders", Operations: []string{"delete"}, Sinks: []string{"audit"}},
		{Name: "other-source", Source: "inventory", Sinks: []string{"bus"}},
	}, []string{"billing", "bus", "audit"})
	if err != nil {
		b.Fatal(err)
	}
	return rules
}

// BenchmarkRoute measures matching one event against a source's rules.
func BenchmarkRoute(b *testing.B) {
	rules := benchRules(b)
	ev := posEvent(b, 1, 42)
	b.ReportAllocs()
	for b.Loop() {
		m := rules.Route(ev)
		if len(m.Sinks) != 1 {
			b.Fatalf("matched %v", m)
		}
	}
}

// nopSink accepts everything at once.
type nopSink struct {
	name string
	max  int
}

func (s nopSink) Name() string                               { return s.name }
func (s nopSink) MaxBatch() int                              { return s.max }
func (s nopSink) Close() error                               { return nil }
func (s nopSink) Send(context.Context, []*event.Event) error { return nil }

// BenchmarkDispatch measures the engine's own cost per event (building the
// event as a source does, routing, lanes with per-key order,
// acknowledgement) with a sink that accepts at once: b.N events are
// dispatched and the benchmark waits for every ack.
func BenchmarkDispatch(b *testing.B) {
	for _, tc := range []struct {
		name  string
		batch int
	}{{"batch1", 1}, {"batch100", 100}} {
		b.Run(tc.name, func(b *testing.B) {
			rules, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: []string{"hook"}}}, []string{"hook"})
			if err != nil {
				b.Fatal(err)
			}
			e, err := NewEngine(rules, []SinkSpec{{Sink: nopSink{"hook", tc.batch}, MaxInFlight: 16, BatchSize: tc.batch}}, nil, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			e.Start(ctx)
			defer func() { cancel(); e.Stop() }()
			raws := make([]bson.Raw, 4096)
			for i := range raws {
				raws[i] = posEvent(b, i, i).Raw
			}
			var wg sync.WaitGroup
			ack := func() { wg.Done() }
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				wg.Add(1)
				ev, err := event.FromChange("orders", uint64(i), raws[i%len(raws)])
				if err != nil {
					b.Fatal(err)
				}
				e.Dispatch(ev, ack)
			}
			wg.Wait()
		})
	}
}

// subscriptionRules compiles n rules of source "orders" shaped as
// subscriptions are merged (subscription.Merge): operations, an equality
// on the customer (n/100 distinct customers when n >= 100, so that 1% of
// the rules match a change; one in n below) and the creation cluster time,
// each rule with its own sink.
func subscriptionRules(b *testing.B, n int, indexed bool) *Rules {
	b.Helper()
	customers := max(n/10, 10)
	if n >= 100 {
		customers = 100
	}
	specs := make([]RuleSpec, n)
	sinkNames := make([]string, n)
	for i := range specs {
		sinkNames[i] = fmt.Sprintf("team-%d", i)
		specs[i] = RuleSpec{Name: sinkNames[i], Source: "orders", Operations: []string{"insert", "update", "replace"},
			Filter: bson.D{{Key: "$and", Value: bson.A{
				bson.D{{Key: "fullDocument.customer", Value: fmt.Sprintf("c%d", i%customers)}},
				bson.D{{Key: "clusterTime", Value: bson.D{{Key: "$gte", Value: bson.Timestamp{T: 1, I: uint32(i)}}}}},
			}}},
			Sinks: []string{sinkNames[i]}}
	}
	rules, err := CompileRules(specs, sinkNames)
	if err != nil {
		b.Fatal(err)
	}
	if !indexed {
		rules.index = nil
	}
	return rules
}

// BenchmarkRouteSubscriptions measures routing one change among n
// subscription-shaped rules of one source: 1,000 of which 1% match (with
// the index, and scanned as before it), against 10 of which one matches.
func BenchmarkRouteSubscriptions(b *testing.B) {
	for _, tc := range []struct {
		name    string
		n       int
		indexed bool
		want    int
	}{{"rules10", 10, true, 1}, {"subs1000", 1000, true, 10}, {"subs1000-scan", 1000, false, 10}} {
		b.Run(tc.name, func(b *testing.B) {
			rules := subscriptionRules(b, tc.n, tc.indexed)
			ev := indexEvent(b, 42, "update", "shop", "orders", bson.D{{Key: "_id", Value: 42},
				{Key: "customer", Value: "c7"}, {Key: "status", Value: "paid"}, {Key: "total", Value: 120.5}})
			b.ReportAllocs()
			for b.Loop() {
				if m := rules.Route(ev); len(m.Sinks) != tc.want {
					b.Fatalf("matched %d sinks, want %d", len(m.Sinks), tc.want)
				}
			}
		})
	}
}
