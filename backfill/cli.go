package backfill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/router"
)

// CommandLine runs the command line's backfills: it delivers with
// Engine.DeliverNow (the sinks' retry policy, no lanes: a running gateway's
// lanes and parked backlogs are its own), 8 deliveries at a time, holding
// the sinks' backfill locks (so no other backfill of them runs meanwhile,
// in any process). Each backfill is recorded in the state database as the
// command line's, which gateways do not resume: when the process stops or
// dies before the end, Resume continues it with the same id, after the last
// document acknowledged.
type CommandLine struct {
	Config *config.Config
	Client *mongo.Client
	// Engine routes and delivers; its lanes are not started.
	Engine *router.Engine
	// Budget bounds the documents held (nil: none).
	Budget *memory.Budget
	// Log receives the log lines; nil discards.
	Log *slog.Logger
	// Progress, when not nil, is called about twice a second and once at
	// the end.
	Progress func(Status)
	// Streams returns a source's change stream, for redeliveries.
	Streams Streams
}

// RedeliverEvent is Runner.RedeliverEvent from the command line: the
// change is delivered directly (Engine.DeliverNow), not through a running
// gateway's lanes.
func (c CommandLine) RedeliverEvent(ctx context.Context, id, sink string) (Redelivered, error) {
	return c.runner(1).RedeliverEvent(ctx, id, sink)
}

// Run sends the documents of req.Source matching req.Filter to req.Sink (or
// every matching sink), throttled by req.Rate. Cancelling ctx stops
// reading; what was sent is finished first. It returns the final status;
// an error wrapping ErrInput or ErrBusy means nothing started.
func (c CommandLine) Run(ctx context.Context, req Request) (Status, error) {
	return c.run(ctx, req, "")
}

// Resume resumes the command line's backfill id, left running by a stop
// (SIGINT), a kill or a crash: with its request, its id (so its event ids)
// and after the last document it saw acknowledged. A backfill of the
// gateway, or one that ended, is refused (ErrInput). The sinks' locks of a
// process that died are taken once they expire (at most leaseTTL, which
// Resume waits); a live process's are not (ErrBusy).
func (c CommandLine) Resume(ctx context.Context, id string) (Status, error) {
	if id == "" {
		return Status{}, fmt.Errorf("%w: no backfill id", ErrInput)
	}
	return c.run(ctx, Request{}, id)
}

// ResumeRedelivery is Resume for a redelivery from the oplog
// (KindRedelivery) of the command line.
func (c CommandLine) ResumeRedelivery(ctx context.Context, id string) (Status, error) {
	if id == "" {
		return Status{}, fmt.Errorf("%w: no redelivery id", ErrInput)
	}
	return c.run(ctx, Request{Kind: KindRedelivery}, id)
}

// run runs req, or resumes the recorded backfill resumeID (of req.Kind).
// A redelivery delivers one change at a time, in stream order.
func (c CommandLine) run(ctx context.Context, req Request, resumeID string) (Status, error) {
	deliveries := 8
	if req.Kind == KindRedelivery {
		deliveries = 1
	}
	b := c.runner(deliveries)
	var r *run
	var err error
	if resumeID == "" {
		r, err = b.start(ctx, c.Config, req)
	} else {
		r, err = b.resumeCLI(ctx, c.Config, resumeID, req.Kind)
	}
	if err != nil {
		return Status{}, err
	}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			st := r.status()
			if c.Progress != nil {
				c.Progress(st)
			}
			if st.State == "failed" {
				return st, errors.New(st.Error)
			}
			return st, nil
		case <-t.C:
			if c.Progress != nil {
				c.Progress(r.status())
			}
		}
	}
}

// runner returns the command line's Runner: its deliveries direct, at
// most deliveries at a time, its records the command line's.
func (c CommandLine) runner(deliveries int) *Runner {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host := c.Config.Cluster.Instance
	if host == "" {
		host = "cli"
	}
	// One lock owner per process: a resume must wait for a dead
	// process's locks to expire, and must not share a live one's.
	var tok [4]byte
	_, _ = rand.Read(tok[:])
	return New(Options{
		Client: c.Client, StateDB: c.Client.Database(c.Config.Mongo.StateDatabase), Instance: host + "/cli-" + hex.EncodeToString(tok[:]),
		Target: &direct{engine: c.Engine, sem: make(chan struct{}, deliveries), log: log}, SinksOf: c.Engine.SinksOf, Log: log,
		Budget: c.Budget, Record: true, CLI: true, Streams: c.Streams,
	})
}
