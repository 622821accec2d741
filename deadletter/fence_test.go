package deadletter_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/deadletter"
)

// Writes of a unit's entries carry the writer's epoch and are refused by the
// store once a newer owner fenced the unit, including the re-creation of an
// entry the newer owner already re-drove and deleted.
func TestFencedWrites(t *testing.T) {
	s, ctx := newStore(t)
	const unit = "orders#1/4"
	mk := func(doc int, epoch int64) deadletter.Entry {
		e := entry(t, ev(t, "orders", "orders", doc, uint32(doc)), "hook", deadletter.KindParked)
		e.Unit, e.Epoch = unit, epoch
		return e
	}
	// The first owner (epoch 1, fenced at acquisition) parks two entries.
	if err := s.Fence(ctx, unit, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMany(ctx, []deadletter.Entry{mk(1, 1), mk(2, 1)}); err != nil {
		t.Fatalf("put under the current epoch: %v", err)
	}
	got, found, err := s.Get(ctx, mk(1, 1).ID)
	if err != nil || !found || got.Epoch != 1 {
		t.Fatalf("get: %+v %v %v; want epoch 1 stored", got.Epoch, found, err)
	}
	// A newer owner takes the unit, re-drives and deletes entry 1.
	if err := s.Fence(ctx, unit, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, mk(1, 2).ID); err != nil {
		t.Fatal(err)
	}
	// The old owner's delayed writes arrive: refused, nothing re-created
	// or changed.
	if err := s.PutMany(ctx, []deadletter.Entry{mk(1, 1), mk(3, 1)}); !errors.Is(err, deadletter.ErrFenced) {
		t.Fatalf("PutMany of an older epoch: %v, want ErrFenced", err)
	}
	if err := s.Put(ctx, mk(1, 1)); !errors.Is(err, deadletter.ErrFenced) {
		t.Fatalf("Put of an older epoch: %v, want ErrFenced", err)
	}
	failed := mk(4, 1)
	failed.Kind = deadletter.KindFailed
	if err := s.Put(ctx, failed); !errors.Is(err, deadletter.ErrFenced) {
		t.Fatalf("dead letter of an older epoch: %v, want ErrFenced", err)
	}
	for _, doc := range []int{1, 3, 4} {
		if _, found, _ := s.Get(ctx, mk(doc, 1).ID); found {
			t.Fatalf("entry of doc %d written by a fenced epoch", doc)
		}
	}
	// The current owner writes; an older fence is refused.
	if err := s.PutMany(ctx, []deadletter.Entry{mk(3, 2)}); err != nil {
		t.Fatalf("put under the current epoch: %v", err)
	}
	if err := s.Fence(ctx, unit, 1); !errors.Is(err, deadletter.ErrFenced) {
		t.Fatalf("fence with an older epoch: %v, want ErrFenced", err)
	}
	// Other units and unfenced writes (epoch 0, single process) are not
	// affected.
	other := mk(5, 1)
	other.Unit = "orders#2/4"
	if err := s.Put(ctx, other); err != nil {
		t.Fatalf("other unit: %v", err)
	}
	if err := s.Put(ctx, mk(6, 0)); err != nil {
		t.Fatalf("unfenced: %v", err)
	}
}

// Upgrade: entries stored by the previous release (no epoch field, no fences
// collection) are read, listed and re-written by a fenced writer.
func TestFencedWritesReadPreviousFormat(t *testing.T) {
	db := testDB(t)
	s := deadletter.NewStore(db, "deadletters")
	ctx := testCtx(t)
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	e := entry(t, ev(t, "orders", "orders", 7, 7), "hook", deadletter.KindParked)
	// The stored form of the previous release, field by field.
	old := bson.D{
		{Key: "_id", Value: e.ID}, {Key: "kind", Value: "parked"}, {Key: "eventId", Value: e.EventID},
		{Key: "source", Value: "orders"}, {Key: "sink", Value: "hook"}, {Key: "unit", Value: "orders"},
		{Key: "operation", Value: "update"}, {Key: "namespace", Value: "shop.orders"},
		{Key: "documentKey", Value: e.DocumentKey}, {Key: "change", Value: e.Change},
		{Key: "clusterTime", Value: e.ClusterTime}, {Key: "attempts", Value: int64(3)},
		{Key: "reason", Value: "parked"}, {Key: "createdAt", Value: base}, {Key: "order", Value: int64(0)},
		{Key: "ver", Value: int64(42)},
	}
	if _, err := db.Collection("deadletters").InsertOne(ctx, old); err != nil {
		t.Fatal(err)
	}
	got, found, err := s.Get(ctx, e.ID)
	if err != nil || !found || got.Epoch != 0 || got.Version != 42 || got.Kind != deadletter.KindParked {
		t.Fatalf("previous format read as %+v (found %v, err %v)", got, found, err)
	}
	n, err := s.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: "hook", Units: []string{"orders"}})
	if err != nil || n != 1 {
		t.Fatalf("count %d %v", n, err)
	}
	e.Unit, e.Epoch = "orders", 3
	if err := s.Put(ctx, e); err != nil {
		t.Fatalf("fenced re-write of a previous-format entry: %v", err)
	}
	got, _, _ = s.Get(ctx, e.ID)
	if got.Epoch != 3 || got.Attempts != 3 {
		t.Fatalf("after re-write: epoch %d attempts %d; want 3 and 3", got.Epoch, got.Attempts)
	}
}

