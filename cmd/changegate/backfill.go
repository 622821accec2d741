package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/config"
)

const backfillUsage = `Usage: changegate backfill -config FILE -source S [-sink K] [-filter JSON] [-rate N]
       changegate backfill -config FILE -resume ID

Sends the documents of source S that exist now (those matching -filter, a
MongoDB query filter as JSON, e.g. '{"status": "paid"}') again, as events
with operationType "snapshot" and ids "<source>:backfill:<backfill
id>:<hash of ns and _id>", routed by the source's rules: to sink K only
(a new subscriber; a rule of S must route to K), or to every matching
sink. It reads in _id order at most -rate documents per second and shows
its progress on stderr. Deliveries use the sinks' retry policy; what fails
for good is counted and reported (exit status 1). A running gateway goes
on streaming meanwhile; one backfill at a time per sink, across processes
(a lock in the state database). SIGINT stops reading; what was sent is
delivered first. The backfill is recorded in the state database: when this
command stops (SIGINT), is killed or crashes before the end, it prints or
has printed the backfill's id, and -resume ID continues it with the same
request and event ids after the last document delivered (after a kill it
first waits up to 30 s for the dead process's sink lock to expire). A
gateway does not resume the command line's backfills. The running gateway
offers the same as POST /api/v1/backfills, where the backfill also yields
to live changes queued for its sinks (and resumes after a restart by
itself).
`

func cmdBackfill(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("backfill", backfillUsage, stderr)
	path := fs.String("config", "", "path of the TOML config file (required)")
	var req backfill.Request
	fs.StringVar(&req.Source, "source", "", "the source whose documents to send (required)")
	fs.StringVar(&req.Sink, "sink", "", "send to this sink only (default: every sink the rules match)")
	fs.StringVar(&req.Filter, "filter", "", `only the documents matching this MongoDB query filter, as JSON, e.g. '{"status": "paid"}'`)
	fs.Float64Var(&req.Rate, "rate", backfill.DefaultRate, "at most this many documents per second")
	resume := fs.String("resume", "", "continue the backfill with this id, left unfinished by a stop, a kill or a crash of this command (its request is recorded: no -source, -sink, -filter or -rate)")
	if ok, code := parseFlags(fs, args); !ok {
		return code
	}
	if *resume != "" {
		given := false
		fs.Visit(func(f *flag.Flag) {
			given = given || f.Name == "source" || f.Name == "sink" || f.Name == "filter" || f.Name == "rate"
		})
		if *path == "" || given {
			fmt.Fprintln(stderr, "changegate backfill: -resume takes -config only (the request is the recorded one)")
			return 2
		}
	} else if *path == "" || req.Source == "" {
		fmt.Fprintln(stderr, "changegate backfill: -config and -source are required")
		return 2
	}
	return runRecorded("backfill", "backfill", "changegate backfill -config "+*path, *path, stdout, stderr,
		func(ctx context.Context, cfg *config.Config, client *mongo.Client, show func(backfill.Status)) (backfill.Status, error) {
			if *resume != "" {
				return app.ResumeBackfill(ctx, cfg, client, *resume, nil, show)
			}
			return app.Backfill(ctx, cfg, client, req, nil, show)
		})
}

// runRecorded runs a recorded backfill or redelivery of the command line
// (cmd, the command's name; what it is): it loads the config at path,
// connects, runs do with a progress bar on stderr, announces the run's id
// with how to resume it (resume, the command line that resumes), and
// prints the result. Exit 2 for a bad request, 1 when it failed or did not
// finish.
func runRecorded(cmd, what, resume, path string, stdout, stderr io.Writer,
	do func(ctx context.Context, cfg *config.Config, client *mongo.Client, show func(backfill.Status)) (backfill.Status, error)) int {
	cfg, ctx, client, done, ok := openState(path, stderr)
	if !ok {
		return 1
	}
	defer done()
	bar := progressBar{w: stderr, tty: isTerminal(stderr)}
	announced := false
	show := func(s backfill.Status) {
		if !announced && s.ID != "" {
			announced = true
			bar.end()
			bar.drew = false
			fmt.Fprintf(stderr, "%s %s (if this command stops before the end: %s -resume %s)\n", what, s.ID, resume, s.ID)
		}
		bar.show(s)
	}
	st, err := do(ctx, cfg, client, show)
	bar.end()
	switch {
	case errors.Is(err, backfill.ErrInput), errors.Is(err, backfill.ErrUnknownSink):
		fmt.Fprintf(stderr, "changegate %s: %v\n", cmd, err)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "changegate %s: %v\n", cmd, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s %s %s: scanned %d, sent %d, finished %d, failed %d\n", what, st.ID, st.State, st.Scanned, st.Sent, st.Finished, st.Failed)
	if st.Failed > 0 || st.State != "done" {
		return 1
	}
	return 0
}

// progressBar draws a backfill's progress: one line redrawn in place on a
// terminal, a line every 5 seconds otherwise.
type progressBar struct {
	w    io.Writer
	tty  bool
	last time.Time
	drew bool
}

func (p *progressBar) show(st backfill.Status) {
	if !p.tty && time.Since(p.last) < 5*time.Second && st.State == "running" {
		return
	}
	p.last = time.Now()
	const width = 30
	filled := int(st.Percent / 100 * width)
	total := "?"
	if st.Estimated > 0 {
		total = fmt.Sprint(st.Estimated)
	}
	unit := "docs"
	if st.Kind == backfill.KindRedelivery {
		unit = "changes"
	}
	line := fmt.Sprintf("[%s%s] %5.1f%% %d/%s %s, %.0f/s", strings.Repeat("#", filled), strings.Repeat(" ", width-filled),
		st.Percent, st.Scanned, total, unit, st.DocsPerSec)
	if st.ETASeconds > 0 {
		line += fmt.Sprintf(", ETA %s", (time.Duration(st.ETASeconds) * time.Second).String())
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r%-80s", line)
		p.drew = true
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progressBar) end() {
	if p.drew {
		fmt.Fprintln(p.w)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
