package deliverylog

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// The cost the delivery path pays for the log, per attempt: in the default
// mode a success costs Wants alone; a recorded attempt costs FromEvent
// (the record, a copy of the document key) and Enqueue (a lock and a copy
// into the queue). The queue is emptied every 4096 records, outside the
// writer, so that what is measured is the caller's side only.
//
//	go test -run '^$' -bench Enqueue -benchmem ./deliverylog/
func BenchmarkEnqueue(b *testing.B) {
	ts := bson.Timestamp{T: 1795000000, I: 1}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8264F1A2B3000000012B0229296E04"}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ts},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "email", Value: "ann@example.com"}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "email", Value: "ann@example.com"}, {Key: "total", Value: 12}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	ev, err := event.FromChange("orders", 1, raw)
	if err != nil {
		b.Fatal(err)
	}
	ev.Rules = []string{"paid"}
	shape, err := event.CompileShape(event.ShapeSpec{Redact: []string{"fullDocument.email"}})
	if err != nil {
		b.Fatal(err)
	}
	redacted, _ := ev.Shaped(shape)

	b.Run("failures-mode-success", func(b *testing.B) {
		w := NewWriter(nil, WriterOptions{Mode: "failures"})
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if w.Wants(OutcomeDelivered) {
				n++
			}
		}
		if n != 0 {
			b.Fatal("a success was wanted")
		}
	})
	for _, c := range []struct {
		name string
		ev   *event.Event
	}{{"record", ev}, {"record-redacted-key", redacted}} {
		b.Run(c.name, func(b *testing.B) {
			w := NewWriter(nil, WriterOptions{Mode: "failures", MaxQueuedRecords: 1 << 20, MaxQueuedBytes: 1 << 40})
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if w.Wants(OutcomeRetrying) {
					r := FromEvent(c.ev, "billing")
					r.Attempt, r.Outcome, r.Status, r.Duration = 2, OutcomeRetrying, 503, 12*time.Millisecond
					if !w.Enqueue(r) {
						b.Fatal("dropped")
					}
				}
				if i++; i%4096 == 0 {
					w.reset()
				}
			}
		})
	}
	b.Run("record-parallel", func(b *testing.B) {
		w := NewWriter(nil, WriterOptions{Mode: "failures", MaxQueuedRecords: 1 << 20, MaxQueuedBytes: 1 << 40})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				r := FromEvent(ev, "billing")
				r.Attempt, r.Outcome = 2, OutcomeRetrying
				w.Enqueue(r)
				if i++; i%4096 == 0 {
					w.reset()
				}
			}
		})
	})
}

// reset empties the queue, keeping its buffer (benchmarks only).
func (w *Writer) reset() {
	w.mu.Lock()
	clear(w.queue)
	w.queue, w.count, w.bytes = w.queue[:0], 0, 0
	w.mu.Unlock()
}
