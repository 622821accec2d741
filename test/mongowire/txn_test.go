package mongowire_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// txnEvent is a change event with its transaction fields.
type txnEvent struct {
	ID            struct{ Data string } `bson:"_id"`
	OperationType string                `bson:"operationType"`
	ClusterTime   bson.Timestamp        `bson:"clusterTime"`
	TxnNumber     *int64                `bson:"txnNumber"`
	Lsid          *struct {
		ID  bson.Binary `bson:"id"`
		UID bson.Binary `bson:"uid"`
	} `bson:"lsid"`
	NS struct {
		DB   string `bson:"db"`
		Coll string `bson:"coll"`
	} `bson:"ns"`
	DocumentKey bson.M `bson:"documentKey"`
}

func nextTxnEvent(t *testing.T, ctx context.Context, cs *mongo.ChangeStream) txnEvent {
	t.Helper()
	if !cs.Next(ctx) {
		t.Fatalf("change stream ended: %v", cs.Err())
	}
	var ev txnEvent
	if err := bson.Unmarshal(cs.Current, &ev); err != nil {
		t.Fatal(err)
	}
	ev.ID.Data = cs.Current.Lookup("_id", "_data").StringValue()
	return ev
}

// noEvent checks that the stream has nothing to deliver right now.
func noEvent(t *testing.T, ctx context.Context, cs *mongo.ChangeStream) {
	t.Helper()
	if cs.TryNext(ctx) {
		t.Fatalf("unexpected event %v", cs.Current)
	}
	if cs.Err() != nil {
		t.Fatal(cs.Err())
	}
}

func sessionUUID(t *testing.T, sess *mongo.Session) []byte {
	t.Helper()
	id := sess.ID().Lookup("id")
	_, data, ok := id.BinaryOK()
	if !ok {
		t.Fatalf("session id %v", id)
	}
	return data
}

