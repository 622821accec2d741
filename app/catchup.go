package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/subscription"
)

// A new subscription is stored with the cluster time of its creation but
// applied by each replica only when it next reads the subscriptions (a
// poll): the changes its source dispatched in between were routed without
// it. Each replica therefore applies a subscription it has not run yet with
// its sink held (its events parked, in their place), reads the changes
// from the creation's cluster time to a cluster time taken after the
// subscription is in force again (source.Reread, for each unit of the
// source running here, under the unit's tenure), hands them to that sink
// alone (Engine.DispatchTo: parked as well; one the live stream parked too
// is the same entry), then applies it released: the new lane re-drives the
// parked entries in stream order, so nothing is missed and each document's
// changes arrive in order. No checkpoint moves; no other sink sees them.

// maxCatchUpInFlight bounds the catch-up's changes handed to the lane and
// not yet parked.
const maxCatchUpInFlight = 1000

// freshSubscriptions returns the active subscriptions of list whose sinks
// the configuration in force does not run yet, marking them held for their
// catch-up (subscriptions.merge applies them held until release).
func (g *gateway) freshSubscriptions(list []subscription.Subscription) []subscription.Subscription {
	cur := g.Config()
	var fresh []subscription.Subscription
	g.subs.mu.Lock()
	defer g.subs.mu.Unlock()
	for _, s := range list {
		if s.Status != subscription.StatusActive || cur.Sink(s.Name) != nil || g.subs.catching[s.Name] {
			continue
		}
		if g.subs.catching == nil {
			g.subs.catching = map[string]bool{}
		}
		g.subs.catching[s.Name] = true
		fresh = append(fresh, s)
	}
	return fresh
}

// catchUp runs the catch-up of sub (freshly applied, held), then releases
// its sink; then calls then (nil: nothing), with the catch-up's error.
func (g *gateway) catchUp(ctx context.Context, sub subscription.Subscription, then func(error)) {
	err := g.readCatchUp(ctx, sub)
	switch {
	case ctx.Err() != nil:
		return // stopping: the process ends with the sink held
	case err != nil:
		g.log.Error("subscriptions: catch-up of a new subscription failed; the changes committed between its creation and its application here may be missing",
			"subscription", sub.Name, "created_cluster_time", sub.CreatedClusterTime, "err", err)
	}
	g.reloadMu.Lock()
	g.subs.mu.Lock()
	delete(g.subs.catching, sub.Name)
	file := g.subs.file
	g.subs.mu.Unlock()
	if aerr := g.apply(file); aerr != nil {
		g.log.Error("subscriptions: releasing a caught-up subscription failed; the running configuration stays in force", "subscription", sub.Name, "err", aerr)
	}
	g.reloadMu.Unlock()
	if then != nil {
		then(err)
	}
}

// readCatchUp hands the changes of sub's source from its creation's
// cluster time to now (taken after it was applied held) to its sink, for
// the units running here, and waits until each was parked.
func (g *gateway) readCatchUp(ctx context.Context, sub subscription.Subscription) error {
	cfg := g.Config()
	src := ""
	for _, r := range cfg.Rules {
		if r.Name == sub.Name {
			src = r.Source
		}
	}
	if src == "" || sub.CreatedClusterTime.IsZero() {
		return nil // not applied (left out, or deleted since), or no time to start from
	}
	until, err := clusterTimeNow(ctx, g.client, cfg.Mongo.StateDatabase)
	if err != nil {
		return fmt.Errorf("read the cluster time: %w", err)
	}
	handed := 0
	for _, u := range g.units.snapshot() {
		if u.def.source != src {
			continue
		}
		n, err := g.catchUpUnit(ctx, u, sub, until)
		handed += n
		if err != nil {
			return fmt.Errorf("unit %s: %w", u.def.name, err)
		}
	}
	g.log.Info("subscriptions: caught up a new subscription", "subscription", sub.Name, "from", sub.CreatedClusterTime, "to", until, "changes", handed)
	return nil
}

