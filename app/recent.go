package app

import (
	"bytes"
	"context"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/observe"
)

// Bounds of the recent changes kept for POST /api/v1/subscriptions/test.
const (
	// RecentChanges is how many of each source's last changes are kept.
	RecentChanges = 100
	// RecentChangeMaxBytes: a larger change is not kept.
	RecentChangeMaxBytes = 64 << 10
	// RecentSourceMaxBytes bounds what one source's kept changes hold.
	RecentSourceMaxBytes = 1 << 20
)

// recentChanges keeps the last changes each source dispatched (an
// observer at the dispatch edge, with [subscriptions] enabled), so that a
// subscription can be tried on them. It keeps the events' own raw
// changes, at most
// RecentChanges and RecentSourceMaxBytes per source, copied (the
// observer's records are the router's during the call only). Only the
// changes the source's stream let through (its pushed-down $match) are
// seen. It is safe for concurrent use.
type recentChanges struct {
	mu       sync.Mutex
	bySource map[string]*recentRing
}

type recentRing struct {
	raws  []bson.Raw // oldest first
	bytes int
}

var _ observe.Observer = (*recentChanges)(nil)

func newRecentChanges() *recentChanges {
	return &recentChanges{bySource: map[string]*recentRing{}}
}

// Dispatched keeps the change.
func (r *recentChanges) Dispatched(d observe.Dispatch) {
	ev := d.Event
	if ev == nil || len(ev.Raw) > RecentChangeMaxBytes || ev.Source == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ring := r.bySource[ev.Source]
	if ring == nil {
		ring = &recentRing{}
		r.bySource[ev.Source] = ring
	}
	if n := len(ring.raws); n > 0 && bytesEqual(ring.raws[n-1], ev.Raw) {
		return // dispatched again (a re-drive, a replay)
	}
	ring.raws = append(ring.raws, bytes.Clone(ev.Raw))
	ring.bytes += len(ev.Raw)
	drop := 0
	for len(ring.raws)-drop > RecentChanges || ring.bytes > RecentSourceMaxBytes {
		ring.bytes -= len(ring.raws[drop])
		ring.raws[drop] = nil
		drop++
	}
	if drop > 0 {
		ring.raws = append(ring.raws[:0], ring.raws[drop:]...)
	}
}

func bytesEqual(a, b bson.Raw) bool { return len(a) == len(b) && string(a) == string(b) }

// Last returns up to n of source's last changes, oldest first.
func (r *recentChanges) Last(source string, n int) []bson.Raw {
	r.mu.Lock()
	defer r.mu.Unlock()
	ring := r.bySource[source]
	if ring == nil || n <= 0 {
		return nil
	}
	raws := ring.raws[max(0, len(ring.raws)-n):]
	return append([]bson.Raw(nil), raws...)
}

// AttemptStart, AttemptEnd and Outcome: nothing.
func (r *recentChanges) AttemptStart(ctx context.Context, _ observe.Attempt) context.Context {
	return ctx
}
func (r *recentChanges) AttemptEnd(context.Context, observe.Attempt) {}
func (r *recentChanges) Outcome(observe.Outcome)                     {}
