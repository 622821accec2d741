package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
)

// recordsCollection holds one record per backfill in the
// state database.
const recordsCollection = "backfill_runs"

// record is the stored form of a backfill: its request and its
// acknowledged progress. Every document before After in Namespace (and
// every namespace before it, in the scan's sorted order) was delivered,
// dead-lettered or parked for every sink.
type record struct {
	ID        string        `bson:"_id"`
	Source    string        `bson:"source"`
	Sink      string        `bson:"sink,omitempty"`
	Filter    string        `bson:"filter,omitempty"`
	Rate      float64       `bson:"rate"`
	State     string        `bson:"state"` // running, done, failed, cancelled
	Namespace string        `bson:"namespace,omitempty"`
	After     bson.RawValue `bson:"after,omitempty"` // the last acknowledged _id
	Scanned   int64         `bson:"scanned"`
	StartedAt time.Time     `bson:"startedAt"`
	UpdatedAt time.Time     `bson:"updatedAt"`
	// Origin is originCLI for a backfill of the command line;
	// absent for the gateway's (and for every record written before the
	// command line's were recorded).
	Origin string `bson:"origin,omitempty"`
	// Kind, Since and Until: a redelivery from the oplog (Request);
	// AfterCT and AfterData are its acknowledged progress, the cluster time
	// and resume token data of the change up to which every change it
	// read was finished (absent before the first).
	Kind      string         `bson:"kind,omitempty"`
	Since     time.Time      `bson:"since,omitempty"`
	Until     time.Time      `bson:"until,omitempty"`
	AfterCT   bson.Timestamp `bson:"afterClusterTime,omitempty"`
	AfterData string         `bson:"afterToken,omitempty"`
}

// originCLI marks the records of the command line's backfills.
const originCLI = "cli"

// resume returns the request of rec and where a resumed run starts.
func (rec record) resume() (Request, *resumePoint) {
	req := Request{Source: rec.Source, Sink: rec.Sink, Filter: rec.Filter, Rate: rec.Rate, Kind: rec.Kind, Since: rec.Since, Until: rec.Until}
	rs := &resumePoint{id: rec.ID, namespace: rec.Namespace, scanned: rec.Scanned, startedAt: rec.StartedAt,
		afterCT: rec.AfterCT, afterData: rec.AfterData}
	if rec.Namespace != "" && rec.After.Type != 0 {
		rs.after, _ = bson.Marshal(bson.D{{Key: "_id", Value: rec.After}})
	}
	return req, rs
}

// resumePoint is where a resumed backfill starts.
type resumePoint struct {
	id        string
	namespace string
	after     bson.Raw
	scanned   int64
	startedAt time.Time
	// afterCT and afterData: where a redelivery resumes (record).
	afterCT   bson.Timestamp
	afterData string
}

