package sinktest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/memory"
)

// Outcome is how a call held by a Hook ends.
type Outcome int

// The outcomes CheckBudget runs a Send through.
const (
	Succeed Outcome = iota // the server answers as it would
	Fail                   // the server refuses the call (a permanent error)
	Cancel                 // the caller's context is cancelled during the call
)

func (o Outcome) String() string {
	return [...]string{"succeed", "fail", "cancel"}[o]
}

// Hook holds each call a test server receives until the test chooses its
// outcome: Wait blocks the server's handler.
type Hook struct {
	entered chan struct{}
	outcome chan Outcome
	body    atomic.Int64 // the bytes of the last held call's request body
}

// NewHook returns a hook holding calls.
func NewHook() *Hook {
	return &Hook{entered: make(chan struct{}), outcome: make(chan Outcome)}
}

// Wait is called by a test server when a call of body bytes arrives: it
// reports the call to CheckBudget and returns the outcome chosen (for
// Cancel, once the caller's context was cancelled).
func (h *Hook) Wait(body int64) Outcome {
	h.body.Store(body)
	h.entered <- struct{}{}
	return <-h.outcome
}

// Handler holds the requests to next for which match is true (nil: every
// request): Succeed passes the request on, Fail answers 400 with an AWS
// JSON error (the sinks' SDK clients do not retry it), Cancel waits until
// the client gave the request up.
func (h *Hook) Handler(next http.Handler, match func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if match != nil && !match(r) {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		switch h.Wait(int64(len(body))) {
		case Succeed:
			next.ServeHTTP(w, r)
		case Fail:
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"__type":"ValidationException","message":"injected by the test"}`)
		case Cancel:
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
		}
	})
}

// CheckBudget runs a Send once per outcome, each time under a fresh byte
// budget carried by the context (memory.WithBudget, as the engine calls
// Send), and fails the test unless the budget holds bytes while the call
// is held by the hook — want(held, body) returns "" when held, the bytes
// charged then, is right for a request body of body bytes (0 when the
// hook does not see bodies), or what is wrong — and holds no bytes and no
// charges once Send returned: a charge not released on success, on error
// or on cancellation fails here. newSend returns the Send of a sink whose
// server calls h.
func CheckBudget(t *testing.T, newSend func(t *testing.T, h *Hook) func(context.Context) error, want func(held, body int64) string) {
	t.Helper()
	for _, o := range []Outcome{Succeed, Fail, Cancel} {
		t.Run(o.String(), func(t *testing.T) {
			b := memory.NewBudget(1<<40, nil, nil)
			h := NewHook()
			send := newSend(t, h)
			ctx, cancel := context.WithCancel(memory.WithBudget(t.Context(), b))
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- send(ctx) }()
			select {
			case <-h.entered:
			case err := <-done:
				t.Fatalf("Send returned %v before its call reached the server", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the call did not reach the server in 30s")
			}
			held := b.InUse()
			if msg := want(held, h.body.Load()); msg != "" {
				t.Errorf("during the call: %d bytes held for a body of %d: %s", held, h.body.Load(), msg)
			}
			if o == Cancel {
				cancel()
			}
			h.outcome <- o
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Send did not return in 30s after the call was let go")
			}
			switch {
			case o == Succeed && err != nil:
				t.Errorf("Send = %v, want nil", err)
			case o == Fail && (err == nil || errors.Is(err, context.Canceled)):
				t.Errorf("Send = %v, want the refusal", err)
			case o == Cancel && !errors.Is(err, context.Canceled):
				t.Errorf("Send = %v, want the context's error", err)
			}
			if n, c := b.InUse(), b.Charges(); n != 0 || c != 0 {
				t.Errorf("after Send (%v): %d bytes and %d charges still held, want 0 and 0 (leak)", err, n, c)
			}
		})
	}
}

// Proxy returns the URL of a test server that forwards every request to
// target (another test server's URL, whose SigV4 checks still pass: the
// Host header is kept), held by h as Handler holds them.
func Proxy(t *testing.T, h *Hook, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	return Server(t, h, httputil.NewSingleHostReverseProxy(u))
}

// Server returns the URL of a test server (closed when the test ends)
// serving next, every request held by h as Handler holds them.
func Server(t testing.TB, h *Hook, next http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h.Handler(next, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}
