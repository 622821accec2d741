package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"golang.org/x/time/rate"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
)

// scan scans the source's collections in _id order and sends each matching
// document, throttled: at most req.Rate documents per second, at most
// maxInFlight unfinished, and never while the sinks have live
// changes queued.
func (b *Runner) scan(ctx context.Context, r *run, src config.Source, log *slog.Logger) error {
	nss, err := source.Namespaces(ctx, b.client, src.Database, src.Collection, b.stateDB)
	if err != nil {
		return err
	}
	var est int64
	if len(r.filter) == 0 {
		est = source.EstimateDocuments(ctx, b.client, nss)
	} else {
		for _, ns := range nss {
			db, coll, _ := strings.Cut(ns, ".")
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := b.client.Database(db).Collection(coll).CountDocuments(cctx, r.filter)
			cancel()
			if err != nil {
				est = 0
				break
			}
			est += n
		}
	}
	r.mu.Lock()
	r.st.Estimated = est
	r.mu.Unlock()
	burst := max(1, min(int(r.req.Rate), 100))
	th := b.newThrottle(r)
	docsSent := b.metrics.BackfillDocuments.WithLabelValues(r.req.Source, r.req.Sink)
	// The acknowledged progress: each document read is a slot, its
	// position {ns, _id}; the watermark is saved (saveProgress).
	tr := th.tr
	for _, ns := range nss {
		var after bson.Raw
		if rs := r.resume; rs != nil && rs.namespace != "" {
			if ns < rs.namespace {
				continue // scanned before the restart
			}
			if ns == rs.namespace {
				after = rs.after
			}
		}
		db, coll, _ := strings.Cut(ns, ".")
		r.mu.Lock()
		r.st.Namespace = ns
		r.mu.Unlock()
		// Events carry the documentKey the stream gives (with the shard
		// key of a sharded collection).
		shardKey, err := source.ShardKeyFields(ctx, b.client, db, coll)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Warn("backfill: cannot read the shard key; documentKey is {_id} only", "namespace", ns, "err", err)
		}
		for {
			mark := b.target.mark(r.req.Source) // before the read
			var f any = bson.D{}
			switch {
			case after != nil:
				f = source.AfterIDFilter(after.Lookup("_id"), r.filter)
			case len(r.filter) > 0:
				f = r.filter
			}
			cur, err := b.client.Database(db).Collection(coll).Find(ctx, f,
				options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(int32(min(max(burst*2, 100), 1000))))
			if err != nil {
				return fmt.Errorf("read %s: %w", ns, err)
			}
			for cur.Next(ctx) {
				if err := th.wait(ctx); err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				doc := cur.Current
				idv := doc.Lookup("_id")
				after, _ = bson.Marshal(bson.D{{Key: "_id", Value: idv}})
				tok, _ := bson.Marshal(bson.D{{Key: "ns", Value: ns}, {Key: "_id", Value: idv}})
				seq, err := tr.Add(ctx, tok, bson.Timestamp{}, time.Time{})
				if err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				done := th.done(seq)
				ev, err := source.SnapshotEventKeyed(r.req.Source, source.BackfillPrefix(r.id), db, coll, bson.Timestamp{}, time.Now(), doc, shardKey)
				r.mu.Lock()
				r.st.Scanned++
				r.mu.Unlock()
				if err != nil {
					tr.Ack(seq)
					continue
				}
				// Admitted against the byte budget as a change is; the
				// lanes it is handed to hold their own references.
				mem, err := b.budget.Acquire(ctx, int64(len(ev.Raw)), "backfill "+r.id)
				if err != nil {
					_ = cur.Close(context.WithoutCancel(ctx))
					return err
				}
				ev.Mem = mem
				r.inFlight.Add(1)
				sent := b.sendOrdered(ctx, r, db, coll, shardKey, ev, idv, mark, done)
				mem.Release()
				if !sent {
					r.inFlight.Add(-1)
					if ctx.Err() != nil {
						// Not handed over because the backfill stops
						// (the CLI's send gives up waiting for a
						// delivery slot): not acknowledged, so that a
						// resume reads it again. Acknowledging it lost
						// the document on resume.
						_ = cur.Close(context.WithoutCancel(ctx))
						return ctx.Err()
					}
					tr.Ack(seq) // no sink routes it
					continue
				}
				docsSent.Inc()
				r.mu.Lock()
				r.st.Sent++
				r.mu.Unlock()
			}
			err = cur.Err()
			_ = cur.Close(context.WithoutCancel(ctx))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Warn("backfill read failed; reopening after the last document read", "namespace", ns, "err", err)
			time.Sleep(time.Second)
		}
	}
	return th.drain(ctx)
}

