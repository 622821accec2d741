// Package app is the composition root: it builds a running gateway from a
// config (MongoDB client, stores, sinks, rules, the engine, the units of
// work and their sources, the backfill runner, and the admin HTTP server of
// package api with the console's routes), runs it (every unit here, or the
// cluster lease loop), reloads it, and stops it with a two-phase shutdown
// (stop reading and drain within the grace period, then cancel). It also
// builds the command line's one-shot tools from a config: check, replay,
// backfill, tail and the rules dry run.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/console"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/eventbridge"
	"github.com/changegate/changegate/sinks/kafka"
	"github.com/changegate/changegate/sinks/kinesis"
	"github.com/changegate/changegate/sinks/lambda"
	"github.com/changegate/changegate/sinks/limit"
	"github.com/changegate/changegate/sinks/sns"
	"github.com/changegate/changegate/sinks/sqs"
	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/subscription"
	"github.com/changegate/changegate/tracing"
)

// The engine takes the ordering key's hash a source computed already; the
// admin API and the console read the gateway through their interfaces.
var (
	_ source.KeyedDispatcher = (*router.Engine)(nil)
	_ api.Gateway            = (*gateway)(nil)
	_ console.Gateway        = (*gateway)(nil)
)

// Options are the parts of a run that do not come from the config file.
type Options struct {
	// Logger receives every log line; nil discards.
	Logger *slog.Logger
	// Registry is where metrics are registered; nil creates a new one.
	Registry *prometheus.Registry
	// Hard, when closed during the drain phase, abandons the drain at once
	// (a second signal). Events in flight stay unacknowledged and are
	// re-delivered after the next start.
	Hard <-chan struct{}
	// Reload, when it receives, re-reads the configuration and applies its
	// rules and sinks in place (SIGHUP).
	Reload <-chan struct{}
	// LoadConfig re-reads the configuration for a reload; nil means
	// config.Load of the file the running configuration came from.
	LoadConfig func() (*config.Config, error)
	// NoPushdown evaluates rule filters only in changegate, never inside the
	// change stream (for benchmarks and diagnosis; the result is the same).
	NoPushdown bool
	// Started, when non-nil, is called with the admin server's address
	// ("" when disabled) once everything is running.
	Started func(adminAddr string)
	// ConsoleSampleEvery is the sampling interval of the web console's
	// sparklines (default 10s; they show the last 90 samples). For tests
	// and demos.
	ConsoleSampleEvery time.Duration
	// Tracer, when non-nil, traces every change and delivery
	// (OpenTelemetry; the caller shuts it down after Run returns).
	Tracer *tracing.Tracer
}

type gateway struct {
	cfgPtr     atomic.Pointer[config.Config]
	loadConfig func() (*config.Config, error)
	reloadMu   sync.Mutex
	noPushdown bool
	log        *slog.Logger
	metrics    *metrics.Metrics
	client     *mongo.Client
	cps        *checkpoint.Store
	dls        *deadletter.Store
	dlog       *deliverylog.Log    // the delivery log's reads
	dlw        *deliverylog.Writer // its writer; nil in mode "off"
	engine     *router.Engine
	budget     *memory.Budget // max_in_flight_bytes, shared by every unit, lane and replay
	sizing     memory.Sizing  // where the budget and GOMEMLIMIT came from
	stuckAfter time.Duration  // a stream whose getMore takes this much longer than max_await is not ready

	instance string       // [cluster] instance: names this replica
	defs     []unitDef    // every unit of the configuration
	units    units        // the units whose sources run here
	cl       *clusterLoop // nil outside cluster mode

	wg       sync.WaitGroup    // unit goroutines
	unitDone chan *runningUnit // a unit's Run returned
	stopped  chan struct{}     // closed when Run no longer reads unitDone

	subs      *subscriptions   // nil without [subscriptions] enabled
	backfills *backfill.Runner // on-demand backfills (package backfill)
}

