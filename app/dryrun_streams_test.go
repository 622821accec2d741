package app_test

import (
	"bytes"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
)

// TestSinkEnvelopeKinesisAndSNS: a dry run shows what each sink sends for
// envelope = "document": the record form for Kinesis (no attributes: the
// metadata goes beside fullDocument), the post-image alone for SNS (its
// metadata goes in message attributes), whatever the batch size.
func TestSinkEnvelopeKinesisAndSNS(t *testing.T) {
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8200000001"}}},
		{Key: "operationType", Value: "insert"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "total", Value: 5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := event.FromChange("orders", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	shape, err := event.CompileShape(event.ShapeSpec{Envelope: event.FormDocument})
	if err != nil {
		t.Fatal(err)
	}
	e, _ = e.Shaped(shape)
	record, _ := e.Record(false)
	body, _ := e.Envelope(false)
	if bytes.Equal(record, body) {
		t.Fatal("the test needs a record form that differs from the body")
	}
	for _, tt := range []struct {
		name string
		sc   config.Sink
		want []byte
	}{
		{"kinesis", config.Sink{Kinesis: &config.KinesisSink{}, BatchSize: 500}, record},
		{"kinesis alone", config.Sink{Kinesis: &config.KinesisSink{}, BatchSize: 1}, record},
		{"sns", config.Sink{SNS: &config.SNSSink{}, BatchSize: 10}, body},
	} {
		got, err := app.SinkEnvelope(e, &tt.sc, nil)
		if err != nil || !bytes.Equal(got, tt.want) {
			t.Errorf("%s: %s (%v), want %s", tt.name, got, err, tt.want)
		}
	}
}
