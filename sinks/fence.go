package sinks

import (
	"context"
	"errors"
)

// ErrFenced is returned (wrapped) by CheckFence, and so by a Send, when the
// tenure of an event of the batch ended (cluster mode: the unit's lease was
// lost or handed over) before the request was written. The delivery engine
// drops such events unacknowledged; it is not a failure of the destination.
var ErrFenced = errors.New("unit no longer owned: request not sent")

type fenceKey struct{}

// WithFence returns ctx carrying held, which reports whether every event of
// the batch is still owned by this process. The delivery engine sets it on
// the context it passes to Send.
func WithFence(ctx context.Context, held func() bool) context.Context {
	return context.WithValue(ctx, fenceKey{}, held)
}

// CheckFence returns ErrFenced when ctx carries a fence that no longer
// holds, else ctx's error. A sink calls it immediately before it writes a
// request (after encoding and signing), so that a request is not written
// for a unit whose lease ended while the batch waited or was prepared.
func CheckFence(ctx context.Context) error {
	if held, ok := ctx.Value(fenceKey{}).(func() bool); ok && !held() {
		return ErrFenced
	}
	return ctx.Err()
}
