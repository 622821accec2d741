package event

import (
	"bytes"
	"testing"
	"time"
)

func TestNewNoticeEnvelopeIsTheBody(t *testing.T) {
	body := []byte(`{"id":"n1","type":"subscription.disabled","timestamp":"2026-01-01T00:00:00Z","data":{"subscription":"team-a-x"}}`)
	ev := NewNotice("n1", "changegate", "subscription.disabled", time.Unix(1, 0), body)
	for _, canonical := range []bool{false, true} {
		env, err := ev.Envelope(canonical)
		if err != nil || !bytes.Equal(env, body) {
			t.Fatalf("Envelope(%v) = %s, %v; want the body", canonical, env, err)
		}
		rec, err := ev.Record(canonical)
		if err != nil || !bytes.Equal(rec, body) {
			t.Fatalf("Record(%v) = %s, %v; want the body", canonical, rec, err)
		}
		app, err := ev.AppendRecord([]byte("["), canonical)
		if err != nil || !bytes.Equal(app, append([]byte("["), body...)) {
			t.Fatalf("AppendRecord(%v) = %s, %v", canonical, app, err)
		}
	}
	if _, ok := ev.TxnID(); ok {
		t.Fatal("a notice is in no transaction")
	}
	for _, m := range ev.Metadata() {
		if m.Name == "ns" || m.Name == "documentKey" || m.Name == "clusterTime" {
			t.Fatalf("metadata %s of a notice: %q", m.Name, m.Value)
		}
	}
	if ev.OperationType != "subscription.disabled" || ev.ID != "n1" {
		t.Fatalf("notice %+v", ev)
	}
}