// Fenced writes of one unit from many goroutines of one process all land:
// the store runs them one at a time per unit (each writes the unit's guard
// document, so at once they would conflict and retry each other), and a
// write of several units takes their locks in order, without deadlock.
func TestFencedWritesConcurrent(t *testing.T) {
	s, ctx := newStore(t)
	units := []string{"orders#0/2", "orders#1/2"}
	for _, u := range units {
		if err := s.Fence(ctx, u, 1); err != nil {
			t.Fatal(err)
		}
	}
	const workers, each = 8, 4
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				doc := w*each + i + 1
				a := entry(t, ev(t, "orders", "orders", doc, uint32(doc)), "hook", deadletter.KindParked)
				a.Unit, a.Epoch = units[w%2], 1
				b := entry(t, ev(t, "orders", "orders", 1000+doc, uint32(doc)), "hook", deadletter.KindParked)
				b.Unit, b.Epoch = units[(w+1)%2], 1 // two units, in either order
				errs <- s.PutMany(ctx, []deadletter.Entry{a, b})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("fenced write: %v", err)
		}
	}
	n, err := s.Count(ctx, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2*workers*each {
		t.Fatalf("%d entries stored, want %d", n, 2*workers*each)
	}
}

// A fenced write meeting a transaction that a killed replica left open on
// the unit's guard document (MongoDB keeps it until
// transactionLifetimeLimitSeconds, 60 s by default) fails within one
// bounded attempt, instead of the driver retrying its WriteConflict for
// 120 s, and succeeds once the transaction is gone.
func TestFencedWriteAbandonedTransaction(t *testing.T) {
	ctx := testCtx(t)
	db := testDB(t)
	s := deadletter.NewStore(db, "deadletters")
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	const unit = "orders#2/4"
	if err := s.Fence(ctx, unit, 1); err != nil {
		t.Fatal(err)
	}
	old := deadletter.FencedWriteAttempt
	deadletter.FencedWriteAttempt = 300 * time.Millisecond
	t.Cleanup(func() { deadletter.FencedWriteAttempt = old })

	// The killed replica's write: its transaction wrote the guard and
	// never committed.
	sess, err := db.Client().StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	if err := sess.StartTransaction(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Collection("deadletters_fences").UpdateOne(mongo.NewSessionContext(ctx, sess),
		bson.D{{Key: "_id", Value: unit}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "writes", Value: int64(1)}}}}); err != nil {
		t.Fatal(err)
	}

	e := entry(t, ev(t, "orders", "orders", 7, 7), "hook", deadletter.KindParked)
	e.Unit, e.Epoch = unit, 1
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Put(wctx, e)
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Fatalf("Put against an abandoned transaction: %v after %v; want an error within one bounded attempt", err, took)
	}
	if errors.Is(err, deadletter.ErrFenced) {
		t.Fatalf("Put against an abandoned transaction: %v; not a fence", err)
	}
	if _, found, _ := s.Get(ctx, e.ID); found {
		t.Fatal("entry written despite the failed attempt")
	}
	// MongoDB aborts the transaction at its lifetime limit.
	if err := sess.AbortTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, e); err != nil {
		t.Fatalf("Put once the transaction is gone: %v", err)
	}
}
