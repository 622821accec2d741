package deadletter

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/sinks"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// ErrHeldBack is reported (wrapped, in ReplayResult.Errors) for an entry that
// Replay did not deliver because an earlier entry of the same document and
// sink failed during the same replay: delivering it would break
// per-document order.
var ErrHeldBack = errors.New("held back behind an undelivered entry of the same document")

// ErrClaimed is reported (wrapped, in ReplayResult.Errors) for an entry that
// another replay, running at the same time, is delivering; the later
// entries of its document and sink are held back as well.
var ErrClaimed = errors.New("being replayed by another replay")

// ErrNotRouted is returned (wrapped) by a replay's or a re-drive's
// delivery for a stored change that no current rule routes to its sink: it
// is not delivered without the operator's explicit choice
// (deliver_unrouted), since nothing says how it should be shaped. Replay
// counts such an entry as skipped and leaves it as it is.
var ErrNotRouted = errors.New("no current rule routes this change to the sink: not delivered (replay with deliver_unrouted to deliver it with the strictest shape of the sink's rules)")

// ReplayResult reports what Replay did.
type ReplayResult struct {
	// Replayed entries were delivered and deleted.
	Replayed int
	// Failed entries could not be delivered; they stay in the store with
	// their attempts, lastError and lastFailedAt updated.
	Failed int
	// Skipped entries were not attempted: gaps, entries stored without their
	// change (ErrNotReplayable), entries no current rule routes to their
	// sink (ErrNotRouted), entries another replay is delivering
	// (ErrClaimed) and entries held back behind an undelivered entry of the
	// same document and sink (ErrHeldBack). They stay in the store.
	Skipped int
	// NotRouted counts, per sink, the skipped entries no current rule
	// routes to their sink (ErrNotRouted); nil when there are none.
	NotRouted map[string]int
	// Errors holds one error per failed entry, and per skipped entry except
	// gaps, each naming the entry.
	Errors []error
}

// Replay re-delivers the failed entries matching f through deliver and
// deletes each entry only after deliver returned nil for it; an entry whose
// delivery fails again stays, with attempts, lastError and lastFailedAt
// updated (attempts grows by one, or by the n of an error that has an
// Attempts() int method).
//
// deliver performs the whole sink delivery, retries included; it receives
// the entry's sink name and the event rebuilt from the stored change (with
// the entry's rules). Entries are replayed one at a time in stream order
// (ClusterTime, then Order, then ID), at most f.Limit of them; once an
// entry is not delivered (it failed, cannot be replayed, or another replay
// holds it), later entries of the same document and sink are held back so
// that per-document order is kept.
//
// Before delivering an entry Replay claims it atomically (a claim token, its
// owner process and an expiry, ClaimTTL by the server's clock, renewed
// while the delivery runs), so concurrent replays, in one process or
// several, deliver each entry once; the entry is deleted, or its failure
// recorded, only under that claim. A claim left by a process that died is
// taken over when it expires, or at once from the dead process's machine.
//
// f.Kind selects what is replayed: failed entries when it is empty or
// KindFailed (an empty Kind also counts the matching gaps as skipped);
// KindGap only counts gaps as skipped. Parked entries belong to the running
// gateway's automatic re-drive: asking for KindParked is an error. AfterID
// is ignored.
//
// Replay returns a non-nil error, with the result so far, only when it had
// to stop: ctx ended or the store failed. Delivery failures are reported in
// the result.
func (s *Store) Replay(ctx context.Context, f Filter, deliver func(ctx context.Context, sink string, e *event.Event) error) (ReplayResult, error) {
	return s.ReplayGrouped(ctx, f, deliver, GroupDelivery{})
}

// GroupDelivery is how ReplayGrouped delivers the failed entries of one
// transaction to a sink that takes a transaction whole (transactions =
// "group").
type GroupDelivery struct {
	// Grouped reports whether sink takes a transaction's events together.
	Grouped func(sink string) bool
	// Deliver delivers the events of one transaction, in txn.index order,
	// as one group (sinks.WithTxnGroup), retries included.
	Deliver func(ctx context.Context, sink string, evs []*event.Event) error
}

