package mongowire_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
)

// rawConn speaks the wire protocol directly, to test what the driver never
// sends (resends, legacy opcodes, unacknowledged writes).
type rawConn struct {
	t     *testing.T
	c     net.Conn
	reqID int32
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c}
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r *rawConn) send(opCode int32, payload []byte) int32 {
	r.t.Helper()
	r.reqID++
	hdr := make([]byte, 16, 16+len(payload))
	binary.LittleEndian.PutUint32(hdr[0:], uint32(16+len(payload)))
	binary.LittleEndian.PutUint32(hdr[4:], uint32(r.reqID))
	binary.LittleEndian.PutUint32(hdr[12:], uint32(opCode))
	if _, err := r.c.Write(append(hdr, payload...)); err != nil {
		r.t.Fatal(err)
	}
	return r.reqID
}

// msg sends an OP_MSG with the given flag bits and body.
func (r *rawConn) msg(flags uint32, body bson.D) int32 {
	r.t.Helper()
	p := binary.LittleEndian.AppendUint32(nil, flags)
	p = append(p, 0)
	p = append(p, marshal(r.t, body)...)
	return r.send(2013, p)
}

// reply reads one reply and returns its opcode, responseTo and document.
func (r *rawConn) reply() (int32, int32, bson.Raw) {
	r.t.Helper()
	var hdr [16]byte
	if _, err := io.ReadFull(r.c, hdr[:]); err != nil {
		r.t.Fatal(err)
	}
	buf := make([]byte, binary.LittleEndian.Uint32(hdr[0:])-16)
	if _, err := io.ReadFull(r.c, buf); err != nil {
		r.t.Fatal(err)
	}
	op := int32(binary.LittleEndian.Uint32(hdr[12:]))
	responseTo := int32(binary.LittleEndian.Uint32(hdr[8:]))
	switch op {
	case 1: // OP_REPLY: flags, cursorID, startingFrom, numberReturned, docs
		if n := binary.LittleEndian.Uint32(buf[16:]); n != 1 {
			r.t.Fatalf("OP_REPLY numberReturned = %d", n)
		}
		return op, responseTo, bson.Raw(buf[20:])
	case 2013:
		if buf[4] != 0 {
			r.t.Fatalf("OP_MSG reply section kind %d", buf[4])
		}
		return op, responseTo, bson.Raw(buf[5:])
	}
	r.t.Fatalf("unexpected reply opcode %d", op)
	return 0, 0, nil
}

func (r *rawConn) legacyQuery(ns string, body bson.D) int32 {
	p := binary.LittleEndian.AppendUint32(nil, 0)
	p = append(p, ns...)
	p = append(p, 0)
	p = binary.LittleEndian.AppendUint32(p, 0)
	p = binary.LittleEndian.AppendUint32(p, ^uint32(0)) // numberToReturn -1
	p = append(p, marshal(r.t, body)...)
	return r.send(2004, p)
}

