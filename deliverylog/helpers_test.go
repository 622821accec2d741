package deliverylog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func testDB(t testing.TB) *mongo.Database {
	return mongotest.Database(t, "cgtest_deliverylog_")
}

// newLog returns a log in a fresh database, with its indexes.
func newLog(t testing.TB, mode string, deps deliverylog.Deps) (*deliverylog.Log, context.Context) {
	t.Helper()
	ctx := testCtx(t)
	l := deliverylog.NewLog(testDB(t).Collection("deliveries"), 72*time.Hour, mode, deps)
	if err := l.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	return l, ctx
}

// write writes recs through a Writer in mode "all" and waits until they
// are written.
func write(t testing.TB, l *deliverylog.Log, recs ...deliverylog.Record) {
	t.Helper()
	w := deliverylog.NewWriter(l.Collection(), deliverylog.WriterOptions{Mode: "all", Replica: "r1", FlushEvery: time.Millisecond})
	w.Start()
	for _, r := range recs {
		if !w.Enqueue(r) {
			t.Fatalf("record not queued: %+v", r)
		}
	}
	if err := w.Stop(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if w.Written() != int64(len(recs)) || w.Dropped() != 0 {
		t.Fatalf("written %d, dropped %d, want %d written", w.Written(), w.Dropped(), len(recs))
	}
}

// change returns an update of shop.<coll> document {_id: docID, email}
// at cluster time (1795000000+ct, 1).
func change(t testing.TB, coll string, docID any, email string, ct uint32) bson.Raw {
	t.Helper()
	ts := bson.Timestamp{T: 1795000000 + ct, I: 1}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: tokenData(ts)}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ts},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: coll}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: docID}, {Key: "email", Value: email}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: docID}, {Key: "email", Value: email}, {Key: "total", Value: 12}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// tokenData is a resume token's _data at cluster time ts, as MongoDB's
// KeyString hex starts (type 130, then the timestamp), in stream order.
func tokenData(ts bson.Timestamp) string {
	return fmt.Sprintf("82%08X%08X2B0229296E04", ts.T, ts.I)
}

func ev(t testing.TB, source, coll string, docID any, ct uint32, rules ...string) *event.Event {
	t.Helper()
	e, err := event.FromChange(source, uint64(ct), change(t, coll, docID, "ann@example.com", ct))
	if err != nil {
		t.Fatal(err)
	}
	e.Rules = rules
	return e
}
