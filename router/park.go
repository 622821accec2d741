package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/sinks"
)

// This file is the parking stage of a lane: when a sink keeps failing, its
// backlog is written to the dead-letter store as parked entries and acked
// (the source is not held back), and a re-drive delivers the parked entries
// in stream order until none is left; then the lane goes live again.
//
// Order: an entry's place is its change's position (cluster time, then its
// id, which holds the resume token), fixed by its first write. While the
// lane is parked every event, new or re-read, is parked rather than
// delivered, and the lane goes live only when nothing is queued, held or
// parked (under mode, which enqueue holds shared). A re-drive deletes an
// entry only at the version it read, so a re-park written meanwhile (the
// same change re-read after a stream reopen or a restart) is re-driven
// again, in its place, instead of being lost.

// entry returns the dead-letter entry of kind for it.
func (l *Lane) entry(it *item, kind deadletter.Kind, reason string) (deadletter.Entry, error) {
	e, err := deadletter.EntryFor(it.ev, l.name, kind)
	if err != nil {
		return e, err
	}
	e.Attempts = int(it.attempts)
	e.Reason = reason
	if t := it.ev.Tenure; t != nil {
		// The write is fenced in the store by the tenure's epoch.
		e.Unit, e.Epoch = t.Unit, t.Epoch
	}
	e.FirstError, e.LastError = it.firstErr, it.lastErr
	e.FirstFailedAt, e.LastFailedAt = it.first, l.clk.Now()
	if kind == deadletter.KindParked && it.retryAt.After(l.clk.Now()) {
		e.RetryAt = it.retryAt
	}
	return e, nil
}

// park writes items to the store as parked entries and acks them.
func (l *Lane) park(ctx context.Context, items []*item) {
	if items = l.dropLost(items); len(items) == 0 {
		return
	}
	es := make([]deadletter.Entry, 0, len(items))
	for _, it := range items {
		e, err := l.entry(it, deadletter.KindParked, "parked")
		if err != nil {
			l.log.Error("cannot build parked entry", "event", it.ev.ID, "err", err)
			return
		}
		es = append(es, e)
	}
	mem := l.budget.Force(writeBytes(es...))
	defer mem.Release()
	// The write is work of the items' tenures: once one ends, the store
	// would refuse it anyway (a newer owner fenced the unit) or the
	// items are dropped unacknowledged; retrying (a transaction left open
	// by a killed replica conflicts until MongoDB aborts it) stops then.
	wctx, cancel := tenureCtx(ctx, items)
	defer cancel()
	start := time.Now()
	ok := l.persist(wctx, "park", func(ctx context.Context) error { return fencedWrite(l.dl.PutMany(ctx, es), items...) })
	if x := l.d.obs.live(); x != nil {
		x.stored(items, observe.Parked, "", "park", start, ok)
	}
	if !ok {
		return
	}
	l.mParked.Add(float64(len(items)))
	for _, it := range items {
		it.done()
	}
}

// writeBytes is what writing entries holds beyond their events while the
// write runs, charged to the byte budget then: each entry's envelope
// document (decoded from the event's encoding by deadletter.EntryFor) and
// the BSON of the write (change and envelope again, in the driver's wire
// message).
func writeBytes(es ...deadletter.Entry) int64 {
	var n int64
	for _, e := range es {
		n += int64(2*len(e.Envelope) + len(e.Change))
	}
	return n
}

func (l *Lane) setParked(on bool) {
	l.parked.Store(on)
	if on {
		l.mParkedGauge.Set(1)
		select {
		case l.redrive <- struct{}{}:
		default:
		}
	} else {
		l.mParkedGauge.Set(0)
	}
}

