// Command changegate tails MongoDB change streams and delivers every change
// to webhooks, EventBridge, SQS, SNS, Kinesis, Lambda and Kafka according to the rules of a TOML file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.opentelemetry.io/otel"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/tracing"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `changegate tails MongoDB change streams and delivers every change to
webhooks, AWS EventBridge buses, SQS queues, SNS topics, Kinesis data
streams, Lambda functions and Kafka topics, routed by rules in a TOML file. Deliveries are at-least-once with stable
event ids; what cannot be delivered goes to a dead-letter collection in
MongoDB.

Usage:
  changegate run -config FILE           run the gateway (also: changegate -config FILE)
  changegate check -config FILE         validate the config; connects to nothing
  changegate deadletters list|show|replay|purge -config FILE [filters]
  changegate checkpoints show|reset -config FILE [-source NAME]
  changegate events show ID -config FILE
                                        what became of an event at each sink
  changegate events redeliver ID -config FILE -sink NAME
                                        read a change again from the oplog and
                                        deliver it once more to one sink
  changegate deliveries list -config FILE [filters]
                                        the delivery log's records, newest first
  changegate backfill -config FILE -source S [-sink K] [-filter JSON] [-rate N]
                                        send existing documents again
  changegate sinks redeliver NAME -config FILE -since T -until T [-filter JSON]
                                        send a window of the oplog again to one sink
  changegate subscriptions list|show|create|pause|resume|rotate-secret|delete
                                        manage subscriptions through a running
                                        instance's API (-api URL, token from
                                        $CHANGEGATE_API_TOKEN or -token-file)
  changegate rules test -config FILE -events FILE.jsonl [-json]
                                        dry-run the rules on recorded change events
  changegate tail -config FILE -source NAME [-rule NAME] [-n N]
                                        print live matched changes (read-only)
  changegate version                    print the version

Run 'changegate COMMAND -help' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	if strings.HasPrefix(cmd, "-") {
		if cmd == "-h" || cmd == "-help" || cmd == "--help" {
			fmt.Fprint(stdout, usage)
			return 0
		}
		cmd, rest = "run", args
	}
	switch cmd {
	case "run":
		return cmdRun(rest, stderr)
	case "check":
		return cmdCheck(rest, stdout, stderr)
	case "deadletters":
		return cmdDeadletters(rest, stdout, stderr)
	case "checkpoints":
		return cmdCheckpoints(rest, stdout, stderr)
	case "events":
		return cmdEvents(rest, stdout, stderr)
	case "deliveries":
		return cmdDeliveries(rest, stdout, stderr)
	case "backfill":
		return cmdBackfill(rest, stdout, stderr)
	case "sinks":
		return cmdSinks(rest, stdout, stderr)
	case "subscriptions":
		return cmdSubscriptions(rest, stdout, stderr)
	case "rules":
		return cmdRules(rest, stdout, stderr)
	case "tail":
		return cmdTail(rest, stdout, stderr)
	case "version":
		fmt.Fprintf(stdout, "changegate %s\n", version)
		return 0
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "changegate: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}

// newFlags returns a flag set whose -help prints a description and the flags.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) (ok bool, code int) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return false, 0
		}
		return false, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return false, 2
	}
	return true, 0
}

