package source_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// txn inserts ids into the world's collection in one multi-document
// transaction.
func (w *world) txn(ids ...int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := w.client.StartSession()
	if err != nil {
		w.t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	if _, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		for _, id := range ids {
			if _, err := w.coll.InsertOne(sctx, bson.D{{Key: "_id", Value: id}}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}); err != nil {
		w.t.Fatal(err)
	}
}

// txnOf renders an event's transaction metadata as "-" (none) or
// "index" and "L" when last.
func txnOf(ev *event.Event) string {
	if ev.Txn == nil {
		return "-"
	}
	s := fmt.Sprint(ev.Txn.Index)
	if ev.Txn.Last {
		s += "L"
	}
	return s
}

// checkTxns checks the transaction metadata of evs against want (txnOf
// per event) and that runs of events of one transaction share one id
// (TxnID of the change) that differs between transactions.
func checkTxns(t *testing.T, evs []*event.Event, want ...string) {
	t.Helper()
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d", len(evs), len(want))
	}
	for i, ev := range evs {
		if got := txnOf(ev); got != want[i] {
			var all []string
			for _, e := range evs {
				all = append(all, describe(e)+"/"+txnOf(e))
			}
			t.Fatalf("event %d txn %s, want %s (all: %v)", i, got, want[i], all)
		}
		if ev.Txn == nil {
			continue
		}
		id, ok := event.TxnID(ev.Raw)
		if !ok || ev.Txn.ID != id {
			t.Fatalf("event %d txn id %q, want %q", i, ev.Txn.ID, id)
		}
		if i > 0 && evs[i-1].Txn != nil {
			same := evs[i-1].Txn.ID == ev.Txn.ID
			if same != (ev.Txn.Index > 0) {
				t.Fatalf("event %d: id %s after %s with index %d", i, ev.Txn.ID, evs[i-1].Txn.ID, ev.Txn.Index)
			}
		}
	}
}

// polled waits until the source answered n more getMores than now.
func (r *running) polled(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		before := r.src.Status().LastPoll
		waitFor(t, 10*time.Second, "a getMore", func() bool { return r.src.Status().LastPoll.After(before) })
	}
}

// Checkpoint saves are writes, whose oplog entries move the post-batch
// resume token past a transaction: the boundary tests hold the acks, so
// that nothing is saved while they watch an event being held.

// TestTxnLastFromNextEvent: the last event of a transaction is held until
// the next change tells it is the last: another transaction's first event
// or a single write; the events before it go on at once.
func TestTxnLastFromNextEvent(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rec := &recorder{hold: true}
	r := w.run(w.spec(), rec)
	r.waitOpen(t)
	w.insert(1)
	w.txn(10, 11, 12)
	rec.waitEvents(t, inserts(1, 10, 11)...)
	r.polled(t, 3)
	rec.waitEvents(t, inserts(1, 10, 11)...) // 12 is held: its end is unknown
	w.txn(20, 21)                            // its first event ends the first transaction
	rec.waitEvents(t, inserts(1, 10, 11, 12, 20)...)
	w.insert(2) // ends the second
	rec.waitEvents(t, inserts(1, 10, 11, 12, 20, 21, 2)...)
	checkTxns(t, rec.all(), "-", "0", "1", "2L", "0", "1L", "-")
	rec.release()
	evs := rec.all()
	waitFor(t, 5*time.Second, "the checkpoint at insert 2", func() bool {
		cp, _ := w.checkpoint()
		return tokenData(cp.Token) == tokenData(evs[6].Token)
	})
	if n := value(w.m.Transactions.WithLabelValues("items")); n != 2 {
		t.Fatalf("changegate_transactions_total = %v, want 2", n)
	}
}

// TestTxnLastFromPostBatchToken: with no change after it, a transaction's
// last event goes on when a post-batch resume token past the transaction's
// cluster time arrives (here after a write to another collection, which
// the stream does not return).
func TestTxnLastFromPostBatchToken(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rec := &recorder{hold: true}
	r := w.run(w.spec(), rec)
	r.waitOpen(t)
	w.txn(1, 2)
	rec.waitEvents(t, inserts(1)...)
	r.polled(t, 3)
	rec.waitEvents(t, inserts(1)...)
	other := w.client.Database(w.db).Collection("other")
	if _, err := other.InsertOne(context.Background(), bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	rec.waitEvents(t, inserts(1, 2)...)
	checkTxns(t, rec.all(), "0", "1L")
}

// TestTxnCheckpointNotInside: the events of a transaction before its last
// are acknowledged at the position before the transaction, so the
// checkpoint never lands between two events of a transaction.
func TestTxnCheckpointNotInside(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rec := &recorder{holdIf: func(ev *event.Event) bool { return ev.Txn != nil && ev.Txn.Last }}
	r := w.run(w.spec(), rec)
	r.waitOpen(t)
	w.insert(1)
	w.txn(10, 11, 12)
	// The acks of 1, 10 and 11 are saved; that write's oplog entry ends
	// the transaction (post-batch token), whose last event stays unacked.
	rec.waitEvents(t, inserts(1, 10, 11, 12)...)
	evs := rec.all()
	checkTxns(t, evs, "-", "0", "1", "2L")
	waitFor(t, 5*time.Second, "the checkpoint at insert 1", func() bool {
		cp, _ := w.checkpoint()
		return tokenData(cp.Token) == tokenData(evs[0].Token)
	})
	r.polled(t, 3)
	if cp, _ := w.checkpoint(); tokenData(cp.Token) != tokenData(evs[0].Token) {
		t.Fatalf("checkpoint %s is inside the transaction (insert 1: %s, 11: %s)", tokenData(cp.Token), tokenData(evs[0].Token), tokenData(evs[2].Token))
	}
	rec.release()
	waitFor(t, 5*time.Second, "the checkpoint at the transaction's end", func() bool {
		cp, _ := w.checkpoint()
		return tokenData(cp.Token) >= tokenData(evs[3].Token)
	})
}

// TestTxnShutdownRestart: at shutdown the held last event is not handed
// on and the checkpoint stays before its transaction; the next start reads
// the whole transaction again and delivers it with the same ids, the same
// indexes and its last.
func TestTxnShutdownRestart(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rec := &recorder{hold: true}
	r := w.run(w.spec(), rec)
	r.waitOpen(t)
	w.insert(1)
	w.txn(10, 11, 12)
	rec.waitEvents(t, inserts(1, 10, 11)...)
	r.polled(t, 2)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rec.waitEvents(t, inserts(1, 10, 11)...) // 12 was not handed on
	first := rec.all()
	rec2 := &recorder{}
	w.run(w.spec(), rec2).waitOpen(t)
	w.insert(2)
	rec2.waitEvents(t, inserts(1, 10, 11, 12, 2)...)
	again := rec2.all()
	checkTxns(t, again, "-", "0", "1", "2L", "-")
	for i := 1; i < 3; i++ {
		if again[i].ID != first[i].ID || again[i].Txn.ID != first[i].Txn.ID || again[i].Txn.Index != first[i].Txn.Index {
			t.Fatalf("re-delivered event %d: %s %+v, first %s %+v", i, again[i].ID, again[i].Txn, first[i].ID, first[i].Txn)
		}
	}
}