// watch parks the lane when the sink has been failing for ParkAfter, or is
// failing with ParkBacklog events queued or not yet passed by its
// read-ahead window.
func (l *Lane) watch(ctx context.Context) {
	tick := l.spec.ParkAfter / 10
	if tick > time.Second {
		tick = time.Second
	}
	if tick < 10*time.Millisecond {
		tick = 10 * time.Millisecond
	}
	for sleep(ctx, l.clk, tick) {
		if l.parked.Load() {
			continue
		}
		since := l.d.failing()
		if since.IsZero() {
			continue
		}
		failingFor := l.clk.Now().Sub(since)
		// The read-ahead window counts what holds the source back: the
		// events from the oldest unfinished one on, delivered or not.
		backlog := max(l.q.backlog(), int64(l.q.win.span()))
		if failingFor >= l.spec.ParkAfter || (l.spec.ParkBacklog > 0 && backlog >= int64(l.spec.ParkBacklog)) {
			l.log.Warn("sink keeps failing: parking its backlog in the dead-letter store for an ordered re-drive",
				"failing_for", failingFor.Round(time.Millisecond), "backlog", backlog)
			l.parkLane()
		}
	}
}

// parkLane parks the lane: deliveries in progress are cancelled (and
// parked by their workers, with their backoff), and the re-drive takes over.
// A lane not started yet (a reload's replacement waiting for its
// predecessor to drain) starts parked.
func (l *Lane) parkLane() {
	// Under liveMu, as tryGoLive: a lane going live concurrently must not
	// end up live with the cancelled context.
	l.liveMu.Lock()
	if l.liveCancel != nil {
		l.liveCancel()
	}
	l.setParked(true)
	l.liveMu.Unlock()
	l.q.wakeAll()
}

