package app_test

import (
	"strings"
	"testing"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
)

// TestDryRunShapes: rules test shows each sink's payload as shaped for it
// (the stricter of the sink's and its rules' shapes), and the updates a
// sink skips.
func TestDryRunShapes(t *testing.T) {
	cfg, err := config.Parse("dry.toml", []byte(`
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[[sources]]
name = "users"
database = "shop"
collection = "users"
[[sinks]]
name = "partner"
type = "webhook"
url = "https://partner.example/hook"
fields = { "fullDocument.email" = 0 }
[[sinks]]
name = "keys"
type = "webhook"
url = "https://keys.example/hook"
envelope = "key"
[[sinks]]
name = "status"
type = "webhook"
url = "https://status.example/hook"
fields = ["fullDocument.status"]
skip_empty_updates = true
[[rules]]
name = "all"
source = "users"
filter = { "fullDocument.email" = "ann@x.org" }
redact = ["fullDocument.ssn"]
sinks = ["partner", "keys", "status"]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	change := `{"_id":{"_data":"8264F1A000000000012B022C0100296E5A1004"},"operationType":"update",` +
		`"ns":{"db":"shop","coll":"users"},"documentKey":{"_id":1},` +
		`"fullDocument":{"_id":1,"email":"ann@x.org","ssn":"123-45","status":"new"},` +
		`"updateDescription":{"updatedFields":{"ssn":"123-45"},"removedFields":[]}}`
	_, rt := dryRoute(t, cfg, "users", change)
	if len(rt.Deliveries) != 3 {
		t.Fatalf("%d deliveries (the filter on a field partner excludes must still match)", len(rt.Deliveries))
	}
	got := map[string]app.Delivery{}
	for _, d := range rt.Deliveries {
		got[d.Sink.Name] = d
	}
	if p := string(got["partner"].Envelope); strings.Contains(p, "ann@x.org") || strings.Contains(p, "123-45") || !strings.Contains(p, `"ssn":"[REDACTED]"`) {
		t.Errorf("partner: %s", p)
	}
	if k := string(got["keys"].Envelope); k != `{"id":"users:8264F1A000000000012B022C0100296E5A1004","operationType":"update","ns":{"db":"shop","coll":"users"},"documentKey":{"_id":1}}` {
		t.Errorf("keys: %s", k)
	}
	if s := got["status"]; !s.Skipped || s.Envelope != nil {
		t.Errorf("status: skipped %t, %s", s.Skipped, s.Envelope)
	}
}

// TestDryRunKafkaIsTheRecordValue: a batching kafka sink sends each event's
// envelope as its record value (with envelope = "document", the post-image
// alone, the metadata going to headers), not a batch element's record form.
func TestDryRunKafkaIsTheRecordValue(t *testing.T) {
	cfg, err := config.Parse("dry.toml", []byte(`
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[[sources]]
name = "users"
database = "shop"
collection = "users"
[[sinks]]
name = "cdc"
type = "kafka"
brokers = ["kafka:9092"]
topic = "cdc.{db}.{coll}"
batch_size = 100
envelope = "document"
[[rules]]
name = "all"
source = "users"
sinks = ["cdc"]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	change := `{"_id":{"_data":"8264F1A000000000012B022C0100296E5A1004"},"operationType":"update",` +
		`"ns":{"db":"shop","coll":"users"},"documentKey":{"_id":1},` +
		`"fullDocument":{"_id":1,"status":"new"},` +
		`"updateDescription":{"updatedFields":{"status":"new"},"removedFields":[]}}`
	_, rt := dryRoute(t, cfg, "users", change)
	if len(rt.Deliveries) != 1 {
		t.Fatalf("%d deliveries", len(rt.Deliveries))
	}
	if got := string(rt.Deliveries[0].Envelope); got != `{"_id":1,"status":"new"}` {
		t.Errorf("kafka record value %s, want the post-image alone", got)
	}
}