func TestProtocolHandshakeAndErrors(t *testing.T) {
	srv := startServer(t, mongowire.Options{})
	r := dialRaw(t, srv.Addr())

	id := r.legacyQuery("admin.$cmd", bson.D{{Key: "isMaster", Value: 1}, {Key: "helloOk", Value: true}})
	op, to, doc := r.reply()
	if op != 1 || to != id {
		t.Fatalf("legacy hello answered with opcode %d responseTo %d", op, to)
	}
	if doc.Lookup("ismaster").Boolean() != true || doc.Lookup("helloOk").Boolean() != true || doc.Lookup("setName").StringValue() != "rs0" ||
		doc.Lookup("maxWireVersion").Int32() != 21 || doc.Lookup("hosts", "0").StringValue() != srv.Addr() {
		t.Fatalf("legacy hello reply = %v", doc)
	}
	if _, _, ok := doc.Lookup("operationTime").TimestampOK(); !ok {
		t.Fatalf("no operationTime timestamp: %v", doc)
	}

	// Other commands are refused over OP_QUERY, as by MongoDB 7.
	r.legacyQuery("app.$cmd", bson.D{{Key: "find", Value: "c"}})
	if _, _, doc = r.reply(); doc.Lookup("ok").Double() != 0 || doc.Lookup("code").Int32() != 352 {
		t.Fatalf("OP_QUERY find = %v", doc)
	}

	// Unknown commands and missing $db.
	r.msg(0, bson.D{{Key: "frobnicate", Value: 1}, {Key: "$db", Value: "admin"}})
	if _, _, doc = r.reply(); doc.Lookup("code").Int32() != 59 || doc.Lookup("codeName").StringValue() != "CommandNotFound" {
		t.Fatalf("unknown command = %v", doc)
	}
	r.msg(0, bson.D{{Key: "ping", Value: 1}})
	if _, _, doc = r.reply(); doc.Lookup("ok").Double() != 0 {
		t.Fatalf("ping without $db = %v", doc)
	}

	// An unacknowledged (moreToCome) insert gets no reply but is applied.
	r.msg(2, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}}}, {Key: "$db", Value: "app"}})
	id = r.msg(0, bson.D{{Key: "count", Value: "c"}, {Key: "$db", Value: "app"}})
	_, to, doc = r.reply()
	if to != id || doc.Lookup("n").Int32() != 1 {
		t.Fatalf("after unacknowledged insert: responseTo %d (want %d), %v", to, id, doc)
	}

	// getMore on an unknown cursor.
	r.msg(0, bson.D{{Key: "getMore", Value: int64(12345)}, {Key: "collection", Value: "c"}, {Key: "$db", Value: "app"}})
	if _, _, doc = r.reply(); doc.Lookup("code").Int32() != 43 {
		t.Fatalf("getMore unknown cursor = %v", doc)
	}
}

func TestRetryableWriteResend(t *testing.T) {
	srv := startServer(t, mongowire.Options{})
	r := dialRaw(t, srv.Addr())
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	insert := func(txn int64, id int) bson.Raw {
		r.msg(0, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: id}}}},
			{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: txn}, {Key: "$db", Value: "app"}})
		_, _, doc := r.reply()
		return doc
	}
	first := insert(1, 1)
	again := insert(1, 1) // the same retryable write, resent
	if first.Lookup("n").Int32() != 1 || again.Lookup("n").Int32() != 1 || again.Lookup("writeErrors").Type != 0 {
		t.Fatalf("resent write: first %v, again %v", first, again)
	}
	if dup := insert(2, 1); dup.Lookup("writeErrors", "0", "code").Int32() != 11000 {
		t.Fatalf("new txnNumber with the same _id = %v", dup)
	}
	r.msg(0, bson.D{{Key: "count", Value: "c"}, {Key: "$db", Value: "app"}})
	if _, _, doc := r.reply(); doc.Lookup("n").Int32() != 1 {
		t.Fatalf("count = %v", doc)
	}
}

func TestConfigureFailPointCommand(t *testing.T) {
	srv, client, ctx := setup(t)
	admin := client.Database("admin")
	err := admin.RunCommand(ctx, bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: bson.D{{Key: "times", Value: 2}}},
		{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{"find"}}, {Key: "errorCode", Value: 2}}}}).Err()
	if err != nil {
		t.Fatal(err)
	}
	coll := client.Database("app").Collection("c")
	for i := 0; i < 2; i++ {
		var ce mongo.ServerError
		if err := coll.FindOne(ctx, bson.D{}).Err(); !errors.As(err, &ce) || !ce.HasErrorCode(2) {
			t.Fatalf("find %d: %v", i, err)
		}
	}
	if err := coll.FindOne(ctx, bson.D{}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("find after fail point used up: %v", err)
	}
	// A server-chosen label: a retryable code on a retryable write gets
	// RetryableWriteError (seen here with retries off, as the driver would
	// otherwise retry until the context ends under alwaysOn).
	err = admin.RunCommand(ctx, bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "alwaysOn"},
		{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{"insert"}}, {Key: "errorCode", Value: 91}}}}).Err()
	if err != nil {
		t.Fatal(err)
	}
	noRetry := connect(t, srv.URI()+"&retryWrites=false")
	for i := 0; i < 2; i++ {
		_, err = noRetry.Database("app").Collection("c").InsertOne(ctx, bson.D{{Key: "txn", Value: true}})
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(91) {
			t.Fatalf("insert %d under alwaysOn: %v", i, err)
		}
		if se.HasErrorLabel("RetryableWriteError") {
			t.Fatalf("label on a write without txnNumber: %v", err)
		}
	}
	if err := admin.RunCommand(ctx, bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(ctx, bson.D{}); err != nil {
		t.Fatalf("insert after off: %v", err)
	}
}

