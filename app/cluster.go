package app

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/cluster"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/lease"
	"github.com/changegate/changegate/source"
)

// clusterLoop owns this replica's share of the units in cluster mode: it
// keeps the membership heartbeat, renews the leases it holds, acquires
// free units up to its fair share, hands the surplus over cleanly and
// stops a unit at once when its lease is lost.
//
// Acquisition: SetOwnedUnits(owned + unit), checkpoint and dead-letter
// Fence with the new epoch, engine PrepareUnit, then the unit's source starts under a new
// tenure (its saves carry the epoch). Loss (no renewal before the local
// deadline, a renewal refused, or a fenced save): the tenure ends (lanes
// drop what they still hold of it, unacknowledged), the source stops
// without a final save, the unit leaves SetOwnedUnits. Handover (surplus,
// or shutdown): stop reading, drain (bounded), final save, release.
type clusterLoop struct {
	g          *gateway
	instance   string
	renewEvery time.Duration
	ttl        time.Duration
	leases     *lease.Store
	members    *cluster.Members
	log        *slog.Logger
	defs       map[string]unitDef
	names      []string // every unit, sorted

	acquiring atomic.Bool // false once the gateway stops
	wake      chan struct{}

	mu       sync.Mutex
	owned    map[string]*ownedUnit
	view     []lease.Lease   // every lease, as of the last round
	live     []string        // live members, as of the last round
	lastBeat time.Time       // last successful heartbeat (local time)
	prevFree map[string]bool // units free in the previous round (round goroutine only)
}

// ownedUnit is a unit whose lease this replica holds.
type ownedUnit struct {
	lease   lease.Lease
	tenure  *event.Tenure
	ru      *runningUnit
	leaving bool // being handed over
}

func newClusterLoop(g *gateway, cfg config.Cluster, state *mongo.Database) *clusterLoop {
	cl := &clusterLoop{
		g: g, instance: cfg.Instance, renewEvery: cfg.RenewEvery, ttl: cfg.LeaseTTL,
		leases:  lease.NewStore(state, cfg.LeasesCollection, cfg.LeaseTTL),
		members: cluster.NewMembers(state, cfg.LeasesCollection, cfg.Instance, cfg.LeaseTTL),
		log:     g.log.With("component", "cluster"),
		defs:    map[string]unitDef{},
		wake:    make(chan struct{}, 1),
		owned:   map[string]*ownedUnit{},
	}
	for _, d := range g.defs {
		cl.defs[d.name] = d
		cl.names = append(cl.names, d.name)
		g.metrics.LeaseOwned.WithLabelValues(d.name).Set(0)
	}
	slices.Sort(cl.names)
	g.metrics.ClusterMember.WithLabelValues(cfg.Instance).Set(1)
	cl.acquiring.Store(true)
	return cl
}

// run runs rounds until ctx is cancelled; units start on srcCtx.
func (cl *clusterLoop) run(ctx, srcCtx context.Context) {
	cl.log.Info("cluster mode: sharing units through leases", "units", len(cl.names), "lease_ttl", cl.ttl, "renew_every", cl.renewEvery)
	next := time.Now()
	for {
		now := time.Now()
		cl.checkDeadlines(now)
		if !now.Before(next) {
			// Rounds start every renew_every, however long one took.
			next = now.Add(cl.renewEvery)
			cl.round(ctx, srcCtx)
		}
		wait := time.Until(next)
		if d, ok := cl.earliestDeadline(); ok {
			wait = min(wait, time.Until(d))
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-cl.wake:
			next = time.Now()
		case <-t.C:
		}
		t.Stop()
	}
}

func (cl *clusterLoop) earliestDeadline() (time.Time, bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var d time.Time
	for _, o := range cl.owned {
		if d.IsZero() || o.lease.Deadline.Before(d) {
			d = o.lease.Deadline
		}
	}
	return d, !d.IsZero()
}

// checkDeadlines loses every unit whose lease was not renewed in time.
func (cl *clusterLoop) checkDeadlines(now time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, o := range cl.owned {
		if !o.lease.Held(now) {
			cl.loseLocked(o, "lease not renewed before its deadline")
		}
	}
}

