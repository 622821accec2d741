package receiver

import (
	"net"
	"syscall"
)

// setBacklog sets the accept queue of ln, a listening TCP socket, to n
// connections: Linux applies a second listen(2) to a listening socket.
func setBacklog(ln net.Listener, n int) {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) { _ = syscall.Listen(int(fd), n) })
}