// ReplayGrouped is Replay, except that for a sink g.Grouped reports, the
// failed entries of one transaction (same source, txn.id and sink) that
// match f are replayed together when the first of them comes in stream
// order: all claimed, delivered through g.Deliver in txn.index order,
// then all deleted, or the failure recorded on all. f.Limit counts the
// listed entries; the other entries of their transactions come with them.
func (s *Store) ReplayGrouped(ctx context.Context, f Filter, deliver func(ctx context.Context, sink string, e *event.Event) error, g GroupDelivery) (ReplayResult, error) {
	var res ReplayResult
	kinds := bson.A{KindFailed}
	switch f.Kind {
	case "":
		kinds = bson.A{KindFailed, KindGap}
	case KindFailed:
	case KindGap:
		kinds = bson.A{KindGap}
	case KindParked:
		return res, errors.New("dead letters: replay: parked entries are re-driven by the running gateway, not replayed")
	default:
		return res, fmt.Errorf("dead letters: replay: invalid kind %q", f.Kind)
	}
	f.Kind = ""
	q, err := f.query()
	if err != nil {
		return res, fmt.Errorf("dead letters: replay: %w", err)
	}
	q = append(q, bson.E{Key: "kind", Value: bson.D{{Key: "$in", Value: kinds}}})

	// Collect the ids first: deliveries can take long, longer than a
	// server-side cursor may stay idle.
	opts := options.Find().
		SetSort(streamOrder).
		SetProjection(bson.D{{Key: "_id", Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := s.coll.Find(ctx, q, opts)
	if err != nil {
		return res, fmt.Errorf("dead letters: replay: %w", err)
	}
	var ids []string
	for cur.Next(ctx) {
		if id, ok := cur.Current.Lookup("_id").StringValueOK(); ok {
			ids = append(ids, id)
		}
	}
	err = cur.Err()
	_ = cur.Close(ctx)
	if err != nil {
		return res, fmt.Errorf("dead letters: replay: %w", err)
	}

	failedKeys := map[string]bool{}
	holdBack := func(e Entry) { failedKeys[heldKey(e)] = true }
	claim := newClaimToken()
	taken := map[string]bool{} // replayed with their transaction already
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
		if taken[id] {
			continue
		}
		head, ok, err := s.head(ctx, id)
		if err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
		if !ok || (head.Kind != KindFailed && head.Kind != KindGap) {
			continue // deleted or converted since it was listed
		}
		if head.Kind == KindGap {
			res.Skipped++
			continue
		}
		if head.Txn != nil && g.Grouped != nil && g.Deliver != nil && g.Grouped(head.Sink) {
			members, err := s.txnMembers(ctx, q, head)
			if err != nil {
				return res, fmt.Errorf("dead letters: replay: %w", err)
			}
			var stop bool
			res, stop, err = s.replayTxn(ctx, members, claim, res, failedKeys, holdBack, g.Deliver)
			for _, m := range members {
				taken[m.ID] = true
			}
			if stop {
				return res, err
			}
			continue
		}
		if failedKeys[heldKey(head)] {
			res.Skipped++
			res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", id, ErrHeldBack))
			continue
		}
		// An entry is read whole only once the byte budget of ctx
		// (memory.WithBudget; none: not counted) admits the largest
		// entry; the charge is then what was read, with what is derived
		// from it, until it is delivered.
		mem, err := memory.FromContext(ctx).Acquire(ctx, MaxEntryBytes, "dead-letter replay")
		if err != nil {
			return res, fmt.Errorf("dead letters: replay: %w", err)
		}
		var stop bool
		res, stop, err = s.replayOne(ctx, id, head, claim, mem, res, holdBack, deliver)
		mem.Release()
		if stop {
			return res, err
		}
	}
	return res, nil
}

// replayOne claims, delivers and deletes (or records the failure of) the
// entry id; stop reports that Replay must return res and err.
func (s *Store) replayOne(ctx context.Context, id string, head Entry, claim string, mem *memory.Charge, res ReplayResult,
	holdBack func(Entry), deliver func(ctx context.Context, sink string, e *event.Event) error) (_ ReplayResult, stop bool, _ error) {
	e, claimed, err := s.claim(ctx, id, claim)
	if err != nil {
		return res, true, fmt.Errorf("dead letters: replay: %w", err)
	}
	mem.Resize(int64(len(e.Change) + len(e.Envelope) + len(e.DocumentKey)))
	if !claimed {
		if _, still, err := s.head(ctx, id); err != nil {
			return res, true, fmt.Errorf("dead letters: replay: %w", err)
		} else if !still {
			return res, false, nil // delivered and deleted by another replay meanwhile
		}
		// Another replay is delivering it: this one must neither
		// deliver it again nor overtake it with a later change of
		// the same document.
		res.Skipped++
		res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", id, ErrClaimed))
		holdBack(head)
		return res, false, nil
	}
	ev, err := e.Event()
	if err != nil {
		res.Errors = append(res.Errors, err)
		if errors.Is(err, ErrNotReplayable) {
			res.Skipped++
		} else {
			res.Failed++
		}
		// Held back: a later change of this document must not be
		// delivered while this one is still owed to the sink.
		holdBack(e)
		s.release(ctx, id, claim)
		return res, false, nil
	}
	ev.Mem = mem
	derr := s.deliverClaimed(ctx, []string{id}, claim, func(ctx context.Context) error { return deliver(ctx, e.Sink, ev) })
	if derr == nil {
		if _, err := s.deleteClaimed(ctx, id, claim); err != nil {
			// Delivered but still stored: a later replay delivers it
			// again (at least once), once the claim expired.
			return res, true, fmt.Errorf("dead letters: replay: %w", err)
		}
		res.Replayed++
		return res, false, nil
	}
	if err := ctx.Err(); err != nil {
		s.release(ctx, id, claim)
		return res, true, fmt.Errorf("dead letters: replay: %w", err)
	}
	if errors.Is(derr, ErrNotRouted) {
		// Not attempted: the entry stays as it was, and so do the
		// later entries of its document for this sink.
		res.Skipped++
		if res.NotRouted == nil {
			res.NotRouted = map[string]int{}
		}
		res.NotRouted[e.Sink]++
		res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", id, derr))
		holdBack(e)
		s.release(ctx, id, claim)
		return res, false, nil
	}
	res.Failed++
	res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: sink %s: %w", id, e.Sink, derr))
	holdBack(e)
	if err := s.recordFailure(ctx, id, claim, derr); err != nil {
		return res, true, fmt.Errorf("dead letters: replay: %w", err)
	}
	return res, false, nil
}

// txnMembers returns the summaries of the failed entries matching q of
// head's transaction (same source, txn.id and sink), in txn.index order.
// The events of a transaction share its commit cluster time (source/txn.go),
// which keeps the query on the kind_sink_clusterTime_order_id index.
func (s *Store) txnMembers(ctx context.Context, q bson.D, head Entry) ([]Entry, error) {
	tq := bson.D{{Key: "$and", Value: bson.A{q, bson.D{
		{Key: "kind", Value: KindFailed},
		{Key: "sink", Value: head.Sink},
		{Key: "clusterTime", Value: head.ClusterTime},
		{Key: "source", Value: head.Source},
		{Key: "txn.id", Value: head.Txn.ID},
	}}}}
	opts := options.Find().
		SetSort(bson.D{{Key: "txn.index", Value: 1}, {Key: "clusterTime", Value: 1}, {Key: "order", Value: 1}, {Key: "_id", Value: 1}}).
		SetProjection(summaryProjection)
	cur, err := s.coll.Find(ctx, tq, opts)
	if err != nil {
		return nil, err
	}
	var rs []record
	if err := cur.All(ctx, &rs); err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(rs))
	for i := range rs {
		out = append(out, rs[i].entry())
	}
	return out, nil
}

// replayTxn claims, delivers as one group and deletes (or records the
// failure of) the failed entries of one transaction, members in txn.index
// order; stop reports that Replay must return res and err. An entry that
// cannot be claimed or rebuilt keeps the whole transaction back.
func (s *Store) replayTxn(ctx context.Context, members []Entry, claim string, res ReplayResult, failedKeys map[string]bool,
	holdBack func(Entry), deliver func(ctx context.Context, sink string, evs []*event.Event) error) (_ ReplayResult, stop bool, _ error) {
	// skipAll leaves every member where it is, held back with culprit (when
	// not empty, counted by the caller).
	skipAll := func(culprit string) {
		for _, m := range members {
			holdBack(m)
			if m.ID == culprit {
				continue
			}
			res.Skipped++
			res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", m.ID, ErrHeldBack))
		}
	}
	for _, m := range members {
		if failedKeys[heldKey(m)] {
			skipAll("")
			return res, false, nil
		}
	}
	var mems []*memory.Charge // the part being read
	defer func() {
		for _, mem := range mems {
			mem.Release()
		}
	}()
	var claimed []string
	releaseAll := func() {
		for _, id := range claimed {
			s.release(ctx, id, claim)
		}
	}
	// A transaction larger than may be held goes out in parts (issue 39):
	// entries are read while the budget admits them at once and the part
	// holds less than memory.TxnPartShare of it; then the part is
	// delivered (sinks.TxnPart, numbered on) and its memory returned
	// before the next entry waits for room. Every entry stays claimed
	// until the last part is delivered, then all are deleted; a failure
	// keeps them all, with the failure recorded, and a replay stopped
	// between parts sends the transaction again from part 1.
	budget := memory.FromContext(ctx)
	partMax := budget.Limit() / memory.TxnPartShare // 0: no budget, no limit
	var part *sinks.TxnPart
	next := 1
	var held int64
	var evs []*event.Event
	var sink string
	sendPart := func(final bool) error {
		pctx := ctx
		if !final || part != nil {
			part = &sinks.TxnPart{First: next, Final: final}
			pctx = sinks.WithTxnPart(ctx, part)
		}
		err := s.deliverClaimed(pctx, claimed, claim, func(ctx context.Context) error { return deliver(ctx, sink, evs) })
		if part != nil {
			next += part.Used
		}
		for _, mem := range mems {
			mem.Release()
		}
		mems, evs, held = mems[:0], nil, 0
		return err
	}
	var derr error
	for i := 0; i < len(members); {
		m := members[i]
		// The first entry of a part waits for the byte budget like a
		// single one; a later one only joins it if admitted at once
		// (waiting on bytes the part holds could never end).
		var mem *memory.Charge
		if len(evs) == 0 {
			var err error
			mem, err = budget.Acquire(ctx, MaxEntryBytes, "dead-letter replay")
			if err != nil {
				releaseAll()
				return res, true, fmt.Errorf("dead letters: replay: %w", err)
			}
		} else {
			ok := partMax <= 0 || held < partMax
			if ok {
				mem, ok = budget.TryAcquire(MaxEntryBytes)
			}
			if !ok {
				if derr = sendPart(false); derr != nil {
					break
				}
				continue // the same entry, waiting for room now
			}
		}
		i++
		mems = append(mems, mem)
		e, ok, err := s.claim(ctx, m.ID, claim)
		if err != nil {
			releaseAll()
			return res, true, fmt.Errorf("dead letters: replay: %w", err)
		}
		mem.Resize(int64(len(e.Change) + len(e.Envelope) + len(e.DocumentKey)))
		if !ok {
			if _, still, err := s.head(ctx, m.ID); err != nil {
				releaseAll()
				return res, true, fmt.Errorf("dead letters: replay: %w", err)
			} else if !still {
				continue // delivered and deleted by another replay meanwhile
			}
			releaseAll()
			res.Skipped++
			res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", m.ID, ErrClaimed))
			skipAll(m.ID)
			return res, false, nil
		}
		claimed = append(claimed, m.ID)
		ev, err := e.Event()
		if err != nil {
			releaseAll()
			res.Errors = append(res.Errors, err)
			if errors.Is(err, ErrNotReplayable) {
				res.Skipped++
			} else {
				res.Failed++
			}
			skipAll(m.ID)
			return res, false, nil
		}
		ev.Mem = mem
		held += mem.Bytes()
		evs = append(evs, ev)
		sink = e.Sink
	}
	if len(claimed) == 0 {
		return res, false, nil
	}
	if derr == nil {
		derr = sendPart(true)
	}
	if derr == nil {
		for _, id := range claimed {
			if _, err := s.deleteClaimed(ctx, id, claim); err != nil {
				// Delivered but still stored: a later replay delivers
				// it again (at least once), once the claim expired.
				return res, true, fmt.Errorf("dead letters: replay: %w", err)
			}
			res.Replayed++
		}
		return res, false, nil
	}
	if err := ctx.Err(); err != nil {
		releaseAll()
		return res, true, fmt.Errorf("dead letters: replay: %w", err)
	}
	for _, m := range members {
		holdBack(m)
	}
	if errors.Is(derr, ErrNotRouted) {
		releaseAll()
		if res.NotRouted == nil {
			res.NotRouted = map[string]int{}
		}
		for _, id := range claimed {
			res.Skipped++
			res.NotRouted[sink]++
			res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: %w", id, derr))
		}
		return res, false, nil
	}
	for _, id := range claimed {
		res.Failed++
		res.Errors = append(res.Errors, fmt.Errorf("dead letter %s: sink %s: %w", id, sink, derr))
		if err := s.recordFailure(ctx, id, claim, derr); err != nil {
			return res, true, fmt.Errorf("dead letters: replay: %w", err)
		}
	}
	return res, false, nil
}

// heldKey is the document and sink of an entry: replay holds back later
// entries of the same key after one that was not delivered.
func heldKey(e Entry) string {
	return e.Sink + "\x00" + e.Namespace + "\x00" + string(e.DocumentKey)
}

// ClaimTTL is how long a replay's claim on an entry lasts without renewal;
// the replay renews it every ClaimTTL/3 while the delivery runs. A claim
// left by a replay that died expires after at most ClaimTTL, and the entry
// can be replayed again; from the dead replay's machine at once (the claim
// carries its owner, see claimOwner).
const ClaimTTL = 15 * time.Second

// newClaimToken returns a random claim token, one per Replay call.
func newClaimToken() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// unclaimed matches an entry without a live claim; the expiry is judged by
// the server's clock, like the leases.
var unclaimed = bson.D{{Key: "$or", Value: bson.A{
	bson.D{{Key: "claimUntil", Value: bson.D{{Key: "$exists", Value: false}}}},
	bson.D{{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{"$claimUntil", "$$NOW"}}}}},
}}}

