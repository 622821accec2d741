package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/deliverylog"
)

const deliveriesUsage = `Usage: changegate deliveries list -config FILE [filters]

Lists the delivery log's records (one per attempt, or per batch request;
[delivery_log]), newest first, one JSON object per line, then the cursor of
the next page on standard error ("next: CURSOR") when there is one.

Filters: -sink NAME -rule NAME -source NAME -status failed|retrying|parked|
dead_lettered|delivered -since TIME -until TIME (RFC 3339 or a duration such as
24h, meaning that long ago) -document-key JSON (the key as the sink's shape
shows it, as Extended JSON, matched literally; $ operators are refused)
-min-attempts N -min-duration D (e.g. 500ms) -limit N (1 to 1000, default 50)
-after CURSOR (the next page).
`

func cmdDeliveries(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "list" {
		fmt.Fprint(stderr, deliveriesUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	fs := newFlags("deliveries list", deliveriesUsage, stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	var q deliverylog.Query
	fs.StringVar(&q.Sink, "sink", "", "only records of this sink")
	fs.StringVar(&q.Rule, "rule", "", "only records of events this rule routed")
	fs.StringVar(&q.Source, "source", "", "only records of this source")
	fs.StringVar(&q.Status, "status", "", "failed, retrying, parked, dead_lettered or delivered")
	fs.StringVar(&q.Since, "since", "", "at or after this time (RFC 3339) or this long ago (e.g. 24h)")
	fs.StringVar(&q.Until, "until", "", "before this time (RFC 3339) or this long ago")
	fs.StringVar(&q.DocumentKey, "document-key", "", `only records of this document key, as JSON, e.g. '{"_id": 42}'`)
	fs.StringVar(&q.MinAttempts, "min-attempts", "", "only attempts numbered at least this")
	fs.StringVar(&q.MinDuration, "min-duration", "", "only attempts that took at least this long (e.g. 500ms)")
	fs.StringVar(&q.Limit, "limit", "", "at most this many records (1 to 1000, default 50)")
	fs.StringVar(&q.Cursor, "after", "", "the next page: the cursor a listing printed (next: ...)")
	if ok, code := parseFlags(fs, args[1:]); !ok {
		return code
	}
	if *path == "" {
		fmt.Fprintln(stderr, "changegate deliveries: -config is required")
		return 2
	}
	f, err := q.Filter(time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "changegate deliveries list: %v\n", err)
		return 2
	}
	cfg, ctx, client, done, ok := openState(*path, stderr)
	if !ok {
		return 1
	}
	defer done()
	p, err := app.DeliveryLog(cfg, client).List(ctx, f)
	if err != nil {
		fmt.Fprintf(stderr, "changegate deliveries list: %v\n", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	for _, r := range p.Records {
		_ = enc.Encode(r)
	}
	if p.Next != "" {
		fmt.Fprintf(stderr, "next: %s\n", p.Next)
	}
	return 0
}

const eventsUsage = `Usage: changegate events show ID -config FILE
       changegate events redeliver ID -config FILE -sink NAME

show prints what became of the event with this id (a webhook-id, a dead
letter's eventId) at each sink its rules route to: its state (delivered,
in_flight, retrying, parked, dead_lettered, skipped), its attempts from the
delivery log, links to its dead letter or parked entry, and what the answer
rests on ("covers"; "derived": true where the state was not recorded but
derived from the checkpoint and the dead-letter store).

redeliver reads the change again from MongoDB's oplog (a change stream
opened at its cluster time) and delivers it once more, with the same id, to
that one sink, routed and shaped by today's rules as a dead-letter replay is
(with the sink's retry policy, directly: not through a running gateway's
lanes). It fails, saying so, when the oplog no longer holds the change, when
no current rule routes it to the sink, or while the sink is held.
`

func cmdEvents(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "show" && args[0] != "redeliver") {
		fmt.Fprint(stderr, eventsUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	verb := args[0]
	fs := newFlags("events "+verb, eventsUsage, stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	var sink *string
	if verb == "redeliver" {
		sink = fs.String("sink", "", "the sink to deliver the change to again (required)")
	}
	if len(args) < 2 || len(args[1]) > 0 && args[1][0] == '-' {
		// No ID: -help lists the flags; anything else is a usage error.
		if ok, code := parseFlags(fs, args[1:]); !ok && code == 0 {
			return 0 // -help
		}
		fmt.Fprint(stderr, eventsUsage)
		return 2
	}
	id := args[1]
	if ok, code := parseFlags(fs, args[2:]); !ok {
		return code
	}
	if *path == "" {
		fmt.Fprintln(stderr, "changegate events: -config is required")
		return 2
	}
	if sink != nil && *sink == "" {
		fmt.Fprintln(stderr, "changegate events redeliver: -sink is required")
		return 2
	}
	cfg, ctx, client, done, ok := openState(*path, stderr)
	if !ok {
		return 1
	}
	defer done()
	var out any
	var err error
	if verb == "redeliver" {
		out, err = app.RedeliverEvent(ctx, cfg, client, id, *sink, nil)
	} else {
		out, err = app.DeliveryLog(cfg, client).Lifecycle(ctx, id)
	}
	if err != nil {
		fmt.Fprintf(stderr, "changegate events %s: %v\n", verb, err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	return 0
}
