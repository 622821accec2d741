package backfill

import (
	"context"
	"log/slog"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// Target is where a backfill's events go: the lanes of a running
// gateway (Lanes), or direct deliveries from the command line
// (CommandLine). Its methods are the package's own.
type Target interface {
	// send hands ev on to sink (every matching sink when empty); done is
	// called once, when every sink finished (failed: some delivery failed
	// for good without a dead letter). It returns false, without calling
	// done, when no rule routes ev there.
	send(ctx context.Context, sink string, ev *event.Event, done func(failed bool)) bool
	// liveQueued returns the events queued for the sinks beyond own of the
	// backfill's: live changes waiting, which go first.
	liveQueued(sinks []string, own int64) int64
	// mark is taken before documents of source are read; sendAfter is
	// send, run only if no change of ev's document was dispatched since
	// mark (changed: one was; read the document again). A target that
	// cannot order returns nil and sends at once.
	mark(source string) any
	sendAfter(ctx context.Context, sink string, ev *event.Event, mark any, done func(failed bool)) (routed, changed bool)
	// hasSink reports whether the engine has a sink of that name.
	hasSink(sink string) bool
	// deliverNow delivers ev to sink at once, as a dead-letter replay
	// does (router.Engine.DeliverNow).
	deliverNow(ctx context.Context, sink string, ev *event.Event) error
}

// maxRereads bounds the re-reads of a document that keeps changing
// while a backfill tries to send it in order; after them it is sent as
// read, unordered (counted in Status.Unordered).
const maxRereads = 10

// Lanes sends through a running engine's lanes, each event in order
// with the live stream of the unit that owns its document when that unit
// runs in this process (see source.Source.DispatchIfUnchanged).
type Lanes struct {
	Engine *router.Engine
	// Units returns the sources of the units of source running here, by
	// unit name, and the source's partition count; nil: no ordering.
	Units func(source string) (map[string]*source.Source, int)
}

// unitMarks is Lanes's mark: each running unit's DispatchMark.
type unitMarks struct {
	parts int
	srcs  map[string]*source.Source
	marks map[string]uint64
}

func (t Lanes) mark(src string) any {
	if t.Units == nil {
		return nil
	}
	srcs, n := t.Units(src)
	m := unitMarks{parts: n, srcs: srcs, marks: make(map[string]uint64, len(srcs))}
	for name, s := range srcs {
		m.marks[name] = s.DispatchMark()
	}
	return m
}

func (t Lanes) sendAfter(ctx context.Context, sink string, ev *event.Event, mark any, done func(bool)) (bool, bool) {
	m, ok := mark.(unitMarks)
	if !ok {
		return t.send(ctx, sink, ev, done), false
	}
	unit := source.UnitName(ev.Source, 0, 1)
	if m.parts > 1 {
		h := mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: ev.DocumentKey})
		unit = source.UnitName(ev.Source, mhash.Partition(h, m.parts), m.parts)
	}
	src, running := m.srcs[unit]
	if !running {
		// Another replica owns the unit (cluster mode): no ordering.
		return t.send(ctx, sink, ev, done), false
	}
	var routed bool
	sent := src.DispatchIfUnchanged(ev, m.marks[unit], func() {
		routed = t.Engine.DispatchTo(sink, ev, func() { done(false) })
	})
	return routed, !sent
}

func (t Lanes) send(_ context.Context, sink string, ev *event.Event, done func(bool)) bool {
	return t.Engine.DispatchTo(sink, ev, func() { done(false) })
}

func (t Lanes) hasSink(sink string) bool { return t.Engine.Lane(sink) != nil }

func (t Lanes) deliverNow(ctx context.Context, sink string, ev *event.Event) error {
	return t.Engine.DeliverNow(ctx, sink, ev)
}

func (t Lanes) liveQueued(sinks []string, own int64) int64 {
	var q int64
	for _, s := range sinks {
		if l := t.Engine.Lane(s); l != nil {
			st := l.Status()
			q += st.Queued
		}
	}
	// Our own events are at most own of those queued; the rest are live.
	return max(0, q-own)
}

// direct delivers for the command line with Engine.DeliverNow (the sinks'
// retry policy, no lanes: the running gateway's lanes and parked
// backlogs are its own), a few deliveries at a time.
type direct struct {
	engine *router.Engine
	sem    chan struct{}
	log    *slog.Logger
}

func (t *direct) send(ctx context.Context, sink string, ev *event.Event, done func(bool)) bool {
	m := t.engine.Rules().Route(ev)
	var names []string
	for _, i := range m.Sinks {
		name := t.engine.Lanes()[i].Name()
		if sink == "" || name == sink {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return false
	}
	ev.Rules = m.Rules
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	ev.Mem.Retain(1) // this goroutine's, until it delivered
	go func() {
		defer func() { <-t.sem }()
		defer ev.Mem.Release()
		failed := false
		for _, n := range names {
			if err := t.engine.DeliverNow(context.WithoutCancel(ctx), n, ev); err != nil {
				failed = true
				t.log.Warn("backfill delivery failed", "sink", n, "id", ev.ID, "err", err)
			}
		}
		done(failed)
	}()
	return true
}

func (t *direct) hasSink(sink string) bool { return t.engine.Lane(sink) != nil }

func (t *direct) deliverNow(ctx context.Context, sink string, ev *event.Event) error {
	return t.engine.DeliverNow(ctx, sink, ev)
}

func (t *direct) liveQueued([]string, int64) int64 { return 0 }

func (t *direct) mark(string) any { return nil }

func (t *direct) sendAfter(ctx context.Context, sink string, ev *event.Event, _ any, done func(bool)) (bool, bool) {
	return t.send(ctx, sink, ev, done), false
}
