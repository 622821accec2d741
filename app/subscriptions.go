package app

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/subscription"
)

// subscriptions are the stored subscriptions the gateway runs beside the
// operator's file ([subscriptions] enabled): the configuration in force is
// subscription.Merge of the file and the last set read. Every replica
// follows the collection (Store.Watch) and applies a change through the
// reload path, so kept sinks keep their lanes and positions.
type subscriptions struct {
	store  *subscription.Store
	sealer *subscription.Sealer // nil without a key: subscriptions whose secrets cannot open are left out

	// recent keeps each source's last changes for the API's test.
	recent *recentChanges
	// notices are the operational notices for [subscriptions]
	// events_sink.
	notices *subscription.Notifier

	mu   sync.Mutex
	list []subscription.Subscription // the last set read
	file *config.Config              // the operator's file as last applied
	// catching are the new subscriptions whose sinks are held while they
	// catch up (catchup.go).
	catching map[string]bool
	// catchUps are the catch-ups running.
	catchUps sync.WaitGroup
	// wantBackfill are the subscriptions created here with "backfill":
	// true whose backfill starts once they are applied and caught up.
	wantBackfill map[string]bool
}

// openSubscriptions returns the gateway's subscriptions with the stored
// ones read, or nil when [subscriptions] is not enabled.
func openSubscriptions(ctx context.Context, cfg *config.Config, client *mongo.Client, reg prometheus.Registerer, log *slog.Logger) (*subscriptions, error) {
	if !cfg.Subscriptions.Enabled {
		return nil, nil
	}
	s := &subscriptions{file: cfg, recent: newRecentChanges()}
	if cfg.Subscriptions.Key != "" {
		var err error
		if s.sealer, err = subscription.NewSealer([]byte(cfg.Subscriptions.Key.Value())); err != nil {
			return nil, fmt.Errorf("subscriptions: %w", err)
		}
	} else {
		log.Warn("subscriptions: no key (CHANGEGATE_SECRET_KEY or [subscriptions] key_file): none can be created, and stored ones are not applied")
	}
	s.notices = subscription.NewNotifier(subscription.NotifierOptions{Sink: s.eventsSink, Registerer: reg, Log: log.With("component", "subscription_notices")})
	s.store = subscription.NewStore(client.Database(cfg.Mongo.StateDatabase), subscription.Options{Sealer: s.sealer, Log: log,
		DeleteGrace: func() time.Duration { return s.fileConfig().Subscriptions.DeleteGrace },
		OnStatus: func(previous subscription.Status, sub subscription.Subscription, actor string) {
			if n, ok := subscription.StatusNotice(previous, sub, actor, time.Now()); ok {
				s.notices.Notify(n)
			}
		}})
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.store.EnsureIndexes(rctx); err != nil {
		log.Warn("subscriptions: cannot create the audit index (will work without it)", "err", err)
	}
	// Read before anything runs: a restart must not route a change
	// without the subscriptions it was routed to before.
	list, err := s.store.All(rctx)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: %w", err)
	}
	s.list = list
	return s, nil
}

// runPurges removes what deleted subscriptions parked or dead-lettered once
// their delete_grace is over (subscription.Store.RunPurges), looking every
// tenth of the grace, between 1 s and a minute, until ctx ends.
func (s *subscriptions) runPurges(ctx context.Context, dls *deadletter.Store, log *slog.Logger) {
	every := min(max(s.fileConfig().Subscriptions.DeleteGrace/10, time.Second), time.Minute)
	s.store.RunPurges(ctx, every, func(ctx context.Context, sink string) (int64, error) {
		return dls.Purge(ctx, deadletter.Filter{Sink: sink})
	}, func(name string) bool { return s.fileConfig().Sink(name) != nil }, log)
}

// eventsSink returns [subscriptions] events_sink of the file in force.
func (s *subscriptions) eventsSink() string { return s.fileConfig().Subscriptions.EventsSink }

