package receiver

import (
	"net"
	"net/http"
	"net/http/httptest"
	"time"
)

// NewSmall starts a receiver that behaves like a small one written with
// Python's http.server (ThreadingHTTPServer, HTTP/1.0): every answer
// closes its connection (Connection: close), so each request sets up a new
// one; the listen backlog is backlog connections (Python's default is 5;
// Linux drops a connection attempt, SYN or final ACK, while the accept
// queue is full, and the client's TCP retries it after 1 s, then 3 s,
// 7 s ...); and the accept loop takes acceptEvery per connection (the
// single accepting thread, slowed by the interpreter's lock while handler
// threads run), so a burst of connection attempts fills the backlog.
// Signatures are verified with secrets as New's.
func NewSmall(backlog int, acceptEvery time.Duration, secrets ...string) *Receiver {
	r := &Receiver{secrets: secrets}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Connection", "close")
		r.serve(w, req)
	}))
	setBacklog(s.Listener, backlog)
	s.Listener = slowAccept{Listener: s.Listener, every: acceptEvery}
	s.Config.SetKeepAlivesEnabled(false)
	s.Start()
	r.Server = s
	return r
}

// slowAccept is a listener whose Accept takes at least every.
type slowAccept struct {
	net.Listener
	every time.Duration
}

func (l slowAccept) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && l.every > 0 {
		time.Sleep(l.every)
	}
	return c, err
}
