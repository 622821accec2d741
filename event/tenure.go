package event

import (
	"sync"
	"time"
)

// Tenure is one period during which this process owns a unit of work (a
// source, or one partition of it) in cluster mode: from the acquisition of
// the unit's lease to its loss or release. Events read during a tenure
// carry it (Event.Tenure). Once the tenure is over, whatever of its events
// is still queued is dropped rather than delivered, parked or dead-lettered:
// the unit's next owner re-reads it from the checkpoint. A Tenure is safe
// for concurrent use.
type Tenure struct {
	// Unit names the unit of work, e.g. "orders" or "orders#2/4".
	Unit string
	// Epoch is the lease epoch of this tenure (the fencing token).
	Epoch int64

	mu       sync.Mutex
	deadline time.Time // local, monotonic; zero: none
	ended    bool
}

// NewTenure returns the tenure of unit under epoch, held until deadline (a
// local time read from time.Now, so it carries the monotonic clock; zero
// means no deadline).
func NewTenure(unit string, epoch int64, deadline time.Time) *Tenure {
	return &Tenure{Unit: unit, Epoch: epoch, deadline: deadline}
}

// Extend moves the deadline to d after a renewal.
func (t *Tenure) Extend(d time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deadline = d
}

// End ends the tenure (lease lost or released); it cannot be undone.
func (t *Tenure) End() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
}

// Held reports whether the tenure is still on: not ended and before its
// deadline. A nil Tenure (single process mode) is always held.
func (t *Tenure) Held() bool {
	if t == nil {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.ended && (t.deadline.IsZero() || time.Now().Before(t.deadline))
}