// isSubscription reports whether name is a stored subscription's sink.
func (s *subscriptions) isSubscription(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.list {
		if sub.Name == name {
			return true
		}
	}
	return false
}

// merge returns file with the current subscriptions added, logging those
// left out; it records file as the operator's file in force.
func (s *subscriptions) merge(file *config.Config, log *slog.Logger) *config.Config {
	if s == nil {
		return file
	}
	s.mu.Lock()
	list := s.list
	catching := maps.Clone(s.catching)
	s.mu.Unlock()
	merged, skipped := subscription.Merge(file, list, s.sealer, time.Now())
	for _, sk := range skipped {
		log.Error("subscription not applied", "subscription", sk.Name, "reason", sk.Reason)
	}
	for i := range merged.Sinks {
		if catching[merged.Sinks[i].Name] {
			merged.Sinks[i].Held = true
		}
	}
	return merged
}

// watchSubscriptions applies every change of the stored subscriptions
// until ctx ends; a new one is applied held while it catches up
// (catchup.go). It returns once the catch-ups it started ended.
func (g *gateway) watchSubscriptions(ctx context.Context) {
	defer g.subs.catchUps.Wait()
	_ = g.subs.store.Watch(ctx, 0, func(list []subscription.Subscription) {
		g.applySubscriptions(ctx, list, func(s subscription.Subscription, _ error) { g.caughtUp(s.Name) })
	})
}

// applySubscriptions applies list, the stored subscriptions, and starts
// the catch-up of each new one (under ctx); then, when not nil, is called
// with each new one once it caught up and was released.
func (g *gateway) applySubscriptions(ctx context.Context, list []subscription.Subscription, then func(subscription.Subscription, error)) {
	g.reloadMu.Lock()
	g.subs.mu.Lock()
	g.subs.list = list
	file := g.subs.file
	g.subs.mu.Unlock()
	fresh := g.freshSubscriptions(list)
	err := g.apply(file)
	g.reloadMu.Unlock()
	if err != nil {
		g.log.Error("subscriptions: applying the stored subscriptions failed; the running configuration stays in force", "err", err)
		g.subs.mu.Lock()
		for _, s := range fresh {
			delete(g.subs.catching, s.Name)
		}
		g.subs.mu.Unlock()
		return
	}
	for _, s := range fresh {
		g.subs.catchUps.Add(1)
		go func() {
			defer g.subs.catchUps.Done()
			g.catchUp(ctx, s, func(err error) {
				if then != nil {
					then(s, err)
				}
			})
		}()
	}
}

// fileConfig returns the operator's file in force (without the
// subscriptions).
func (s *subscriptions) fileConfig() *config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file
}

// testSubscription answers POST /api/v1/subscriptions/test: each change
// routed by the subscription's rule alone, with the compiled rules and the
// envelope encoding a run uses (DryRun), against the operator's file in
// force. The body is what its webhook would post (one element of the array
// when it batches), unsigned. Nothing is stored or sent.
func (s *subscriptions) testSubscription(route *config.SubscriptionRoute, changes []bson.Raw) ([]api.SubscriptionTestResult, error) {
	c := *s.fileConfig()
	c.Sinks = []config.Sink{route.Sink}
	c.Rules = []config.Rule{route.Rule}
	dry, err := NewDryRun(&c)
	if err != nil {
		return nil, err
	}
	out := make([]api.SubscriptionTestResult, len(changes))
	for i, raw := range changes {
		r := &out[i]
		routed, err := dry.Route(route.Rule.Source, uint64(i+1), raw)
		if err != nil {
			r.Error = "not a change event: " + err.Error()
			continue
		}
		r.ID, r.OperationType = routed.Event.ID, routed.Event.OperationType
		for _, d := range routed.Deliveries {
			r.Matches = true
			switch {
			case d.Skipped:
				r.Skipped = true
			case d.Err != nil:
				r.Error = "the envelope cannot be encoded (the subscription would dead-letter it): " + d.Err.Error()
			default:
				r.Body = d.Envelope
			}
		}
	}
	return out, nil
}
