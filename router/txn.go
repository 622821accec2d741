package router

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// Transactions as a unit (transactions = "group" on a sink).
//
// The source hands a transaction's events on one at a time, in order, and
// marks the last (source/txn.go); every event of it before the last is
// tracked at the position before the transaction, so the checkpoint never
// falls inside it. A grouped lane collects the events of an open
// transaction that are routed to it (each already shaped for it) in a
// txnGroup instead of queueing them; when Dispatch sees the transaction's
// last event — routed to this sink or not — the lane queues the group as a
// whole (keyQueue.pushGroup): its items, consecutive in one partition and
// taken as one batch, and a barrier in every other partition holding one of
// its documents. The group is delivered once every barrier reached the
// head of its partition, in one Send marked sinks.WithTxnGroup; the later
// changes of its documents, queued behind the group or a barrier, wait
// until it is finished (delivered, dead-lettered or parked).
//
// Parts (issue 39). The source admits a transaction's events by the byte
// budget and max_in_flight_events like any others; when it has to wait for
// room while a transaction is open, it calls Engine.FlushTxn
// (source.TxnFlusher, source/txn.go) and every grouped lane queues what it
// collected of the transaction as one part (a group of its own) and keeps
// its newest event to start the next one, so the transaction's last part
// is never empty. The parts of a transaction share a txnChain: they are
// queued in one partition (the first part's), so each is finished —
// delivered, dead-lettered or parked — before the next is taken, and each
// has a barrier in every other partition that holds one of the
// transaction's documents, so no later change of them overtakes the last
// part. The sink numbers the parts' requests over the whole transaction
// (sinks.TxnPart): "part" on every one, "parts" on the last part's only.

// txnGroup is the events of one transaction routed to one grouped lane,
// or one part of them (chain not nil).
type txnGroup struct {
	items []*item
	// chain is shared by the parts of a transaction sent in several
	// groups (nil: the group is the whole transaction); final marks its
	// last part; part is the sinks.TxnPart of the part's delivery.
	chain *txnChain
	final bool
	part  *sinks.TxnPart
	// bars is the number of barriers queued for the group, set under the
	// keyQueue's mu before any of them can be taken.
	bars    int
	reached atomic.Int32
	// arrived is closed once every barrier reached the head of its
	// partition: every earlier change of the group's documents is
	// finished.
	arrived chan struct{}
	// finished is closed once the group's batch was served, whatever
	// the outcome: the barriers let later changes go.
	finished chan struct{}
	once     sync.Once
	// closed is closed when the group leaves the lane's open groups
	// (queued, dropped or released): it ends the group's tenure watch.
	closed    chan struct{}
	closeOnce sync.Once
}

// txnChain is what the parts of one transaction on a grouped lane share.
type txnChain struct {
	// home is the partition of every part, set when the first is queued;
	// touched the partitions holding a document of the parts queued so
	// far (their barriers). Both under the keyQueue's mu.
	home    *partition
	touched []*partition
	// next is the number of the next part's first request (from 1),
	// advanced when a part is finished (before the next is taken).
	next atomic.Int64
	// refused is set when a part was dead-lettered (refused for good, or
	// its retries exhausted): the transaction is dead-lettered from that
	// part on, so every later part is dead-lettered with the same reason
	// and answer without being sent (Lane.serve), and the receiver never
	// sees a transaction with a hole in it.
	refused atomic.Pointer[txnRefusal]
}

// txnRefusal is why a transaction's part was dead-lettered.
type txnRefusal struct{ reason, err string }

// refuse records, when items are a part of a transaction sent in parts,
// that it was dead-lettered for reason (the first such part counts).
func refuse(items []*item, reason string) {
	if len(items) == 0 || items[0].grp == nil || items[0].grp.chain == nil {
		return
	}
	items[0].grp.chain.refused.CompareAndSwap(nil, &txnRefusal{reason: reason, err: items[0].lastErr})
}

// refusedPart returns why an earlier part of batch's transaction was
// dead-lettered (nil: none was, or batch is no part).
func refusedPart(batch []*item) *txnRefusal {
	if len(batch) == 0 || batch[0].grp == nil || batch[0].grp.chain == nil {
		return nil
	}
	return batch[0].grp.chain.refused.Load()
}

func newTxnGroup() *txnGroup {
	return &txnGroup{arrived: make(chan struct{}), finished: make(chan struct{}), closed: make(chan struct{})}
}

// leave marks g as no longer open.
func (g *txnGroup) leave() { g.closeOnce.Do(func() { close(g.closed) }) }

// arrive records that one of g's barriers reached the head of its
// partition.
func (g *txnGroup) arrive() {
	if int(g.reached.Add(1)) == g.bars {
		close(g.arrived)
	}
}

func (g *txnGroup) finish() { g.once.Do(func() { close(g.finished) }) }

// txnKey identifies an open transaction of a unit.
func txnKey(ev *event.Event) string { return txnKeyOf(ev.Txn.Unit, ev.Txn.ID) }

func txnKeyOf(unit, id string) string { return unit + "\x00" + id }