// round is one heartbeat, renewal and balance pass.
func (cl *clusterLoop) round(ctx, srcCtx context.Context) {
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, cl.renewEvery)
	serverNow, err := cl.members.Heartbeat(bctx)
	cancel()
	beat := err == nil
	if err != nil {
		if ctx.Err() == nil {
			cl.log.Warn("cannot write the membership heartbeat", "err", err)
		}
	} else {
		cl.mu.Lock()
		cl.lastBeat = time.Now()
		cl.mu.Unlock()
	}
	cl.renewAll(ctx)

	lctx, cancel := context.WithTimeout(ctx, cl.renewEvery)
	live, lerr := cl.members.Live(lctx)
	all, verr := cl.leases.List(lctx)
	cancel()
	if lerr != nil || verr != nil {
		if ctx.Err() == nil {
			cl.log.Warn("cannot read members and leases", "err", errors.Join(lerr, verr))
		}
		return
	}
	view := all[:0:0]
	for _, l := range all {
		if _, ok := cl.defs[l.Unit]; ok {
			view = append(view, l)
		}
	}
	if !slices.Contains(live, cl.instance) && beat {
		live = append(live, cl.instance)
	}
	cl.g.metrics.ClusterMembers.Set(float64(len(live)))
	cl.mu.Lock()
	cl.view, cl.live = view, live
	var owned []string
	for u := range cl.owned {
		owned = append(owned, u)
	}
	cl.mu.Unlock()
	if !beat || !cl.acquiring.Load() {
		return // without a heartbeat this replica may be cut off: take nothing
	}
	held := map[string]bool{}
	counts := map[string]int{}
	for _, l := range view {
		if !l.Expires.Before(serverNow) {
			held[l.Unit] = true
			counts[l.Owner]++
		}
	}
	var free []string
	fresh := map[string]bool{}
	freeNow := map[string]bool{}
	for _, u := range cl.names {
		if !held[u] {
			free = append(free, u)
			freeNow[u] = true
			if !cl.prevFree[u] {
				fresh[u] = true
			}
		}
	}
	cl.prevFree = freeNow
	plan := cluster.Decide(cl.instance, cl.names, owned, free, live, counts, fresh)
	for _, u := range plan.Release {
		cl.handOver(ctx, u)
	}
	share := cluster.FairShare(len(cl.names), len(live))
	tried := 0
	for _, u := range plan.Acquire {
		if cl.ownedCount() >= share || !cl.acquiring.Load() {
			break
		}
		// Each acquisition fences, prepares the lanes and starts a
		// stream: with many units, acquiring them all in one round could
		// outlast the leases already held. The rest waits for the next
		// round, after their renewal (at least one is tried per round).
		if tried > 0 && time.Since(start) > cl.renewEvery/2 {
			break
		}
		tried++
		cl.acquire(ctx, srcCtx, u)
	}
}

func (cl *clusterLoop) ownedCount() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return len(cl.owned)
}

// ownedTenuresLocked returns the tenures of the owned units; cl.mu is held.
func (cl *clusterLoop) ownedTenuresLocked() []*event.Tenure {
	out := make([]*event.Tenure, 0, len(cl.owned))
	for _, o := range cl.owned {
		out = append(out, o.tenure)
	}
	return out
}

// renewAll renews every owned lease; a renewal the server refuses loses
// the unit, an error leaves it to the deadline.
func (cl *clusterLoop) renewAll(ctx context.Context) {
	cl.mu.Lock()
	owned := make([]*ownedUnit, 0, len(cl.owned))
	for _, o := range cl.owned {
		owned = append(owned, o)
	}
	cl.mu.Unlock()
	for _, o := range owned {
		rctx, cancel := context.WithDeadline(ctx, o.lease.Deadline)
		nl, ok, err := cl.leases.Renew(rctx, o.lease)
		cancel()
		cl.mu.Lock()
		switch {
		case cl.owned[o.lease.Unit] != o:
			// lost or released meanwhile
		case err != nil:
			if ctx.Err() == nil {
				cl.log.Warn("cannot renew lease; retrying until its deadline", "unit", o.lease.Unit, "err", err, "deadline_in", time.Until(o.lease.Deadline).Round(time.Millisecond))
			}
		case !ok:
			cl.loseLocked(o, "lease renewal refused: it lapsed or another replica took it")
		default:
			o.lease = nl
			o.tenure.Extend(nl.Deadline)
			if !o.tenure.Held() {
				// The renewal returned after the local deadline: the
				// tenure ended then (its work was cancelled and dropped)
				// and cannot be revived. Lose the unit and give the
				// renewed lease back, so that it is taken again (here
				// or elsewhere) under a new tenure instead of running
				// on with one that drops everything.
				cl.loseLocked(o, "the lease's local deadline passed before its renewal returned")
				go cl.endAndRelease(o)
			}
		}
		cl.mu.Unlock()
	}
}

