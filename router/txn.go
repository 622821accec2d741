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
// Memory and the in-flight cap: the events of a transaction after its
// first are admitted by the source without waiting (memory.Budget.Force,
// checkpoint.Tracker.AddOver): a group larger than the byte budget or
// max_in_flight_events is admitted alone and cannot deadlock waiting for
// room its own events hold.

// txnGroup is the events of one transaction routed to one grouped lane.
type txnGroup struct {
	items []*item
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
func txnKey(ev *event.Event) string { return ev.Txn.Unit + "\x00" + ev.Txn.ID }

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
		g.leave()
		l.pushGroup(g)
	}
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

// groupCtx marks the context of a group's delivery.
func groupCtx(ctx context.Context, batch []*item) context.Context {
	if len(batch) > 0 && batch[0].grp != nil {
		return sinks.WithTxnGroup(ctx)
	}
	return ctx
}