func TestFailPointDefaultLabels(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	// A retryable write failing once with a retryable code is labelled by
	// the server and retried by the driver.
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, Times: 1, ErrorCode: 91})
	if _, err := coll.InsertOne(ctx, bson.D{}); err != nil {
		t.Fatalf("insert not retried: %v", err)
	}
	if n := len(srv.CommandsNamed("insert")); n != 2 {
		t.Fatalf("inserts sent = %d, want 2", n)
	}
	// A change stream getMore failing through failCommand with a
	// resumable code and no explicit labels gets no label: the fault fires
	// before the getMore checks out its cursor (error_labels.cpp reads the
	// originating command from it), so the application sees the error.
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	srv.ResetCommands()
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, ErrorCode: 10107})
	mustInsert(t, ctx, coll, doc("_id", "x"))
	if cs.Next(ctx) {
		t.Fatalf("event %v despite the getMore error", cs.Current)
	}
	var ce mongo.CommandError
	if !errors.As(cs.Err(), &ce) || ce.Code != 10107 || len(ce.Labels) != 0 {
		t.Fatalf("stream error = %v, want NotWritablePrimary without labels", cs.Err())
	}
	if n := len(srv.CommandsNamed("aggregate")); n != 0 {
		t.Fatalf("resuming aggregates = %d, want 0", n)
	}
	// After the cursor checkout (failGetMoreAfterCursorCheckout) the same
	// error is labelled ResumableChangeStreamError and the driver resumes.
	cs2, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close(ctx)
	srv.ResetCommands()
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, ErrorCode: 10107, AfterCursorCheckout: true})
	mustInsert(t, ctx, coll, doc("_id", "y"))
	if ev := next(t, ctx, cs2); ev.DocumentKey["_id"] != "y" {
		t.Fatalf("event = %+v", ev)
	}
	if n := len(srv.CommandsNamed("aggregate")); n != 1 {
		t.Fatalf("resuming aggregates = %d, want 1", n)
	}
}

func TestBlockConnection(t *testing.T) {
	srv, client, ctx := setup(t)
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"ping"}, Times: 1, BlockFor: 200 * time.Millisecond})
	start := time.Now()
	if err := client.Ping(ctx, readpref.Primary()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("blocked ping took %v", d)
	}
}

func TestStopRestartPause(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := client.Database("app").Collection("c")
	mustInsert(t, ctx, coll, doc("_id", 1))
	addr := srv.Addr()

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	short := ctxFor(t, 300*time.Millisecond)
	if err := client.Ping(short, readpref.Primary()); err == nil {
		t.Fatal("ping succeeded while stopped")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if srv.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", srv.Addr(), addr)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("data after restart: %d %v", n, err)
	}

	srv.Pause()
	short = ctxFor(t, 300*time.Millisecond)
	if err := client.Ping(short, readpref.Primary()); err == nil {
		t.Fatal("ping answered while paused")
	}
	srv.Resume()
	if err := client.Ping(ctx, readpref.Primary()); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
}