// acquire tries to take unit and starts its source.
func (cl *clusterLoop) acquire(ctx, srcCtx context.Context, unit string) {
	actx, cancel := context.WithTimeout(ctx, cl.renewEvery)
	defer cancel()
	l, ok, err := cl.leases.Acquire(actx, unit, cl.instance)
	if err != nil || !ok {
		if err != nil && ctx.Err() == nil {
			cl.log.Warn("cannot acquire lease", "unit", unit, "err", err)
		}
		return
	}
	o := &ownedUnit{lease: l, tenure: event.NewTenure(unit, l.Epoch, l.Deadline)}
	cl.mu.Lock()
	cl.owned[unit] = o
	cl.g.engine.SetOwnedTenures(cl.ownedTenuresLocked())
	cl.mu.Unlock()
	// Fence before the source loads its checkpoint: from now on the
	// previous owner's saves are refused, and what it saved is read.
	err = cl.g.cps.Fence(actx, unit, l.Epoch)
	if err == nil {
		// The same for its parked entries and dead letters: the previous
		// owner's writes still on their way are refused by the store.
		err = cl.g.dls.Fence(actx, unit, l.Epoch)
	}
	if err == nil {
		err = cl.g.engine.PrepareUnit(actx, unit)
	}
	if err != nil {
		cl.log.Warn("cannot take over unit; giving its lease back", "unit", unit, "epoch", l.Epoch, "err", err)
		cl.mu.Lock()
		if cl.owned[unit] == o {
			delete(cl.owned, unit)
			cl.g.engine.SetOwnedTenures(cl.ownedTenuresLocked())
		}
		cl.mu.Unlock()
		o.tenure.End()
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cl.renewEvery)
		if o.tenure.Quiesce(qctx) == nil {
			_, _ = cl.leases.Release(qctx, unit, cl.instance, l.Epoch)
		}
		cancel()
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.owned[unit] != o {
		return // lost while fencing
	}
	o.ru = cl.g.startUnit(srcCtx, cl.defs[unit], o.tenure)
	cl.g.metrics.LeaseAcquisitions.WithLabelValues(unit).Inc()
	cl.g.metrics.LeaseOwned.WithLabelValues(unit).Set(1)
	cl.log.Info("acquired unit", "unit", unit, "epoch", l.Epoch)
}

// loseLocked stops a unit whose lease is lost; cl.mu is held.
func (cl *clusterLoop) loseLocked(o *ownedUnit, reason string) {
	unit := o.lease.Unit
	o.tenure.End()
	if o.ru != nil {
		o.ru.src.Abandon()
	}
	delete(cl.owned, unit)
	cl.g.engine.SetOwnedTenures(cl.ownedTenuresLocked())
	cl.g.metrics.LeaseLosses.WithLabelValues(unit).Inc()
	cl.g.metrics.LeaseOwned.WithLabelValues(unit).Set(0)
	cl.log.Error("lost the lease of a unit: stopped reading it; what it still held is dropped unacknowledged and re-read by its next owner",
		"unit", unit, "epoch", o.lease.Epoch, "reason", reason)
}

