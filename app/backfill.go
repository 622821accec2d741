package app

import (
	"context"
	"log/slog"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// Backfill runs one backfill from the command line (backfill.CommandLine),
// or a redelivery from the oplog (req.Kind backfill.KindRedelivery: the
// changes of the window delivered to req.Sink one at a time, in order):
// it sends the documents of req.Source matching req.Filter to req.Sink (or
// every matching sink) with the sinks' retry policy, through an engine built
// from cfg whose lanes are not started. progress, when not nil, is called
// about twice a second and once at the end. It returns the final status; an
// error wrapping backfill.ErrInput or backfill.ErrBusy means nothing
// started. ResumeBackfill continues one that stopped before the end.
func Backfill(ctx context.Context, cfg *config.Config, client *mongo.Client, req backfill.Request, log *slog.Logger, progress func(backfill.Status)) (backfill.Status, error) {
	return backfillCLI(ctx, cfg, client, log, progress, func(c backfill.CommandLine) (backfill.Status, error) {
		return c.Run(ctx, req)
	})
}

// ResumeBackfill resumes the command line's backfill id, left running by a
// stop (SIGINT), a kill or a crash (backfill.CommandLine.Resume).
func ResumeBackfill(ctx context.Context, cfg *config.Config, client *mongo.Client, id string, log *slog.Logger, progress func(backfill.Status)) (backfill.Status, error) {
	return backfillCLI(ctx, cfg, client, log, progress, func(c backfill.CommandLine) (backfill.Status, error) {
		return c.Resume(ctx, id)
	})
}

// ResumeRedelivery resumes the command line's redelivery id, left running
// by a stop (SIGINT), a kill or a crash.
func ResumeRedelivery(ctx context.Context, cfg *config.Config, client *mongo.Client, id string, log *slog.Logger, progress func(backfill.Status)) (backfill.Status, error) {
	return backfillCLI(ctx, cfg, client, log, progress, func(c backfill.CommandLine) (backfill.Status, error) {
		return c.ResumeRedelivery(ctx, id)
	})
}

// backfillCLI builds the command line's backfill from cfg (an engine that
// delivers directly, the byte budget) and runs do with it.
func backfillCLI(ctx context.Context, cfg *config.Config, client *mongo.Client, log *slog.Logger, progress func(backfill.Status), do func(backfill.CommandLine) (backfill.Status, error)) (backfill.Status, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, dls := Stores(cfg, client)
	rules, err := CompileRules(cfg)
	if err != nil {
		return backfill.Status{}, err
	}
	specs, err := BuildSinks(cfg, log)
	if err != nil {
		return backfill.Status{}, err
	}
	engine, err := router.NewEngine(rules, specs, dls, nil, log)
	if err != nil {
		return backfill.Status{}, err
	}
	defer engine.Stop()
	sizing, err := MemorySizing(cfg)
	if err != nil {
		return backfill.Status{}, err
	}
	budget := memory.NewBudget(sizing.Budget, log, nil)
	engine.SetBudget(budget)
	return do(backfill.CommandLine{Config: cfg, Client: client, Engine: engine, Budget: budget, Log: log, Progress: progress,
		Streams: streams(func() *config.Config { return cfg })})
}

// RedeliverEvent reads the change with event id again from the oplog and
// delivers it once more to sink, directly (backfill.CommandLine
// RedeliverEvent), through an engine built from cfg whose lanes are not
// started.
func RedeliverEvent(ctx context.Context, cfg *config.Config, client *mongo.Client, id, sink string, log *slog.Logger) (backfill.Redelivered, error) {
	var out backfill.Redelivered
	_, err := backfillCLI(ctx, cfg, client, log, nil, func(c backfill.CommandLine) (backfill.Status, error) {
		var err error
		out, err = c.RedeliverEvent(ctx, id, sink)
		return backfill.Status{}, err
	})
	return out, err
}

// streams returns the change stream of each source of the configuration
// in force, as its units open it, for the whole source (no partition).
func streams(cfg func() *config.Config) backfill.Streams {
	return func(name string) (source.Spec, bool) {
		for _, d := range unitDefs(cfg()) {
			if d.source == name {
				spec := d.spec
				spec.Unit, spec.Partition, spec.Partitions = name, 0, 1
				return spec, true
			}
		}
		return source.Spec{}, false
	}
}

// newBackfills returns the gateway's backfills: sent through the engine's
// lanes, each in order with the live stream of the unit running here that
// owns its document, and recorded (those a stop, a kill or a crash left
// running resume at the next start).
func (g *gateway) newBackfills(cfg *config.Config) *backfill.Runner {
	return backfill.New(backfill.Options{
		Client: g.client, StateDB: g.client.Database(cfg.Mongo.StateDatabase), Instance: cfg.Cluster.Instance,
		Target: backfill.Lanes{Engine: g.engine, Units: g.unitSources}, SinksOf: g.engine.SinksOf, Streams: streams(g.Config),
		Metrics: g.metrics, Log: g.log, Budget: g.budget, Record: true,
	})
}

// unitSources returns the sources of src's units running in this process,
// by unit name, and src's partition count.
func (g *gateway) unitSources(src string) (map[string]*source.Source, int) {
	n := 1
	for _, d := range g.defs {
		if d.source == src {
			n = max(n, d.spec.Partitions)
		}
	}
	out := map[string]*source.Source{}
	for _, u := range g.units.snapshot() {
		if u.def.source == src {
			out[u.def.name] = u.src
		}
	}
	return out, n
}