// throttle paces what a run hands on: at most its rate per second, at
// most maxInFlight unfinished, and never while its sinks have live
// changes queued; tr is its acknowledged progress, a slot per event
// handed on.
type throttle struct {
	b     *Runner
	r     *run
	lim   *rate.Limiter
	space chan struct{}
	tr    *checkpoint.Tracker
}

func (b *Runner) newThrottle(r *run) *throttle {
	burst := max(1, min(int(r.req.Rate), 100))
	th := &throttle{b: b, r: r, lim: rate.NewLimiter(rate.Limit(r.req.Rate), burst), space: make(chan struct{}, 1),
		tr: checkpoint.NewTracker(maxInFlight+1, checkpoint.Position{})}
	r.mu.Lock()
	r.acked = th.tr
	r.mu.Unlock()
	return th
}

// wait returns once the next event may be handed on, or ctx's error.
func (th *throttle) wait(ctx context.Context) error {
	if err := th.lim.Wait(ctx); err != nil {
		return err
	}
	// Live changes first, and a bounded backlog of our own.
	for th.r.inFlight.Load() >= maxInFlight || th.b.target.liveQueued(th.r.sinks, th.r.inFlight.Load()) > 0 {
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-th.space:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// done returns the callback of the event of slot seq, handed on: it
// acknowledges the slot and counts the event finished.
func (th *throttle) done(seq uint64) func(failed bool) {
	return func(failed bool) {
		th.tr.Ack(seq)
		r := th.r
		r.inFlight.Add(-1)
		r.mu.Lock()
		r.st.Finished++
		if failed {
			r.st.Failed++
		}
		r.mu.Unlock()
		select {
		case th.space <- struct{}{}:
		default:
		}
	}
}

// drain waits for the deliveries of what was handed on.
func (th *throttle) drain(ctx context.Context) error {
	for th.r.inFlight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-th.space:
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// sendOrdered hands ev (the document read after mark) on in order with the
// live stream: if a change of the document was dispatched since mark, it
// reads the document again (with a new mark) and retries; a document
// deleted or no longer matching meanwhile is not sent (its change is on
// the way). It reports whether ev (or its re-read) was handed to a sink.
func (b *Runner) sendOrdered(ctx context.Context, r *run, db, coll string, shardKey []string, ev *event.Event, id bson.RawValue, mark any, done func(bool)) bool {
	routed, changed := b.target.sendAfter(ctx, r.req.Sink, ev, mark, done)
	for try := 0; changed && try < maxRereads; try++ {
		r.mu.Lock()
		r.st.Reread++
		r.mu.Unlock()
		mark = b.target.mark(r.req.Source)
		f := bson.D{{Key: "_id", Value: id}}
		if len(r.filter) > 0 {
			f = bson.D{{Key: "$and", Value: bson.A{f, r.filter}}}
		}
		raw, err := b.client.Database(db).Collection(coll).FindOne(ctx, f).Raw()
		if err != nil {
			if !errors.Is(err, mongo.ErrNoDocuments) {
				b.log.Warn("backfill: cannot read a document again; not sending it", "namespace", db+"."+coll, "err", err)
			}
			return false
		}
		mem := ev.Mem
		if ev, err = source.SnapshotEventKeyed(r.req.Source, source.BackfillPrefix(r.id), db, coll, bson.Timestamp{}, time.Now(), raw, shardKey); err != nil {
			return false
		}
		mem.Resize(int64(len(ev.Raw))) // the re-read replaces the first read
		ev.Mem = mem
		routed, changed = b.target.sendAfter(ctx, r.req.Sink, ev, mark, done)
	}
	if changed {
		r.mu.Lock()
		r.st.Unordered++
		r.mu.Unlock()
		routed = b.target.send(ctx, r.req.Sink, ev, done)
	}
	return routed
}