// redriveLoop delivers parked entries in order while the lane is parked, and
// turns the lane live again once nothing is parked or queued.
func (l *Lane) redriveLoop(ctx context.Context) {
	idle := 20 * time.Millisecond
	// The units whose entries the re-drive has listed: their sources'
	// acknowledged positions are taken before each listing.
	units := map[string]bool{}
	if l.spec.Held {
		// Parked until a reload replaces the lane with one not held,
		// which re-drives what this one parked.
		<-ctx.Done()
		return
	}
	for {
		if !l.parked.Load() {
			select {
			case <-l.redrive:
				continue
			case <-ctx.Done():
				return
			}
		}
		// Summaries only: a page of 512 whole entries could be 512 changes
		// of up to 16 MiB each. Each entry is read whole when its turn comes.
		acked := l.own.snapshotAcked(units)
		var entries []deadletter.Entry
		err := l.dl.Summaries(ctx, l.own.parkedFilter(l.name, redrivePage), nil, func(e deadletter.Entry) error {
			entries = append(entries, e)
			units[e.Unit] = true
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.log.Error("re-drive: cannot list parked events", "err", err)
			sleep(ctx, l.clk, time.Second)
			continue
		}
		if len(entries) == 0 {
			if l.tryGoLive(ctx) {
				continue
			}
			sleep(ctx, l.clk, idle)
			continue
		}
		if !l.redriveEntries(ctx, entries, acked) {
			// Nothing was re-driven: the units of these entries are no
			// longer owned here (the lease loop has not noticed yet), or
			// their sources have not read up to them yet.
			sleep(ctx, l.clk, idle)
		}
	}
}

// tenureContext returns ctx ended with tenure as well (ctx itself for a nil
// tenure).
func tenureContext(ctx context.Context, tenure *event.Tenure) (context.Context, context.CancelFunc) {
	if tenure == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-tenure.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (l *Lane) tryGoLive(ctx context.Context) bool {
	l.mode.Lock()
	defer l.mode.Unlock()
	if !l.q.empty() {
		return false
	}
	n, err := l.dl.Count(ctx, l.own.parkedFilter(l.name, 0))
	if err != nil || n != 0 {
		return false
	}
	l.liveMu.Lock()
	l.liveCtx, l.liveCancel = context.WithCancel(l.baseCtx)
	l.d.markHealthy()
	l.setParked(false)
	l.liveMu.Unlock()
	l.log.Info("parked backlog re-driven; sink is live again")
	return true
}

// redriveEntries delivers entries (in stream order) keeping per-key order,
// with up to as many keys in parallel as the lane has partitions. It reports
// whether any entry was finished.
func (l *Lane) redriveEntries(ctx context.Context, entries []deadletter.Entry, acked ackedSnapshot) bool {
	if l.spec.Group && slices.ContainsFunc(entries, func(e deadletter.Entry) bool { return e.Txn != nil }) {
		return l.redriveInOrder(ctx, entries, acked)
	}
	type group struct{ entries []deadletter.Entry }
	var groups []*group
	byKey := map[string]*group{}
	for _, e := range entries {
		key := e.Namespace + "\x00" + string(e.DocumentKey)
		switch l.spec.Ordering {
		case OrderStrict:
			key = ""
		case OrderNone:
			key = e.ID
		}
		g := byKey[key]
		if g == nil {
			g = &group{}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.entries = append(g.entries, e)
	}
	// Keys in parallel: the lane's workers, at most redriveParallel (each
	// holds one whole entry at a time).
	sem := make(chan struct{}, min(len(l.q.parts), redriveParallel))
	var wg sync.WaitGroup
	var progress atomic.Bool
	for _, g := range groups {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			for _, e := range g.entries {
				// The tenure is taken before anything of the entry is
				// read: the reads and the send are work of that tenure,
				// and end with it.
				tenure, ok := l.own.held(e.Unit)
				if !ok {
					return // handed over meanwhile: the unit's owner re-drives the rest
				}
				if !acked.readPast(e.Unit, e.ClusterTime) {
					// The unit's source had not yet re-read (and parked)
					// this change and the ones before it when the
					// entries were listed: the next pass.
					return
				}
				if !l.redriveOne(ctx, e, tenure) {
					return // stopping or handed over: the rest stay parked, in order
				}
				progress.Store(true)
			}
		}()
	}
	wg.Wait()
	return progress.Load()
}

// redrivePage is the most parked entries one pass of the re-drive lists.
const redrivePage = 512

// redriveInOrder re-drives entries of a grouped lane (transactions =
// "group") one after the other in stream order, the entries of one
// transaction (consecutive in stream order) together in one delivery, as
// it would have gone live. A transaction at the end of a full page may
// continue on the next: it waits for the next pass, unless it fills the
// page alone. It reports whether any entry was finished.
func (l *Lane) redriveInOrder(ctx context.Context, entries []deadletter.Entry, acked ackedSnapshot) bool {
	var runs [][]deadletter.Entry
	for i, e := range entries {
		if i > 0 && e.Txn != nil && entries[i-1].Txn != nil && sameTxn(e, entries[i-1]) {
			runs[len(runs)-1] = append(runs[len(runs)-1], e)
			continue
		}
		runs = append(runs, []deadletter.Entry{e})
	}
	if len(entries) >= redrivePage && len(runs) > 1 && runs[len(runs)-1][0].Txn != nil {
		runs = runs[:len(runs)-1]
	}
	progress := false
	for _, run := range runs {
		// The tenure is taken before anything of the run is read (the
		// entries of a run share their unit): the reads and the send are
		// work of that tenure, and end with it.
		tenure, held := l.own.held(run[0].Unit)
		if !held {
			return progress // handed over: the unit's owner re-drives the rest
		}
		for _, e := range run {
			if !acked.readPast(e.Unit, e.ClusterTime) {
				return progress // not read up to it when listed: the next pass
			}
		}
		ok := false
		if len(run) == 1 && run[0].Txn == nil {
			ok = l.redriveOne(ctx, run[0], tenure)
		} else {
			ok = l.redriveTxn(ctx, run, tenure)
		}
		if !ok {
			return progress // stopping or handed over: the rest stay parked, in order
		}
		progress = true
	}
	return progress
}

// sameTxn reports whether two parked entries are events of one transaction
// read by one source.
func sameTxn(a, b deadletter.Entry) bool {
	return a.Txn.ID == b.Txn.ID && a.Source == b.Source && a.Unit == b.Unit
}

// redriveTxn re-drives the parked entries of one transaction in one
// delivery marked as a group (sinks.WithTxnGroup), retried until the sink
// takes it; entries the sink refuses for good become failed dead letters,
// the others are deleted. It returns false when ctx or the unit's tenure
// ended (the entries stay parked). Every store read, wait and send runs
// under tenure (nil outside cluster mode).
//
// A transaction larger than may be held (issue 39) goes out in parts, as
// on the live path: entries are read while the budgets admit them at once
// and the part holds less than memory.TxnPartShare of the byte budget; then
// what is held is delivered (sinks.TxnPart, numbered on), its memory
// returned, and the next entry waits for room. The entries of the
// delivered parts stay parked until the last part is delivered, then are
// all deleted: a pass stopped between parts re-drives the transaction again
// from part 1, as a receiver of parts expects.
func (l *Lane) redriveTxn(laneCtx context.Context, run []deadletter.Entry, tenure *event.Tenure) bool {
	ctx, cancel := tenureContext(laneCtx, tenure)
	defer cancel()
	var ps []*parkedItem   // the part being read
	var sent []*parkedItem // entries of the parts delivered (released: no event held)
	defer func() {
		for _, p := range ps {
			p.release()
		}
	}()
	var part *sinks.TxnPart // nil until the transaction goes out in parts
	next := 1
	partMax := l.budget.Limit() / memory.TxnPartShare // 0: no budget, no limit
	held := func() int64 {
		var n int64
		for _, p := range ps {
			n += p.it.mem.Bytes()
		}
		return n
	}
	// deliver sends ps as one part (final: the transaction's last); false
	// when the pass stops here (stopping, or an entry was refused).
	deliver := func(final bool) (ok, cont bool) {
		var items []*item
		for _, p := range ps {
			if !p.skip {
				items = append(items, p.it)
			}
		}
		gctx := sinks.WithTxnGroup(ctx)
		if !final || part != nil {
			part = &sinks.TxnPart{First: next, Final: final}
			gctx = sinks.WithTxnPart(gctx, part)
		}
		var failed []*item
		var err error
		if len(items) > 0 {
			failed, err = l.d.deliver(gctx, items, modeRedrive, nil, 0)
		}
		if ctx.Err() != nil || errors.Is(err, errTenureEnded) {
			return false, false
		}
		if part != nil {
			next += part.Used
		}
		if err != nil {
			// Refused: the delivered parts' entries are done, the refused
			// ones failed, the others stay parked for the next pass.
			for _, p := range sent {
				l.finishParked(laneCtx, ctx, p, nil)
			}
			for _, p := range ps {
				if slices.Contains(failed, p.it) {
					l.finishParked(laneCtx, ctx, p, err)
				}
			}
			return false, true
		}
		for _, p := range ps {
			p.delivered()
		}
		sent, ps = append(sent, ps...), ps[:0]
		return true, true
	}
	for i := 0; i < len(run); {
		if len(ps) > 0 && partMax > 0 && held() >= partMax {
			if ok, cont := deliver(false); !ok {
				return cont
			}
		}
		p, cont, full := l.loadParked(ctx, run[i], len(ps) == 0, tenure)
		if full {
			if ok, cont := deliver(false); !ok {
				return cont
			}
			continue // the same entry, waiting for room now
		}
		i++
		if p == nil {
			if !cont {
				return false
			}
			continue
		}
		ps = append(ps, p)
	}
	if ok, cont := deliver(true); !ok {
		return cont
	}
	for _, p := range sent {
		l.finishParked(laneCtx, ctx, p, nil)
	}
	return true
}

// redriveParallel bounds the documents re-driven at once, and so the whole
// entries held in memory by a re-drive.
const redriveParallel = 64

// redriveOne reads the parked entry of summary s whole, delivers it (after
// its RetryAt) and deletes it at the version it read; it returns false when
// ctx ended or tenure (the tenure of the entry's unit, nil outside cluster
// mode) ended (cluster mode: the entry stays parked for the unit's next
// owner). Every store read, wait and send of the entry runs under the
// tenure: a read held up by a cut connection past the end of the tenure
// sends nothing.
func (l *Lane) redriveOne(laneCtx context.Context, s deadletter.Entry, tenure *event.Tenure) bool {
	ctx, cancel := tenureContext(laneCtx, tenure)
	defer cancel()
	p, cont, _ := l.loadParked(ctx, s, true, tenure)
	if p == nil {
		return cont
	}
	defer p.release()
	var err error
	if !p.skip { // skip_empty_updates: nothing to send, done
		_, err = l.d.deliver(ctx, []*item{p.it}, modeRedrive, nil, 0)
	}
	if ctx.Err() != nil || errors.Is(err, errTenureEnded) {
		return false // stopping, or handed over: the entry stays parked
	}
	l.finishParked(laneCtx, ctx, p, err)
	return true
}

// parkedItem is a parked entry read whole for its re-drive.
type parkedItem struct {
	s, e    deadletter.Entry // the summary listed, the entry read
	it      *item
	skip    bool // skip_empty_updates: nothing to send
	release func()
	told    bool // delivered: the observer was told, the event released
}

// delivered tells the observer that p was delivered, ahead of its delete
// (a part of a transaction whose later parts are still to be sent), and
// returns and drops what p holds of the change: only what its delete
// needs is kept.
func (p *parkedItem) delivered() {
	if p.it.obs != nil {
		p.it.obs.outcome(p.it, observe.Outcome{Kind: observe.Delivered})
	}
	p.told = true
	p.release()
	p.release = func() {}
	p.e = deadletter.Entry{ID: p.e.ID, EventID: p.e.EventID}
	p.it = &item{}
}

// loadParked reads the parked entry of summary s whole and rebuilds its
// item. It returns nil with cont true when the entry needs no delivery
// (gone, converted to failed), and nil with cont false when ctx ended or
// the tenure of the entry's unit ended. wait is false for the later
// entries of a transaction read to be delivered with the earlier ones:
// when the byte budgets do not admit one at once, it returns full (nothing
// read; waiting on bytes the transaction's earlier entries hold could never
// end, redriveTxn sends them first).
func (l *Lane) loadParked(ctx context.Context, s deadletter.Entry, wait bool, tenure *event.Tenure) (p *parkedItem, cont, full bool) {
	// An entry is read whole only once the byte budget admits the largest
	// one can be (MaxEntryBytes); the charge is then set to what was read,
	// and the event rebuilt from it, its shaped views and encodings are
	// charged to it until it is delivered (or converted).
	//
	// It is admitted first by the re-drives' share of the budget, so that
	// re-drives retrying a sink that is still down never hold more than
	// RedriveSharePercent of it, then by the budget itself.
	var share, mem *memory.Charge
	if wait {
		var err error
		share, err = l.redriveBudget.Acquire(ctx, deadletter.MaxEntryBytes, "re-drive of sink "+l.name)
		if err != nil {
			return nil, false, false
		}
		mem, err = l.budget.Acquire(ctx, deadletter.MaxEntryBytes, "re-drive of sink "+l.name)
		if err != nil {
			share.Release()
			return nil, false, false
		}
	} else {
		var ok bool
		if share, ok = l.redriveBudget.TryAcquire(deadletter.MaxEntryBytes); !ok {
			return nil, true, true
		}
		if mem, ok = l.budget.TryAcquire(deadletter.MaxEntryBytes); !ok {
			share.Release()
			return nil, true, true
		}
	}
	release := func() { mem.Release(); share.Release() }
	done := false
	defer func() {
		if !done {
			release()
		}
	}()
	var e deadletter.Entry
	var found bool
	if !l.persist(ctx, "get", func(ctx context.Context) error {
		var err error
		e, found, err = l.dl.Get(ctx, s.ID)
		return err
	}) {
		return nil, false, false
	}
	if !found || e.Kind != deadletter.KindParked {
		return nil, true, false // delivered, converted or purged meanwhile
	}
	read := int64(len(e.Change) + len(e.Envelope) + len(e.DocumentKey))
	share.Resize(read)
	mem.Resize(read)
	ev, err := event.FromChange(e.Source, 0, e.Change)
	if err != nil {
		reason, msg := "corrupt", fmt.Sprintf("cannot rebuild parked event: %v", err)
		if e.ChangeDropped {
			reason, msg = "too_large_to_park", "the change was too large to store with its parked entry (over 16 MiB with its envelope); it cannot be re-driven"
		}
		// Loud: this event reaches the sink only if someone acts on it.
		l.log.Error("parked event cannot be re-driven; it stays in the dead-letter collection as failed", "event", e.EventID, "reason", reason, "err", msg)
		l.persist(ctx, "convert", func(ctx context.Context) error {
			return l.dl.Convert(ctx, e.ID, deadletter.KindFailed, reason, msg)
		})
		l.mDead.Inc()
		return nil, true, false
	}
	ev.Rules = e.Rules
	ev.Txn = e.Txn // index and last are the entry's, not the change's
	// The re-drive of a unit's entry is work of the unit's tenure: its
	// waits end and nothing more is sent once the tenure ends.
	if !tenure.Held() {
		return nil, false, false
	}
	ev.Tenure = tenure
	ev.Mem = mem // views made by reshape share it
	// The entry keeps the raw change: route and shape it as the current
	// configuration would live. One no current rule routes to this sink is
	// not delivered: it stays as failed, for an operator to replay (with
	// deliver_unrouted) or purge.
	ev, skip, err := l.reshape(ev)
	if err != nil {
		l.log.Warn("parked event is no longer routed to its sink by any rule; it stays in the dead-letter collection as failed", "event", e.EventID, "rules", e.Rules, "err", err)
		l.persist(ctx, "convert", func(ctx context.Context) error {
			return l.dl.Convert(ctx, e.ID, deadletter.KindFailed, "not_routed", err.Error())
		})
		l.mDead.Inc()
		return nil, true, false
	}
	ev.Tenure = tenure // on the shaped view too
	it := newItem(ev)
	it.attempts, it.first, it.firstErr, it.retryAt = int32(min(e.Attempts, math.MaxInt32)), e.FirstFailedAt, e.FirstError, e.RetryAt
	it.obs = l.d.obs.redrive()
	done = true
	// Abandoned unless finishParked gave it an outcome.
	return &parkedItem{s: s, e: e, it: it, skip: skip, release: func() { it.abandon(); release() }}, true, false
}

// finishParked records the outcome of a re-driven entry: err nil deletes
// it at the version listed, an error converts it to a failed dead letter.
// ctx is the entry's tenure's; the delete of a delivered entry runs under
// laneCtx: it may outlive the tenure (an entry left behind is only
// delivered again by the next owner).
func (l *Lane) finishParked(laneCtx, ctx context.Context, p *parkedItem, err error) {
	e, it := p.e, p.it
	if err != nil {
		reason := "error"
		if de, ok := sinks.Classify(err); ok {
			reason = de.Reason
		}
		l.persist(ctx, "convert", func(ctx context.Context) error {
			return l.dl.Convert(ctx, e.ID, deadletter.KindFailed, reason, err.Error())
		})
		if it.obs != nil {
			it.obs.outcome(it, observe.Outcome{Kind: observe.DeadLettered, Reason: reason, Failure: failureOf(err)})
		}
		l.mDead.Inc()
		return
	}
	if it.obs != nil && !p.told {
		it.obs.outcome(it, observe.Outcome{Kind: observe.Delivered})
	}
	var deleted bool
	if l.persist(laneCtx, "delete", func(ctx context.Context) error {
		var err error
		// The version listed, not the one read now: an entry parked again
		// since the listing must go round again with the later entries
		// of its document that this pass also delivers, so that the
		// re-read is replayed in full.
		deleted, err = l.dl.DeleteVersion(ctx, e.ID, p.s.Version)
		return err
	}) {
		l.mRedriven.Inc()
		l.mDelivered.Inc()
		if !deleted {
			// Parked again while it was being delivered (a re-read of
			// the same change): that version stays and is re-driven
			// again in its place; at least once, never lost.
			l.log.Debug("re-driven event was parked again meanwhile; it will be re-driven again", "event", e.EventID)
		}
	}
}
