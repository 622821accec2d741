package tracing

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkChange is the tracing work of one change delivered by one
// sink in one attempt, exported to a discarding exporter.
func BenchmarkChange(b *testing.B) {
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{})))
	defer tr.Shutdown(context.Background())
	info := ChangeInfo{ID: "orders:826B086CD00000000700000000000000000000000500", Source: "orders", DB: "shop", Coll: "orders",
		Operation: "insert", Size: 300, ClusterT: 1, ClusterI: 2, WallTime: time.Now()}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ch := tr.StartChange(info)
		ch.Route([]string{"all"}, []string{"hook"})
		d := ch.Delivery("hook", "webhook")
		actx, a := tr.StartAttempt(ctx, []*Delivery{d}, AttemptInfo{Sink: "hook", Kind: "webhook", Number: 1, Propagate: true})
		a.Admitted()
		Entry(actx, 0)
		a.End(nil)
		d.Outcome("delivered", "")
		d.End()
		ch.Ack()
	}
}
