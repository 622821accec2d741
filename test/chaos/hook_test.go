package chaos

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/changegate/changegate/test/receiver"
)

// hookMode is what an endpoint does with requests.
type hookMode int

const (
	hookNormal      hookMode = iota // 204 and record
	hookUnavailable                 // 503 with Retry-After
	hookRefusing                    // listener closed: connections refused
)

// request is one request an endpoint answered (accepted or refused with 503).
type request struct {
	EventID string
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
	srv := &http.Server{Handler: e.rcv, ReadHeaderTimeout: 10 * time.Second}
	e.srv = srv
	go func() { _ = srv.Serve(ln) }()
}

func (e *endpoint) respond(body []byte) *receiver.Response {
	var env struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &env)
	e.mu.Lock()
	defer e.mu.Unlock()
	r := request{EventID: env.ID, At: time.Now(), Status: http.StatusNoContent}
	var resp *receiver.Response
	if e.mode == hookUnavailable {
		r.Status = http.StatusServiceUnavailable
		resp = &receiver.Response{Status: r.Status, RetryAfter: strconv.Itoa(e.retryAfter)}
	}
	e.requests = append(e.requests, r)
	return resp
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
