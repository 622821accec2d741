package tracing

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// benchSamplers are the settings BenchmarkChange compares: tracing off (a
// nil Tracer), every change sampled, none sampled (a ratio sampler at 0),
// and 1% (the ratio sampler docs/tracing.md recommends for busy streams),
// each as OTEL_TRACES_SAMPLER=parentbased_traceidratio configures it.
var benchSamplers = []struct {
	name    string
	sampler sdktrace.Sampler // nil: tracing off
}{
	{"off", nil},
	{"unsampled", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))},
	{"ratio0.01", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))},
	{"sampled", sdktrace.ParentBased(sdktrace.AlwaysSample())},
}

// BenchmarkChange is the tracing work of one change delivered by one
// webhook sink in one attempt, the hooks in the order the router and the
// sink call them, exported to a discarding exporter through the batch span
// processor.
func BenchmarkChange(b *testing.B) {
	for _, s := range benchSamplers {
		b.Run(s.name, func(b *testing.B) {
			var tr *Tracer
			if s.sampler != nil {
				tr = New(sdktrace.NewTracerProvider(sdktrace.WithSampler(s.sampler), sdktrace.WithBatcher(discard{})))
				defer tr.Shutdown(context.Background())
			}
			info := ChangeInfo{ID: "orders:826B086CD00000000700000000000000000000000500", Source: "orders", DB: "shop", Coll: "orders",
				Operation: "insert", Size: 300, ClusterT: 1, ClusterI: 2, WallTime: time.Now()}
			ctx := context.Background()
			rules, sinks := []string{"all"}, []string{"hook"}
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				benchOneChange(ctx, tr, info, rules, sinks, h)
			}
		})
	}
}