// TestTransactionCommitAppliesAtOnce: writes in a transaction across two
// collections of two databases are invisible to other readers and change
// streams until the commit, then appear together, in order, at one cluster
// time, with lsid and txnNumber, and resume tokens ordered within the
// transaction.
func TestTransactionCommitAppliesAtOnce(t *testing.T) {
	srv, client, ctx := setup(t)
	other := connect(t, srv.URI())
	orders := client.Database("shop").Collection("orders")
	stock := client.Database("inventory").Collection("stock")
	cs, err := client.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	mustInsert(t, ctx, stock, doc("_id", "sku1", "n", 5))

	sess, err := client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	if err := sess.StartTransaction(); err != nil {
		t.Fatal(err)
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	if _, err := orders.InsertOne(sctx, doc("_id", "o1", "sku", "sku1")); err != nil {
		t.Fatal(err)
	}
	if _, err := stock.UpdateOne(sctx, doc("_id", "sku1"), doc("$inc", doc("n", -1))); err != nil {
		t.Fatal(err)
	}
	if _, err := orders.InsertOne(sctx, doc("_id", "o2", "sku", "sku1")); err != nil {
		t.Fatal(err)
	}
	// The transaction reads its own writes ...
	var got bson.M
	if err := stock.FindOne(sctx, doc("_id", "sku1")).Decode(&got); err != nil || got["n"] != int32(4) {
		t.Fatalf("in-transaction read = %v, %v; want n 4", got, err)
	}
	if n, err := orders.CountDocuments(sctx, bson.D{}); err != nil || n != 2 {
		t.Fatalf("in-transaction count = %d, %v; want 2", n, err)
	}
	// ... others do not, nor does the change stream.
	if err := other.Database("inventory").Collection("stock").FindOne(ctx, doc("_id", "sku1")).Decode(&got); err != nil || got["n"] != int32(5) {
		t.Fatalf("outside read = %v, %v; want n 5", got, err)
	}
	if n, err := other.Database("shop").Collection("orders").CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("outside count = %d, %v; want 0", n, err)
	}
	if ev := nextTxnEvent(t, ctx, cs); ev.DocumentKey["_id"] != "sku1" || ev.TxnNumber != nil || ev.Lsid != nil {
		t.Fatalf("first event = %+v, want the plain insert of sku1", ev)
	}
	noEvent(t, ctx, cs)

	if err := sess.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := other.Database("shop").Collection("orders").CountDocuments(ctx, bson.D{}); err != nil || n != 2 {
		t.Fatalf("count after commit = %d, %v; want 2", n, err)
	}
	want := []struct{ op, db, id string }{{"insert", "shop", "o1"}, {"update", "inventory", "sku1"}, {"insert", "shop", "o2"}}
	var evs []txnEvent
	var raws []bson.Raw
	for range want {
		evs = append(evs, nextTxnEvent(t, ctx, cs))
		raws = append(raws, bson.Raw(append([]byte(nil), cs.Current.Lookup("_id").Document()...)))
	}
	uuid := sessionUUID(t, sess)
	for i, ev := range evs {
		w := want[i]
		if ev.OperationType != w.op || ev.NS.DB != w.db || ev.DocumentKey["_id"] != w.id {
			t.Fatalf("event %d = %s %s %v, want %s %s %s", i, ev.OperationType, ev.NS.DB, ev.DocumentKey, w.op, w.db, w.id)
		}
		if ev.TxnNumber == nil || *ev.TxnNumber != evs[0].txnNumber() || *ev.TxnNumber < 1 {
			t.Fatalf("event %d txnNumber = %v", i, ev.TxnNumber)
		}
		if ev.Lsid == nil || !bytes.Equal(ev.Lsid.ID.Data, uuid) || len(ev.Lsid.UID.Data) != 32 {
			t.Fatalf("event %d lsid = %+v, want the session's id %x and a uid", i, ev.Lsid, uuid)
		}
		if ev.ClusterTime != evs[0].ClusterTime {
			t.Fatalf("event %d clusterTime %v != %v", i, ev.ClusterTime, evs[0].ClusterTime)
		}
		if i > 0 && ev.ID.Data <= evs[i-1].ID.Data {
			t.Fatalf("token %d %s not after %s", i, ev.ID.Data, evs[i-1].ID.Data)
		}
	}
	if op := sess.OperationTime(); op == nil || *op != evs[0].ClusterTime {
		t.Fatalf("commit operationTime %v, want the events' clusterTime %v", op, evs[0].ClusterTime)
	}

	// Resuming from the token of the transaction's first event delivers
	// the rest of the transaction, then what follows.
	mustInsert(t, ctx, orders, doc("_id", "after"))
	cs2, err := client.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(raws[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close(ctx)
	for _, w := range []string{"sku1", "o2", "after"} {
		if ev := nextTxnEvent(t, ctx, cs2); ev.DocumentKey["_id"] != w {
			t.Fatalf("resumed event = %v, want %s", ev.DocumentKey, w)
		}
	}
}

func (e txnEvent) txnNumber() int64 {
	if e.TxnNumber == nil {
		return -1
	}
	return *e.TxnNumber
}

// TestTransactionAbort: nothing of an aborted transaction is visible or
// reported, and the session's next transaction works.
func TestTransactionAbort(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	mustInsert(t, ctx, coll, doc("_id", 1, "v", "old"))
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	sess, err := client.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(ctx)
	if err := sess.StartTransaction(); err != nil {
		t.Fatal(err)
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	if _, err := coll.InsertOne(sctx, doc("_id", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.UpdateOne(sctx, doc("_id", 1), doc("$set", doc("v", "new"))); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.DeleteOne(sctx, doc("_id", 1)); err != nil {
		t.Fatal(err)
	}
	if err := sess.AbortTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	var got bson.M
	if err := coll.FindOne(ctx, doc("_id", 1)).Decode(&got); err != nil || got["v"] != "old" {
		t.Fatalf("after abort: %v, %v", got, err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{}); n != 1 {
		t.Fatalf("documents after abort = %d, want 1", n)
	}
	// The next transaction of the session commits; only its event shows.
	if _, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		return coll.InsertOne(sctx, doc("_id", 3))
	}); err != nil {
		t.Fatal(err)
	}
	if ev := nextTxnEvent(t, ctx, cs); ev.DocumentKey["_id"] != int32(3) || ev.txnNumber() < 1 {
		t.Fatalf("event after abort = %+v, want the insert of 3 in a transaction", ev)
	}
	noEvent(t, ctx, cs)
}

// TestTransactionWriteConflict: a write to a document another open
// transaction wrote fails with WriteConflict labelled
// TransientTransactionError and aborts its transaction (NoSuchTransaction
// afterwards); WithTransaction retries such a transaction until it commits.
func TestTransactionWriteConflict(t *testing.T) {
	_, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	mustInsert(t, ctx, coll, doc("_id", 1, "n", 0))
	s1, _ := client.StartSession()
	defer s1.EndSession(ctx)
	s2, _ := client.StartSession()
	defer s2.EndSession(ctx)
	_ = s1.StartTransaction()
	_ = s2.StartTransaction()
	c1, c2 := mongo.NewSessionContext(ctx, s1), mongo.NewSessionContext(ctx, s2)
	if _, err := coll.UpdateOne(c1, doc("_id", 1), doc("$inc", doc("n", 1))); err != nil {
		t.Fatal(err)
	}
	_, err := coll.UpdateOne(c2, doc("_id", 1), doc("$inc", doc("n", 10)))
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(112) || !se.HasErrorLabel("TransientTransactionError") {
		t.Fatalf("conflicting write: %v, want WriteConflict with TransientTransactionError", err)
	}
	err = s2.CommitTransaction(ctx)
	if !errors.As(err, &se) || !se.HasErrorCode(251) || !se.HasErrorLabel("TransientTransactionError") {
		t.Fatalf("commit after conflict: %v, want NoSuchTransaction with TransientTransactionError", err)
	}
	if err := s1.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	// A non-transactional write after a transaction's copy was taken
	// conflicts at the transaction's next write to that document.
	_ = s2.StartTransaction()
	var got bson.M
	if err := coll.FindOne(c2, doc("_id", 1)).Decode(&got); err != nil || got["n"] != int32(1) {
		t.Fatalf("read in transaction = %v, %v", got, err)
	}
	if _, err := coll.UpdateOne(ctx, doc("_id", 1), doc("$inc", doc("n", 100))); err != nil {
		t.Fatal(err)
	}
	_, err = coll.UpdateOne(c2, doc("_id", 1), doc("$inc", doc("n", 10)))
	if !errors.As(err, &se) || !se.HasErrorCode(112) {
		t.Fatalf("write after an outside change: %v, want WriteConflict", err)
	}
	_ = s2.AbortTransaction(ctx)

	// WithTransaction retries a callback that met a transient error.
	attempts := 0
	_, err = s2.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		attempts++
		if attempts == 1 {
			// Another transaction holds the document for this attempt.
			_ = s1.StartTransaction()
			if _, err := coll.UpdateOne(mongo.NewSessionContext(ctx, s1), doc("_id", 1), doc("$inc", doc("n", 1000))); err != nil {
				return nil, err
			}
		}
		_, err := coll.UpdateOne(sctx, doc("_id", 1), doc("$inc", doc("n", 10)))
		if attempts == 1 {
			_ = s1.AbortTransaction(ctx)
		}
		return nil, err
	})
	if err != nil || attempts != 2 {
		t.Fatalf("WithTransaction: %v after %d attempts, want success after 2", err, attempts)
	}
	if err := coll.FindOne(ctx, doc("_id", 1)).Decode(&got); err != nil || got["n"] != int32(111) {
		t.Fatalf("final = %v, %v; want n 111", got, err)
	}
}

// TestTransactionErrorsAndLabels: commands of a transaction the server no
// longer knows fail with NoSuchTransaction, a retryable commit error is
// labelled RetryableWriteError and the driver's retried commit succeeds
// once, and a write error aborts the transaction.
func TestTransactionErrorsAndLabels(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	sess, _ := client.StartSession()
	defer sess.EndSession(ctx)

	// The first commit attempt fails with ShutdownInProgress: the server
	// labels it RetryableWriteError, the driver retries the commit, and the
	// transaction is applied once.
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"commitTransaction"}, Times: 1, ErrorCode: 91})
	if _, err := sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		return coll.InsertOne(sctx, doc("_id", "a"))
	}); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.CommandsNamed("commitTransaction")); n != 2 {
		t.Fatalf("commitTransaction sent %d times, want 2", n)
	}
	if ev := nextTxnEvent(t, ctx, cs); ev.DocumentKey["_id"] != "a" {
		t.Fatalf("event %v", ev.DocumentKey)
	}
	noEvent(t, ctx, cs)

	// A duplicate key error aborts the transaction; its earlier insert is
	// discarded.
	_ = sess.StartTransaction()
	sctx := mongo.NewSessionContext(ctx, sess)
	if _, err := coll.InsertOne(sctx, doc("_id", "b")); err != nil {
		t.Fatal(err)
	}
	_, err = coll.InsertOne(sctx, doc("_id", "a"))
	var we mongo.WriteException
	if !errors.As(err, &we) || !we.HasErrorCode(11000) || we.HasErrorLabel("TransientTransactionError") {
		t.Fatalf("duplicate in transaction: %v", err)
	}
	_, err = coll.InsertOne(sctx, doc("_id", "c"))
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(251) || !se.HasErrorLabel("TransientTransactionError") {
		t.Fatalf("write after the aborting error: %v, want NoSuchTransaction", err)
	}
	_ = sess.AbortTransaction(ctx)
	if n, _ := coll.CountDocuments(ctx, bson.D{}); n != 1 {
		t.Fatalf("documents = %d, want 1", n)
	}

	// Change streams and unsupported commands are refused in transactions.
	_ = sess.StartTransaction()
	_, err = coll.Watch(mongo.NewSessionContext(ctx, sess), mongo.Pipeline{})
	if !errors.As(err, &se) || !se.HasErrorCode(263) {
		t.Fatalf("watch in a transaction: %v, want OperationNotSupportedInTransaction", err)
	}
	_ = sess.AbortTransaction(ctx)

	// killAllSessions aborts open transactions.
	_ = sess.StartTransaction()
	sctx = mongo.NewSessionContext(ctx, sess)
	if _, err := coll.InsertOne(sctx, doc("_id", "d")); err != nil {
		t.Fatal(err)
	}
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "killAllSessions", Value: bson.A{}}}).Err(); err != nil {
		t.Fatal(err)
	}
	err = sess.CommitTransaction(ctx)
	if !errors.As(err, &se) || !se.HasErrorCode(251) {
		t.Fatalf("commit after killAllSessions: %v, want NoSuchTransaction", err)
	}
	noEvent(t, ctx, cs)
}