// oversizePolicy returns the sink's oversize policy, counting in m (when
// not nil).
func oversizePolicy(sc config.Sink, m *metrics.Metrics) sinks.Oversize {
	p := sinks.Oversize{Strip: sc.Oversize == config.OversizeStrip}
	if m != nil {
		p.Stripped = m.SinkOversize.WithLabelValues(sc.Name, metrics.OversizeStrip)
		p.Refused = m.SinkOversize.WithLabelValues(sc.Name, metrics.OversizeDeadLetter)
	}
	return p
}

// Connect returns a MongoDB client for cfg. The driver connects lazily: an
// unreachable server is reported by the operations, not here.
func Connect(cfg *config.Config) (*mongo.Client, error) {
	opts := options.Client().ApplyURI(cfg.Mongo.URI.Value()).SetAppName("changegate")
	c, err := mongo.Connect(opts)
	if err != nil {
		return nil, fmt.Errorf("mongo: %w", err)
	}
	return c, nil
}

// BuildSinks constructs the sinks of cfg, in config order.
func BuildSinks(cfg *config.Config, log *slog.Logger) ([]router.SinkSpec, error) {
	return buildSinks(cfg, log, nil)
}

// buildSinks is BuildSinks; m, when not nil, receives the sinks' own
// counters (changegate_sink_oversize_events_total).
func buildSinks(cfg *config.Config, log *slog.Logger, m *metrics.Metrics) ([]router.SinkSpec, error) {
	var specs []router.SinkSpec
	for _, sc := range cfg.Sinks {
		sp, err := buildSink(cfg, sc, log, m)
		if err != nil {
			for _, s := range specs {
				_ = s.Sink.Close()
			}
			return nil, err
		}
		specs = append(specs, sp)
	}
	return specs, nil
}

