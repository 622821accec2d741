package source

import (
	"sync"

	"github.com/changegate/changegate/event"
)

// orderBuckets is the number of hash buckets of ordering keys whose last
// dispatch a Source remembers for backfills (a power of two).
const orderBuckets = 1 << 14

// dispatchOrder numbers a Source's dispatches and remembers, per hash
// bucket of ordering keys, the number of the last one, so that a backfill
// can hand over an event only if no change of its document was dispatched
// since it read the document (see DispatchIfUnchanged).
type dispatchOrder struct {
	mu      sync.Mutex
	seq     uint64
	buckets [orderBuckets]uint64
}

// dispatchHooks is implemented by a Dispatcher with work to do for an
// event outside the dispatch lock (the router's tracing: spans are made
// there, not under the lock that serialises the read path): BeginDispatch
// is called before the lock is taken, EndDispatch after it is released,
// whether Dispatch ran or not.
type dispatchHooks interface {
	BeginDispatch(ev *event.Event)
	EndDispatch(ev *event.Event)
}

// dispatch hands ev to the router, recording it for DispatchIfUnchanged.
func (s *Source) dispatch(ev *event.Event, ack func()) {
	h, _ := s.out.(dispatchHooks)
	if h != nil {
		h.BeginDispatch(ev)
	}
	o := &s.order
	o.mu.Lock()
	o.seq++
	o.buckets[ev.OrderingKeyHash()&(orderBuckets-1)] = o.seq
	s.out.Dispatch(ev, ack)
	o.mu.Unlock()
	if h != nil {
		h.EndDispatch(ev)
	}
}

// DispatchMark returns the number of the Source's last dispatch: a
// backfill takes it before it reads documents, and passes it to
// DispatchIfUnchanged.
func (s *Source) DispatchMark() uint64 {
	s.order.mu.Lock()
	defer s.order.mu.Unlock()
	return s.order.seq
}

// DispatchIfUnchanged runs send (which hands ev, a backfill event, to the
// router) unless a change with ev's ordering key — or one sharing its hash
// bucket — was dispatched after mark; it reports whether it ran send.
// Dispatches of the Source wait meanwhile, so every change of the
// document dispatched later is queued behind ev: a change made after the
// backfill read the document (mark was taken before the read) is either
// dispatched already (false: read the document again) or delivered after
// ev.
func (s *Source) DispatchIfUnchanged(ev *event.Event, mark uint64, send func()) bool {
	if h, ok := s.out.(dispatchHooks); ok {
		h.BeginDispatch(ev)
		defer h.EndDispatch(ev) // after the lock is released
	}
	o := &s.order
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.buckets[ev.OrderingKeyHash()&(orderBuckets-1)] > mark {
		return false
	}
	send()
	return true
}