// collect adds it, an event of a transaction, to its open group; false when
// the lane is retiring (a reload replaced it): it is then queued alone.
func (l *Lane) collect(it *item) bool {
	l.groupMu.Lock()
	defer l.groupMu.Unlock()
	if l.retiring {
		return false
	}
	k := txnKey(it.ev)
	g := l.open[k]
	if g == nil {
		l.dropAbandonedLocked()
		if l.open == nil {
			l.open = map[string]*txnGroup{}
		}
		g = newTxnGroup()
		l.open[k] = g
		if t := it.ev.Tenure; t != nil {
			// Cluster mode: when the tenure the group was read under ends,
			// its last event never comes here (the unit's next owner reads
			// the transaction again); return its memory then rather than
			// when the lane's next transaction starts, which may never be.
			go l.watchTenure(k, g, t.Done())
		}
	}
	g.items = append(g.items, it)
	return true
}

// watchTenure drops g, the open group k, once done is closed, unless g
// left the open groups before.
func (l *Lane) watchTenure(k string, g *txnGroup, done <-chan struct{}) {
	select {
	case <-g.closed:
		return
	case <-done:
	}
	l.groupMu.Lock()
	defer l.groupMu.Unlock()
	if l.open[k] == g {
		l.dropAbandonedLocked()
	}
}

// dropAbandonedLocked drops the open groups read under a tenure that is
// over (cluster mode): their last event never comes here, the unit's next
// owner reads them again. Must be called with groupMu held.
func (l *Lane) dropAbandonedLocked() {
	for k, g := range l.open {
		if g.items[0].ev.Tenure.Held() {
			continue
		}
		l.mDropped.Add(float64(len(g.items)))
		releaseItems(g.items)
		delete(l.open, k)
		g.leave()
	}
}

// endTxn queues the open group of ev's transaction, whose last event ev is
// (Dispatch calls it for every grouped lane, after the event's own
// enqueue).
func (l *Lane) endTxn(ev *event.Event) {
	k := txnKey(ev)
	l.groupMu.Lock()
	g := l.open[k]
	delete(l.open, k)
	l.groupMu.Unlock()
	if g != nil {
		g.final = true
		g.leave()
		l.pushGroup(g)
	}
}

// flushTxn queues what the lane collected of the open transaction k as a
// part of it, keeping its newest event in the open group to start the
// next part. It returns the event kept (nil: the lane has none of the
// transaction).
func (l *Lane) flushTxn(k string) *event.Event {
	l.groupMu.Lock()
	g := l.open[k]
	if g == nil {
		l.groupMu.Unlock()
		return nil
	}
	n := len(g.items)
	kept := g.items[n-1].ev
	if n < 2 {
		l.groupMu.Unlock()
		return kept
	}
	if g.chain == nil {
		g.chain = &txnChain{}
		g.chain.next.Store(1)
	}
	part := newTxnGroup()
	part.chain, part.items = g.chain, g.items[:n-1:n-1]
	g.items = append(make([]*item, 0, 8), g.items[n-1])
	l.groupMu.Unlock()
	part.leave()
	l.pushGroup(part)
	return kept
}

// partCtx marks the context of a part's delivery with its sinks.TxnPart:
// its first request's number, and whether it is the last part.
func (g *txnGroup) partCtx(ctx context.Context) context.Context {
	if g.chain == nil {
		return ctx
	}
	if g.part == nil {
		g.part = &sinks.TxnPart{First: int(g.chain.next.Load()), Final: g.final}
	}
	return sinks.WithTxnPart(ctx, g.part)
}

// finishPart advances the chain's part numbers past g's and lets its
// barriers go (finish).
func (g *txnGroup) finishPart() {
	if g.chain != nil && g.part != nil {
		g.chain.next.Add(int64(g.part.Used))
	}
	g.finish()
}

func (l *Lane) pushGroup(g *txnGroup) {
	l.mGroups.Inc()
	l.mGroupEvents.Observe(float64(len(g.items)))
	l.mode.RLock()
	l.q.pushGroup(g)
	l.mode.RUnlock()
}

// retire queues what the lane collected of open transactions (a reload
// replaced the lane: their last events go to its successor) and makes
// later events of transactions go alone.
func (l *Lane) retire() {
	l.groupMu.Lock()
	l.retiring = true
	open := l.open
	l.open = nil
	l.groupMu.Unlock()
	for _, g := range open {
		g.leave()
		l.pushGroup(g)
	}
}

// releaseOpen returns the memory of the events collected for open
// transactions when the lane stops (they stay unacknowledged).
func (l *Lane) releaseOpen() {
	l.groupMu.Lock()
	defer l.groupMu.Unlock()
	for _, g := range l.open {
		g.leave()
		releaseItems(g.items)
	}
	l.open = nil
}

// holdBarrier serves a barrier: it reports that every earlier item of its
// partition is finished and keeps the partition until its group is
// finished (or ctx ends).
func (l *Lane) holdBarrier(ctx context.Context, it *item) {
	g := it.bar
	g.arrive()
	select {
	case <-g.finished:
	default:
		end := l.q.wait()
		select {
		case <-g.finished:
		case <-ctx.Done():
		}
		end()
	}
	l.q.release(1)
}

// waitArrived waits until every barrier of g arrived; false when ctx ended
// first.
func (l *Lane) waitArrived(ctx context.Context, g *txnGroup) bool {
	select {
	case <-g.arrived:
		return true
	default:
	}
	end := l.q.wait()
	defer end()
	select {
	case <-g.arrived:
		return true
	case <-ctx.Done():
		return false
	}
}

// groupCtx marks the context of a group's delivery (and of a part's,
// partCtx).
func groupCtx(ctx context.Context, batch []*item) context.Context {
	if len(batch) > 0 && batch[0].grp != nil {
		return batch[0].grp.partCtx(sinks.WithTxnGroup(ctx))
	}
	return ctx
}