// buildSink constructs one sink of cfg and how the engine drives it; m may
// be nil.
func buildSink(cfg *config.Config, sc config.Sink, log *slog.Logger, m *metrics.Metrics) (router.SinkSpec, error) {
	var sk sinks.Sink
	var err error
	oversize := oversizePolicy(sc, m)
	// Connections per destination: the fixed limit, or the adaptive
	// limit's ceiling (fewer would show as queueing latency and hold the
	// limit down).
	conns := sc.MaxInFlight
	if conns == 0 {
		conns = adaptiveCeiling(cfg, sc)
	}
	switch {
	case sc.Webhook != nil:
		w := sc.Webhook
		secrets := make([]string, 0, len(w.Secrets))
		for _, s := range w.Secrets {
			secrets = append(secrets, s.Value())
		}
		headers := make(map[string]string, len(w.Headers))
		for _, h := range w.Headers {
			headers[h.Name] = h.Value.Value()
		}
		var basicUser, basicPassword string
		if w.BasicAuth != nil {
			basicUser, basicPassword = w.BasicAuth.Username, w.BasicAuth.Password.Value()
		}
		sk, err = webhook.New(webhook.Config{
			Name: sc.Name, URL: w.URL, Secrets: secrets, Headers: headers,
			BearerToken: w.BearerToken.Value(), BasicUser: basicUser, BasicPassword: basicPassword,
			Timeout: w.Timeout, Canonical: sc.JSON == "canonical", BatchSize: sc.BatchSize, MaxRequestBytes: w.MaxRequestBytes,
			AllowPrivateNetworks: w.AllowPrivateNetworks, TLSCAFile: w.TLSCAFile, TLSInsecureSkipVerify: w.TLSInsecureSkipVerify,
			MaxConns: conns, SigV4: webhookSigV4(w), Oversize: oversize,
		}, log.With("sink", sc.Name))
	case sc.EventBridge != nil:
		e := sc.EventBridge
		sk, err = eventbridge.New(eventbridge.Config{
			Name: sc.Name, EventBus: e.EventBus, Region: e.Region, Endpoint: e.Endpoint, RoleARN: e.RoleARN,
			Source: e.Source, DetailType: e.DetailType, Resources: e.Resources,
			MaxRequestBytes: e.MaxRequestBytes, Canonical: sc.JSON == "canonical", Timeout: e.Timeout,
			MaxConns: conns, Oversize: oversize,
		}, log.With("sink", sc.Name))
	case sc.SQS != nil:
		q := sc.SQS
		sk, err = sqs.New(sqs.Config{
			Name: sc.Name, QueueURL: q.QueueURL, QueueName: q.QueueName, Region: q.Region, Endpoint: q.Endpoint,
			RoleARN: q.RoleARN, GroupBy: q.MessageGroupID, MaxRequestBytes: q.MaxRequestBytes,
			Canonical: sc.JSON == "canonical", Timeout: q.Timeout, MaxConns: conns,
			Oversize: oversize,
		}, log.With("sink", sc.Name))
	case sc.Lambda != nil:
		l := sc.Lambda
		sk, err = lambda.New(lambda.Config{
			Name: sc.Name, Function: l.Function, Qualifier: l.Qualifier, InvocationType: l.InvocationType,
			ClientContext: l.ClientContext, BatchSize: sc.BatchSize, MaxPayloadBytes: l.MaxRequestBytes,
			Oversize: oversize, Canonical: sc.JSON == "canonical",
			Region: l.Region, Endpoint: l.Endpoint, RoleARN: l.RoleARN, Timeout: l.Timeout, MaxConns: conns,
		}, log.With("sink", sc.Name))
	case sc.Kinesis != nil:
		k := sc.Kinesis
		sk, err = kinesis.New(kinesis.Config{
			Name: sc.Name, Stream: k.Stream, PartitionKey: k.PartitionKey,
			Region: k.Region, Endpoint: k.Endpoint, RoleARN: k.RoleARN, MaxRequestBytes: k.MaxRequestBytes,
			Canonical: sc.JSON == "canonical", Timeout: k.Timeout, MaxConns: conns, Oversize: oversize,
		}, log.With("sink", sc.Name))
	case sc.SNS != nil:
		n := sc.SNS
		sk, err = sns.New(sns.Config{
			Name: sc.Name, TopicARN: n.TopicARN, GroupBy: n.MessageGroupID,
			Region: n.Region, Endpoint: n.Endpoint, RoleARN: n.RoleARN, MaxRequestBytes: n.MaxRequestBytes,
			Canonical: sc.JSON == "canonical", Timeout: n.Timeout, MaxConns: conns, Oversize: oversize,
		}, log.With("sink", sc.Name))
	case sc.Kafka != nil:
		k := sc.Kafka
		sk, err = kafka.New(kafka.Config{
			Name: sc.Name, Brokers: k.Brokers, Topic: k.Topic, MaxRequestBytes: k.MaxRequestBytes,
			Oversize: oversize, Canonical: sc.JSON == "canonical", Timeout: k.Timeout,
			TLS: k.TLS, TLSCAFile: k.TLSCAFile, TLSCertFile: k.TLSCertFile, TLSKeyFile: k.TLSKeyFile,
			TLSInsecureSkipVerify: k.TLSInsecureSkipVerify,
			SASLMechanism:         k.SASLMechanism, SASLUsername: k.SASLUsername.Value(), SASLPassword: k.SASLPassword.Value(),
		}, log.With("sink", sc.Name))
	default:
		err = fmt.Errorf("sink type %q is not supported", sc.Type)
	}
	if err != nil {
		return router.SinkSpec{}, fmt.Errorf("sink %s: %w", sc.Name, err)
	}
	return router.SinkSpec{
		Sink: sk,
		Retry: sinks.RetryPolicy{
			MaxAttempts: sc.Retry.MaxAttempts, InitialInterval: sc.Retry.InitialInterval,
			MaxInterval: sc.Retry.MaxInterval, MaxElapsed: sc.Retry.MaxElapsed,
			Multiplier: sc.Retry.Multiplier, Jitter: sc.Retry.Jitter,
		},
		Ordering:    router.Ordering(sc.Ordering),
		MaxInFlight: sc.MaxInFlight,
		BatchSize:   sc.BatchSize,
		BatchWait:   sc.BatchWait,
		ParkAfter:   sc.ParkAfter,
		Kind:        sc.Type,
		// trace_context = false: no traceparent in requests and messages.
		NoTraceContext: !sc.TraceContext,
		ParkBacklog:    parkBacklog(cfg),
		UseLimit:       true,
		Group:          sc.Transactions == config.TransactionsGroup,
		Held:           sc.Held,
		Limit: limit.Config{
			Min: sc.MaxInFlightMin, Max: adaptiveCeiling(cfg, sc),
			Cap:  maxInFlightEvents(cfg),
			Rate: sc.RateLimit, Burst: sc.RateLimitBurst,
			BreakerMaxCooldown: sc.CircuitMaxCooldown,
		},
	}, nil
}

