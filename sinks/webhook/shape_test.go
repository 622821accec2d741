package webhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
)

// With envelope = "document" the body is the post-image and the metadata
// travels in headers; a batch carries each event's self-contained record.
func TestSendDocumentForm(t *testing.T) {
	shape, err := event.CompileShape(event.ShapeSpec{Envelope: event.FormDocument, Redact: []string{"fullDocument.status"}})
	if err != nil {
		t.Fatal(err)
	}
	srv, rc := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, Secrets: []string{testSecret}, AllowPrivateNetworks: true})
	w.now = func() time.Time { return t0 }
	e, _ := testEvent(t, 1).Shaped(shape)
	if err := w.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	r := rc.requests()[0]
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatal(err)
	}
	if body["status"] != event.RedactMask || body["_id"] != float64(1) || body["operationType"] != nil {
		t.Errorf("body %s, want the shaped document", r.body)
	}
	for k, v := range map[string]string{
		"webhook-id": e.ID, HeaderOperationType: "insert", HeaderNamespace: "shop.orders",
		HeaderDocumentKey: `{"_id":1}`, HeaderClusterTime: "2023-11-14T22:13:20Z",
	} {
		if got := r.header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if err := Verify([]string{testSecret}, r.header, r.body, time.Minute, t0); err != nil {
		t.Errorf("signature: %v", err)
	}

	// Batched: an array of records, no per-event headers.
	wb := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true, BatchSize: 10})
	e2, _ := testEvent(t, 2).Shaped(shape)
	if err := wb.Send(context.Background(), []*event.Event{e, e2}); err != nil {
		t.Fatal(err)
	}
	rb := rc.requests()[1]
	var arr []map[string]any
	if err := json.Unmarshal(rb.body, &arr); err != nil {
		t.Fatal(err)
	}
	if len(arr) != 2 || arr[0]["id"] != e.ID || arr[1]["fullDocument"] == nil || strings.Contains(string(rb.body), `"status":"paid"`) {
		t.Errorf("batch body %s", rb.body)
	}
	if rb.header.Get(HeaderNamespace) != "" {
		t.Error("a batch carries per-event headers")
	}
}
