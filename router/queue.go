package router

import (
	"context"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
)

// item is one event waiting for one sink, with its delivery history. Make
// one with newItem (a barrier has no event).
type item struct {
	ev   *event.Event
	done func() // acks the event for this sink; nil for replays and re-drives
	key  uint64 // ev.OrderingKeyHash()
	// The fields of ev every pass over a batch reads, copied by newItem
	// while the event is in the cache: the passes after a request
	// (success, release) read the item's own cache line instead of two
	// more of the event's, cold again by then. Neither changes once an
	// event is handed to a sink.
	mem    *memory.Charge // ev.Mem
	tenure *event.Tenure  // ev.Tenure
	wall   int64          // ev.WallTime in unix nanos; noWall when zero
	// obs is what the item's outcomes are told to (nil: no observer);
	// finished: it had a final outcome (else release reports it
	// abandoned).
	obs      *edges
	released bool // release ran (the item's holder is the only one to call it)
	finished bool // beside released and attempts: the item is 160 bytes, a size class
	attempts int32
	first    time.Time
	// retryAt is the earliest time of the next attempt: the backoff or
	// Retry-After in force. It survives parking (deadletter.Entry.RetryAt).
	retryAt  time.Time
	firstErr string
	lastErr  string
	// grp is the transaction group the item belongs to (transactions =
	// "group"): its items are consecutive in one partition and taken as
	// one batch. bar, set on an item without an event, is a barrier: it
	// holds its partition (where later changes of one of the group's
	// documents queue) until the group is finished.
	grp, bar *txnGroup
	// seq is the item's place in the order the lane was handed its items
	// (keyQueue.push): ready partitions are served oldest head first. win
	// is the lane's read-ahead window the item counts in until released
	// (nil: it does not, as a barrier or an item of a re-drive).
	seq uint64
	win *window
}

// noWall is item.wall for an event without a wall time.
const noWall = math.MinInt64

// newItem returns the item of ev (see item for the fields it copies).
func newItem(ev *event.Event) *item {
	it := &item{ev: ev, mem: ev.Mem, tenure: ev.Tenure, wall: noWall}
	if !ev.WallTime.IsZero() {
		it.wall = ev.WallTime.UnixNano()
	}
	return it
}

// release returns the item's reference to its event's share of the byte
// budget (event.Event.Mem), once: it is called when the lane no longer
// holds the item, whatever the outcome.
func (it *item) release() {
	if it.released {
		return
	}
	it.released = true
	it.mem.Release() // nil for a barrier, or an event nothing counts
	it.abandon()
	if it.win != nil {
		it.win.finish(it.seq)
	}
}

func releaseItems(items []*item) {
	for _, it := range items {
		it.release()
	}
}

// partition is a FIFO of items delivered one batch at a time, in order. Its
// fields are guarded by the keyQueue's mu.
type partition struct {
	q     []*item // q[0].seq is its place in the ready heap
	state partState
	seen  keySet // distinctKeys' scratch space
}

// partState is where a partition is in the keyQueue's schedule.
type partState uint8

const (
	partIdle  partState = iota // empty, or being filled before it is scheduled
	partReady                  // has items; in the ready list
	partBusy                   // a worker has it (one batch in flight)
)

