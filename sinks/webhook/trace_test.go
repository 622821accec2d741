package webhook

import (
	"context"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// A traced request carries the attempt's traceparent header (a batch too);
// the signature still verifies. Untraced, or with trace_context = false,
// no traceparent.
func TestRequestTraceparent(t *testing.T) {
	srv, rc := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, Secrets: []string{testSecret}, BatchSize: 2, AllowPrivateNetworks: true})
	one := []*event.Event{testEvent(t, 1)}
	two := []*event.Event{testEvent(t, 2), testEvent(t, 3)}
	tr1, tr2 := sinktest.TracedSend(1, true), sinktest.TracedSend(2, true)
	for _, s := range []struct {
		ctx context.Context
		evs []*event.Event
	}{{tr1.Ctx, one}, {tr2.Ctx, two}, {context.Background(), one}, {sinktest.TracedSend(1, false).Ctx, one}} {
		if err := w.Send(s.ctx, s.evs); err != nil {
			t.Fatal(err)
		}
	}
	if got := tr1.Attempt()["http.response.status_code"]; got != "204" {
		t.Errorf("attempt span http.response.status_code = %q, want 204", got)
	}
	reqs := rc.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests", len(reqs))
	}
	for i, want := range []string{tr1.Request, tr2.Request, "", ""} {
		if got := reqs[i].header.Get("traceparent"); got != want {
			t.Errorf("request %d: traceparent %q, want %q", i, got, want)
		}
		if err := Verify([]string{testSecret}, reqs[i].header, reqs[i].body, time.Hour, time.Now()); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if tr1.Request == "" || tr2.Request == tr2.Entries[0] {
		t.Errorf("a batch's request context is its attempt's, not an entry's: %q", tr2.Request)
	}
}