// saveRecord writes r's request and state (not its progress).
func (b *Runner) saveRecord(ctx context.Context, r *run, state string) error {
	if b.records == nil {
		return nil
	}
	st := r.status()
	set := bson.D{
		{Key: "source", Value: r.req.Source}, {Key: "sink", Value: r.req.Sink}, {Key: "filter", Value: r.req.Filter},
		{Key: "rate", Value: r.req.Rate}, {Key: "state", Value: state}, {Key: "startedAt", Value: st.StartedAt},
		{Key: "updatedAt", Value: time.Now().UTC()},
	}
	if b.origin != "" {
		set = append(set, bson.E{Key: "origin", Value: b.origin})
	}
	if r.req.Kind != "" {
		set = append(set, bson.E{Key: "kind", Value: r.req.Kind}, bson.E{Key: "since", Value: r.req.Since}, bson.E{Key: "until", Value: r.req.Until})
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.records.UpdateOne(wctx, bson.D{{Key: "_id", Value: r.id}}, bson.D{{Key: "$set", Value: set}}, options.UpdateOne().SetUpsert(true))
	return err
}

// saveProgress saves r's acknowledged progress every second until ctx ends.
func (b *Runner) saveProgress(ctx context.Context, r *run) {
	if b.records == nil {
		return
	}
	var saved uint64
	for {
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if tr := r.tracker(); tr != nil {
			if _, v := tr.Position(); v != saved {
				if b.saveProgressNow(ctx, r) {
					saved = v
				}
			}
		}
	}
}

// saveProgressNow saves r's acknowledged progress once.
func (b *Runner) saveProgressNow(ctx context.Context, r *run) bool {
	tr := r.tracker()
	if b.records == nil || tr == nil {
		return false
	}
	pos, _ := tr.Position()
	var set bson.D
	if r.req.Kind == KindRedelivery {
		// The position of a change read from the oplog: its cluster time
		// and resume token.
		if len(pos.Token) == 0 {
			return false
		}
		set = bson.D{{Key: "afterClusterTime", Value: pos.ClusterTime}, {Key: "afterToken", Value: event.TokenData(pos.Token)}}
	} else {
		var at struct {
			NS string        `bson:"ns"`
			ID bson.RawValue `bson:"_id"`
		}
		if len(pos.Token) == 0 || bson.Unmarshal(pos.Token, &at) != nil || at.NS == "" {
			return false
		}
		set = bson.D{{Key: "namespace", Value: at.NS}, {Key: "after", Value: at.ID}}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.records.UpdateOne(wctx, bson.D{{Key: "_id", Value: r.id}}, bson.D{{Key: "$set", Value: append(set,
		bson.E{Key: "scanned", Value: r.status().Scanned}, bson.E{Key: "updatedAt", Value: time.Now().UTC()},
	)}})
	if err != nil {
		b.log.Warn("cannot save backfill progress", "backfill", r.id, "err", err)
		return false
	}
	return true
}

func (r *run) tracker() *checkpoint.Tracker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked
}

// ResumeAll resumes, from their acknowledged progress and with the same
// ids, the backfills a previous run of the gateway (or another replica)
// left running: stopped, killed or crashed. A backfill whose sink lock is
// still held (by its crashed owner until the lock expires, or by another
// replica running it) is retried until it can be taken or is no longer
// running. It returns when ctx ends or every such backfill was resumed.
func (b *Runner) ResumeAll(ctx context.Context, cfg func() *config.Config) {
	if b.records == nil {
		return
	}
	for {
		// The command line's backfills are resumed by the command line
		// (changegate backfill -resume ID), not by a gateway.
		cur, err := b.records.Find(ctx, bson.D{{Key: "state", Value: "running"}, {Key: "origin", Value: bson.D{{Key: "$ne", Value: originCLI}}}})
		var recs []record
		if err == nil {
			err = cur.All(ctx, &recs)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			b.log.Warn("cannot list backfills to resume", "err", err)
		}
		waiting := err != nil
		for _, rec := range recs {
			b.mu.Lock()
			_, mine := b.runs[rec.ID]
			b.mu.Unlock()
			if mine {
				continue
			}
			req, rs := rec.resume()
			_, err := b.startRun(ctx, cfg(), req, rs)
			switch {
			case err == nil:
				b.log.Info("resumed a backfill left running", "backfill", rec.ID, "namespace", rec.Namespace, "scanned", rec.Scanned)
			case errors.Is(err, ErrInput):
				b.log.Warn("cannot resume a backfill: its request no longer fits the configuration", "backfill", rec.ID, "err", err)
				_, _ = b.records.UpdateOne(ctx, bson.D{{Key: "_id", Value: rec.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: "failed"}}}})
			default:
				waiting = true // busy: its lock is still held
			}
		}
		if !waiting {
			return
		}
		t := time.NewTimer(5 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// resumeCLI resumes the command line's recorded backfill id, waiting up
// to the lock's lifetime for the locks of the process that ran it.
func (b *Runner) resumeCLI(ctx context.Context, cfg *config.Config, id, kind string) (*run, error) {
	var rec record
	err := b.records.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&rec)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, fmt.Errorf("%w: no backfill %q", ErrInput, id)
	case err != nil:
		return nil, fmt.Errorf("backfill: read %s: %w", id, err)
	case rec.Origin != originCLI:
		return nil, fmt.Errorf("%w: backfill %s was started by a gateway, which resumes it itself", ErrInput, id)
	case rec.State != "running":
		return nil, fmt.Errorf("%w: backfill %s is %s: nothing to resume", ErrInput, id, rec.State)
	case rec.Kind != kind && rec.Kind == KindRedelivery:
		return nil, fmt.Errorf("%w: %s is a redelivery from the oplog: resume it with changegate sinks redeliver -resume", ErrInput, id)
	case rec.Kind != kind:
		return nil, fmt.Errorf("%w: %s is a backfill: resume it with changegate backfill -resume", ErrInput, id)
	}
	req, rs := rec.resume()
	deadline := time.Now().Add(leaseTTL + 5*time.Second)
	for {
		r, err := b.startRun(ctx, cfg, req, rs)
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			return r, err
		}
		b.log.Info("waiting for the backfill's sink lock (held until it expires when its process died)", "backfill", id)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
