package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/source"
)

const checkpointsUsage = `Usage: changegate checkpoints show|reset -config FILE [-source NAME]

  show    print the persisted checkpoint of every source (or of -source)
  reset   delete the checkpoint of -source (requires -yes): its next start
          begins at "now" (or its start_at), skipping whatever came before.
          Use it to move a source past lost history on purpose; stop the
          gateway first.
`

type checkpointJSON struct {
	Source      string    `json:"source"`
	Token       string    `json:"token"`
	ClusterTime uint32    `json:"clusterTime,omitempty"`
	WallTime    time.Time `json:"wallTime,omitzero"`
	UpdatedAt   time.Time `json:"updatedAt,omitzero"`
	// Snapshot is the progress of an unfinished initial snapshot: the
	// stream starts at Token once it is done.
	Snapshot *snapshotJSON `json:"snapshot,omitempty"`
}

type snapshotJSON struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace,omitempty"`
	After     string `json:"after,omitempty"` // the last _id done, as Extended JSON
	Scanned   int64  `json:"scanned"`
}

func cmdCheckpoints(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(stderr, checkpointsUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, rest := args[0], args[1:]
	if sub != "show" && sub != "reset" {
		fmt.Fprintf(stderr, "changegate checkpoints: unknown command %q\n\n%s", sub, checkpointsUsage)
		return 2
	}
	fs := newFlags("checkpoints "+sub, checkpointsUsage, stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	src := fs.String("source", "", "the source's name")
	yes := fs.Bool("yes", false, "confirm reset")
	if ok, code := parseFlags(fs, rest); !ok {
		return code
	}
	if *path == "" {
		fmt.Fprintln(stderr, "changegate checkpoints: -config is required")
		return 2
	}
	cfg, ok := loadConfig(*path, stderr)
	if !ok {
		return 1
	}
	// A unit name ("orders#2/4", also of an earlier partitioning) names
	// its source's checkpoint of that partition.
	if name, _, _, ok := source.ParseUnit(*src); *src != "" && (!ok || cfg.Source(name) == nil) {
		fmt.Fprintf(stderr, "changegate checkpoints: no source %q in %s\n", *src, *path)
		return 2
	}
	ctx, client, done, ok := connect(cfg, stderr)
	if !ok {
		return 1
	}
	defer done()
	store, _ := app.Stores(cfg, client)
	switch sub {
	case "show":
		cps, err := store.List(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "changegate checkpoints show: %v\n", err)
			return 1
		}
		enc := json.NewEncoder(stdout)
		for _, cp := range cps {
			if *src != "" && cp.Source != *src {
				continue
			}
			out := checkpointJSON{Source: cp.Source, Token: cp.Token.String(), ClusterTime: cp.ClusterTime.T, WallTime: cp.WallTime, UpdatedAt: cp.UpdatedAt}
			if sn := cp.Snapshot; sn != nil {
				out.Snapshot = &snapshotJSON{ID: sn.ID, Namespace: sn.Namespace, Scanned: sn.Scanned}
				if sn.After != nil {
					out.Snapshot.After = sn.After.Lookup("_id").String()
				}
			}
			_ = enc.Encode(out)
		}
		return 0
	case "reset":
		if *src == "" {
			fmt.Fprintln(stderr, "changegate checkpoints reset: -source is required")
			return 2
		}
		if !*yes {
			fmt.Fprintf(stderr, "changegate checkpoints reset: this makes source %s skip every change before its next start; add -yes to do it\n", *src)
			return 1
		}
		found, err := store.Reset(ctx, *src)
		if err != nil {
			fmt.Fprintf(stderr, "changegate checkpoints reset: %v\n", err)
			return 1
		}
		if !found {
			fmt.Fprintf(stdout, "source %s had no checkpoint\n", *src)
			return 0
		}
		fmt.Fprintf(stdout, "checkpoint of source %s deleted; its next start begins at now (or start_at)\n", *src)
		return 0
	default:
		fmt.Fprintf(stderr, "changegate checkpoints: unknown command %q\n\n%s", sub, checkpointsUsage)
		return 2
	}
}
