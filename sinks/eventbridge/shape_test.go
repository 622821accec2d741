package eventbridge

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// With envelope = "document" the detail is self-contained: the metadata
// beside fullDocument (event.Event.Record), no updateDescription.
func TestSendDocumentForm(t *testing.T) {
	f := &fakeBus{}
	b := newTestSink(t, f, nil)
	e := sinktest.DocumentForm(t, testEvent(t, 1, 0))
	if err := b.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	got := f.snapshot()[0][0]
	var d map[string]any
	if err := json.Unmarshal([]byte(got.Detail), &d); err != nil {
		t.Fatal(err)
	}
	if d["id"] != e.ID || d["operationType"] != "insert" || d["fullDocument"] == nil || d["documentKey"] == nil || d["updateDescription"] != nil {
		t.Errorf("detail %s", got.Detail)
	}
	if got.DetailType != "shop.orders.insert" {
		t.Errorf("detail type %q", got.DetailType)
	}
}
