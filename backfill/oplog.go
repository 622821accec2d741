package backfill

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/source"
)

// reread runs a redelivery from the oplog (KindRedelivery): it reads the
// source's changes from Since on again (source.Reread) and hands those
// before Until that the filter matches to the run's sink alone, in stream
// order, throttled as a backfill is. Each change handed on is a slot of
// the run's tracker (its resume token and cluster time), whose watermark
// is saved, so that a resumed run starts at that cluster time and skips
// the changes up to that token. Nothing is checkpointed; no other sink
// gets anything.
func (b *Runner) reread(ctx context.Context, r *run, log *slog.Logger) error {
	spec, ok := b.streams(r.req.Source)
	if !ok {
		return fmt.Errorf("unknown source %q", r.req.Source)
	}
	spec.Budget = b.budget
	var match *query.Filter
	if len(r.filter) > 0 {
		var err error
		if match, err = query.Compile(r.filter); err != nil {
			return err
		}
	}
	// Cluster times count seconds: the window is Since's second to
	// Until's, Until excluded unless it falls within a second.
	start := bson.Timestamp{T: uint32(r.req.Since.Unix())}
	until := uint32(r.req.Until.Unix())
	if r.req.Until.Nanosecond() > 0 {
		until++
	}
	var skipTo string // the token data of the last change finished before a restart
	if rs := r.resume; rs != nil && rs.afterCT.T != 0 {
		start, skipTo = rs.afterCT, strings.ToUpper(rs.afterData)
		log.Info("redelivery resumes after the last change finished", "cluster_time", rs.afterCT)
	}
	th := b.newThrottle(r)
	sent := b.metrics.BackfillDocuments.WithLabelValues(r.req.Source, r.req.Sink)
	err := source.Reread(ctx, b.client, spec, start, func(ev *event.Event, at bson.Timestamp) (bool, error) {
		if ev == nil {
			// Nothing more for now: every change up to the time the
			// request was made (until is not later) was read.
			return false, nil
		}
		if ev.ClusterTime.T >= until {
			return false, nil
		}
		if skipTo != "" && ev.ClusterTime == start && strings.ToUpper(event.TokenData(ev.Token)) <= skipTo {
			return true, nil // finished before the restart
		}
		r.mu.Lock()
		r.st.Scanned++
		r.mu.Unlock()
		if match != nil && !match.Match(ev.Raw) {
			return true, nil
		}
		if err := th.wait(ctx); err != nil {
			return false, err
		}
		seq, err := th.tr.Add(ctx, ev.Token, ev.ClusterTime, ev.WallTime)
		if err != nil {
			return false, err
		}
		r.inFlight.Add(1)
		if !b.target.send(ctx, r.req.Sink, ev, th.done(seq)) {
			r.inFlight.Add(-1)
			if ctx.Err() != nil {
				// Not handed over because the run stops: not
				// acknowledged, so that a resume reads it again.
				return false, ctx.Err()
			}
			th.tr.Ack(seq) // today's rules do not route it to the sink
			return true, nil
		}
		sent.Inc()
		r.mu.Lock()
		r.st.Sent++
		r.mu.Unlock()
		return true, nil
	})
	if err != nil {
		return err
	}
	return th.drain(ctx)
}