// catchUpUnit reads unit u's changes from sub's creation to until and hands
// them to sub's sink, under u's tenure; it returns how many it handed on,
// once each was parked.
func (g *gateway) catchUpUnit(ctx context.Context, u *runningUnit, sub subscription.Subscription, until bson.Timestamp) (int, error) {
	spec := u.def.spec
	spec.Budget = g.budget
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxCatchUpInFlight)
	n := 0
	err := source.Reread(ctx, g.client, spec, sub.CreatedClusterTime, func(ev *event.Event, _ bson.Timestamp) (bool, error) {
		if ev == nil || ev.ClusterTime.After(until) {
			return false, nil
		}
		if !ev.ClusterTime.After(sub.CreatedClusterTime) {
			// Committed at the creation's cluster time, the last write the
			// creation read: before the subscription.
			return true, nil
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		ev.Tenure = u.tenure
		wg.Add(1)
		done := func() { <-slots; wg.Done() }
		if !g.engine.DispatchTo(sub.Name, ev, done) {
			done() // today's rules do not route it there
			return true, nil
		}
		n++
		return true, nil
	})
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	var lost <-chan struct{}
	if u.tenure != nil {
		lost = u.tenure.Done()
	}
	select {
	case <-waited:
	case <-lost:
		// The unit's lease is lost: its lanes drop what they hold of it,
		// and its next owner reads on from the unit's checkpoint.
		return n, fmt.Errorf("the unit's lease was lost during the catch-up")
	case <-ctx.Done():
		return n, ctx.Err()
	}
	return n, err
}

// backfillWhenApplied starts a backfill of the subscription name's source
// to its sink (it was created here with "backfill": true) once this process
// runs it caught up: now if it does, else when its catch-up ends
// (caughtUp).
func (g *gateway) backfillWhenApplied(name string) {
	g.subs.mu.Lock()
	applied := !g.subs.catching[name] && g.Config().Sink(name) != nil
	if !applied {
		if g.subs.wantBackfill == nil {
			g.subs.wantBackfill = map[string]bool{}
		}
		g.subs.wantBackfill[name] = true
	}
	g.subs.mu.Unlock()
	if applied {
		g.startSubscriptionBackfill(name)
	}
}

// caughtUp is called once the subscription name caught up and was
// released: it starts the backfill its creation asked for here.
func (g *gateway) caughtUp(name string) {
	g.subs.mu.Lock()
	want := g.subs.wantBackfill[name]
	delete(g.subs.wantBackfill, name)
	g.subs.mu.Unlock()
	if want {
		g.startSubscriptionBackfill(name)
	}
}

// startSubscriptionBackfill starts a backfill of the subscription name's
// source to its sink: every document, as "snapshot" events its rule routes
// (its filter applies to them as to its changes).
func (g *gateway) startSubscriptionBackfill(name string) {
	cfg := g.Config()
	src := ""
	for _, r := range cfg.Rules {
		if r.Name == name {
			src = r.Source
		}
	}
	if src == "" {
		g.log.Warn("subscriptions: no backfill: the subscription is not applied (deleted, or left out)", "subscription", name)
		return
	}
	// The backfill runs until it ends or the gateway stops (StopAll), and
	// resumes at the next start.
	st, err := g.backfills.Start(context.Background(), cfg, backfill.Request{Source: src, Sink: name})
	if err != nil {
		g.log.Error("subscriptions: cannot start the backfill asked for at creation", "subscription", name, "err", err)
		return
	}
	g.log.Info("subscriptions: backfill started", "subscription", name, "backfill", st.ID)
}

// clusterTimeNow returns the server's cluster time now: every change
// committed so far is at or before it.
func clusterTimeNow(ctx context.Context, client *mongo.Client, db string) (bson.Timestamp, error) {
	sess, err := client.StartSession()
	if err != nil {
		return bson.Timestamp{}, err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Database(db).RunCommand(mongo.NewSessionContext(cctx, sess), bson.D{{Key: "ping", Value: 1}}).Err(); err != nil {
		return bson.Timestamp{}, err
	}
	t := sess.OperationTime()
	if t == nil {
		return bson.Timestamp{}, fmt.Errorf("the server answered no operationTime")
	}
	return *t, nil
}
