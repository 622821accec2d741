package source

// Reading the stream: opening it from a position (open), consuming its
// batches into events and the tracker (consume, take), recording a gap
// when history is lost, and whether an event is this unit's (mine).

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/memory"
)

func (s *Source) open(ctx context.Context, token bson.Raw, startAt *bson.Timestamp, narrow bool) (*mongo.ChangeStream, error) {
	opts := options.ChangeStream()
	if s.spec.FullDocument != "" && s.spec.FullDocument != "default" {
		opts.SetFullDocument(options.FullDocument(s.spec.FullDocument))
	}
	if s.spec.FullDocumentBeforeChange != "" && s.spec.FullDocumentBeforeChange != "off" {
		opts.SetFullDocumentBeforeChange(options.FullDocument(s.spec.FullDocumentBeforeChange))
	}
	if s.spec.BatchSize > 0 {
		opts.SetBatchSize(s.spec.BatchSize)
	}
	if narrow {
		opts.SetBatchSize(1)
	}
	if s.spec.MaxAwait > 0 {
		opts.SetMaxAwaitTime(s.spec.MaxAwait)
	}
	switch {
	case token != nil:
		// startAfter also works past an invalidate event.
		opts.SetStartAfter(token)
	case startAt != nil:
		opts.SetStartAtOperationTime(startAt)
	}
	pipeline := bson.A{}
	if s.spec.Database == "" && s.spec.StateDatabase != "" {
		pipeline = append(pipeline, StateFilter(s.spec.StateDatabase))
	}
	if s.spec.Partitions > 1 && !s.clientFilter {
		pipeline = append(pipeline, PartitionFilter(s.spec.Partition, s.spec.Partitions))
	}
	s.mu.Lock()
	push := s.spec.Pushdown
	s.mu.Unlock()
	if push != nil {
		pipeline = append(pipeline, push)
	}
	pipeline = append(pipeline, s.spec.Pipeline...)
	pipeline, err := s.splitPipeline(ctx, pipeline)
	if err != nil {
		return nil, err
	}
	switch {
	case s.spec.Database == "":
		return s.client.Watch(ctx, pipeline, opts)
	case s.spec.Collection == "":
		return s.client.Database(s.spec.Database).Watch(ctx, pipeline, opts)
	default:
		return s.client.Database(s.spec.Database).Collection(s.spec.Collection).Watch(ctx, pipeline, opts)
	}
}

// consume reads events until the stream ends or fails. It returns the resume
// token to reopen from (the last event handed to the router, or the newest
// post-batch token), whether the stream ended with an invalidate, whether
// it made progress (read a change or got an answer to a getMore), and the
// stream's error. tx is the transaction being read (txn.go), kept across
// reopens. recovering: the stream failed before without progress;
// its state turns open with the first progress.
func (s *Source) consume(ctx context.Context, cs *mongo.ChangeStream, tr *checkpoint.Tracker, tx *txnState, token bson.Raw, recovering bool) (bson.Raw, bool, bool, error) {
	// A held transaction event is read again after a reopen (txn.go).
	defer tx.dropHeld()
	invalidated, progressed := false, false
	progress := func() {
		if !progressed && recovering {
			s.setState(StateOpen, nil)
			s.mFailures.Set(0)
		}
		progressed = true
	}
	// The fragments of a split event read so far (split.go) and their
	// charge: the post-batch token is not a resume point while fragments
	// are pending.
	var pend pending
	defer func() { pend.mem.Release() }()
	polls := 0
	for {
		got, polled := s.tryNext(ctx, cs)
		if polled {
			s.mu.Lock()
			s.status.LastPoll = time.Now()
			s.mu.Unlock()
		}
		if got {
			progress()
			reopen, inv, ok, err := s.take(ctx, tr, tx, &pend, cs.Current)
			if err != nil {
				return token, false, progressed, err
			}
			if !ok {
				return token, false, progressed, nil // stopping
			}
			if reopen != nil {
				token = reopen
			}
			if inv {
				invalidated = true
			}
			continue
		}
		if err := cs.Err(); err != nil {
			if ctx.Err() != nil {
				return token, false, progressed, nil
			}
			return token, false, progressed, err
		}
		// The first empty TryNext only consumes the aggregate's first
		// batch; the second one got an answer to a getMore.
		if polls++; polls >= 2 {
			progress()
		}
		if cs.ID() == 0 {
			// The server closed the cursor: an invalidate. Its event may have
			// been filtered out by the source's own pipeline stages; the
			// final post-batch token then marks it, and startAfter that
			// token continues after it.
			if !s.endTxn(ctx, tr, tx) {
				return token, false, progressed, nil // stopping
			}
			if rt := cs.ResumeToken(); rt != nil && !invalidated {
				s.resumePoint(tr, tx, rt)
				token = rt
			}
			return token, true, progressed, nil
		}
		if rt := cs.ResumeToken(); rt != nil && cs.RemainingBatchLength() == 0 && !pend.frags.pending() {
			taken, ok := s.txnPostBatch(ctx, tr, tx, rt)
			if !ok {
				return token, false, progressed, nil // stopping
			}
			if taken {
				token = rt
			}
		}
	}
}