// claimUpdate sets the claim token, its owner (this process) and its expiry
// (server clock + ClaimTTL).
func claimUpdate(token string) bson.A {
	return bson.A{bson.D{{Key: "$set", Value: bson.D{
		{Key: "claim", Value: token},
		{Key: "claimBy", Value: bson.D{{Key: "$literal", Value: self()}}},
		{Key: "claimUntil", Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", ClaimTTL.Milliseconds()}}}},
	}}}}
}

// head returns the entry id without its change and envelope.
func (s *Store) head(ctx context.Context, id string) (Entry, bool, error) {
	var r record
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}, options.FindOne().SetProjection(summaryProjection)).Decode(&r)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("dead letter %s: get: %w", id, err)
	}
	return r.entry(), true, nil
}

// claim atomically marks the failed entry id as being replayed with token,
// unless another replay holds a live claim on it, and returns the entry;
// false when it is not (or no longer) a failed entry or is claimed. A claim
// whose owner is known to be dead (claimOwner.dead: a killed replay on
// this machine) is taken over, conditionally on its token, at once.
func (s *Store) claim(ctx context.Context, id, token string) (Entry, bool, error) {
	base := bson.D{{Key: "_id", Value: id}, {Key: "kind", Value: KindFailed}}
	e, ok, err := s.claimIf(ctx, id, append(base, unclaimed...), token)
	if ok || err != nil {
		return e, ok, err
	}
	var cur struct {
		Claim string      `bson:"claim"`
		By    *claimOwner `bson:"claimBy"`
	}
	err = s.coll.FindOne(ctx, base, options.FindOne().SetProjection(bson.D{{Key: "claim", Value: 1}, {Key: "claimBy", Value: 1}})).Decode(&cur)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("dead letter %s: claim: %w", id, err)
	}
	if cur.Claim == "" || cur.By == nil || !cur.By.dead(self()) {
		return Entry{}, false, nil
	}
	return s.claimIf(ctx, id, append(base, bson.E{Key: "claim", Value: cur.Claim}), token)
}

