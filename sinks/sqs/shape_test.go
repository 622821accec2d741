package sqs

import (
	"context"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// With envelope = "document" the body is the post-image and the metadata
// travels in message attributes.
func TestSendDocumentForm(t *testing.T) {
	f := &fakeQueue{}
	s, _ := newTestSink(t, f, nil)
	e := sinktest.DocumentForm(t, events(t, 1, 0)[0])
	if err := s.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	m := f.snapshot()[0].Entries[0]
	body, _ := e.Envelope(false)
	if m.MessageBody != string(body) || body[0] != '{' {
		t.Errorf("body %q", m.MessageBody)
	}
	if _, err := e.Raw.LookupErr("fullDocument"); err != nil {
		t.Fatal("test event has no fullDocument")
	}
	want := map[string]string{"id": e.ID, "documentKey": `{"_id":0}`, "operationType": "update", "db": "shop", "coll": "orders", "source": "orders"}
	for k, v := range want {
		if a := m.MessageAttributes[k]; a.StringValue != v {
			t.Errorf("attribute %s = %+v, want %q", k, a, v)
		}
	}
	if a := m.MessageAttributes["clusterTime"]; (a.StringValue == "") != (e.ClusterTime.T == 0) {
		t.Errorf("clusterTime attribute %+v for cluster time %v", a, e.ClusterTime)
	}
	if m.MessageDeduplicationId != DeduplicationID(e) {
		t.Error("dedup id")
	}
}
