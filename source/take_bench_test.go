package source

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/sinks"
)

// benchChange is an insert change shaped like the benchmark command's
// (test/cmd/bench: an order of about 300 bytes of BSON).
func benchChange(b *testing.B, i int) bson.Raw {
	b.Helper()
	doc := bson.D{
		{Key: "_id", Value: int32(i)}, {Key: "seq", Value: int32(i)},
		{Key: "customer", Value: fmt.Sprintf("customer-%06d", i%50000)},
		{Key: "status", Value: "paid"}, {Key: "total", Value: float64(i%1000) + 0.99}, {Key: "currency", Value: "EUR"},
		{Key: "items", Value: bson.A{
			bson.D{{Key: "sku", Value: fmt.Sprintf("SKU-%05d", i%977)}, {Key: "qty", Value: int32(1 + i%3)}, {Key: "price", Value: 19.99}},
			bson.D{{Key: "sku", Value: fmt.Sprintf("SKU-%05d", i%311)}, {Key: "qty", Value: int32(1)}, {Key: "price", Value: 5.5}},
		}},
		{Key: "shipping", Value: bson.D{{Key: "city", Value: "Lyon"}, {Key: "zip", Value: "69002"}, {Key: "country", Value: "FR"}}},
		{Key: "b", Value: int32(i % 10)}, {Key: "wts", Value: int64(0)},
	}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("8266%024X", i)}}},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: uint32(time.Now().Unix()), I: uint32(i + 1)}},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.Now())},
		{Key: "fullDocument", Value: doc},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "bench"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(i)}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// processCPU returns the process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ackAtOnce acknowledges every event as it is dispatched.
type ackAtOnce struct{}

func (ackAtOnce) Dispatch(ev *event.Event, ack func()) { ack() }

// nopSink accepts every batch at once.
type nopSink struct{}

func (nopSink) Name() string                               { return "hook" }
func (nopSink) MaxBatch() int                              { return 100 }
func (nopSink) Close() error                               { return nil }
func (nopSink) Send(context.Context, []*event.Event) error { return nil }

var _ sinks.Sink = nopSink{}

// BenchmarkTake is a Source's cost per change read, from the driver's
// buffer to the router: copy, byte budget, split test, FromChange,
// transaction test, tracker, dispatch. "ack" acknowledges in Dispatch;
// "engine" dispatches to a router.Engine with one webhook-like lane of
// batches of 100 whose sink accepts at once (its workers run on the other
// core), as scenario 5 of test/cmd/bench does.
func BenchmarkTake(b *testing.B) {
	raws := make([]bson.Raw, 4096)
	for i := range raws {
		raws[i] = benchChange(b, i)
	}
	run := func(b *testing.B, out Dispatcher) {
		budget := memory.NewBudget(256<<20, nil, nil)
		s := New(Spec{Name: "orders", Budget: budget}, nil, nil, nil, out, nil, nil)
		tr := checkpoint.NewTracker(10000, checkpoint.Position{})
		tx := &txnState{}
		var pend pending
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := processCPU(b)
		for i := 0; i < b.N; i++ {
			if _, _, ok, err := s.take(ctx, tr, tx, &pend, raws[i%len(raws)]); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		<-tr.Drained()
		b.StopTimer()
		// CPU time of the process (every goroutine, GC included) per
		// change: steadier than ns/op on a loaded machine.
		b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		if budget.InUse() != 0 || budget.Charges() != 0 {
			b.Fatalf("budget holds %d bytes in %d charges", budget.InUse(), budget.Charges())
		}
	}
	b.Run("ack", func(b *testing.B) { run(b, ackAtOnce{}) })
	b.Run("engine", func(b *testing.B) {
		rules, err := router.CompileRules([]router.RuleSpec{{Name: "all", Source: "orders", Sinks: []string{"hook"}}}, []string{"hook"})
		if err != nil {
			b.Fatal(err)
		}
		e, err := router.NewEngine(rules, []router.SinkSpec{{Sink: nopSink{}, MaxInFlight: 16, BatchSize: 100}}, nil, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		e.Start(ctx)
		var once sync.Once
		defer once.Do(func() { cancel(); e.Stop() })
		run(b, e)
	})
}