// TestTransactionCreatesCollection: a collection created by a transaction's
// insert exists for others only after the commit.
func TestTransactionCreatesCollection(t *testing.T) {
	_, client, ctx := setup(t)
	db := client.Database("app")
	sess, _ := client.StartSession()
	defer sess.EndSession(ctx)
	_ = sess.StartTransaction()
	sctx := mongo.NewSessionContext(ctx, sess)
	if _, err := db.Collection("fresh").InsertOne(sctx, doc("_id", 1)); err != nil {
		t.Fatal(err)
	}
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) != 0 {
		t.Fatalf("collections before commit = %v, %v", names, err)
	}
	if err := sess.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := db.Collection("fresh").CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("after commit: %d, %v", n, err)
	}
}

// TestTransactionLifetimeLimit: a transaction its client abandoned holds
// the documents it wrote — another transaction writing one fails with
// WriteConflict at once — until the lifetime limit
// (transactionLifetimeLimitSeconds) aborts it; then the other transaction's
// write proceeds, and the abandoned session's commit fails with
// NoSuchTransaction.
func TestTransactionLifetimeLimit(t *testing.T) {
	const limit = 700 * time.Millisecond
	srv := startServer(t, mongowire.Options{TransactionLifetimeLimit: limit})
	client := connect(t, srv.URI())
	ctx := ctxFor(t, 30*time.Second)
	coll := client.Database("app").Collection("c")
	mustInsert(t, ctx, coll, doc("_id", 1, "n", 0))
	abandoned, _ := client.StartSession()
	defer abandoned.EndSession(ctx)
	_ = abandoned.StartTransaction()
	began := time.Now()
	if _, err := coll.UpdateOne(mongo.NewSessionContext(ctx, abandoned), doc("_id", 1), doc("$inc", doc("n", 1))); err != nil {
		t.Fatal(err)
	}
	other, _ := client.StartSession()
	defer other.EndSession(ctx)
	write := func() error {
		_ = other.StartTransaction()
		_, err := coll.UpdateOne(mongo.NewSessionContext(ctx, other), doc("_id", 1), doc("$inc", doc("n", 10)))
		if err != nil {
			_ = other.AbortTransaction(ctx)
			return err
		}
		return other.CommitTransaction(ctx)
	}
	var se mongo.ServerError
	if err := write(); !errors.As(err, &se) || !se.HasErrorCode(112) || !se.HasErrorLabel("TransientTransactionError") {
		t.Fatalf("write while the abandoned transaction is open: %v, want WriteConflict with TransientTransactionError", err)
	}
	if time.Since(began) >= limit {
		t.Skip("machine too slow to observe the conflict within the limit")
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err = write(); err == nil || time.Now().After(deadline) {
			break
		}
		if !errors.As(err, &se) || !se.HasErrorCode(112) {
			t.Fatalf("write: %v, want WriteConflict until the limit", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("write after the lifetime limit: %v", err)
	}
	if since := time.Since(began); since < limit {
		t.Fatalf("conflict ended after %v, before the %v limit", since, limit)
	}
	if err := abandoned.CommitTransaction(ctx); !errors.As(err, &se) || !se.HasErrorCode(251) {
		t.Fatalf("commit of the reaped transaction: %v, want NoSuchTransaction", err)
	}
	var got bson.M
	if err := coll.FindOne(ctx, doc("_id", 1)).Decode(&got); err != nil || got["n"] != int32(10) {
		t.Fatalf("final = %v, %v; want n 10 (the reaped transaction's write discarded)", got, err)
	}
}
