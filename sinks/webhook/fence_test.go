package webhook

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// A request whose fence no longer holds (the unit's lease ended while the
// batch was prepared) is not written: the receiver sees nothing, and Send
// reports sinks.ErrFenced.
func TestSendChecksFenceBeforeWriting(t *testing.T) {
	srv, rc := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	var held atomic.Bool
	ctx := sinks.WithFence(context.Background(), held.Load)
	err := w.Send(ctx, []*event.Event{testEvent(t, 1)})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Fatalf("Send with an ended fence: %v, want ErrFenced", err)
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("%d requests written for an ended fence", n)
	}
	held.Store(true)
	if err := w.Send(ctx, []*event.Event{testEvent(t, 2)}); err != nil {
		t.Fatalf("Send with a held fence: %v", err)
	}
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("%d requests for a held fence, want 1", n)
	}
}
