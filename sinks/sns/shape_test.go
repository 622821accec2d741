package sns

import (
	"context"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// With envelope = "document" the message is the post-image and the
// metadata travels in message attributes, as for SQS.
func TestSendDocumentForm(t *testing.T) {
	srv := newServer(t, 0)
	s := newSink(t, srv, "changes.fifo", nil)
	e := sinktest.DocumentForm(t, sinktest.Change(t, 1, 7, 0))
	if err := s.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	m := srv.Messages("changes.fifo")[0]
	body, _ := e.Envelope(false)
	if m.Message != string(body) || body[0] != '{' {
		t.Errorf("message %q", m.Message)
	}
	want := map[string]string{"id": e.ID, "documentKey": `{"_id":7}`, "operationType": "update", "db": "shop", "coll": "orders", "source": "orders"}
	for k, v := range want {
		if a := m.Attributes[k]; a.StringValue != v || a.DataType != "String" {
			t.Errorf("attribute %s = %+v, want %q", k, a, v)
		}
	}
}