// webhookSigV4 returns the SigV4 signing of a webhook sink, nil without
// auth = "aws_sigv4".
func webhookSigV4(w *config.WebhookSink) *webhook.SigV4 {
	if w.Auth != config.WebhookAuthSigV4 {
		return nil
	}
	return &webhook.SigV4{Service: w.AWSService, Region: w.Region, RoleARN: w.RoleARN}
}

// CompileRules compiles cfg's rules against its sinks.
func CompileRules(cfg *config.Config) (*router.Rules, error) {
	names := make([]string, len(cfg.Sinks))
	for i, s := range cfg.Sinks {
		names[i] = s.Name
	}
	shapes := make([]*event.Shape, len(cfg.Sinks))
	for i, s := range cfg.Sinks {
		sh, err := event.CompileShape(s.Shape.Spec())
		if err != nil {
			return nil, fmt.Errorf("sink %s: %w", s.Name, err)
		}
		shapes[i] = sh
	}
	specs := make([]router.RuleSpec, 0, len(cfg.Rules))
	for _, r := range cfg.Rules {
		var namespaces []string
		for _, ns := range r.Namespaces {
			namespaces = append(namespaces, ns.String())
		}
		sh, err := event.CompileShape(r.Shape.Spec())
		if err != nil {
			return nil, fmt.Errorf("rule %s: %w", r.Name, err)
		}
		specs = append(specs, router.RuleSpec{
			Name: r.Name, Source: r.Source, Operations: r.Operations,
			Namespaces: namespaces, Filter: r.Filter, Sinks: r.Sinks, Shape: sh,
		})
	}
	return router.CompileRulesShaped(specs, names, shapes)
}

// Stores returns the checkpoint and dead-letter stores of cfg on client.
func Stores(cfg *config.Config, client *mongo.Client) (*checkpoint.Store, *deadletter.Store) {
	db := client.Database(cfg.Mongo.StateDatabase)
	return checkpoint.NewStore(db, cfg.Mongo.CheckpointCollection), deadletter.NewStore(db, cfg.Mongo.DeadLetterCollection)
}

