//go:build !linux

package receiver

import "net"

// setBacklog leaves the accept queue as it is where a second listen(2) is
// not known to resize it.
func setBacklog(net.Listener, int) {}
