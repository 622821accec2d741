package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/subscription"
)

// SystemActor is the actor of the audit records of what changegate does
// to subscriptions by itself (disable_after).
const SystemActor = "changegate"

// disableEvery is how often the gateway checks disable_after.
const disableEvery = time.Second

// disableAfterOf caches each subscription's disable_after by name and
// revision, so that the check does not decode every form every second.
type disableAfterOf map[string]struct {
	rev int64
	d   time.Duration
}

// watchDisableAfter disables, until ctx ends, every active subscription
// with disable_after whose sink on this replica has been failing without a
// success for that long: its status becomes "disabled" with the reason,
// through the store, conditionally on the revision read, so that of the
// replicas that see it failing one decides (the others' writes are
// refused as stale and they find it disabled at their next look). Its
// sink is then held as a paused one's: its events are parked, and
// re-driven in order when it is resumed.
func (g *gateway) watchDisableAfter(ctx context.Context) {
	cache := disableAfterOf{}
	t := time.NewTicker(disableEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.subs.mu.Lock()
		list, file := g.subs.list, g.subs.file
		g.subs.mu.Unlock()
		now := time.Now()
		if len(cache) > 2*len(list)+16 {
			cache = disableAfterOf{} // deleted subscriptions' entries
		}
		for _, sub := range list {
			if sub.Status != subscription.StatusActive {
				continue
			}
			d := cache.get(sub, file)
			if d <= 0 {
				continue
			}
			l := g.engine.Lane(sub.Name)
			if l == nil {
				continue
			}
			st := l.Status()
			if st.Held || st.FailingSince.IsZero() || now.Sub(st.FailingSince) < d {
				continue
			}
			reason := fmt.Sprintf("disable_after: its endpoint has failed without a success for %s (since %s)", d, st.FailingSince.UTC().Format(time.RFC3339))
			if st.LastError != "" {
				reason += "; last error: " + st.LastError // bounded by the sink (sinks.Answer)
			}
			_, err := g.subs.store.SetStatus(ctx, SystemActor, sub.Name, sub.Revision, subscription.StatusDisabled, reason)
			switch {
			case err == nil:
				g.log.Warn("subscription disabled", "subscription", sub.Name, "reason", reason)
			case errors.Is(err, subscription.ErrConflict), errors.Is(err, subscription.ErrNotFound):
				// Changed meanwhile (another replica disabled it, a
				// user paused or deleted it): seen at the next poll.
			case ctx.Err() == nil:
				g.log.Error("subscription: disabling it failed; retried at the next check", "subscription", sub.Name, "err", err)
			}
		}
	}
}

func (c disableAfterOf) get(sub subscription.Subscription, file *config.Config) time.Duration {
	if e, ok := c[sub.Name]; ok && e.rev == sub.Revision {
		return e.d
	}
	var d time.Duration
	if route, problems := config.ParseSubscriptionJSON(sub.Spec, file); problems == nil {
		d = route.DisableAfter
	}
	c[sub.Name] = struct {
		rev int64
		d   time.Duration
	}{sub.Revision, d}
	return d
}