// claimIf claims the entry id matched by q with token.
func (s *Store) claimIf(ctx context.Context, id string, q bson.D, token string) (Entry, bool, error) {
	var r record
	err := s.coll.FindOneAndUpdate(ctx, q, claimUpdate(token), options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&r)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("dead letter %s: claim: %w", id, err)
	}
	return r.entry(), true, nil
}

// deliverClaimed runs deliver while renewing the claims on ids.
func (s *Store) deliverClaimed(ctx context.Context, ids []string, token string, deliver func(context.Context) error) error {
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(ClaimTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = s.coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "claim", Value: token}}, claimUpdate(token))
			}
		}
	}()
	err := deliver(ctx)
	close(stop)
	<-renewed
	return err
}

// deleteClaimed deletes id if this replay still holds its claim.
func (s *Store) deleteClaimed(ctx context.Context, id, token string) (bool, error) {
	res, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "claim", Value: token}})
	if err != nil {
		return false, fmt.Errorf("dead letter %s: delete: %w", id, err)
	}
	return res.DeletedCount > 0, nil
}

// release drops this replay's claim on id (best effort: an unreleased
// claim expires by itself).
func (s *Store) release(ctx context.Context, id, token string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = s.coll.UpdateOne(rctx, bson.D{{Key: "_id", Value: id}, {Key: "claim", Value: token}},
		bson.D{{Key: "$unset", Value: bson.D{{Key: "claim", Value: ""}, {Key: "claimBy", Value: ""}, {Key: "claimUntil", Value: ""}}}})
}

// recordFailure updates a failed entry after another failed delivery and
// releases this replay's claim on it.
func (s *Store) recordFailure(ctx context.Context, id, token string, derr error) error {
	n := 1
	var counted interface{ Attempts() int }
	if errors.As(derr, &counted) && counted.Attempts() > 0 {
		n = counted.Attempts()
	}
	_, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "claim", Value: token}}, bson.D{
		{Key: "$set", Value: bson.D{
			{Key: "lastError", Value: derr.Error()},
			{Key: "lastFailedAt", Value: time.Now().UTC()},
		}},
		{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int64(n)}}},
		{Key: "$unset", Value: bson.D{{Key: "claim", Value: ""}, {Key: "claimBy", Value: ""}, {Key: "claimUntil", Value: ""}}},
	})
	if err != nil {
		return fmt.Errorf("dead letter %s: record failure: %w", id, err)
	}
	return nil
}
