package mongowire_test

import (
	"context"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkChangeStreamDrain measures how many small change events per
// second the real driver drains from a change stream: b.N documents are
// inserted (untimed), then the timed part iterates the stream over all of
// them, reading each event's operationType and documentKey as a consumer would.
func BenchmarkChangeStreamDrain(b *testing.B) {
	srv := startServer(b, mongowire.Options{CommandLogLimit: -1})
	client := connect(b, srv.URI())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	coll := client.Database("bench").Collection("events")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetMaxAwaitTime(50*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close(ctx)

	const chunk = 10000
	docs := make([]any, 0, chunk)
	for i := 0; i < b.N; i++ {
		docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "name", Value: "order"}, {Key: "qty", Value: i % 7}})
		if len(docs) == chunk || i == b.N-1 {
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				b.Fatal(err)
			}
			docs = docs[:0]
		}
	}

	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !cs.Next(ctx) {
			b.Fatalf("stream ended after %d events: %v", i, cs.Err())
		}
		if cs.Current.Lookup("operationType").StringValue() != "insert" || cs.Current.Lookup("documentKey", "_id").Int32() != int32(i) {
			b.Fatalf("event %d: %v", i, cs.Current)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
