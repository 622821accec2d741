package source

import (
	"context"
	"time"

	"github.com/changegate/changegate/memory"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/event"
)

// Transactions (issue 27).
//
// The events of one multi-document transaction (same lsid + txnNumber:
// event.TxnID) follow each other in a replica set's change stream, all at
// the transaction's commit cluster time. Each gets Event.Txn: the id, its
// index among the transaction's events this source reads (0, 1, ...), and
// Last on the final one.
//
// Boundary. Whether an event is the last of its transaction is known only
// from what follows it, so the source holds the newest event of an open
// transaction back (not yet in the tracker, not dispatched) until
//   - the next change is read: another transaction's or a single write's
//     change ends the transaction (the held event is last); one of the same
//     transaction does not (the held event goes on, not last, and the new
//     one is held);
//   - a post-batch resume token with a later cluster time arrives: the
//     stream has returned everything up to it, and every event of the
//     transaction has the transaction's cluster time, so none is left;
//   - the cursor is closed by the server (invalidate).
//
// A token with the same cluster time proves nothing (the test server's
// high-water marks can fall between two events of one transaction), so
// the added latency of a transaction's last event is the time until the
// next change of the source or the next post-batch token past the commit:
// on a busy database the next change, on a quiet replica set the next
// oplog entry (MongoDB's periodic no-op writer adds one every 10 s by
// default) plus up to max_await. Events before the last are not delayed
// beyond their successor's arrival.
//
// Index across restarts. While a transaction is open, every event of it
// handed on enters the checkpoint tracker with the position before the
// transaction (the last resume point before its first event), and no
// post-batch token is taken as a resume point; the last event enters with
// its own token. So a checkpoint is never inside a transaction: a restart
// (or kill -9) resumes before the transaction or after its end, reads every
// event of it again and numbers them again from 0, with the same ids, the
// same indexes and the same last. The resume token's own txnOpIndex is not
// used: MongoDB counts every operation of the transaction in it (also those
// of namespaces and filters the stream leaves out, and per shard), so it is
// not the position among the events delivered.
//
// In-process reopens (errors, a reloaded filter) continue after the last
// event handed on with the transaction's state kept; the held event is
// dropped and read again. At shutdown the held event is dropped: it was
// never acknowledged, the checkpoint is before its transaction, and the
// next start delivers the whole transaction again, with its last marked.
//
// Memory and max_in_flight_events (issue 39). A transaction's events are
// admitted by the byte budget and the tracker like any others: the source
// waits for room. A sink without grouping delivers and acknowledges them as
// they come. A grouped sink (router/txn.go) keeps what it collected of the
// open transaction until its last event, so a wait for room those events
// hold would never end: when what the source read of an open transaction
// since its last part reaches memory.TxnPartShare of the byte budget or of
// max_in_flight_events, or when it has waited txnPartAfter for room while
// one is open (other units' transactions or slow sinks hold the rest), it
// tells the dispatcher (TxnFlusher) to send what the grouped sinks collected
// on as a part, in order, and waits for room. Each grouped
// sink keeps its newest event of the transaction (so its last part is never
// empty, and says it is the last), and the source the event it holds back:
// the waits do not count those (memory.Budget.AcquireBeside,
// checkpoint.Tracker.AddBeside), so the bytes held stay within the budget
// plus those few events. The checkpoint still never falls inside a
// transaction: a crash between parts reads it again from its first event.
//
// Limits: on a sharded cluster a transaction over several shards reaches
// the stream as one run per shard, possibly with other changes between
// them, so it can show as several runs (each 0-based, each with a last).
// With partitions each unit numbers and ends the events of its own share.

// txnState is the transaction a source is reading (kept across the
// stream's reopens within one Run).
type txnState struct {
	id   string         // open transaction's id; "" when none is open
	ct   bson.Timestamp // its cluster time
	next int            // index of its next event
	pre  checkpoint.Position
	held *event.Event // newest event of the open transaction, not handed on
	// since and sinceN are the bytes and events of the open transaction
	// read since its last part was sent on (FlushTxn); kept and keptN what
	// the grouped sinks kept of it then (see "Memory" above).
	since         int64
	sinceN, keptN int
	kept          int64
	// pos is the last resume position given to the tracker (an event's
	// own token or a post-batch token): pre for the next transaction.
	pos checkpoint.Position
}

func (t *txnState) open() bool { return t.id != "" }

// dropHeld forgets the held event (it is read again after a reopen).
func (t *txnState) dropHeld() {
	if t.held != nil {
		t.held.Mem.Release() // its bytes: it is read again
		t.held = nil
		t.next--
	}
}

