package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
)

const tailUsage = `Usage: changegate tail -config FILE -source NAME [-rule NAME] [-n N] [-relaxed]
                       [-resume-after TOKEN | -start-at TIME]

Prints the live changes of one source that its rules match (or only those
rule -rule matches), one change event per line as canonical Extended JSON:
the raw change event, so the output can be fed to 'changegate rules test'.
The stream is opened as run opens it (the rules' pushed-down $match, the
source's pipeline, split large events reassembled), over the whole source
(every partition). It is read-only: nothing is delivered, no checkpoint is
read or written, no lease is taken, so it does not disturb running
gateways. It starts from now, and stops on SIGINT/SIGTERM or after -n
changes. Progress and errors go to standard error. Exit status: 0 after
SIGINT/SIGTERM or -n changes, 1 when the stream fails for good (lost
history, say), 2 for bad flags.

Example:
  changegate tail -config config.toml -source orders -rule paid-orders -n 10
`

func cmdTail(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tail", strings.TrimSuffix(tailUsage, "\n"), stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	src := fs.String("source", "", "the source to read (required)")
	rule := fs.String("rule", "", "print only the changes this rule (of -source) matches")
	limit := fs.Int("n", 0, "stop after printing this many changes (0: until interrupted)")
	relaxed := fs.Bool("relaxed", false, "print relaxed Extended JSON (easier to read; numbers lose their BSON type)")
	resume := fs.String("resume-after", "", `start after this resume token: its _data string or the token as JSON ({"_data":"..."})`)
	startAt := fs.String("start-at", "", "start at this time (RFC 3339, e.g. 2026-11-23T10:00:00Z) instead of now; within the oplog's window")
	level := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	if ok, code := parseFlags(fs, args); !ok {
		return code
	}
	log, err := newLogger(stderr, *level, "text")
	if err != nil {
		fmt.Fprintf(stderr, "changegate: %v\n", err)
		return 2
	}
	switch {
	case *path == "":
		fmt.Fprintln(stderr, "changegate tail: -config is required")
		return 2
	case *src == "":
		fmt.Fprintln(stderr, "changegate tail: -source is required")
		return 2
	case *limit < 0:
		fmt.Fprintln(stderr, "changegate tail: -n must be 0 or more")
		return 2
	case *resume != "" && *startAt != "":
		fmt.Fprintln(stderr, "changegate tail: -resume-after and -start-at exclude each other")
		return 2
	}
	opts := app.TailOptions{Source: *src, Rule: *rule, Limit: *limit, Logger: log}
	if *resume != "" {
		if opts.ResumeAfter, err = parseToken(*resume); err != nil {
			fmt.Fprintf(stderr, "changegate tail: -resume-after: %v\n", err)
			return 2
		}
	}
	if *startAt != "" {
		if opts.StartAt, err = time.Parse(time.RFC3339, *startAt); err != nil {
			fmt.Fprintf(stderr, "changegate tail: -start-at: want an RFC 3339 time such as 2026-11-23T10:00:00Z: %v\n", err)
			return 2
		}
	}
	cfg, ok := loadConfig(*path, stderr)
	if !ok {
		return 1
	}
	sc := cfg.Source(*src)
	if sc == nil {
		fmt.Fprintf(stderr, "changegate tail: no source %q in %s (sources: %s)\n", *src, *path, sourceNames(cfg))
		return 2
	}
	if *rule != "" {
		var names []string
		found := false
		for _, r := range cfg.Rules {
			if r.Source == *src {
				names = append(names, r.Name)
			}
			if r.Name == *rule {
				found = true
				if r.Source != *src {
					fmt.Fprintf(stderr, "changegate tail: rule %q reads source %q, not %q\n", *rule, r.Source, *src)
					return 2
				}
			}
		}
		if !found {
			fmt.Fprintf(stderr, "changegate tail: no rule %q in %s (rules of source %s: %s)\n", *rule, *path, *src, strings.Join(names, ", "))
			return 2
		}
	} else if !slices.ContainsFunc(cfg.Rules, func(r config.Rule) bool { return r.Source == *src }) {
		fmt.Fprintf(stderr, "changegate tail: source %q has no rules: nothing it reads would be delivered, so nothing would be printed\n", *src)
		return 2
	}
	where := "now"
	switch {
	case opts.ResumeAfter != nil:
		where = "after the given resume token"
	case !opts.StartAt.IsZero():
		where = opts.StartAt.UTC().Format(time.RFC3339)
	}
	which := "the changes its rules match"
	if *rule != "" {
		which = "the changes rule " + *rule + " matches"
	}
	opts.Opened = func() {
		fmt.Fprintf(stderr, "changegate tail: reading source %s (%s) from %s, printing %s; Ctrl-C stops\n", sc.Name, watches(sc), where, which)
	}
	opts.Print = func(ev *event.Event, _ []string) error {
		b, err := bson.MarshalExtJSON(ev.Raw, !*relaxed, false)
		if err != nil {
			// Not valid UTF-8, say: JSON cannot hold it. Say so and go on.
			fmt.Fprintf(stderr, "changegate tail: change %s cannot be printed as Extended JSON: %v\n", ev.ID, err)
			return nil
		}
		_, err = stdout.Write(append(b, '\n'))
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Tail(ctx, cfg, opts); err != nil {
		fmt.Fprintf(stderr, "changegate tail: %v\n", err)
		return 1
	}
	return 0
}

// parseToken reads a resume token given as its _data string or as a JSON
// document.
func parseToken(s string) (bson.Raw, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") {
		var raw bson.Raw
		if err := bson.UnmarshalExtJSON([]byte(s), false, &raw); err != nil {
			return nil, err
		}
		return raw, nil
	}
	if s == "" {
		return nil, fmt.Errorf("empty token")
	}
	return bson.Marshal(bson.D{{Key: "_data", Value: s}})
}

// watches says what a source reads: "db.coll", "database db" or "the
// whole cluster".
func watches(sc *config.Source) string {
	switch {
	case sc.Collection != "":
		return sc.Database + "." + sc.Collection
	case sc.Database != "":
		return "database " + sc.Database
	default:
		return "the whole cluster"
	}
}
