package mongowire_test

// Regression tests for reply shapes a second client (the Node.js driver,
// see compat/node) relies on and MongoDB 7 produces.

import (
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestDuplicateKeyErrorInfo: MongoDB reports the index key pattern and the
// duplicate key with every 11000, as keyPattern and keyValue, in write
// errors and in command errors (findAndModify).
func TestDuplicateKeyErrorInfo(t *testing.T) {
	srv := startServer(t, mongowire.Options{})
	r := dialRaw(t, srv.Addr())
	run := func(body bson.D) bson.Raw {
		t.Helper()
		r.msg(0, append(body, bson.E{Key: "$db", Value: "app"}))
		_, _, doc := r.reply()
		return doc
	}
	run(bson.D{{Key: "createIndexes", Value: "c"}, {Key: "indexes", Value: bson.A{
		bson.D{{Key: "key", Value: bson.D{{Key: "email", Value: 1}, {Key: "org", Value: 1}}}, {Key: "name", Value: "email_org"}, {Key: "unique", Value: true}}}}})
	run(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}, {Key: "email", Value: "a@x"}, {Key: "org", Value: 7}}}}})

	check := func(what string, e bson.Raw, pattern, value bson.D) {
		t.Helper()
		if e.Lookup("code").Int32() != 11000 {
			t.Fatalf("%s: not a duplicate key error: %v", what, e)
		}
		if got, want := docOf(e, "keyPattern"), bson.Raw(marshal(t, pattern)); got.String() != want.String() {
			t.Errorf("%s: keyPattern = %v, want %v", what, got, want)
		}
		if got, want := docOf(e, "keyValue"), bson.Raw(marshal(t, value)); got.String() != want.String() {
			t.Errorf("%s: keyValue = %v, want %v", what, got, want)
		}
	}
	dupID := run(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}}}})
	check("insert duplicate _id", dupID.Lookup("writeErrors", "0").Document(), bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 1}})

	dupKey := run(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 2}, {Key: "email", Value: "a@x"}, {Key: "org", Value: 7}}}}})
	check("insert duplicate unique key", dupKey.Lookup("writeErrors", "0").Document(),
		bson.D{{Key: "email", Value: 1}, {Key: "org", Value: 1}}, bson.D{{Key: "email", Value: "a@x"}, {Key: "org", Value: 7}})

	fam := run(bson.D{{Key: "findAndModify", Value: "c"}, {Key: "query", Value: bson.D{{Key: "_id", Value: 3}}},
		{Key: "update", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "email", Value: "a@x"}, {Key: "org", Value: 7}}}}}, {Key: "upsert", Value: true}})
	if ok, _ := fam.Lookup("ok").AsFloat64OK(); ok != 0 || fam.Lookup("codeName").StringValue() != "DuplicateKey" {
		t.Fatalf("findAndModify duplicate = %v", fam)
	}
	check("findAndModify", fam, bson.D{{Key: "email", Value: 1}, {Key: "org", Value: 1}}, bson.D{{Key: "email", Value: "a@x"}, {Key: "org", Value: 7}})
}

// docOf returns the document at key, or an empty document.
func docOf(doc bson.Raw, key string) bson.Raw {
	d, ok := doc.Lookup(key).DocumentOK()
	if !ok {
		return bson.Raw{5, 0, 0, 0, 0}
	}
	return d
}

// TestKillCursorsInterruptsWaitingGetMore: killing a change stream cursor
// while a getMore waits for events (as a driver does when a stream is closed
// from another task) ends that getMore at once with CursorKilled (237),
// instead of holding it until maxTimeMS.
func TestKillCursorsInterruptsWaitingGetMore(t *testing.T) {
	srv := startServer(t, mongowire.Options{})
	a, b := dialRaw(t, srv.Addr()), dialRaw(t, srv.Addr())
	a.msg(0, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$changeStream", Value: bson.D{}}}}},
		{Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: "app"}})
	_, _, open := a.reply()
	id, ok := open.Lookup("cursor", "id").Int64OK()
	if !ok || id == 0 {
		t.Fatalf("aggregate = %v", open)
	}
	a.msg(0, bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "c"}, {Key: "maxTimeMS", Value: int64(10000)}, {Key: "$db", Value: "app"}})
	time.Sleep(100 * time.Millisecond) // let the getMore start waiting
	start := time.Now()
	b.msg(0, bson.D{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{id}}, {Key: "$db", Value: "app"}})
	if _, _, kill := b.reply(); kill.Lookup("cursorsKilled", "0").Int64() != id {
		t.Fatalf("killCursors = %v", kill)
	}
	_, _, gm := a.reply()
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("getMore returned %v after killCursors", waited)
	}
	if gm.Lookup("code").Int32() != 237 || gm.Lookup("codeName").StringValue() != "CursorKilled" {
		t.Fatalf("interrupted getMore = %v", gm)
	}
}

