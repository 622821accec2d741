package source

import (
	"context"
	"time"

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
func (s *Source) handOn(ctx context.Context, tr *checkpoint.Tracker, ev *event.Event, pos checkpoint.Position) bool {
	// The source's reference to ev.Mem (the byte budget's charge) ends
	// here: the lanes hold their own once dispatched.
	defer ev.Mem.Release()
	var seq uint64
	if ev.Txn != nil && ev.Txn.Index > 0 {
		// A transaction's later events do not wait for room in the
		// tracker: a grouped sink acknowledges them only with the
		// earlier ones (router/txn.go).
		seq = tr.AddOver(pos.Token, pos.ClusterTime, pos.WallTime)
	} else {
		var err error
		if seq, err = tr.Add(ctx, pos.Token, pos.ClusterTime, pos.WallTime); err != nil {
			return false
		}
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
		if !s.handOn(ctx, tr, h, own(h)) {
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
		} else if !s.handOn(ctx, tr, ev, own(ev)) {
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
		seq, err := tr.Add(ctx, tx.pre.Token, tx.pre.ClusterTime, tx.pre.WallTime)
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
		if !s.handOn(ctx, tr, h, tx.pre) {
			tx.next--
			return nil, false
		}
		reopen = h.Token
	}
	ev.Txn = &event.Txn{ID: id, Index: tx.next, Unit: s.spec.Unit}
	tx.next++
	tx.held = ev
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