// Run runs the gateway until ctx is cancelled, then drains within the
// configured grace period and stops. It returns nil after a clean stop and an
// error when the gateway cannot start or a source fails for good (for
// example history lost with on_history_lost = "fail").
func Run(ctx context.Context, cfg *config.Config, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := metrics.New(reg)

	sizing, err := MemorySizing(cfg)
	if err != nil {
		return err
	}
	logSizing(log, sizing, sizing.Apply())
	budget := memory.NewBudget(sizing.Budget, log, func(d int64) { m.InflightBytes.Add(float64(d)) })
	m.InflightBytesBudget.Set(float64(sizing.Budget))

	client, err := Connect(cfg)
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(dctx)
	}()
	cps, dls := Stores(cfg, client)
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := dls.EnsureIndexes(ictx); err != nil {
		log.Warn("cannot create dead-letter indexes (will work without them)", "err", err)
	}
	cancel()

	// The stored subscriptions run beside the file's sinks and rules: the
	// configuration in force is their merge.
	subs, err := openSubscriptions(ctx, cfg, client, reg, log)
	if err != nil {
		return err
	}
	cfg = subs.merge(cfg, log)

	rules, err := CompileRules(cfg)
	if err != nil {
		return err
	}
	for _, n := range PushdownNotes(cfg) {
		log.Info(n) // as check prints them: why a rule is not pushed down
	}
	specs, err := buildSinks(cfg, log, m)
	if err != nil {
		return err
	}
	engine, err := router.NewEngine(rules, specs, dls, m, log)
	if err != nil {
		return err
	}
	engine.SetBudget(budget)
	log = log.With("instance", cfg.Cluster.Instance)
	g := &gateway{log: log, metrics: m, budget: budget, sizing: sizing, noPushdown: opts.NoPushdown, client: client, cps: cps, dls: dls, engine: engine, stuckAfter: 5 * time.Second,
		loadConfig: opts.LoadConfig, instance: cfg.Cluster.Instance, defs: unitDefs(cfg),
		units:    units{running: map[string]*runningUnit{}, pushdowns: pushdowns{}},
		unitDone: make(chan *runningUnit), stopped: make(chan struct{}), subs: subs}
	g.cfgPtr.Store(cfg)
	engine.SetAcked(g.acked)
	// The delivery log observes beside the tracer; its writer stops after
	// the engine (deferred before engine.Stop), so the last outcomes are
	// written.
	var dlObs observe.Observer
	g.dlog, g.dlw, dlObs = newDeliveryLog(ctx, cfg, client, deliverylog.Deps{Checkpoints: cps, DeadLetters: dls}, g.Config, reg, log)
	defer stopDeliveryLog(g.dlw, log)
	var obs []observe.Observer
	if opts.Tracer != nil {
		obs = append(obs, opts.Tracer)
	}
	if subs != nil {
		obs = append(obs, subs.recent, subscription.NoticeObserver(subs.notices, subs.isSubscription, cfg.Cluster.Instance))
	}
	if o := observe.Fanout(append(obs, dlObs)...); o != nil {
		engine.SetObserver(o)
	}
	if g.loadConfig == nil {
		g.loadConfig = func() (*config.Config, error) { return config.Load(cfg.File) }
	}

	engineCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEngine()
	engine.Start(engineCtx)
	defer engine.Stop()
	g.backfills = g.newBackfills(cfg)
	defer g.backfills.StopAll()
	// Backfills are recorded with their acknowledged progress; those a
	// previous run left running (a stop, a kill, a crash) resume here.
	resumeCtx, stopResume := context.WithCancel(ctx)
	defer stopResume()
	go g.backfills.ResumeAll(resumeCtx, g.Config)

	for _, sc := range cfg.Sources {
		g.stuckAfter = max(g.stuckAfter, sc.MaxAwait+5*time.Second)
		push, _ := rules.Pushdown(sc.Name)
		if opts.NoPushdown {
			push = nil
		}
		g.units.pushdowns[sc.Name] = push
	}

	if cfg.Cluster.Enabled {
		// Before the admin server and the console's sampler, which read
		// the loop's status.
		g.cl = newClusterLoop(g, cfg.Cluster, client.Database(cfg.Mongo.StateDatabase))
	}
	var adminAddr string
	var srv *http.Server
	if cfg.Server.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Server.Listen)
		if err != nil {
			return fmt.Errorf("server.listen: %w", err)
		}
		adminAddr = ln.Addr().String()
		var subsAPI *api.Subscriptions
		if subs != nil {
			subsAPI = &api.Subscriptions{Store: subs.store, File: subs.fileConfig, Test: subs.testSubscription, Recent: subs.recent.Last,
				Backfill: g.backfillWhenApplied}
		}
		a := api.New(api.Options{Gateway: g, DeadLetters: dls, Backfills: g.backfills, Deliveries: g.dlog, DeliveryLogDropped: g.dlw.Dropped,
			Registry: reg, Log: log, Subscriptions: subsAPI})
		con := console.New(a, console.Options{Gateway: g, DeadLetters: dls, Metrics: m, SampleEvery: opts.ConsoleSampleEvery, Log: log})
		srv = a.HTTPServer()
		go con.Sample(ctx)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin server failed", "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}

	// Sources run until srcCtx is cancelled (after the drain).
	srcCtx, stopSources := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSources()
	clDone := make(chan struct{})
	stopCluster := func() {}
	if cfg.Cluster.Enabled {
		// Units start as their leases are acquired; the lease loop runs
		// until the sources have stopped, so that it keeps renewing
		// during the drain, and then releases every lease.
		engine.SetOwnedUnits([]string{})
		clCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		stopCluster = stop
		go func() {
			defer close(clDone)
			g.cl.run(clCtx, srcCtx)
		}()
		defer stopCluster()
	} else {
		for _, d := range g.defs {
			g.startUnit(srcCtx, d, nil)
		}
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.countDeadLetters(srcCtx, m)
	}()
	log.Info("changegate running", "units", len(g.defs), "cluster", cfg.Cluster.Enabled, "sinks", len(specs), "rules", len(cfg.Rules), "admin", adminAddr)
	if opts.Started != nil {
		opts.Started(adminAddr)
	}

	// Subscriptions are followed until the stop begins: a change applied
	// during the drain would start lanes that are about to stop.
	subsCtx, stopSubs := context.WithCancel(ctx)
	subsDone := make(chan struct{})
	if subs != nil {
		go func() {
			defer close(subsDone)
			var side sync.WaitGroup
			side.Go(func() { g.watchDisableAfter(subsCtx) })
			side.Go(func() { subs.notices.Run(subsCtx, engine.DeliverNotice) })
			side.Go(func() { subs.runPurges(subsCtx, dls, log) })
			g.watchSubscriptions(subsCtx)
			side.Wait()
		}()
	} else {
		close(subsDone)
	}
	defer func() { stopSubs(); <-subsDone }()

	var runErr error
wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping: no new changes are read; draining deliveries in flight", "grace", g.Config().Server.ShutdownGrace)
			break wait
		case u := <-g.unitDone:
			if err := g.unitEnded(u); err != nil {
				runErr = err
				log.Error("a source failed; stopping", "unit", u.def.name, "err", runErr)
				break wait
			}
		case <-opts.Reload:
			if err := g.Reload(); err != nil {
				log.Error("reload failed", "err", err)
			}
		}
	}
	stopSubs()
	<-subsDone
	// From here on units that end are only collected.
	var endMu sync.Mutex
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			select {
			case u := <-g.unitDone:
				if err := g.unitEnded(u); err != nil {
					endMu.Lock()
					if runErr == nil {
						runErr = err
					}
					endMu.Unlock()
				}
			case <-g.stopped:
				return
			}
		}
	}()
	if g.cl != nil {
		g.cl.stopAcquiring()
	}
	for _, u := range g.units.snapshot() {
		u.src.StopReading()
	}
	g.drain(g.Config().Server.ShutdownGrace, opts.Hard)
	stopSources() // final checkpoint saves happen here
	g.wg.Wait()
	close(g.stopped)
	<-collected
	if g.cl != nil {
		stopCluster()
		<-clDone
		g.cl.releaseAll() // after the final saves: the next owner starts from them
	}
	stopEngine()
	log.Info("changegate stopped")
	endMu.Lock()
	defer endMu.Unlock()
	return runErr
}

// unitEnded handles a unit whose source's Run returned: it is no longer
// running; a lost lease is the lease loop's business; any other error is
// the gateway's failure.
func (g *gateway) unitEnded(u *runningUnit) error {
	g.units.remove(u)
	if g.cl != nil {
		g.cl.unitEnded(u)
		if errors.Is(u.err, source.ErrLeaseLost) {
			return nil
		}
	}
	return u.err
}

func (g *gateway) drain(grace time.Duration, hard <-chan struct{}) {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for _, u := range g.units.snapshot() {
		select {
		case <-u.src.Drained():
		case <-timer.C:
			g.log.Warn("shutdown grace period over; events still in flight will be re-delivered after the next start")
			return
		case <-hard:
			g.log.Warn("second signal: stopping without draining; events in flight will be re-delivered after the next start")
			return
		}
	}
}

// ReplayOptions are an operator's choices for a replay.
type ReplayOptions struct {
	// DeliverUnrouted also delivers the entries that no current rule routes
	// to their sink (CLI -deliver-unrouted, API deliver_unrouted=true),
	// shaped with the strictest shape of the sink's current rules. Without
	// it they are skipped (deadletter.ErrNotRouted) and stay.
	DeliverUnrouted bool
}

// deliverer returns the engine's delivery for a replay with opts.
func (o ReplayOptions) deliverer(e *router.Engine) func(context.Context, string, *event.Event) error {
	if o.DeliverUnrouted {
		return e.DeliverUnrouted
	}
	return e.DeliverNow
}

