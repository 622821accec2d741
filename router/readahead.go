package router

import (
	"context"
	"sync"
	"time"
)

// readAheadRounds is how many rounds of requests a lane may hold from its
// oldest unfinished item on: readAheadRounds × its concurrency limit (the
// limiter's current one, or max_in_flight) × batch_size items. Enough to
// keep every request slot busy and to fill the next rounds' batches (and a
// slow start's ×4 step), and no more: events read further ahead are only
// delivered out of read order, ahead of the checkpoint, and sent again
// after a crash. With a small receiver (limit 1–8) that is at most 64
// events; a request the receiver holds for seconds then holds back a few
// dozen deliveries, not thousands.
const readAheadRounds = 8

// readAheadPoll bounds a source's wait for room in a lane's window: the
// lane's limit may have grown meanwhile, or the lane been parked.
const readAheadPoll = 50 * time.Millisecond

// readAheadStall is how long a lane's oldest unfinished item may stay
// unfinished before the lane counts as lagging: its window then grows as a
// failing lane's does (ParkBacklog), so that a receiver holding requests
// for long (a hung endpoint, a long timeout) does not hold back the other
// sinks of its sources for that long. A small receiver's slow requests
// (seconds) stay below it, and keep the window short.
const readAheadStall = 10 * time.Second

// window is a lane's read-ahead window: the items handed to the lane
// (item.seq, in order) from the oldest one not yet finished (released:
// delivered, dead-lettered, parked, dropped) to the newest. Its span is
// what the source's checkpoint may lag behind the lane's deliveries. It is
// safe for concurrent use.
type window struct {
	mu   sync.Mutex
	done []bool // ring by seq: finished, not yet passed by base
	mask uint64
	base uint64 // oldest seq not finished
	next uint64 // one past the newest seq added
	low  uint64 // wake is closed once the span is down to low
	wake chan struct{}
	// moved is when base last moved, or the window last became non-empty:
	// how long the oldest unfinished item has held the window (stalled).
	moved time.Time
}

func newWindow() *window {
	return &window{done: make([]bool, 64), mask: 63}
}

// add adds seq, the next item's (items are added in seq order).
func (w *window) add(seq uint64) {
	w.mu.Lock()
	if w.next == w.base {
		w.moved = time.Now()
	}
	if seq-w.base >= uint64(len(w.done)) {
		w.grow()
	}
	w.done[seq&w.mask] = false
	w.next = seq + 1
	w.mu.Unlock()
}

// grow doubles the ring. Must be called with mu held.
func (w *window) grow() {
	done := make([]bool, 2*len(w.done))
	mask := uint64(len(done) - 1)
	for s := w.base; s < w.next; s++ {
		done[s&mask] = w.done[s&w.mask]
	}
	w.done, w.mask = done, mask
}

// finish marks seq finished and moves base past every finished item.
func (w *window) finish(seq uint64) {
	w.mu.Lock()
	w.done[seq&w.mask] = true
	if w.base < w.next && w.done[w.base&w.mask] {
		w.moved = time.Now()
	}
	for w.base < w.next && w.done[w.base&w.mask] {
		w.base++
	}
	if w.wake != nil && w.next-w.base <= w.low {
		close(w.wake)
		w.wake = nil
	}
	w.mu.Unlock()
}

// span returns the number of items from the oldest unfinished one on.
func (w *window) span() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next - w.base
}

// stalled reports whether the oldest unfinished item has held the window
// for longer than d.
func (w *window) stalled(d time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next != w.base && time.Since(w.moved) > d
}

// full returns nil when the span is below limit, else a channel closed once
// it is down to low (or less).
func (w *window) full(limit, low uint64) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next-w.base < limit {
		return nil
	}
	if w.wake == nil {
		w.wake = make(chan struct{})
		w.low = low
	} else {
		w.low = max(w.low, low)
	}
	return w.wake
}

// aheadLimit returns how many items the lane may hold from its oldest
// unfinished one on (readAheadRounds). A failing sink, or one whose oldest
// unfinished item has held the window for readAheadStall, may hold up to
// ParkBacklog: the other sinks of its sources go on meanwhile, and the
// lane is parked once it holds that many (Lane.watch), as before the
// read-ahead bound, rather than holding them for park_after.
func (l *Lane) aheadLimit() uint64 {
	c := l.spec.MaxInFlight
	if a, ok := l.d.limit.(adaptive); ok {
		c = a.current()
	}
	n := readAheadRounds * max(c, 1) * l.spec.BatchSize
	if l.spec.ParkBacklog > 0 && (!l.d.failing().IsZero() || l.q.win.stalled(readAheadStall)) {
		n = max(n, l.spec.ParkBacklog)
	}
	return uint64(n)
}

// waitAhead waits while the lane's window is full (see readAheadRounds)
// and the lane is live: a parked lane writes what it is given to the
// store, at the store's pace. It returns ctx's error if ctx ends first.
func (l *Lane) waitAhead(ctx context.Context) error {
	for {
		if l.parked.Load() {
			return nil
		}
		limit := l.aheadLimit()
		ch := l.q.win.full(limit, limit/2)
		if ch == nil {
			return nil
		}
		t := time.NewTimer(readAheadPoll)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
	}
}

// ReadAhead returns the wait a source named source makes before it reads
// the next event (checkpoint.Tracker.SetGate): while a lane that one of its
// rules routes to holds a full window (Lane.waitAhead), the source stops
// reading, as it does at max_in_flight_events. The lanes are looked up at
// each call, so a reload applies at once.
func (e *Engine) ReadAhead(source string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		st := e.state.Load()
		for _, i := range st.sourceLanes[source] {
			if err := st.lanes[i].waitAhead(ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

// sourceLanes returns, per source, the indexes of the lanes its rules route
// to.
func sourceLanes(r *Rules) map[string][]int {
	out := map[string][]int{}
	for src, rules := range r.bySource {
		seen := map[int]bool{}
		for _, ru := range rules {
			for _, s := range ru.sinks {
				if !seen[s] {
					seen[s] = true
					out[src] = append(out[src], s)
				}
			}
		}
	}
	return out
}
