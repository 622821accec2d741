package checkpoint

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// Position is a point in a source's change stream up to which everything has
// been acknowledged.
type Position struct {
	Token       bson.Raw
	ClusterTime bson.Timestamp
	WallTime    time.Time
}

type slot struct {
	token bson.Raw
	ct    bson.Timestamp
	wall  time.Time
	acked bool
}

// Tracker tracks the events of one source that are in flight and computes the
// contiguous acknowledged watermark: the position of the highest event below
// which every event has been acknowledged. It is also the source's
// backpressure: Add blocks while the number of events in flight (added, not
// acknowledged) is at the cap, or while the events the watermark has not
// passed, acknowledged or not, are spanFactor times it.
//
// A Tracker is safe for concurrent use.
type Tracker struct {
	mu    sync.Mutex
	space chan struct{} // signalled when an in-flight slot frees up
	ring  []slot
	max   uint64 // the cap of Add on events not acknowledged
	span  uint64 // the cap of Add on events the watermark has not passed; the ring grows past it only for AddBeside
	ahead uint64 // events acknowledged that the watermark has not passed
	base  uint64 // lowest sequence number not yet covered by the watermark
	next  uint64 // next sequence number to assign
	pos   Position
	// posShared: pos.Token is the token an event was added with, a slice
	// of its change, which the byte budget no longer counts: Position
	// copies it (once) before handing it out.
	posShared bool
	version   uint64 // bumps whenever pos changes
	idle      *pendingResume
	// drained is closed when everything is acked, and then forgotten: it
	// is made only when Drained is asked while events are in flight (not
	// once per ack that empties the tracker).
	drained chan struct{}
	// mask is len(ring)-1: the ring's length is a power of two, so a
	// sequence number's slot is seq&mask.
	mask uint64
	// gate, when set, is waited for by Add before it takes a slot
	// (SetGate).
	gate func(context.Context) error
}

// spanFactor bounds the events the watermark has not passed, acknowledged or
// not, to this many times the cap on those not acknowledged. Counting only
// those (max_in_flight_events: "read but not yet delivered or
// dead-lettered"), one slow event no longer stops the source once
// max_in_flight_events were read after it: against a receiver taking 1 s,
// the events queued behind the few partitions that drew two or three of a
// window's keys held the whole source, and a lane allowed 8,192 requests kept
// about 2,000 in flight (a simulation of the queue gave 2,500 events/s with
// the count of the span, 5,000 with this). An acknowledged event behind the
// watermark holds a slot (64 bytes) and a copy of its resume token (see
// Ack), about 100-200 bytes: at 10,000 events, at most 30,000 of them, about
// 10 MiB per source with the ring.
const spanFactor = 4

type pendingResume struct {
	after uint64 // applies once base >= after
	token bson.Raw
}

// NewTracker returns a tracker allowing at most maxInFlight unacknowledged
// events. start is the position the source resumed from (zero for none).
func NewTracker(maxInFlight int, start Position) *Tracker {
	if maxInFlight < 1 {
		maxInFlight = 1
	}
	size := 1
	for size < maxInFlight {
		size *= 2
	}
	return &Tracker{
		space: make(chan struct{}, 1),
		ring:  make([]slot, size), // grows to span when acks run ahead of the watermark
		mask:  uint64(size - 1),
		max:   uint64(maxInFlight),
		span:  spanFactor * uint64(maxInFlight),
		pos:   start,
	}
}

// room reports whether Add may add an event now.
func (t *Tracker) room() bool {
	return t.next-t.base-t.ahead < t.max && t.next-t.base < t.span
}

// grow doubles the ring when it is full.
func (t *Tracker) grow() {
	if t.next-t.base < uint64(len(t.ring)) {
		return
	}
	ring := make([]slot, 2*len(t.ring))
	mask := uint64(len(ring) - 1)
	for seq := t.base; seq < t.next; seq++ {
		ring[seq&mask] = t.ring[seq&t.mask]
	}
	t.ring, t.mask = ring, mask
}

// SetGate sets a wait that Add makes first, before it waits for room:
// the router's read-ahead bound (router.Engine.ReadAhead), which holds the
// source back while a sink it routes to has read far enough ahead of its
// deliveries. Call it before the first Add.
func (t *Tracker) SetGate(gate func(context.Context) error) { t.gate = gate }

// Add registers a newly read event and returns its sequence number. It blocks
// while the gate (SetGate) holds it back, and while the cap of events in
// flight is reached, until an Ack frees a slot or ctx is done.
func (t *Tracker) Add(ctx context.Context, token bson.Raw, ct bson.Timestamp, wall time.Time) (uint64, error) {
	return t.AddBeside(ctx, token, ct, wall, 0)
}

