package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/observe"
)

// deliveryLogStopGrace bounds how long a stop waits for the delivery
// log's last records to be written.
const deliveryLogStopGrace = 5 * time.Second

// newDeliveryLog builds the delivery log of cfg ([delivery_log]): the Log
// for the reads (Lifecycle routes by the rules of the running
// configuration, cfgNow) and the started Writer with its observer, nil in
// mode "off". Index creation failing is logged, not fatal: records are
// written without them (and without the TTL until a later start makes it).
func newDeliveryLog(ctx context.Context, cfg *config.Config, client *mongo.Client, deps deliverylog.Deps, cfgNow func() *config.Config,
	reg prometheus.Registerer, log *slog.Logger) (*deliverylog.Log, *deliverylog.Writer, observe.Observer) {
	dc := cfg.DeliveryLog
	coll := client.Database(cfg.Mongo.StateDatabase).Collection(dc.Collection)
	deps.Routes = func(source string) []deliverylog.Route { return routesOf(cfgNow(), source) }
	l := deliverylog.NewLog(coll, dc.Retention, dc.Mode, deps)
	if dc.Mode == config.DeliveryLogOff {
		return l, nil, nil
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := l.EnsureIndexes(ictx); err != nil {
		log.Warn("cannot create the delivery log's indexes (records are written without them)", "err", err)
	}
	cancel()
	w := deliverylog.NewWriter(coll, deliverylog.WriterOptions{Mode: dc.Mode, Replica: cfg.Cluster.Instance,
		Logger: log.With("component", "delivery_log"), Registerer: reg})
	w.Start()
	return l, w, deliverylog.NewObserver(w)
}

// DeliveryLog returns the delivery log of cfg on client, for reading:
// Lifecycle places events against cfg's checkpoints, dead letters and
// rules.
func DeliveryLog(cfg *config.Config, client *mongo.Client) *deliverylog.Log {
	cps, dls := Stores(cfg, client)
	dc := cfg.DeliveryLog
	return deliverylog.NewLog(client.Database(cfg.Mongo.StateDatabase).Collection(dc.Collection), dc.Retention, dc.Mode, deliverylog.Deps{
		Checkpoints: cps, DeadLetters: dls, Routes: func(source string) []deliverylog.Route { return routesOf(cfg, source) },
	})
}

// routesOf returns the sinks the rules of source route to in cfg, each
// with those rules, in configuration order.
func routesOf(cfg *config.Config, source string) []deliverylog.Route {
	var out []deliverylog.Route
	at := map[string]int{}
	for _, r := range cfg.Rules {
		if r.Source != source {
			continue
		}
		for _, s := range r.Sinks {
			i, ok := at[s]
			if !ok {
				i = len(out)
				at[s] = i
				out = append(out, deliverylog.Route{Sink: s})
			}
			out[i].Rules = append(out[i].Rules, r.Name)
		}
	}
	return out
}

// stopDeliveryLog writes what the delivery log still holds, for at most
// deliveryLogStopGrace.
func stopDeliveryLog(w *deliverylog.Writer, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), deliveryLogStopGrace)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		log.Warn("delivery log: records left unwritten at stop", "dropped", w.Dropped(), "err", err)
	}
}
