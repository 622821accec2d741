package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/config"
)

const sinksUsage = `Usage: changegate sinks redeliver NAME -config FILE -since TIME -until TIME [-filter JSON] [-source S] [-rate N]
       changegate sinks redeliver -config FILE -resume ID

redeliver reads the changes of a window of MongoDB's oplog again (from
-since to -until, RFC 3339 times, to the second: cluster times count
seconds) and delivers those that -filter matches (the rules' query syntax,
over the change event, e.g. '{"fullDocument.status": "paid"}') and today's
rules route to sink NAME to that sink alone, once more, with their ids, one
at a time in stream order, with the sink's retry policy: what a receiver
that lost its data asks for. -source names the source when the rules route
several to the sink. No checkpoint moves and no other sink gets anything. It
shows its progress on stderr and fails (exit 1) when the oplog no longer
holds -since. The redelivery is recorded in the state database: when this
command stops (SIGINT), is killed or crashes before the end, -resume ID
continues it after the last change delivered. A running gateway offers the
same as POST /api/v1/sinks/{name}/redeliver (through its lanes, resumed by
the gateway after a restart, followed at /api/v1/backfills/{id}).
`

func cmdSinks(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "redeliver" {
		fmt.Fprint(stderr, sinksUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	args = args[1:]
	req := backfill.Request{Kind: backfill.KindRedelivery}
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		req.Sink, args = args[0], args[1:]
	}
	fs := newFlags("sinks redeliver", sinksUsage, stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	since := fs.String("since", "", "the window's start, an RFC 3339 time (required)")
	until := fs.String("until", "", "the window's end (excluded), an RFC 3339 time, not in the future (required)")
	fs.StringVar(&req.Filter, "filter", "", `only the changes matching this filter (the rules' query syntax over the change event), as JSON, e.g. '{"fullDocument.status": "paid"}'`)
	fs.StringVar(&req.Source, "source", "", "the source to read (required when the rules route several to the sink)")
	fs.Float64Var(&req.Rate, "rate", backfill.DefaultRate, "at most this many changes per second")
	resume := fs.String("resume", "", "continue the redelivery with this id, left unfinished by a stop, a kill or a crash of this command (its request is recorded: no NAME or other flags)")
	if ok, code := parseFlags(fs, args); !ok {
		return code
	}
	if *resume != "" {
		given := req.Sink != ""
		fs.Visit(func(f *flag.Flag) { given = given || f.Name != "config" && f.Name != "resume" })
		if *path == "" || given {
			fmt.Fprintln(stderr, "changegate sinks redeliver: -resume takes -config only (the request is the recorded one)")
			return 2
		}
	} else {
		if *path == "" || req.Sink == "" || *since == "" || *until == "" {
			fmt.Fprintln(stderr, "changegate sinks redeliver: NAME, -config, -since and -until are required")
			return 2
		}
		for _, t := range []struct {
			flag, text string
			to         *time.Time
		}{{"since", *since, &req.Since}, {"until", *until, &req.Until}} {
			v, err := time.Parse(time.RFC3339Nano, t.text)
			if err != nil {
				fmt.Fprintf(stderr, "changegate sinks redeliver: -%s %q: want an RFC 3339 time, e.g. 2026-11-28T10:00:00Z\n", t.flag, t.text)
				return 2
			}
			*t.to = v.UTC()
		}
	}
	return runRecorded("sinks redeliver", "redelivery", "changegate sinks redeliver -config "+*path, *path, stdout, stderr,
		func(ctx context.Context, cfg *config.Config, client *mongo.Client, show func(backfill.Status)) (backfill.Status, error) {
			if *resume != "" {
				return app.ResumeRedelivery(ctx, cfg, client, *resume, nil, show)
			}
			return app.Backfill(ctx, cfg, client, req, nil, show)
		})
}
