package chaos

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/changegate/changegate/test/receiver"
)

// hookMode is what an endpoint does with requests.
type hookMode int

const (
	hookNormal          hookMode = iota // 204 and record
	hookUnavailable                     // 503 with Retry-After
	hookUnavailableBare                 // 503 without Retry-After
	hookRefusing                        // listener closed: connections refused
)

// request is one request an endpoint answered (accepted or refused with 503),
// or one envelope of a batch request (a JSON array: each of its envelopes
// is recorded with the request's arrival, replica and answer). Replica is
// the last element of the URL's path when the sender's URL names it (the
// cluster campaign gives each replica its own path).
type request struct {
	EventID string
	Replica string
	Doc     int32 // the envelope's documentKey._id, when HasDoc
	HasDoc  bool
	At      time.Time
	Status  int
}

// endpoint is a webhook receiver (test/receiver) on a fixed loopback port
// whose listener can be closed and reopened, and that can answer 503 with
// Retry-After. It logs every request it answers. Safe for concurrent use.
type endpoint struct {
	rcv        *receiver.Receiver
	addr       string
	retryAfter int // seconds

	mu       sync.Mutex
	srv      *http.Server
	mode     hookMode
	requests []request
}

func newEndpoint(secret string, retryAfter int) (*endpoint, error) {
	e := &endpoint{rcv: receiver.NewHandler(secret), retryAfter: retryAfter}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e.addr = ln.Addr().String()
	e.rcv.SetResponder(e.respond)
	e.serve(ln)
	return e, nil
}

func (e *endpoint) URL() string { return "http://" + e.addr + "/hook" }

func (e *endpoint) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(e.handle), ReadHeaderTimeout: 10 * time.Second}
	e.srv = srv
	go func() { _ = srv.Serve(ln) }()
}

// handle records every request that reached the receiver: its event id,
// the replica named by the path, its arrival and the answer.
func (e *endpoint) handle(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	var envs []json.RawMessage // a fresh slice: RawMessage decodes by appending to its element
	if len(body) > 0 && body[0] == '[' {
		_ = json.Unmarshal(body, &envs)
	} else {
		envs = []json.RawMessage{body}
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	e.rcv.ServeHTTP(sw, req)
	replica := strings.TrimPrefix(strings.TrimPrefix(req.URL.Path, "/hook"), "/")
	rs := make([]request, 0, len(envs))
	for _, raw := range envs {
		var env struct {
			ID          string `json:"id"`
			DocumentKey struct {
				ID json.Number `json:"_id"`
			} `json:"documentKey"`
		}
		_ = json.Unmarshal(raw, &env)
		doc, derr := strconv.ParseInt(string(env.DocumentKey.ID), 10, 32)
		rs = append(rs, request{EventID: env.ID, Replica: replica, At: at, Status: sw.status, Doc: int32(doc), HasDoc: derr == nil})
	}
	e.mu.Lock()
	e.requests = append(e.requests, rs...)
	e.mu.Unlock()
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// respond decides the answer from the endpoint's mode.
func (e *endpoint) respond([]byte) *receiver.Response {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.mode {
	case hookUnavailable:
		return &receiver.Response{Status: http.StatusServiceUnavailable, RetryAfter: strconv.Itoa(e.retryAfter)}
	case hookUnavailableBare:
		return &receiver.Response{Status: http.StatusServiceUnavailable}
	}
	return nil
}

// setMode switches the endpoint's behaviour; refusing closes the listener and
// every open connection, leaving it reopens the listener on the same port.
func (e *endpoint) setMode(m hookMode) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m == e.mode {
		return nil
	}
	if m == hookRefusing {
		_ = e.srv.Close()
	} else if e.mode == hookRefusing {
		ln, err := net.Listen("tcp", e.addr)
		if err != nil {
			return err
		}
		e.serve(ln)
	}
	e.mode = m
	return nil
}

// Requests returns a copy of the request log, in arrival order.
func (e *endpoint) Requests() []request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]request(nil), e.requests...)
}

// Close stops the server.
func (e *endpoint) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mode != hookRefusing {
		_ = e.srv.Close()
	}
	e.mode = hookRefusing
}