// keyQueue is the queue stage of a lane: it keeps per-key order by sending
// every event of an ordering key to the same partition, and schedules
// partitions onto a pool of workers, mailbox-style: a partition with items
// waits among the ready ones until a worker takes it, and is busy (not
// ready) while that worker delivers one batch from it, in which no key
// appears twice (a batching lane's batch also takes from the next ready
// partitions, which are then busy too: gather). So a partition has at most
// one batch in flight, which keeps per-key order, and a busy worker takes
// the next ready partition instead of sleeping.
//
// Ready partitions are served oldest first: the one whose head item was
// handed to the lane first (item.seq), so that events go out in about the
// order they were read across documents, as far as per-document order
// allows, and the source's checkpoint, which waits for the oldest event
// not yet delivered, follows the deliveries closely. (A FIFO of partitions
// served a partition's later items a whole round of the ready list after
// its first: with thousands of events queued, a crash re-sent most of what
// had been delivered.)
//
// The pool grows on demand up to one worker per partition, but keeps the
// workers that are not waiting (for a backoff, a Retry-After or to fill a
// batch) at the target: the limiter's current concurrency limit for an
// auto lane. Idle workers sleep until a partition is ready and fewer than
// the target are active. At zero latency a handful of workers loop over
// the ready partitions; against a slow receiver, as many run as the
// limiter admits. It counts what is queued and what workers hold (taken,
// not finished).
type keyQueue struct {
	ordering Ordering
	parts    []*partition
	rr       atomic.Uint64
	clk      clock

	mu      sync.Mutex
	ready   readyHeap  // partitions with items, not busy: oldest head first
	nextSeq uint64     // item.seq of the next item pushed
	win     *window    // the read-ahead window items count in (nil: none)
	cond    *sync.Cond // idle workers wait on it
	workers int        // alive
	idle    int        // in next, waiting for a ready partition
	waiting int        // in a timed wait (backoff, pause, batch wait)
	closed  bool
	target  func() int // workers wanted active; nil or <= 0: one per partition
	spawn   func()     // starts a worker; called with mu held
	// follow: a worker beyond the target goes idle rather than take a
	// ready partition (see next). Set for a lane that sends one event per
	// request; a batching lane keeps such workers going, because a
	// partition held busy while its worker queues in the limiter fills
	// its next batch meanwhile (scenario 5's ~60 events per request fall
	// to ~25 without it).
	follow bool
	// gather: a batch that one partition does not fill takes more from
	// the next ready ones (see take). Set for a batching lane: batches
	// then fill from the whole lane's backlog, not from the share of it
	// one partition holds (1/100 of it for batch_size 100 and the
	// default max_in_flight_events).
	gather bool

	queued atomic.Int64 // in partitions
	held   atomic.Int64 // taken by a worker, not released

	mQueue prometheus.Gauge
}

func newKeyQueue(ordering Ordering, n int, clk clock, mQueue prometheus.Gauge) *keyQueue {
	q := &keyQueue{ordering: ordering, clk: clk, mQueue: mQueue}
	q.cond = sync.NewCond(&q.mu)
	for range n {
		q.parts = append(q.parts, &partition{})
	}
	return q
}

// run sets the pool's target and how to start a worker; the pool starts
// workers only once run was called, and none after close.
func (q *keyQueue) run(target func() int, spawn func()) {
	q.mu.Lock()
	q.target, q.spawn = target, spawn
	q.schedule()
	q.mu.Unlock()
}