// AddBeside is Add for a source that holds own events in flight that are
// acknowledged only once it has read more (what the grouped sinks keep of
// an open transaction, source/txn.go): it also admits the event when no
// more than own events are in flight, so the source cannot wait for
// itself. With own = 0 it is Add. The gate is waited for first, as by Add
// (it counts no event a grouped sink keeps: those are not queued yet).
func (t *Tracker) AddBeside(ctx context.Context, token bson.Raw, ct bson.Timestamp, wall time.Time, own int) (uint64, error) {
	if t.gate != nil {
		if err := t.gate(ctx); err != nil {
			return 0, err
		}
	}
	for {
		t.mu.Lock()
		if t.room() || t.next-t.base-t.ahead <= uint64(max(own, 0)) {
			t.grow()
			seq := t.next
			t.ring[seq&t.mask] = slot{token: token, ct: ct, wall: wall}
			t.next++
			t.mu.Unlock()
			return seq, nil
		}
		t.mu.Unlock()
		select {
		case <-t.space:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Ack marks event seq as fully handled (delivered to or dead-lettered for
// every sink it was routed to). Acking an unknown or already acked sequence
// number panics, as it means the accounting is broken.
func (t *Tracker) Ack(seq uint64) {
	t.mu.Lock()
	if seq < t.base || seq >= t.next {
		t.mu.Unlock()
		panic(fmt.Sprintf("checkpoint: ack of sequence %d outside [%d, %d)", seq, t.base, t.next))
	}
	s := &t.ring[seq&t.mask]
	if s.acked {
		t.mu.Unlock()
		panic(fmt.Sprintf("checkpoint: sequence %d acked twice", seq))
	}
	s.acked = true
	cloned := seq != t.base
	if cloned {
		// Acked out of order: the slot outlives the event until the
		// watermark passes it. Its token is a slice of the change the
		// source read (the whole document, perhaps megabytes), whose
		// bytes the byte budget stops counting now: keep a copy of the
		// token alone, or every event acked behind a slow one stays in
		// memory, up to the span (spanFactor × max_in_flight_events)
		// of them.
		s.token = bytes.Clone(s.token)
	}
	t.ahead++
	moved := false
	for t.base < t.next {
		s := &t.ring[t.base&t.mask]
		if !s.acked {
			break
		}
		t.pos = Position{Token: s.token, ClusterTime: s.ct, WallTime: s.wall}
		*s = slot{}
		t.base++
		t.ahead--
		moved = true
	}
	if moved {
		// pos holds the slice of seq's change when the watermark stopped
		// at seq acked in order; else a copy (out of order: above).
		t.posShared = t.base == seq+1 && !cloned
		t.applyIdleLocked()
		t.version++
		if t.base == t.next && t.drained != nil {
			close(t.drained)
			t.drained = nil
		}
	}
	t.mu.Unlock()
	// Every ack makes room: one fewer event is not acknowledged.
	select {
	case t.space <- struct{}{}:
	default:
	}
}

// SetResumePoint records a resume token that follows every event added so
// far, typically the change stream's post-batch resume token after a batch
// was consumed. It becomes the watermark once every event added before it is
// acknowledged, which keeps quiet or filtered streams' checkpoints fresh.
// The tracker keeps a copy of token: a post-batch resume token is a slice
// of the driver's whole reply (the batch of changes, up to 16 MiB), which
// would stay in memory for as long as the watermark or the saver holds it.
func (t *Tracker) SetResumePoint(token bson.Raw) {
	if len(token) == 0 {
		return
	}
	token = bytes.Clone(token)
	t.mu.Lock()
	t.idle = &pendingResume{after: t.next, token: token}
	if t.applyIdleLocked() {
		t.version++
	}
	t.mu.Unlock()
}

func (t *Tracker) applyIdleLocked() bool {
	if t.idle == nil || t.base < t.idle.after {
		return false
	}
	changed := !bytesEqual(t.pos.Token, t.idle.token)
	t.pos.Token, t.posShared = t.idle.token, false
	// A post-batch token is newer than the last event: take its time too,
	// so a quiet stream's checkpoint does not look older than it is.
	if ct, ok := event.TokenClusterTime(t.idle.token); ok && ct.After(t.pos.ClusterTime) {
		t.pos.ClusterTime = ct
		t.pos.WallTime = time.Unix(int64(ct.T), 0).UTC()
	}
	t.idle = nil
	return changed
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// Position returns the current watermark and a version number that changes
// whenever the watermark moves. The watermark's token is the tracker's own
// copy, never a slice of an event's change: the saver keeps what it saved,
// and behind a slow event the watermark stays where it is. (An event acked
// in order leaves the slice of its change as the watermark until the next
// call, at most a checkpoint interval: copying it here, not at every ack,
// keeps the copy off the path of each event.)
func (t *Tracker) Position() (Position, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.posShared {
		t.pos.Token, t.posShared = bytes.Clone(t.pos.Token), false
	}
	return t.pos, t.version
}

// InFlight returns the number of events added but not yet acknowledged.
func (t *Tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int(t.next - t.base - t.ahead)
}

// Drained returns a channel closed when no event is in flight: at once when
// none is now.
func (t *Tracker) Drained() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.base == t.next {
		return closedChan
	}
	if t.drained == nil {
		t.drained = make(chan struct{})
	}
	return t.drained
}

// closedChan is what Drained returns when nothing is in flight.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