// reset forgets the open transaction (its events are not read again:
// history lost, or a new start point).
func (t *txnState) reset() {
	if t.held != nil {
		t.held.Mem.Release()
	}
	t.id, t.next, t.held = "", 0, nil
	t.since, t.sinceN, t.kept, t.keptN = 0, 0, 0, 0
}

// txnPartAfter is how long the source waits for room while a transaction
// is open before its grouped sinks send what they collected of it on as a
// part ("Memory" above).
const txnPartAfter = time.Second

// TxnFlusher is a Dispatcher that keeps the events of open transactions
// for grouped sinks (the router's Engine, router/txn.go). FlushTxn sends
// what it keeps of unit's open transaction id on as a part of it, in
// order after the earlier parts, and returns what it still keeps of it:
// at most one event per grouped sink (its last part is then never empty),
// their bytes and their number.
type TxnFlusher interface {
	FlushTxn(unit, id string) (keptBytes int64, kept int)
}

// ownBytes is what the source holds of the open transaction that only
// reading more can return: its held event and what the grouped sinks kept.
func (t *txnState) ownBytes() int64 {
	n := t.kept
	if t.held != nil {
		n += t.held.Mem.Bytes()
	}
	return n
}

// admitTxn runs wait, an admission that may have to wait for room (the
// byte budget, the tracker), with the transaction rules ("Memory" above):
// while a transaction is open and wait cannot admit at once, the grouped
// sinks send what they collected of it on as a part, at once when that is
// large, else after txnPartAfter; then it waits. wait reads tx's own
// bytes and events when it is called.
func (s *Source) admitTxn(ctx context.Context, tx *txnState, wait func(context.Context) error) error {
	f, _ := s.out.(TxnFlusher)
	if !tx.open() || f == nil {
		return wait(ctx)
	}
	wctx, cancel := context.WithTimeout(ctx, txnPartAfter)
	err := wait(wctx)
	cancel()
	if err == nil || ctx.Err() != nil {
		return err
	}
	s.flushTxn(f, tx)
	return wait(ctx)
}

// maybeFlushTxn sends a part of the open transaction on when what was read
// of it since the last one reached memory.TxnPartShare of the byte budget
// or of max_in_flight_events.
func (s *Source) maybeFlushTxn(tx *txnState) {
	f, _ := s.out.(TxnFlusher)
	if f == nil || !tx.open() {
		return
	}
	if lim := s.spec.Budget.Limit(); (lim > 0 && tx.since >= lim/memory.TxnPartShare) || tx.sinceN >= max(s.spec.MaxInFlight/memory.TxnPartShare, 1) {
		s.flushTxn(f, tx)
	}
}

// flushTxn sends what the grouped sinks collected of the open transaction
// on as a part.
func (s *Source) flushTxn(f TxnFlusher, tx *txnState) {
	tx.kept, tx.keptN = f.FlushTxn(s.spec.Unit, tx.id)
	tx.since, tx.sinceN = 0, 0
}

// admit charges n bytes of a change read to the byte budget, waiting while
// it is spent (admitTxn while a transaction is open).
func (s *Source) admit(ctx context.Context, tx *txnState, n int64) (*memory.Charge, error) {
	var c *memory.Charge
	err := s.admitTxn(ctx, tx, func(ctx context.Context) error {
		var err error
		c, err = s.spec.Budget.AcquireBeside(ctx, n, s.spec.Unit, tx.ownBytes())
		return err
	})
	return c, err
}

// track adds a position to the tracker, waiting for room (admitTxn while a
// transaction is open).
func (s *Source) track(ctx context.Context, tr *checkpoint.Tracker, tx *txnState, pos checkpoint.Position) (uint64, error) {
	var seq uint64
	err := s.admitTxn(ctx, tx, func(ctx context.Context) error {
		var err error
		seq, err = tr.AddBeside(ctx, pos.Token, pos.ClusterTime, pos.WallTime, tx.keptN)
		return err
	})
	return seq, err
}

// resumePoint records a post-batch (or initial) token as a resume point.
func (s *Source) resumePoint(tr *checkpoint.Tracker, tx *txnState, rt bson.Raw) {
	tr.SetResumePoint(rt)
	p := checkpoint.Position{Token: rt}
	if ct, ok := event.TokenClusterTime(rt); ok {
		p.ClusterTime, p.WallTime = ct, timeOf(ct)
	}
	tx.pos = p
}