// unitEnded is told when a unit's source returned. A fenced save (another
// replica claimed the unit) is a loss; other endings are the gateway's.
func (cl *clusterLoop) unitEnded(u *runningUnit) {
	if !errors.Is(u.err, source.ErrLeaseLost) {
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if o := cl.owned[u.def.name]; o != nil && o.ru == u {
		cl.loseLocked(o, u.err.Error())
	}
}

// handOver gives unit to the other replicas cleanly, in the background:
// stop reading, wait (bounded) for its events to drain, save the
// checkpoint, release the lease. The lease keeps being renewed meanwhile.
func (cl *clusterLoop) handOver(ctx context.Context, unit string) {
	cl.mu.Lock()
	o := cl.owned[unit]
	if o == nil || o.leaving || o.ru == nil {
		cl.mu.Unlock()
		return
	}
	o.leaving = true
	cl.mu.Unlock()
	cl.log.Info("handing a unit over to another replica (more than the fair share here)", "unit", unit, "epoch", o.lease.Epoch)
	grace := cl.g.Config().Server.ShutdownGrace
	go func() {
		o.ru.src.StopReading()
		t := time.NewTimer(grace)
		select {
		case <-o.ru.src.Drained():
		case <-t.C:
			cl.log.Warn("handover: events still in flight after the grace period; the next owner delivers them again", "unit", unit)
		case <-ctx.Done():
		}
		t.Stop()
		o.ru.cancel() // final save, fenced by the epoch
		<-o.ru.done
		cl.mu.Lock()
		if cl.owned[unit] != o {
			cl.mu.Unlock()
			return // lost meanwhile
		}
		delete(cl.owned, unit)
		cl.g.engine.SetOwnedTenures(cl.ownedTenuresLocked())
		cl.g.metrics.LeaseOwned.WithLabelValues(unit).Set(0)
		cl.mu.Unlock()
		cl.endAndRelease(o)
	}()
}

// endAndRelease ends o's tenure, which cancels every wait of its queued
// work (limiter, backoff, pause, re-drive), waits (bounded) until no request
// of the unit is in progress, and only then releases the lease: the next
// owner, which may take the unit at once, is not overtaken by a request of
// this one.
func (cl *clusterLoop) endAndRelease(o *ownedUnit) {
	// Drain, not End: a request in progress is left to finish rather than
	// cancelled (a cancelled request may already be on the wire and reach
	// its receiver after the release); nothing new starts meanwhile.
	qctx, cancel := context.WithTimeout(context.Background(), cl.renewEvery)
	err := o.tenure.Drain(qctx)
	cancel()
	if err != nil {
		// A request that ignores its cancelled context: the lease is
		// left to expire rather than released under it.
		cl.log.Warn("handover: a request of the unit is still in progress; leaving its lease to expire", "unit", o.lease.Unit)
		return
	}
	cl.release(o)
}

func (cl *clusterLoop) release(o *ownedUnit) {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := cl.leases.Release(rctx, o.lease.Unit, cl.instance, o.lease.Epoch)
	switch {
	case err != nil:
		cl.log.Warn("cannot release lease; it expires by itself", "unit", o.lease.Unit, "err", err)
	case ok:
		cl.log.Info("released unit", "unit", o.lease.Unit, "epoch", o.lease.Epoch)
	}
}

// stopAcquiring is called when the gateway starts to stop: no unit is
// acquired or handed over any more; leases keep being renewed.
func (cl *clusterLoop) stopAcquiring() { cl.acquiring.Store(false) }

// releaseAll releases every lease still held and leaves the membership;
// called after the loop stopped and every source made its final save.
func (cl *clusterLoop) releaseAll() {
	cl.mu.Lock()
	owned := make([]*ownedUnit, 0, len(cl.owned))
	for u, o := range cl.owned {
		owned = append(owned, o)
		delete(cl.owned, u)
		cl.g.metrics.LeaseOwned.WithLabelValues(u).Set(0)
	}
	cl.g.engine.SetOwnedUnits([]string{})
	cl.mu.Unlock()
	for _, o := range owned {
		cl.endAndRelease(o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.members.Leave(ctx); err != nil {
		cl.log.Warn("cannot leave the membership; it expires by itself", "err", err)
	}
}

// status returns every unit's lease and role, whether the loop is healthy
// (a heartbeat within the ttl) and the live members.
func (cl *clusterLoop) status() ([]api.UnitStatus, bool, []string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	byUnit := map[string]lease.Lease{}
	for _, l := range cl.view {
		byUnit[l.Unit] = l
	}
	out := make([]api.UnitStatus, 0, len(cl.names))
	for _, d := range cl.g.defs {
		us := api.UnitStatus{Name: d.name, Source: d.source, Role: "standby"}
		if l, ok := byUnit[d.name]; ok {
			us.Owner, us.Epoch, us.Expires = l.Owner, l.Epoch, l.Expires
		}
		if o := cl.owned[d.name]; o != nil {
			us.Owner, us.Epoch, us.Expires, us.Role = cl.instance, o.lease.Epoch, o.lease.Expires, "active"
		}
		out = append(out, us)
	}
	healthy := !cl.lastBeat.IsZero() && time.Since(cl.lastBeat) < cl.ttl
	return out, healthy, slices.Clone(cl.live)
}
