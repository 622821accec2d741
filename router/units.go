package router

import (
	"context"
	"slices"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// ownership is the set of units of work this process owns, shared by an
// engine's lanes. Without a set (single process mode) it owns every unit.
type ownership struct {
	units   atomic.Pointer[[]string] // sorted; nil: every unit
	tenures atomic.Pointer[map[string]*event.Tenure]
	acked   atomic.Pointer[AckedFunc] // nil: re-drives are not gated
}

// AckedFunc returns the cluster time up to which the source of unit has
// acknowledged every change it read, and false when that source is not
// reading here (yet).
type AckedFunc func(unit string) (bson.Timestamp, bool)

// SetAcked gives the engine the acknowledged position of each unit's
// source. With it, a lane re-drives a parked entry only once the entry's
// unit acknowledged up to the entry's cluster time: after a restart (or a
// takeover) the source re-reads from the checkpoint, and a document's
// earlier changes, re-read and parked in their place, must not be overtaken
// by its later parked change. Without it (tools, tests) re-drives are not
// gated.
func (e *Engine) SetAcked(f AckedFunc) {
	if f == nil {
		e.own.acked.Store(nil)
		return
	}
	e.own.acked.Store(&f)
}

// ackedSnapshot is the acknowledged positions of some units at one moment
// (nil: re-drives are not gated).
type ackedSnapshot map[string]bson.Timestamp

// snapshotAcked returns the acknowledged positions of units now; nil
// without SetAcked.
func (o *ownership) snapshotAcked(units map[string]bool) ackedSnapshot {
	f := o.acked.Load()
	if f == nil {
		return nil
	}
	snap := ackedSnapshot{}
	for u := range units {
		if at, ok := (*f)(u); ok {
			snap[u] = at
		}
	}
	return snap
}

// readPast reports whether the source of unit had acknowledged every change
// up to ct when snap was taken (always, without SetAcked). The re-drive
// takes the snapshot before it lists the parked entries: a change the source
// re-read and parked again before that moment was parked (with a new
// version) before the listing, so the listing has the version to delete. A
// check made after the listing could pass for a re-park the listing missed:
// the entry, delivered, would stay (its version changed) and be delivered
// again.
func (snap ackedSnapshot) readPast(unit string, ct bson.Timestamp) bool {
	if snap == nil {
		return true
	}
	at, ok := snap[unit]
	return ok && !at.Before(ct)
}

// list returns the owned units (nil: every unit).
func (o *ownership) list() []string {
	if p := o.units.Load(); p != nil {
		return *p
	}
	return nil
}

// owns reports whether unit is owned. An entry written without a unit
// (before units existed) belongs to its source's single unit.
func (o *ownership) owns(unit string) bool {
	p := o.units.Load()
	if p == nil {
		return true
	}
	if _, found := slices.BinarySearch(*p, unit); !found {
		return false
	}
	// Held checks the tenure's local deadline too: a replica that was
	// paused past its lease stops re-driving before its lease loop runs.
	if ts := o.tenures.Load(); ts != nil {
		return (*ts)[unit].Held()
	}
	return true
}

// held returns the tenure under which unit is owned and true, or false
// when unit is not owned (or its tenure is over). With tenures (cluster
// mode) an owned unit always has one: a unit missing from them is not
// owned — it was lost or released since the caller last looked — and must
// not be worked on with no tenure to fence it. Without tenures the tenure
// is nil (single process mode, or units set by SetOwnedUnits).
func (o *ownership) held(unit string) (*event.Tenure, bool) {
	p := o.units.Load()
	if p == nil {
		return nil, true
	}
	if _, found := slices.BinarySearch(*p, unit); !found {
		return nil, false
	}
	ts := o.tenures.Load()
	if ts == nil {
		return nil, true
	}
	t := (*ts)[unit]
	return t, t != nil && t.Held()
}

// parkedFilter returns the filter of the parked entries of sink that this
// process may re-drive.
func (o *ownership) parkedFilter(sink string, limit int) deadletter.Filter {
	f := deadletter.Filter{Kind: deadletter.KindParked, Sink: sink, Limit: limit}
	if units := o.list(); units != nil {
		f.Units = units
	}
	return f
}

// SetOwnedUnits tells the engine which units of work this process owns (in
// cluster mode; nil, the default, means every unit): lanes re-drive only the
// parked entries of owned units, and stop re-driving a unit's entries as
// soon as it is no longer owned.
func (e *Engine) SetOwnedUnits(units []string) {
	e.own.tenures.Store(nil)
	e.setUnits(units)
}

// SetOwnedTenures is SetOwnedUnits with the tenure of each owned unit: a
// unit whose tenure is no longer held (its local lease deadline passed)
// counts as not owned at once, before the lease loop notices.
func (e *Engine) SetOwnedTenures(ts []*event.Tenure) {
	units := make([]string, 0, len(ts))
	m := make(map[string]*event.Tenure, len(ts))
	for _, t := range ts {
		units = append(units, t.Unit)
		m[t.Unit] = t
	}
	e.own.tenures.Store(&m)
	e.setUnits(units)
}

func (e *Engine) setUnits(units []string) {
	if units == nil {
		e.own.units.Store(nil)
		return
	}
	s := slices.Clone(units)
	slices.Sort(s)
	s = slices.Compact(s)
	e.own.units.Store(&s)
}

// PrepareUnit must be called after this process acquired unit (and
// SetOwnedUnits includes it), before the unit's source dispatches anything:
// every lane that has parked entries of the unit (parked by its previous
// owner) is parked, so that the unit's changes are delivered after them.
func (e *Engine) PrepareUnit(ctx context.Context, unit string) error {
	for _, l := range e.Lanes() {
		if l.dl == nil {
			continue
		}
		n, err := l.dl.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: l.name, Units: []string{unit}})
		if err != nil {
			return err
		}
		if n > 0 && !l.parked.Load() {
			l.log.Info("re-driving events another replica parked for a unit this one took over", "unit", unit, "parked", n)
			l.parkLane()
		}
	}
	return nil
}