// groups returns the engine's delivery of one transaction's entries, for
// a replay with opts, to the sinks with transactions = "group".
func (o ReplayOptions) groups(e *router.Engine) deadletter.GroupDelivery {
	g := deadletter.GroupDelivery{Grouped: e.Grouped, Deliver: e.DeliverGroupNow}
	if o.DeliverUnrouted {
		g.Deliver = e.DeliverGroupUnrouted
	}
	return g
}

// Replay re-delivers the failed dead letters f selects through the running
// engine, as the admin API and the console ask (api.Gateway).
func (g *gateway) Replay(ctx context.Context, f deadletter.Filter, deliverUnrouted bool) (deadletter.ReplayResult, error) {
	opts := ReplayOptions{DeliverUnrouted: deliverUnrouted}
	return g.dls.ReplayGrouped(memory.WithBudget(ctx, g.budget), f, opts.deliverer(g.engine), opts.groups(g.engine))
}

// Replay re-delivers the dead letters matching f through their sinks (built
// from cfg) with each sink's retry policy, routed and shaped as the current
// configuration would a live change (router.Rules.ReshapeStored); an entry
// is deleted only after its sink accepted it.
func Replay(ctx context.Context, cfg *config.Config, client *mongo.Client, f deadletter.Filter, opts ReplayOptions, log *slog.Logger) (deadletter.ReplayResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, dls := Stores(cfg, client)
	rules, err := CompileRules(cfg)
	if err != nil {
		return deadletter.ReplayResult{}, err
	}
	specs, err := BuildSinks(cfg, log)
	if err != nil {
		return deadletter.ReplayResult{}, err
	}
	engine, err := router.NewEngine(rules, specs, dls, nil, log)
	if err != nil {
		return deadletter.ReplayResult{}, err
	}
	defer engine.Stop()
	// The replay reads one entry at a time; the budget bounds it and what
	// its deliveries build as in the gateway.
	sizing, err := MemorySizing(cfg)
	if err != nil {
		return deadletter.ReplayResult{}, err
	}
	budget := memory.NewBudget(sizing.Budget, log, nil)
	engine.SetBudget(budget)
	return dls.ReplayGrouped(memory.WithBudget(ctx, budget), f, opts.deliverer(engine), opts.groups(engine))
}

// countDeadLetters refreshes the dead-letter gauge until ctx is done.
func (g *gateway) countDeadLetters(ctx context.Context, m *metrics.Metrics) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	type series struct {
		sink string
		kind deadletter.Kind
	}
	for {
		values := map[series]int64{}
		ok := true
		for _, kind := range []deadletter.Kind{deadletter.KindFailed, deadletter.KindParked, deadletter.KindGap} {
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			counts, err := g.dls.CountBySink(qctx, kind)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					g.log.Debug("cannot count dead letters", "err", err)
				}
				ok = false
				break
			}
			// Every running sink gets a value (0 too), and so does every
			// sink that still has entries although a reload removed it.
			for _, l := range g.engine.Lanes() {
				values[series{l.Name(), kind}] = counts[l.Name()]
			}
			for sink, n := range counts {
				values[series{sink, kind}] = n
			}
		}
		if ok {
			// Replace the whole set, so sinks whose entries are gone drop out.
			m.DeadLetters.Reset()
			for s, n := range values {
				m.DeadLetters.WithLabelValues(s.sink, string(s.kind)).Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maxInFlightEvents is the largest max_in_flight_events of cfg's sources:
// more requests than events in flight can never be made, so it caps a
// sink's concurrency.
func maxInFlightEvents(cfg *config.Config) int {
	n := 0
	for _, s := range cfg.Sources {
		n = max(n, s.MaxInFlightEvents)
	}
	return n
}

// parkBacklog is the backlog at which a failing sink is parked before
// park_after has passed: half the smallest source in-flight cap, so a failing
// sink cannot fill a source's cap and stall the healthy sinks.
func parkBacklog(cfg *config.Config) int {
	n := 0
	for _, s := range cfg.Sources {
		if n == 0 || s.MaxInFlightEvents < n {
			n = s.MaxInFlightEvents
		}
	}
	return max(n/2, 1)
}
