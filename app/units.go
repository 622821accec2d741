package app

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
)

// unitDef is one unit of work of the configuration: a source, or one
// partition of it.
type unitDef struct {
	name   string // source.UnitName(source, partition, partitions)
	source string
	spec   source.Spec // without Pushdown and Tenure
}

// unitDefs returns the units of cfg, in config order.
func unitDefs(cfg *config.Config) []unitDef {
	var out []unitDef
	for _, sc := range cfg.Sources {
		var pipeline bson.A
		for _, st := range sc.Pipeline {
			pipeline = append(pipeline, st)
		}
		n := max(sc.Partitions, 1)
		for i := range n {
			name := source.UnitName(sc.Name, i, n)
			out = append(out, unitDef{name: name, source: sc.Name, spec: source.Spec{
				Name: sc.Name, Unit: name, Partition: i, Partitions: n,
				Database: sc.Database, Collection: sc.Collection, StateDatabase: cfg.Mongo.StateDatabase,
				FullDocument: sc.FullDocument, FullDocumentBeforeChange: sc.FullDocumentBeforeChange,
				Pipeline: pipeline, StartAt: sc.StartAt, OnHistoryLost: string(sc.OnHistoryLost),
				SplitLargeEvents: sc.SplitLargeEvents, OnOversizeEvent: sc.OnOversizeEvent,
				BatchSize: sc.BatchSize, MaxAwait: sc.MaxAwait, MaxInFlight: sc.MaxInFlightEvents,
				CheckpointInterval: sc.CheckpointInterval,
				Snapshot:           sc.Snapshot,
			}})
		}
	}
	return out
}

// runningUnit is a unit whose source runs in this process.
type runningUnit struct {
	def    unitDef
	src    *source.Source
	tenure *event.Tenure // nil outside cluster mode
	cancel context.CancelFunc
	done   chan struct{} // closed when the source's Run returned
	err    error         // Run's result, set before done is closed
}

// units is the set of units whose sources run in this process. It is safe
// for concurrent use.
type units struct {
	mu        sync.Mutex
	running   map[string]*runningUnit
	pushdowns pushdowns // the $match stage each source currently runs with
}

// snapshot returns the running units in unit-name order.
func (us *units) snapshot() []*runningUnit {
	us.mu.Lock()
	defer us.mu.Unlock()
	out := make([]*runningUnit, 0, len(us.running))
	for _, u := range us.running {
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b *runningUnit) int { return compareStrings(a.def.name, b.def.name) })
	return out
}

func (us *units) remove(u *runningUnit) {
	us.mu.Lock()
	defer us.mu.Unlock()
	if us.running[u.def.name] == u {
		delete(us.running, u.def.name)
	}
}

// acked is the engine's router.AckedFunc: the acknowledged position of the
// source of unit running here. A unit (or source) the configuration does
// not have any more does not hold its entries back.
func (g *gateway) acked(unit string) (bson.Timestamp, bool) {
	for _, d := range g.defs {
		if d.name == unit || d.source == unit {
			return g.units.acked(unit)
		}
	}
	return bson.Timestamp{T: math.MaxUint32, I: math.MaxUint32}, true
}

// acked returns the acknowledged position of the source of unit running
// here. An entry written without partitions names its source: then the
// least position of the source's units.
func (us *units) acked(unit string) (bson.Timestamp, bool) {
	us.mu.Lock()
	var srcs []*source.Source
	if u := us.running[unit]; u != nil {
		srcs = append(srcs, u.src)
	} else {
		for _, u := range us.running {
			if u.def.source == unit {
				srcs = append(srcs, u.src)
			}
		}
	}
	us.mu.Unlock()
	var least bson.Timestamp
	for i, src := range srcs {
		at, ok := src.Acked()
		if !ok {
			return bson.Timestamp{}, false
		}
		if i == 0 || at.Before(least) {
			least = at
		}
	}
	return least, len(srcs) > 0
}

// Pushdowns returns a copy of the $match stage each source runs with, and
// whether pushdown is off (-no-pushdown) (console.Gateway).
func (g *gateway) Pushdowns() (map[string]bson.D, bool) {
	g.units.mu.Lock()
	defer g.units.mu.Unlock()
	return maps.Clone(g.units.pushdowns), g.noPushdown
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// startUnit starts the source of def under tenure (nil outside cluster
// mode) on a context derived from parent; its Run result is reported on
// done. The source starts with the pushdown currently in force for its
// source, and a reload updates it.
func (g *gateway) startUnit(parent context.Context, def unitDef, tenure *event.Tenure) *runningUnit {
	spec := def.spec
	spec.Tenure = tenure
	spec.Budget = g.budget
	g.units.mu.Lock()
	spec.Pushdown = g.units.pushdowns[def.source]
	src := source.New(spec, g.client, g.cps, g.dls, g.engine, g.metrics, g.log)
	ctx, cancel := context.WithCancel(parent)
	u := &runningUnit{def: def, src: src, tenure: tenure, cancel: cancel, done: make(chan struct{})}
	g.units.running[def.name] = u
	g.units.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		u.err = src.Run(ctx)
		close(u.done)
		select {
		case g.unitDone <- u:
		case <-g.stopped:
		}
	}()
	return u
}
