package router

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// A document whose field names look like Extended JSON type wrappers (legal
// in MongoDB 5.0+) still gets dead-lettered and acknowledged when its sink
// rejects it: an event that can never be acknowledged would hold the
// source's checkpoint back forever.
func TestEngineDeadLettersEventWithDollarFieldNames(t *testing.T) {
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "00000001"}}},
		{Key: "operationType", Value: "insert"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "price", Value: bson.D{{Key: "$oid", Value: 1}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.FromChange("orders", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []deadletter.Kind{deadletter.KindFailed, deadletter.KindParked} {
		t.Run(string(kind), func(t *testing.T) {
			dl := newMemDL()
			s := &fakeSink{name: "s"}
			spec := SinkSpec{Sink: s, Retry: fastRetry(2)}
			if kind == deadletter.KindFailed {
				s.setFail(func(*event.Event) error { return sinks.Permanent("http_400", errors.New("400")) })
			} else {
				s.setFail(func(*event.Event) error { return sinks.Retryable("http_503", 0, errors.New("503")) })
				spec.Retry = sinks.RetryPolicy{MaxAttempts: 1000, InitialInterval: 5 * time.Millisecond, MaxInterval: 5 * time.Millisecond}
				spec.ParkAfter = 50 * time.Millisecond
			}
			eng := newTestEngine(t, dl, spec)
			acked := make(chan struct{})
			eng.Dispatch(ev, func() { close(acked) })
			select {
			case <-acked:
			case <-time.After(5 * time.Second):
				t.Fatal("event never acknowledged")
			}
			l, _ := dl.List(t.Context(), deadletter.Filter{Kind: kind})
			if len(l) != 1 || len(l[0].Change) == 0 {
				t.Fatalf("%s entries: %+v", kind, l)
			}
		})
	}
}
