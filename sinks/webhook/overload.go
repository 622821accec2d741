package webhook

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// slowConnectSlack is how much longer than twice the fastest connection
// set-up seen a TCP connect may take before it counts as a sign of
// overload. A connection attempt the receiver's full accept queue dropped
// is retried by the client's TCP after its initial retransmission timeout
// (1 s on Linux, RFC 6298), so every such attempt takes at least that much
// more than the path's round trip, and one that does not is at most a
// little jitter above it.
const slowConnectSlack = 500 * time.Millisecond

// maxDialing bounds the TCP connects in progress at once to a receiver. A
// limit that steps from 2,048 to 4,096 opened thousands of connections at
// once: more SYNs than the kernel's SYN queue takes (tcp_max_syn_backlog,
// 2,048 here) were dropped and retried a second later by TCP, and those
// slow connects, counted as overload, halved a limit the receiver was
// keeping up with (bench scenario 10, 1 s receiver: 52% of the best fixed
// limit). Connects beyond this wait for a slot, and the wait is not
// connect time; a receiver whose own backlog is small (5) still overflows
// at this many and is still seen.
const maxDialing = 64

// overloadWatch reports the signs of an overloaded receiver that a
// request's outcome does not show (sinks.OverloadNotifier): a connect that
// took far longer than the fastest one seen (slowConnectSlack), and a
// connection refused or reset that go-retryablehttp retried. Safe for
// concurrent use.
type overloadWatch struct {
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	fast   atomic.Int64 // the fastest connect seen, in nanoseconds; 0: none yet
	notify atomic.Pointer[func(time.Time)]
	// dialing holds a slot per connect in progress (maxDialing).
	dialing chan struct{}
}

// NotifyOverload implements sinks.OverloadNotifier.
func (w *Webhook) NotifyOverload(notify func(at time.Time)) { w.overload.notify.Store(&notify) }

func (o *overloadWatch) signal(at time.Time) {
	if f := o.notify.Load(); f != nil {
		(*f)(at)
	}
}

// dialContext dials as the transport's dialer and times the connect.
func (o *overloadWatch) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if o.dialing != nil {
		select {
		case o.dialing <- struct{}{}:
			defer func() { <-o.dialing }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	start := time.Now()
	c, err := o.dial(ctx, network, addr)
	if err != nil {
		return c, err // a refused connect is seen by Webhook.checkRetry
	}
	took := time.Since(start)
	fast := o.fast.Load()
	for (fast == 0 || int64(took) < fast) && !o.fast.CompareAndSwap(fast, int64(took)) {
		fast = o.fast.Load()
	}
	if fast > 0 && took > 2*time.Duration(fast)+slowConnectSlack {
		o.signal(start)
	}
	return c, nil
}

// refusedOrReset reports whether err is a connection refused or reset by
// the receiver.
func refusedOrReset(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