// handOn adds ev to the tracker at pos and dispatches it; false when the
// source is stopping (ev was not added).
func (s *Source) handOn(ctx context.Context, tr *checkpoint.Tracker, tx *txnState, ev *event.Event, pos checkpoint.Position) bool {
	// The source's reference to ev.Mem (the byte budget's charge) ends
	// here: the lanes hold their own once dispatched.
	defer ev.Mem.Release()
	seq, err := s.track(ctx, tr, tx, pos)
	if err != nil {
		return false
	}
	ev.Seq = seq
	s.mRead.Inc()
	s.mInFlight.Inc()
	s.mu.Lock()
	s.status.LastEvent = ev.WallTime
	s.mu.Unlock()
	s.dispatch(ev, func() {
		tr.Ack(seq)
		s.mInFlight.Dec()
	})
	return true
}

// own is the tracker position of ev itself.
func own(ev *event.Event) checkpoint.Position {
	return checkpoint.Position{Token: ev.Token, ClusterTime: ev.ClusterTime, WallTime: ev.WallTime}
}

// endTxn ends the open transaction: its held event goes on as the last.
// false when the source is stopping.
func (s *Source) endTxn(ctx context.Context, tr *checkpoint.Tracker, tx *txnState) bool {
	if !tx.open() {
		return true
	}
	if h := tx.held; h != nil {
		h.Txn.Last = true
		tx.held = nil // handed on (handOn releases its bytes either way)
		if !s.handOn(ctx, tr, tx, h, own(h)) {
			return false
		}
		tx.pos = own(h)
		s.mTxns.Inc()
		s.mTxnEvents.Observe(float64(tx.next))
	}
	tx.reset()
	return true
}

// txnEvent handles a change read from the stream (after reassembly) with
// the transaction rules above. It returns the token to reopen from when
// it changes (nil: unchanged) and false when the source is stopping.
func (s *Source) txnEvent(ctx context.Context, tr *checkpoint.Tracker, tx *txnState, ev *event.Event) (bson.Raw, bool) {
	id, inTxn := ev.TxnID()
	if tx.open() && (!inTxn || id != tx.id) {
		if !s.endTxn(ctx, tr, tx) {
			return nil, false
		}
	}
	mine := s.mine(ev)
	if !mine {
		ev.Mem.Release() // another partition's: never dispatched
	}
	if !inTxn {
		if !mine {
			seq, err := tr.Add(ctx, ev.Token, ev.ClusterTime, ev.WallTime)
			if err != nil {
				return nil, false
			}
			tr.Ack(seq) // another partition's: acknowledged at once, never dispatched
		} else if !s.handOn(ctx, tr, tx, ev, own(ev)) {
			return nil, false
		}
		tx.pos = own(ev)
		return ev.Token, true
	}
	if !tx.open() {
		tx.id, tx.ct, tx.next, tx.pre = id, ev.ClusterTime, 0, tx.pos
		if tx.pre.Token == nil {
			// No resume point before it (cannot happen after the first
			// open persisted one): the event's own position is the best.
			tx.pre = own(ev)
		}
	}
	if !mine {
		seq, err := s.track(ctx, tr, tx, tx.pre)
		if err != nil {
			return nil, false
		}
		tr.Ack(seq)
		if tx.held != nil {
			return nil, true // a reopen must not pass the held event
		}
		return ev.Token, true
	}
	var reopen bson.Raw
	if h := tx.held; h != nil {
		tx.held = nil
		if !s.handOn(ctx, tr, tx, h, tx.pre) {
			tx.next--
			return nil, false
		}
		reopen = h.Token
		s.maybeFlushTxn(tx)
	}
	ev.Txn = &event.Txn{ID: id, Index: tx.next, Unit: s.spec.Unit}
	tx.next++
	tx.held = ev
	tx.since += ev.Mem.Bytes()
	tx.sinceN++
	return reopen, true
}

// txnPostBatch handles a post-batch resume token: it ends the open
// transaction when the token is past its cluster time, and records the
// token as a resume point unless a transaction is still open. It returns
// whether the token was taken as a resume point, and false when the source
// is stopping.
func (s *Source) txnPostBatch(ctx context.Context, tr *checkpoint.Tracker, tx *txnState, rt bson.Raw) (taken, ok bool) {
	if tx.open() {
		ct, known := event.TokenClusterTime(rt)
		if !known || !ct.After(tx.ct) {
			return false, true
		}
		if !s.endTxn(ctx, tr, tx) {
			return false, false
		}
	}
	s.resumePoint(tr, tx, rt)
	return true, true
}

func timeOf(ct bson.Timestamp) time.Time { return time.Unix(int64(ct.T), 0).UTC() }
