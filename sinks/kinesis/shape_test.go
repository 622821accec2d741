package kinesis

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// With envelope = "document" a record, which has no attributes, carries
// the metadata beside fullDocument (the event's Record form).
func TestSendDocumentForm(t *testing.T) {
	srv := newServer(t, awstest.Options{})
	k := newSink(t, srv, nil)
	e := sinktest.DocumentForm(t, sinktest.Change(t, 1, 7, 0))
	if err := k.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		ID           string          `json:"id"`
		DocumentKey  json.RawMessage `json:"documentKey"`
		FullDocument json.RawMessage `json:"fullDocument"`
	}
	r := srv.Records("changes")[0]
	if err := json.Unmarshal(r.Data, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != e.ID || string(got.DocumentKey) != `{"_id":7}` || len(got.FullDocument) == 0 {
		t.Errorf("record %s", r.Data)
	}
	if r.PartitionKey != `shop.orders:{"_id":7}` {
		t.Errorf("partition key %q", r.PartitionKey)
	}
}