// tryNext is cs.TryNext; polled: the batch was read and the server asked
// for more, bounded in time: a getMore that never answers (a network
// partition, a hung server) would block forever, so it fails when the
// bound expires and the stream reopens.
func (s *Source) tryNext(ctx context.Context, cs *mongo.ChangeStream) (got, polled bool) {
	if cs.RemainingBatchLength() > 0 {
		return cs.TryNext(ctx), false
	}
	timeout := s.spec.MaxAwait + 10*time.Second
	if s.spec.MaxAwait <= 0 {
		timeout = 11 * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return cs.TryNext(pctx), true
}

// pending is what consume keeps between the changes it reads: the
// fragments of a split event so far (split.go), and mem, the byte budget's
// charge of the change being read, returned if it is not handed on.
type pending struct {
	frags fragments
	mem   *memory.Charge
}

// take handles one change read from the stream (cur, the driver's buffer:
// copied before it is kept). It returns the token to reopen from when it
// changes (nil: unchanged), whether the change is an invalidate, false
// when the source is stopping, and an error that reopens the stream.
func (s *Source) take(ctx context.Context, tr *checkpoint.Tracker, tx *txnState, pend *pending, cur bson.Raw) (bson.Raw, bool, bool, error) {
	raw := make(bson.Raw, len(cur))
	copy(raw, cur)
	// The byte budget admits the change (its first fragment, for a split
	// one) before the next is read: while it is spent, the Source stops
	// reading here. A split change's later fragments are charged to it
	// without waiting (waiting on bytes that the change itself holds
	// could never end); the reassembled change then replaces them. While
	// a transaction is open its grouped sinks may have to send a part of
	// it on first (txn.go).
	if pend.mem == nil {
		c, err := s.admit(ctx, tx, int64(len(raw)))
		if err != nil {
			return nil, false, false, nil // stopping
		}
		pend.mem = c
	} else {
		pend.mem.Grow(int64(len(raw)))
	}
	whole, err := pend.frags.add(raw)
	if err != nil {
		// Reopen from the last whole event: the fragments come again from
		// the first.
		return nil, false, true, err
	}
	if whole == nil {
		return nil, false, true, nil // more fragments to come
	}
	if len(whole) != len(raw) || (len(raw) > 0 && &whole[0] != &raw[0]) {
		s.mSplit.Inc()
		pend.mem.Resize(int64(len(whole))) // the fragments are garbage now
	}
	ev, err := event.FromChange(s.spec.Name, 0, whole)
	if err != nil {
		// The driver refuses a change without a document _id, so this
		// cannot loop on one change; reopen as for an error.
		return nil, false, true, fmt.Errorf("malformed change event: %w", err)
	}
	ev.Tenure = s.spec.Tenure
	ev.Mem, pend.mem = pend.mem, nil // released by handOn, or where the change is not handed on (txn.go)
	// Transactions (txn.go): the event may be held back until its
	// successor tells whether it ends its transaction.
	reopen, ok := s.txnEvent(ctx, tr, tx, ev)
	if !ok {
		return nil, false, false, nil // stopping
	}
	return reopen, ev.OperationType == "invalidate", true, nil
}

func (s *Source) recordGap(ctx context.Context, tr *checkpoint.Tracker, cause error) error {
	pos, _ := tr.Position()
	now := time.Now().UTC()
	from := pos.WallTime
	if from.IsZero() && pos.ClusterTime.T != 0 {
		from = time.Unix(int64(pos.ClusterTime.T), 0).UTC()
	}
	e := deadletter.Entry{
		ID:        deadletter.GapID(s.spec.Name, from),
		Kind:      deadletter.KindGap,
		Source:    s.spec.Name,
		Reason:    "history_lost",
		LastError: cause.Error(), FirstError: cause.Error(),
		GapFrom: from, GapTo: now, LastToken: pos.Token,
		CreatedAt: now, FirstFailedAt: now, LastFailedAt: now,
	}
	if err := s.gaps.Put(ctx, e); err != nil {
		return err
	}
	s.log.Error("change stream history lost: continuing from now; the gap is recorded in the dead-letter collection",
		"gap_from", formatTime(from), "gap_to", formatTime(now), "gap_id", e.ID)
	return nil
}

// mine reports whether ev belongs to this Source's partition: every event
// without partitions; partition 0 takes the events without a documentKey
// (every partition's stream sees them: an invalidate must close each
// cursor); the others are filtered by the server, or here by the same hash
// when the server lacks $toHashedIndexKey.
func (s *Source) mine(ev *event.Event) bool {
	switch {
	case s.spec.Database == "" && s.spec.StateDatabase != "" && ev.DB == s.spec.StateDatabase:
		return false // StateFilter keeps them out; a server that ignored it
	case s.spec.Partitions <= 1:
		return true
	case ev.DocumentKey == nil:
		return s.spec.Partition == 0
	case !s.clientFilter:
		return true
	}
	h := mhash.HashedIndexKey(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: ev.DocumentKey})
	return mhash.Partition(h, s.spec.Partitions) == s.spec.Partition
}
