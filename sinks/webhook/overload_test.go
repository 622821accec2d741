//go:build linux

package webhook

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
)

// A connection set-up that the receiver's full accept queue held for a
// second (Linux dropped the attempt and the client's TCP retried it) is
// reported as a sign of overload (sinks.OverloadNotifier), though the
// request then succeeds.
func TestSlowConnectIsOverload(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.Control(func(fd uintptr) { _ = syscall.Listen(int(fd), 1) }) // an accept queue of 1
	// Nothing accepts yet: fill the queue until a connection attempt is
	// dropped.
	full := false
	for range 8 {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond)
		if err != nil {
			full = true
			break
		}
		defer c.Close()
	}
	if !full {
		t.Skip("this kernel does not drop connection attempts to a full accept queue")
	}

	w, err := New(Config{Name: "hook", URL: "http://" + ln.Addr().String() + "/", AllowPrivateNetworks: true, Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var signs atomic.Int32
	var at atomic.Pointer[time.Time]
	w.NotifyOverload(func(t time.Time) { signs.Add(1); at.Store(&t) })
	w.overload.fast.Store(int64(100 * time.Microsecond)) // the connections before were quick
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})}
	defer srv.Close()
	go func() {
		time.Sleep(300 * time.Millisecond)
		srv.Serve(ln) // drains the queue
	}()
	sent := time.Now()
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(sent)
	if signs.Load() != 1 {
		t.Fatalf("%d signs of overload after a request that waited %v for its connection, want 1", signs.Load(), took)
	}
	if a := *at.Load(); a.Before(sent) || a.After(sent.Add(100*time.Millisecond)) {
		t.Errorf("the sign is dated %v after the request started, want its connection attempt's start", a.Sub(sent))
	}

	// A quick connection set-up is no sign.
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 2)}); err != nil {
		t.Fatal(err)
	}
	w.transport.CloseIdleConnections()
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 3)}); err != nil {
		t.Fatal(err)
	}
	if n := signs.Load(); n != 1 {
		t.Fatalf("%d signs of overload after quick connection set-ups, want still 1", n)
	}
}
