package kafka

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/changegate/changegate/event"
)

// BenchmarkSend measures one Send of 100 events of ~1 KiB against an
// in-process kfake broker (so mostly the client's and the sink's own cost).
func BenchmarkSend(b *testing.B) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, topic))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	k, err := New(Config{Name: "k", Brokers: c.ListenAddrs(), Topic: "cdc.{db}.{coll}"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	evs := make([]*event.Event, 100)
	for i := range evs {
		evs[i] = change(b, i, i, "insert", "orders", 1000)
	}
	b.ResetTimer()
	for range b.N {
		if err := k.Send(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}