func cmdRun(args []string, stderr io.Writer) int {
	fs := newFlags("run", "Usage: changegate run -config FILE [-log-level LEVEL] [-log-format auto|text|json]\n\n"+
		"Runs the gateway until SIGINT or SIGTERM. The first signal stops reading\n"+
		"changes and drains deliveries in flight within server.shutdown_grace, then\n"+
		"persists checkpoints and exits 0; a second signal exits at once (events in\n"+
		"flight are re-delivered after the next start). SIGHUP re-reads the config\n"+
		"and applies rules and sinks in place; an invalid file is rejected and the\n"+
		"running configuration stays. The [server] listener serves /metrics,\n"+
		"/healthz, /readyz, /api/v1/... and the web console at / (server.console,\n"+
		"server.console_auth). OpenTelemetry tracing is configured by the standard\n"+
		"OTEL_* environment variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER,\n"+
		"OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...; see docs/tracing.md); off when\n"+
		"none is set.", stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	format := fs.String("log-format", "auto", "log format: auto (text on a terminal, JSON otherwise), text or json")
	if ok, code := parseFlags(fs, args); !ok {
		return code
	}
	log, err := newLogger(stderr, *level, *format)
	if err != nil {
		fmt.Fprintf(stderr, "changegate: %v\n", err)
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "changegate run: -config is required")
		return 2
	}
	cfg, ok := loadConfig(*path, stderr)
	if !ok {
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hard := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Info("signal received; draining (send it again to stop at once)", "signal", s.String())
		cancel()
		<-sigs
		close(hard)
	}()
	reload := make(chan struct{}, 1)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	go func() {
		for range hups {
			log.Info("SIGHUP: reloading the configuration", "config", *path)
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	tracer, err := tracing.FromEnv(ctx, version, os.Stdout)
	if err != nil {
		log.Error("changegate: tracing", "err", err)
		return 2
	}
	if tracer != nil {
		log.Info("OpenTelemetry tracing on (OTEL_* environment variables)")
		// The SDK's own errors (an export the collector refused, a full
		// queue) go to our log rather than its default stderr logger.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tracer.Shutdown(sctx); err != nil {
				log.Warn("tracing: flushing spans at exit", "err", err)
			}
		}()
	}
	if err := app.Run(ctx, cfg, app.Options{Logger: log, Hard: hard, Reload: reload, Tracer: tracer}); err != nil {
		log.Error("changegate failed", "err", err)
		return 1
	}
	return 0
}

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check", "Usage: changegate check -config FILE\n\n"+
		"Validates the config file (syntax, types, names, filters, secrets) and builds\n"+
		"every sink exactly as run does, without connecting to anything, and prints the\n"+
		"byte budget (max_in_flight_bytes) and GOMEMLIMIT that apply in this container\n"+
		"and where they come from. Exits 0 when valid, 1 with every problem listed.\n"+
		"Credentials that would cross the network in clear text or go to a server whose\n"+
		"certificate is not verified are refused (by run too), unless the sink sets\n"+
		"allow_cleartext_credentials = true.", stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	if ok, code := parseFlags(fs, args); !ok {
		return code
	}
	if *path == "" {
		fmt.Fprintln(stderr, "changegate check: -config is required")
		return 2
	}
	cfg, err := config.Load(*path)
	if err == nil {
		err = app.Check(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	for _, n := range app.PushdownNotes(cfg) {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	for _, n := range app.StateDatabaseNotes(cfg) {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	fmt.Fprintf(stdout, "%s: ok (%d sources, %d sinks, %d rules)\n", *path, len(cfg.Sources), len(cfg.Sinks), len(cfg.Rules))
	if sizing, err := app.MemorySizing(cfg); err == nil {
		for _, l := range app.SizingText(sizing) {
			fmt.Fprintf(stdout, "memory: %s\n", l)
		}
	}
	for _, sc := range cfg.Sources {
		if sc.Partitions > 1 {
			fmt.Fprintf(stdout, "note: source %q has %d partitions (units %s ... %s), each with its own change stream and checkpoint. "+
				"If the source ran before with another number of partitions, each new unit starts from the oldest checkpoint of the previous ones: "+
				"nothing is lost, but changes after that checkpoint may be delivered again (with the same ids).\n",
				sc.Name, sc.Partitions, source.UnitName(sc.Name, 0, sc.Partitions), source.UnitName(sc.Name, sc.Partitions-1, sc.Partitions))
		}
	}
	return 0
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level: %q is not one of debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "auto":
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				return slog.New(slog.NewTextHandler(w, opts)), nil
			}
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("-log-format: %q is not one of auto, text, json", format)
	}
}

// loadConfig loads the config file, printing its errors (each names its
// key and file:line) when it is invalid.
func loadConfig(path string, stderr io.Writer) (*config.Config, bool) {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "changegate: invalid config:\n%v\n", err)
		return nil, false
	}
	return cfg, true
}

// openState loads the config at path and connects to its MongoDB, for the
// commands that read or write changegate's state; errors are printed.
func openState(path string, stderr io.Writer) (cfg *config.Config, ctx context.Context, client *mongo.Client, done func(), ok bool) {
	if cfg, ok = loadConfig(path, stderr); !ok {
		return nil, nil, nil, nil, false
	}
	ctx, client, done, ok = connect(cfg, stderr)
	return cfg, ctx, client, done, ok
}

// connect opens the MongoDB client of cfg, printing why it cannot, and
// returns it with a context that SIGINT or SIGTERM cancels; done
// disconnects the client and stops catching the signals.
func connect(cfg *config.Config, stderr io.Writer) (ctx context.Context, client *mongo.Client, done func(), ok bool) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	client, err := app.Connect(cfg)
	if err != nil {
		stop()
		fmt.Fprintf(stderr, "changegate: %v\n", err)
		return nil, nil, nil, false
	}
	return ctx, client, func() {
		client.Disconnect(context.Background())
		stop()
	}, true
}