// close stops the pool: idle workers exit, busy ones after their batch, and
// no new one starts.
func (q *keyQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

// discard empties the partitions of a closed queue whose workers exited and
// returns what was still queued (unacknowledged: re-read after a restart).
func (q *keyQueue) discard() []*item {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*item
	for _, p := range q.parts {
		out = append(out, p.q...)
		n := len(p.q)
		clear(p.q)
		p.q = p.q[:0]
		q.queued.Add(-int64(n))
		q.mQueue.Sub(float64(n))
		p.state = partIdle
	}
	clear(q.ready)
	q.ready = q.ready[:0]
	return out
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

// stamp gives it its place in the lane's order and in the read-ahead
// window. Must be called with mu held.
func (q *keyQueue) stamp(it *item) {
	it.seq = q.nextSeq
	q.nextSeq++
	if q.win != nil {
		q.win.add(it.seq)
		it.win = q.win
	}
}

// push queues it behind the earlier items of its key.
func (q *keyQueue) push(it *item) {
	p := q.partitionFor(it.key)
	q.mu.Lock()
	q.stamp(it)
	p.q = append(p.q, it)
	q.queued.Add(1)
	if p.state == partIdle {
		q.makeReady(p)
	}
	q.mu.Unlock()
	q.mQueue.Inc()
}

// pushGroup queues the items of a transaction group, in order, in the
// partition of its first item, and a barrier in every other partition that
// holds one of its documents (ordering "key"): the group is delivered only
// once every barrier reached the head of its partition (every earlier
// change of its documents was finished), and the later changes queued
// behind a barrier wait until the group is finished. Everything is queued
// under one lock, so the barriers and groups of a lane form one order and
// a group waits only for what was queued before it: no cycle, whatever the
// partitions.
//
// The parts of one transaction (g.chain, router/txn.go) are all queued in
// the first part's partition, so each is taken only once the one before
// is finished, and each has a barrier in every partition that holds a
// document of that part or an earlier one.
func (q *keyQueue) pushGroup(g *txnGroup) {
	p := q.partitionFor(g.items[0].key)
	q.mu.Lock()
	c := g.chain
	if c != nil {
		if c.home == nil {
			c.home = p
		}
		p = c.home
	}
	n := 0
	for _, it := range g.items {
		it.grp = g
		q.stamp(it)
		p.q = append(p.q, it)
		n++
	}
	if q.ordering == OrderKey && len(q.parts) > 1 {
		bar := func(o *partition, key uint64) {
			if o == p || slicesContainsBar(o, g) {
				return
			}
			// A barrier takes the place of the group's next item, outside
			// the read-ahead window (it holds no event).
			o.q = append(o.q, &item{bar: g, key: key, seq: q.nextSeq})
			g.bars++
			n++
			if o.state == partIdle {
				q.makeReady(o)
			}
		}
		for _, it := range g.items {
			o := q.partitionFor(it.key)
			if c != nil && !slices.Contains(c.touched, o) {
				c.touched = append(c.touched, o)
			}
			bar(o, it.key)
		}
		if c != nil {
			for _, o := range c.touched {
				bar(o, 0)
			}
		}
	}
	if g.bars == 0 {
		close(g.arrived)
	}
	q.queued.Add(int64(n))
	if p.state == partIdle {
		q.makeReady(p)
	}
	q.mu.Unlock()
	q.mQueue.Add(float64(n))
}

// slicesContainsBar reports whether p's last item is g's barrier (the
// barriers of one group are appended together). Must be called with mu
// held.
func slicesContainsBar(p *partition, g *txnGroup) bool {
	return len(p.q) > 0 && p.q[len(p.q)-1].bar == g
}

// makeReady adds p, which has items, to the ready partitions and finds it
// a worker. Must be called with mu held.
func (q *keyQueue) makeReady(p *partition) {
	p.state = partReady
	q.ready.push(p)
	q.schedule()
}

// schedule wakes an idle worker, or starts one, when a partition is ready
// and fewer workers than the target are active. Must be called with mu
// held.
func (q *keyQueue) schedule() {
	if len(q.ready) == 0 || q.closed || q.spawn == nil {
		return
	}
	if q.workers-q.idle-q.waiting >= q.targetLocked() {
		return // an active worker takes it when it is done
	}
	if q.idle > 0 {
		q.cond.Signal()
		return
	}
	if q.workers < len(q.parts) {
		q.workers++
		q.spawn()
	}
}

// targetLocked returns the number of workers wanted active: the target,
// at most one per partition. Must be called with mu held.
func (q *keyQueue) targetLocked() int {
	target := len(q.parts)
	if q.target != nil {
		if t := q.target(); t > 0 {
			target = min(target, t)
		}
	}
	return target
}

// wakeAll wakes every idle worker, and starts workers for the ready
// partitions if the target allows more now (a lane that was just parked).
func (q *keyQueue) wakeAll() {
	q.mu.Lock()
	q.schedule()
	q.mu.Unlock()
	q.cond.Broadcast()
}

// next returns the next ready partition, now busy for the caller, waiting
// while none is ready. It returns nil when the queue is closed or ctx is
// done; the worker must then exit.
func (q *keyQueue) next(ctx context.Context) *partition {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed || ctx.Err() != nil {
			q.workers--
			return nil
		}
		// A worker beyond the target (the limiter's limit went down since
		// it was started) of a lane that does not batch goes idle rather
		// than take a partition: it would only queue in the limiter, a
		// park and a wake-up per request. The caller is active, so at
		// least one other worker stays active when it does.
		if len(q.ready) > 0 && (!q.follow || q.workers-q.idle-q.waiting <= q.targetLocked()) {
			p := q.ready.pop()
			p.state = partBusy
			// More ready than this worker: maybe another one should run.
			q.schedule()
			return p
		}
		q.idle++
		q.cond.Wait()
		q.idle--
	}
}

// done returns p, whose batch the caller finished, to the schedule.
func (q *keyQueue) done(p *partition) {
	q.mu.Lock()
	p.state = partIdle
	if len(p.q) > 0 {
		q.makeReady(p)
	}
	q.mu.Unlock()
}

// wait brackets a timed wait of a worker (backoff, pause, batch wait): it
// does not count as active meanwhile, so another worker may run. The
// returned function ends the wait.
func (q *keyQueue) wait() func() {
	q.mu.Lock()
	q.waiting++
	q.schedule()
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		q.waiting--
		q.mu.Unlock()
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

// take removes up to max items from p, which the caller has busy, waiting
// up to wait to fill a batch. It returns nil when ctx is done first. The
// items are held until released. more reports that a partition the batch
// was taken from still has items (the batch did not take all it had).
//
// With gather set, a batch that p alone does not fill takes more from the
// next ready partitions (whose head is a single event), which become busy
// for the caller too: they are appended to *extra, and the caller gives
// them back with done as it does p. It waits only if the ready partitions
// do not hold enough to fill the batch. Every partition still has at most one
// batch in flight, and a document's events are in one partition, so
// per-document order holds and a document appears at most once per batch.
func (q *keyQueue) take(ctx context.Context, p *partition, max int, wait time.Duration, extra *[]*partition) (batch []*item, more bool) {
	q.mu.Lock()
	plain := true
	if len(p.q) > 0 {
		// A barrier, or a transaction group, is a batch of its own.
		if head := p.q[0]; head.bar != nil {
			max, wait, plain = 1, 0, false
		} else if head.grp != nil {
			max, wait, plain = len(head.grp.items), 0, false
		}
	}
	gather := q.gather && plain && extra != nil
	if n := len(p.q); n < max && wait > 0 && !(gather && q.readyItems(max-n) >= max-n) {
		q.mu.Unlock()
		end := q.wait()
		ok := sleep(ctx, q.clk, wait)
		end()
		if !ok {
			return nil, false
		}
		q.mu.Lock()
	}
	if gather {
		// Room for what is there, not batch_size (up to 1,000) for one
		// event at a time.
		n := len(p.q)
		if n < max {
			n += q.readyItems(max - n)
		}
		batch = make([]*item, 0, min(n, max))
	}
	batch, more = q.takeFrom(p, batch, max, !plain)
	for gather && len(batch) < max && len(q.ready) > 0 {
		o := q.ready[0].p
		if head := o.q[0]; head.bar != nil || head.grp != nil {
			break // a batch of its own: the next worker takes it
		}
		q.ready.pop()
		o.state = partBusy
		*extra = append(*extra, o)
		var m bool
		batch, m = q.takeFrom(o, batch, max, false)
		more = more || m
	}
	q.mu.Unlock()
	q.mQueue.Sub(float64(len(batch)))
	return batch, more
}

// readyItems returns how many items the ready partitions hold, counting
// no further than limit. Must be called with mu held.
func (q *keyQueue) readyItems(limit int) int {
	n := 0
	for _, r := range q.ready {
		if n += len(r.p.q); n >= limit {
			return n
		}
	}
	return n
}

// takeFrom moves up to max-len(batch) items from the head of p to batch
// (group: p's head is a transaction group, taken whole; otherwise single
// events, stopping before a barrier or a group) and reports whether p
// still has items. batch nil: a new slice of the items. Must be called with
// mu held.
func (q *keyQueue) takeFrom(p *partition, batch []*item, max int, group bool) ([]*item, bool) {
	n := min(len(p.q), max-len(batch))
	if n > 0 && !group {
		// Single events stop before a barrier or a group.
		for i, it := range p.q[:n] {
			if it.grp != nil || it.bar != nil {
				n = i
				break
			}
		}
		if n > 1 && q.ordering != OrderNone {
			// A batch API may fail one entry and accept the next: a
			// document appears at most once per batch, so its later
			// events cannot overtake a failed one.
			n = p.distinctKeys(p.q[:n])
		}
	}
	if batch == nil {
		batch = make([]*item, 0, n)
	}
	batch = append(batch, p.q[:n]...)
	clear(p.q[:n])
	p.q = p.q[n:]
	if len(p.q) == 0 {
		p.q = nil
	}
	q.held.Add(int64(n))
	q.queued.Add(-int64(n))
	return batch, len(p.q) > 0
}

// distinctKeys returns the length of the longest prefix of q in which no two
// events have the same ordering key (at least 1). Must be called with the
// keyQueue's mu held.
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
	p.seen.reset(len(q))
	for i, it := range q {
		if j := p.seen.add(it.key, i); j >= 0 {
			if q[j].ev.SameOrderingKey(it.ev) {
				return i
			}
			// Two keys with the same hash: compare the keys themselves.
			return distinctKeysSlow(q)
		}
	}
	return len(q)
}

// keySet is a set of ordering key hashes with the index of each, open
// addressing with linear probing: a batch's worth of inserts costs a
// fraction of a map's, and it is emptied by bumping a generation instead of
// clearing it.
type keySet struct {
	slots []keySlot
	gen   uint32
	shift uint8
}

type keySlot struct {
	key uint64
	idx int32
	gen uint32 // the slot is in the set when gen is keySet.gen
}

// reset empties the set and sizes it for n keys.
func (s *keySet) reset(n int) {
	size := 16
	for size < 2*n {
		size *= 2
	}
	if len(s.slots) < size {
		s.slots = make([]keySlot, size)
		s.gen = 0
	}
	s.shift = uint8(64 - bits.TrailingZeros(uint(len(s.slots))))
	s.gen++
	if s.gen == 0 { // wrapped: slots of an old generation could match
		clear(s.slots)
		s.gen = 1
	}
}

// add adds key with index i and returns -1, or the index of key when it is
// in the set already (then i is not added).
func (s *keySet) add(key uint64, i int) int {
	mask := len(s.slots) - 1
	for h := int((key * 0x9e3779b97f4a7c15) >> s.shift); ; h = (h + 1) & mask {
		sl := &s.slots[h]
		if sl.gen != s.gen {
			*sl = keySlot{key: key, idx: int32(i), gen: s.gen}
			return -1
		}
		if sl.key == key {
			return int(sl.idx)
		}
	}
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

// readyHeap is the ready partitions, a binary min-heap by the seq of each
// one's head item (copied into the entry: a partition's head does not
// change while it is ready, and the comparisons then read the heap's own
// memory).
type readyHeap []readyEntry

type readyEntry struct {
	seq uint64
	p   *partition
}

// push adds p, which has items.
func (h *readyHeap) push(p *partition) {
	*h = append(*h, readyEntry{seq: p.q[0].seq, p: p})
	s := *h
	i := len(s) - 1
	for i > 0 {
		up := (i - 1) / 2
		if s[up].seq <= s[i].seq {
			break
		}
		s[up], s[i] = s[i], s[up]
		i = up
	}
}

// pop removes the partition with the oldest head and returns it. The heap
// must not be empty.
func (h *readyHeap) pop() *partition {
	s := *h
	p := s[0].p
	n := len(s) - 1
	s[0] = s[n]
	s[n] = readyEntry{}
	s = s[:n]
	for i := 0; ; {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && s[c+1].seq < s[c].seq {
			c++
		}
		if s[i].seq <= s[c].seq {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return p
}
