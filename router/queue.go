package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/event"
)

// item is one event waiting for one sink, with its delivery history.
type item struct {
	ev       *event.Event
	done     func() // acks the event for this sink; nil for replays and re-drives
	key      uint64 // ev.OrderingKeyHash()
	attempts int
	first    time.Time
	// retryAt is the earliest time of the next attempt: the backoff or
	// Retry-After in force. It survives parking (deadletter.Entry.RetryAt).
	retryAt  time.Time
	firstErr string
	lastErr  string
	reason   string
}

// partition is a FIFO of items delivered one batch at a time, in order.
type partition struct {
	mu   sync.Mutex
	q    []*item
	wake chan struct{}
	seen map[uint64]int // distinctKeys' scratch space, guarded by mu
}

// keyQueue is the queue stage of a lane: it keeps per-key order by sending
// every event of an ordering key to the same partition, and one worker per
// partition takes batches in which no key appears twice. It counts what is
// queued and what workers hold (taken, not finished).
type keyQueue struct {
	ordering Ordering
	parts    []*partition
	rr       atomic.Uint64
	clk      clock

	queued atomic.Int64 // in partitions
	held   atomic.Int64 // taken by a worker, not released

	mQueue prometheus.Gauge
}

func newKeyQueue(ordering Ordering, n int, clk clock, mQueue prometheus.Gauge) *keyQueue {
	q := &keyQueue{ordering: ordering, clk: clk, mQueue: mQueue}
	for range n {
		q.parts = append(q.parts, &partition{wake: make(chan struct{}, 1)})
	}
	return q
}

func (q *keyQueue) partitionFor(key uint64) *partition {
	switch {
	case len(q.parts) == 1:
		return q.parts[0]
	case q.ordering == OrderNone:
		return q.parts[q.rr.Add(1)%uint64(len(q.parts))]
	default:
		return q.parts[key%uint64(len(q.parts))]
	}
}

// push queues it behind the earlier items of its key.
func (q *keyQueue) push(it *item) {
	p := q.partitionFor(it.key)
	p.mu.Lock()
	p.q = append(p.q, it)
	q.queued.Add(1)
	p.mu.Unlock()
	q.mQueue.Inc()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// wakeAll wakes every partition's worker.
func (q *keyQueue) wakeAll() {
	for _, p := range q.parts {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// release reports that a worker finished n held items.
func (q *keyQueue) release(n int) { q.held.Add(-int64(n)) }

// backlog returns the number of items queued or held.
func (q *keyQueue) backlog() int64 { return q.queued.Load() + q.held.Load() }

// empty reports whether nothing is queued or held. take counts an item as
// held before it stops counting it as queued, so reading queued first
// cannot miss an item moving between the two.
func (q *keyQueue) empty() bool { return q.queued.Load() == 0 && q.held.Load() == 0 }

// take removes up to max items from p, waiting up to wait to fill a batch.
// It returns nil when ctx is done. The items are held until released.
func (q *keyQueue) take(ctx context.Context, p *partition, max int, wait time.Duration) []*item {
	waited := false
	for {
		p.mu.Lock()
		if n := len(p.q); n > 0 {
			if n < max && wait > 0 && !waited {
				p.mu.Unlock()
				waited = true
				if !sleep(ctx, q.clk, wait) {
					return nil
				}
				continue
			}
			if n > max {
				n = max
			}
			if n > 1 && q.ordering != OrderNone {
				// A batch API may fail one entry and accept the next:
				// a document appears at most once per batch, so its
				// later events cannot overtake a failed one.
				n = p.distinctKeys(p.q[:n])
			}
			batch := make([]*item, n)
			copy(batch, p.q)
			clear(p.q[:n])
			p.q = p.q[n:]
			if len(p.q) == 0 {
				p.q = nil
			}
			q.held.Add(int64(n))
			q.queued.Add(-int64(n))
			p.mu.Unlock()
			q.mQueue.Sub(float64(n))
			return batch
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

// distinctKeys returns the length of the longest prefix of q in which no two
// events have the same ordering key (at least 1). Must be called with p.mu
// held.
func (p *partition) distinctKeys(q []*item) int {
	if len(q) <= 16 {
		for i := 1; i < len(q); i++ {
			for _, prev := range q[:i] {
				if prev.key == q[i].key && prev.ev.SameOrderingKey(q[i].ev) {
					return i
				}
			}
		}
		return len(q)
	}
	if p.seen == nil {
		p.seen = make(map[uint64]int, len(q))
	}
	defer clear(p.seen)
	for i, it := range q {
		if j, dup := p.seen[it.key]; dup {
			if q[j].ev.SameOrderingKey(it.ev) {
				return i
			}
			// Two keys with the same hash: compare the keys themselves.
			return distinctKeysSlow(q)
		}
		p.seen[it.key] = i
	}
	return len(q)
}

// distinctKeysSlow is distinctKeys comparing the ordering keys themselves.
func distinctKeysSlow(q []*item) int {
	seen := make(map[string]struct{}, len(q))
	for i, it := range q {
		k := it.ev.OrderingKey()
		if _, dup := seen[k]; dup {
			return i
		}
		seen[k] = struct{}{}
	}
	return len(q)
}
