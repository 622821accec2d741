package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/tracing"
)

type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// dispatchHooks is what a Source calls around its dispatch lock when its
// Dispatcher has it (the engine, when tracing is built in).
type dispatchHooks interface {
	BeginDispatch(ev *event.Event)
	EndDispatch(ev *event.Event)
}

// BenchmarkDispatchTraced is BenchmarkDispatch (batch_size 1) with the
// tracing hooks: off, on with no change sampled (a ratio sampler at 0),
// 1% sampled, every change sampled; spans go through the batch span
// processor to a discarding exporter. Dispatch runs under a mutex as a
// Source runs it under its dispatch lock, with the engine's hooks around
// it as the Source calls them; lock-ns/op is the time the lock was held
// per event (what tracing adds to it serialises the source's read path).
func BenchmarkDispatchTraced(b *testing.B) {
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{
		{"off", nil},
		{"unsampled", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))},
		{"ratio0.01", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))},
		{"sampled", sdktrace.ParentBased(sdktrace.AlwaysSample())},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rules, err := CompileRules([]RuleSpec{{Name: "all", Source: "orders", Sinks: []string{"hook"}}}, []string{"hook"})
			if err != nil {
				b.Fatal(err)
			}
			e, err := NewEngine(rules, []SinkSpec{{Sink: nopSink{"hook", 1}, Kind: "webhook", MaxInFlight: 16, BatchSize: 1}}, nil, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if tc.sampler != nil {
				tr := tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler), sdktrace.WithBatcher(discardSpans{})))
				defer tr.Shutdown(context.Background())
				e.SetObserver(tr)
			}
			hooks, _ := any(e).(dispatchHooks)
			ctx, cancel := context.WithCancel(context.Background())
			e.Start(ctx)
			defer func() { cancel(); e.Stop() }()
			raws := make([]bson.Raw, 4096)
			for i := range raws {
				raws[i] = posEvent(b, i, i).Raw
			}
			var wg sync.WaitGroup
			ack := func() { wg.Done() }
			var mu sync.Mutex // the source's dispatch lock
			var held time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				wg.Add(1)
				ev, err := event.FromChange("orders", uint64(i), raws[i%len(raws)])
				if err != nil {
					b.Fatal(err)
				}
				if hooks != nil {
					hooks.BeginDispatch(ev)
				}
				mu.Lock()
				t0 := time.Now()
				e.Dispatch(ev, ack)
				held += time.Since(t0)
				mu.Unlock()
				if hooks != nil {
					hooks.EndDispatch(ev)
				}
			}
			wg.Wait()
			b.ReportMetric(float64(held.Nanoseconds())/float64(b.N), "lock-ns/op")
		})
	}
}
