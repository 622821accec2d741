package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/sinks"
)

const deadlettersUsage = `Usage: changegate deadletters COMMAND -config FILE [filters]

Commands:
  list     list dead letters (newest first), one JSON object per line, without
           their change and envelope (show prints those); -limit is 1 to 1000,
           default 100: page with -after the id of the last entry listed
  show     print one dead letter in full: -id ID (for a sink that shapes its
           payload, "shaped": true, the envelope is the shaped payload and
           the raw change, kept for replay, is not printed)
  replay   re-deliver matching dead letters through their sinks, routed and
           shaped as the config would a live change now; an entry is removed
           only once its sink accepted it. An entry no current rule routes to
           its sink is skipped unless -deliver-unrouted is given: it is then
           shaped with the strictest shape of the sink's rules
  purge    delete matching dead letters (requires -yes)

replay's exit status: 0 when nothing failed or was skipped for want of a route,
1 when an entry failed again or the replay stopped on an error, 3 when (only)
entries no current rule routes to their sink were skipped (kept; counted per
sink on standard error: re-add a rule, or replay with -deliver-unrouted).

Filters: -sink NAME -source NAME -kind failed|parked|gap -since TIME (RFC 3339 or
a duration such as 24h, meaning that long ago) -document-key JSON (the key's
value as Extended JSON, matched literally; $ operators are refused)
-document-key-bson BASE64 (the exact key, as a listing's documentKeyBSON shows
it for a key JSON cannot name: invalid UTF-8, "$" field names) -limit N
-after ID (list paging). The admin API (/api/v1/deadletters) takes the same
filters as query parameters.
`

func cmdDeadletters(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(stderr, deadlettersUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "list", "show", "replay", "purge":
	default:
		fmt.Fprintf(stderr, "changegate deadletters: unknown command %q\n\n%s", sub, deadlettersUsage)
		return 2
	}
	fs := newFlags("deadletters "+sub, deadlettersUsage, stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	var q api.DeadLetterQuery
	fs.StringVar(&q.Sink, "sink", "", "only entries of this sink")
	fs.StringVar(&q.Source, "source", "", "only entries of this source")
	fs.StringVar(&q.Kind, "kind", "", "only entries of this kind: failed, parked or gap (replay: failed)")
	fs.StringVar(&q.Since, "since", "", "only entries created at or after this time (RFC 3339) or this long ago (e.g. 24h)")
	fs.StringVar(&q.DocumentKey, "document-key", "", `only entries of this document, as JSON, e.g. '{"_id": 42}'`)
	fs.StringVar(&q.DocumentKeyBSON, "document-key-bson", "", "only entries of this exact document key: its raw BSON, base64 (documentKeyBSON of a listed entry)")
	fs.StringVar(&q.Limit, "limit", "", "at most this many entries (list: 1 to 1000, default 100; replay and purge: default no limit)")
	fs.StringVar(&q.After, "after", "", "list: the entries after this id (paging)")
	id := fs.String("id", "", "the entry's id (show)")
	yes := fs.Bool("yes", false, "confirm purge")
	unrouted := fs.Bool("deliver-unrouted", false, "replay: also deliver entries that no current rule routes to their sink, with the strictest shape of the sink's rules")
	if ok, code := parseFlags(fs, rest); !ok {
		return code
	}
	if *path == "" {
		fmt.Fprintln(stderr, "changegate deadletters: -config is required")
		return 2
	}
	var f deadletter.Filter
	var err error
	if sub == "list" {
		f, err = q.ListFilter(time.Now())
	} else {
		f, err = q.Filter(time.Now(), 0)
	}
	if err != nil {
		fmt.Fprintf(stderr, "changegate deadletters: -%v\n", err)
		return 2
	}
	cfg, ctx, client, done, ok := openState(*path, stderr)
	if !ok {
		return 1
	}
	defer done()
	_, store := app.Stores(cfg, client)
	enc := json.NewEncoder(stdout)
	switch sub {
	case "list":
		if err := store.Summaries(ctx, f, nil, func(e deadletter.Entry) error { return enc.Encode(e) }); err != nil {
			fmt.Fprintf(stderr, "changegate deadletters list: %v\n", err)
			return 1
		}
		return 0
	case "show":
		if *id == "" {
			fmt.Fprintln(stderr, "changegate deadletters show: -id is required")
			return 2
		}
		e, found, err := store.Get(ctx, *id)
		if err != nil {
			fmt.Fprintf(stderr, "changegate deadletters show: %v\n", err)
			return 1
		}
		if !found {
			fmt.Fprintf(stderr, "changegate deadletters show: no dead letter %q\n", *id)
			return 1
		}
		enc.SetIndent("", "  ")
		_ = enc.Encode(e)
		return 0
	case "replay":
		if f.Kind == "" {
			f.Kind = deadletter.KindFailed
		}
		res, err := app.Replay(ctx, cfg, client, f, app.ReplayOptions{DeliverUnrouted: *unrouted}, nil)
		return replayReport(res, err, stdout, stderr)
	case "purge":
		if !*yes {
			n, err := store.Count(ctx, f)
			if err != nil {
				fmt.Fprintf(stderr, "changegate deadletters purge: %v\n", err)
				return 1
			}
			fmt.Fprintf(stderr, "changegate deadletters purge: would delete %d entries; add -yes to delete them\n", n)
			return 1
		}
		n, err := store.Purge(ctx, f)
		if err != nil {
			fmt.Fprintf(stderr, "changegate deadletters purge: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "purged %d\n", n)
		return 0
	default:
		fmt.Fprintf(stderr, "changegate deadletters: unknown command %q\n\n%s", sub, deadlettersUsage)
		return 2
	}
}

// exitNotRouted is replay's exit status when nothing failed but entries no
// current rule routes to their sink were skipped: the operator asked for
// them to be delivered and they were not.
const exitNotRouted = 3

// replayReport prints what a replay did (the counts on stdout, each entry's
// error and the unrouted skips per sink on stderr) and returns the exit
// status: 1 on an error or a failed entry, exitNotRouted when entries were
// skipped because no current rule routes them, else 0.
func replayReport(res deadletter.ReplayResult, err error, stdout, stderr io.Writer) int {
	fmt.Fprintf(stdout, "replayed %d, failed %d, skipped %d\n", res.Replayed, res.Failed, res.Skipped)
	// Errors quote receivers (sinks.Error is printable already); print
	// them so whatever wraps them.
	for _, e := range res.Errors {
		fmt.Fprintf(stderr, "  %s\n", sinks.Printable(e.Error()))
	}
	if n := len(res.NotRouted); n > 0 {
		names := slices.Sorted(maps.Keys(res.NotRouted))
		parts := make([]string, len(names))
		total := 0
		for i, s := range names {
			parts[i] = fmt.Sprintf("%s %d", sinks.Printable(s), res.NotRouted[s])
			total += res.NotRouted[s]
		}
		fmt.Fprintf(stderr, "changegate deadletters replay: skipped %d entries no current rule routes to their sink (%s); they stay stored: replay with -deliver-unrouted to deliver them\n",
			total, strings.Join(parts, ", "))
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "changegate deadletters replay: %s\n", sinks.Printable(err.Error()))
		return 1
	case res.Failed > 0:
		return 1
	case len(res.NotRouted) > 0:
		return exitNotRouted
	}
	return 0
}