// TestStreamingHello: with Options.StreamingHello, hello reports a
// topologyVersion; an awaitable hello (topologyVersion + maxAwaitTimeMS)
// sent with exhaustAllowed is answered by a stream of moreToCome replies,
// one per maxAwaitTimeMS, each answering the previous; and "not primary"
// errors carry the same topologyVersion.
func TestStreamingHello(t *testing.T) {
	srv := startServer(t, mongowire.Options{StreamingHello: true})
	r := dialRaw(t, srv.Addr())
	r.legacyQuery("admin.$cmd", bson.D{{Key: "isMaster", Value: 1}, {Key: "helloOk", Value: true}})
	_, _, hello := r.reply()
	tv, ok := hello.Lookup("topologyVersion").DocumentOK()
	if !ok {
		t.Fatalf("hello without topologyVersion: %v", hello)
	}
	if _, ok := tv.Lookup("processId").ObjectIDOK(); !ok || tv.Lookup("counter").Type != bson.TypeInt64 {
		t.Fatalf("topologyVersion = %v", tv)
	}

	// A stale topologyVersion is answered at once, without streaming.
	start := time.Now()
	r.msg(0, bson.D{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: bson.NewObjectID()}, {Key: "counter", Value: int64(0)}}},
		{Key: "maxAwaitTimeMS", Value: int64(5000)}, {Key: "$db", Value: "admin"}})
	if _, _, doc := r.reply(); doc.Lookup("isWritablePrimary").Boolean() != true || time.Since(start) > 2*time.Second {
		t.Fatalf("stale awaitable hello = %v after %v", doc, time.Since(start))
	}

	start = time.Now()
	req := r.msg(1<<16, bson.D{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(150)}, {Key: "$db", Value: "admin"}})
	prev := req
	for i := 0; i < 3; i++ {
		flags, reqID, responseTo, doc := readMsg(t, r)
		if responseTo != prev || flags&2 == 0 || doc.Lookup("isWritablePrimary").Boolean() != true {
			t.Fatalf("streamed hello %d: flags %#x responseTo %d (want %d): %v", i, flags, responseTo, prev, doc)
		}
		prev = reqID
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("three awaited replies in %v, want >= 450ms", d)
	}

	c := dialRaw(t, srv.Addr())
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"find"}, Times: 1, ErrorCode: 10107})
	c.msg(0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "app"}})
	_, _, fe := c.reply()
	if got, ok := fe.Lookup("topologyVersion").DocumentOK(); !ok || got.String() != tv.String() {
		t.Fatalf("NotWritablePrimary error = %v, want topologyVersion %v", fe, tv)
	}
	// The Go driver monitors with the streaming protocol and retries.
	client, ctx := connect(t, srv.URI()), ctxFor(t, 20*time.Second)
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, Times: 1, ErrorCode: 91})
	if _, err := client.Database("app").Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatalf("insert after a ShutdownInProgress error: %v", err)
	}
}

// readMsg reads one OP_MSG and returns its flags, requestID, responseTo and body.
func readMsg(t *testing.T, r *rawConn) (uint32, int32, int32, bson.Raw) {
	t.Helper()
	var hdr [16]byte
	if _, err := io.ReadFull(r.c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, binary.LittleEndian.Uint32(hdr[0:])-16)
	if _, err := io.ReadFull(r.c, buf); err != nil {
		t.Fatal(err)
	}
	if op := binary.LittleEndian.Uint32(hdr[12:]); op != 2013 || buf[4] != 0 {
		t.Fatalf("not an OP_MSG reply: opcode %d", op)
	}
	return binary.LittleEndian.Uint32(buf), int32(binary.LittleEndian.Uint32(hdr[4:])), int32(binary.LittleEndian.Uint32(hdr[8:])), bson.Raw(buf[5:])
}
