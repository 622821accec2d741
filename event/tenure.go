package event

import (
	"context"
	"sync"
	"time"
)

// Tenure is one period during which this process owns a unit of work (a
// source, or one partition of it) in cluster mode: from the acquisition of
// the unit's lease to its loss or release. Events read during a tenure
// carry it (Event.Tenure). Once the tenure is over, whatever of its events
// is still queued is dropped rather than delivered, parked or dead-lettered:
// the unit's next owner re-reads it from the checkpoint.
//
// A tenure is also a cancellation: Done is closed when it ends (End, or its
// local deadline passed), so that every wait of the unit's work (limiter,
// backoff, pause, re-drive) ends with it. Senders bracket each request with
// Enter and Exit, and Quiesce waits until no request of the tenure is in
// progress: a handover ends the tenure, quiesces, and only then releases
// the lease, so nothing of the unit is sent after the release. A Tenure is
// safe for concurrent use; it must be made with NewTenure.
type Tenure struct {
	// Unit names the unit of work, e.g. "orders" or "orders#2/4".
	Unit string
	// Epoch is the lease epoch of this tenure (the fencing token).
	Epoch int64

	mu       sync.Mutex
	deadline time.Time // local, monotonic; zero: none
	ended    bool
	draining bool          // Drain: no new request, the ones in progress finish
	done     chan struct{} // closed when the tenure ends
	timer    *time.Timer   // fires at the deadline
	inflight int           // requests between Enter and Exit
	quiet    chan struct{} // closed when inflight drops to 0 after the end
}

// NewTenure returns the tenure of unit under epoch, held until deadline (a
// local time read from time.Now, so it carries the monotonic clock; zero
// means no deadline).
func NewTenure(unit string, epoch int64, deadline time.Time) *Tenure {
	t := &Tenure{Unit: unit, Epoch: epoch, deadline: deadline, done: make(chan struct{})}
	if !deadline.IsZero() {
		// Under the lock: the timer may fire before it is stored.
		t.mu.Lock()
		t.timer = time.AfterFunc(time.Until(deadline), t.expire)
		t.mu.Unlock()
	}
	return t
}

// expire ends the tenure if its deadline passed (the timer may fire for a
// deadline Extend has moved since).
func (t *Tenure) expire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.checkLocked()
}

// checkLocked ends the tenure when its deadline passed; t.mu is held.
func (t *Tenure) checkLocked() {
	if !t.ended && !t.deadline.IsZero() && !time.Now().Before(t.deadline) {
		t.endLocked()
	}
}

func (t *Tenure) endLocked() {
	if t.ended {
		return
	}
	t.ended = true
	if t.done != nil {
		close(t.done)
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	if t.inflight == 0 && t.quiet != nil {
		close(t.quiet)
		t.quiet = nil
	}
}

// Extend moves the deadline to d after a renewal. A tenure that already
// ended (or whose deadline already passed) stays ended.
func (t *Tenure) Extend(d time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.checkLocked()
	if t.ended {
		return
	}
	t.deadline = d
	if t.timer != nil {
		t.timer.Reset(time.Until(d))
	}
}

// End ends the tenure (lease lost or released); it cannot be undone.
func (t *Tenure) End() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endLocked()
}

// Held reports whether the tenure is still on: not ended and before its
// deadline. A nil Tenure (single process mode) is always held.
func (t *Tenure) Held() bool {
	if t == nil {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.checkLocked()
	return !t.ended && !t.draining
}

// Done returns a channel closed when the tenure ends; nil (never closed)
// for a nil Tenure.
func (t *Tenure) Done() <-chan struct{} {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil { // a Tenure not made by NewTenure
		t.done = make(chan struct{})
		if t.ended {
			close(t.done)
		}
	}
	return t.done
}

// Enter registers a request about to be written for the tenure's unit and
// reports whether the tenure is held; only then must the request be made,
// and Exit called once it returned. A nil Tenure always enters.
func (t *Tenure) Enter() bool {
	if t == nil {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.checkLocked()
	if t.ended || t.draining {
		return false
	}
	t.inflight++
	return true
}

// Exit ends a request that Enter admitted.
func (t *Tenure) Exit() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inflight--
	if t.inflight == 0 && (t.ended || t.draining) && t.quiet != nil {
		close(t.quiet)
		t.quiet = nil
	}
}

// Drain ends the tenure gracefully, for a handover or a shutdown: from now
// on it is no longer held (no new request is admitted, and a sender checking
// the fence before a transport retry stops), but the requests in progress
// are not cancelled: Drain waits until none is (or ctx is done), and only
// then ends the tenure, which cancels the waits of its queued work. A
// cancelled request may already be on the wire and reach its receiver after
// the lease is released; one left to finish has reached it. It returns
// ctx's error when requests were still in progress.
func (t *Tenure) Drain(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	t.checkLocked()
	if t.ended || t.inflight == 0 {
		t.endLocked()
		t.mu.Unlock()
		return nil
	}
	t.draining = true
	if t.quiet == nil {
		t.quiet = make(chan struct{})
	}
	q := t.quiet
	t.mu.Unlock()
	var err error
	select {
	case <-q:
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.End()
	return err
}

// Quiesce waits until the tenure has ended and no request it admitted is in
// progress (or ctx is done; it then returns ctx's error). End first: the
// requests of an ended tenure are cancelled through Done.
func (t *Tenure) Quiesce(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	if t.ended && t.inflight == 0 {
		t.mu.Unlock()
		return nil
	}
	if t.quiet == nil {
		t.quiet = make(chan struct{})
	}
	q := t.quiet
	t.mu.Unlock()
	select {
	case <-q:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
