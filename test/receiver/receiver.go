// Package receiver is a webhook receiver for tests and the demo: it verifies
// Standard Webhooks signatures, records every delivery and can be told to
// fail.
package receiver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
)

// Delivery is one envelope received.
type Delivery struct {
	WebhookID string          // the webhook-id header
	ID        string          // the envelope's id
	Operation string          // operationType
	DocKey    string          // documentKey as JSON
	Envelope  json.RawMessage // the envelope as received
	SigOK     bool
	At        time.Time
	// Traceparent is the request's W3C traceparent header ("" without).
	Traceparent string
}

// Response decides the answer to one request; nil means 200.
type Response struct {
	Status     int
	RetryAfter string
}

// Receiver is an HTTP server recording deliveries. Safe for concurrent use.
type Receiver struct {
	Server  *httptest.Server
	secrets []string

	mu         sync.Mutex
	deliveries []Delivery
	requests   int
	badSig     int
	decide     func(body []byte) *Response
	onDelivery func(Delivery)
}

// New starts a receiver on 127.0.0.1 that verifies signatures with secrets
// (none: signatures are not checked).
func New(secrets ...string) *Receiver {
	r := &Receiver{secrets: secrets}
	r.Server = httptest.NewServer(r)
	return r
}

// NewHandler returns a receiver without a server of its own: it is an
// http.Handler to mount on a server the caller controls (for example one
// whose listener is closed and reopened on the same port). URL returns "" and
// Close does nothing for it.
func NewHandler(secrets ...string) *Receiver {
	return &Receiver{secrets: secrets}
}

// URL returns the receiver's URL ("" for a NewHandler receiver).
func (r *Receiver) URL() string {
	if r.Server == nil {
		return ""
	}
	return r.Server.URL
}

// Close stops the server started by New.
func (r *Receiver) Close() {
	if r.Server != nil {
		r.Server.Close()
	}
}

// ServeHTTP handles one webhook request: it verifies the signature, asks the
// responder for the answer and records the accepted envelopes.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) { r.serve(w, req) }

// SetResponder installs f to decide each request's answer (nil: always 200).
func (r *Receiver) SetResponder(f func(body []byte) *Response) {
	r.mu.Lock()
	r.decide = f
	r.mu.Unlock()
}

// OnDelivery installs a callback run for every accepted envelope.
func (r *Receiver) OnDelivery(f func(Delivery)) {
	r.mu.Lock()
	r.onDelivery = f
	r.mu.Unlock()
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sigOK := true
	if len(r.secrets) > 0 {
		sigOK = webhook.Verify(r.secrets, req.Header, body, 5*time.Minute, time.Now()) == nil
	}
	r.mu.Lock()
	r.requests++
	decide := r.decide
	r.mu.Unlock()
	if !sigOK {
		r.mu.Lock()
		r.badSig++
		r.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	if decide != nil {
		if resp := decide(body); resp != nil && resp.Status != 0 && resp.Status != http.StatusOK {
			if resp.RetryAfter != "" {
				w.Header().Set("Retry-After", resp.RetryAfter)
			}
			http.Error(w, "refused by test receiver", resp.Status)
			return
		}
	}
	var envs []json.RawMessage
	if len(body) > 0 && body[0] == '[' {
		if err := json.Unmarshal(body, &envs); err != nil {
			http.Error(w, "bad json: "+err.Error(), http.StatusBadRequest)
			return
		}
	} else {
		envs = []json.RawMessage{body}
	}
	now := time.Now()
	var got []Delivery
	for _, env := range envs {
		var e struct {
			ID            string          `json:"id"`
			OperationType string          `json:"operationType"`
			DocumentKey   json.RawMessage `json:"documentKey"`
		}
		if err := json.Unmarshal(env, &e); err != nil {
			http.Error(w, "bad envelope: "+err.Error(), http.StatusBadRequest)
			return
		}
		got = append(got, Delivery{
			WebhookID: req.Header.Get("webhook-id"), ID: e.ID, Operation: e.OperationType,
			DocKey: string(e.DocumentKey), Envelope: env, SigOK: sigOK, At: now,
			Traceparent: req.Header.Get("traceparent"),
		})
	}
	r.mu.Lock()
	r.deliveries = append(r.deliveries, got...)
	cb := r.onDelivery
	r.mu.Unlock()
	if cb != nil {
		for _, d := range got {
			cb(d)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// Deliveries returns a copy of what was received, in arrival order.
func (r *Receiver) Deliveries() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Delivery(nil), r.deliveries...)
}

// Count returns the number of envelopes received.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.deliveries)
}

// Requests returns the number of requests received (accepted or not) and
// how many had a bad signature.
func (r *Receiver) Requests() (total, badSignature int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, r.badSig
}

// Unavailable returns a responder answering status with a Retry-After of
// retryAfter seconds until the given time.
func Unavailable(until time.Time, status, retryAfter int) func([]byte) *Response {
	return func([]byte) *Response {
		if time.Now().Before(until) {
			return &Response{Status: status, RetryAfter: strconv.Itoa(retryAfter)}
		}
		return nil
	}
}

// String summarises the receiver for test failures.
func (r *Receiver) String() string {
	t, b := r.Requests()
	return fmt.Sprintf("receiver: %d envelopes, %d requests, %d bad signatures", r.Count(), t, b)
}
