package mongowire_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

const tenMiB = 10 * 1024 * 1024

// splitInfo is a fragment's splitEvent field.
type splitInfo struct {
	Fragment int32 `bson:"fragment"`
	Of       int32 `bson:"of"`
}

// prePostColl creates app.big with changeStreamPreAndPostImages enabled.
func prePostColl(t *testing.T, ctx context.Context, client *mongo.Client) *mongo.Collection {
	t.Helper()
	db := client.Database("app")
	err := db.CreateCollection(ctx, "big", options.CreateCollection().SetChangeStreamPreAndPostImages(bson.M{"enabled": true}))
	if err != nil {
		t.Fatal(err)
	}
	return db.Collection("big")
}

func serverCode(err error) int32 {
	var se mongo.ServerError
	if errors.As(err, &se) {
		var ce mongo.CommandError
		if errors.As(err, &ce) {
			return ce.Code
		}
	}
	return 0
}

// TestSplitLargeChanges does what the Go driver's own integration test
// "split large changes" (internal/integration/change_stream_test.go) does:
// a 10 MiB document updated to another 10 MiB value, watched with
// fullDocument: required and $changeStreamSplitLargeEvent, arrives as
// fragment 1 of 2 then 2 of 2.
func TestSplitLargeChanges(t *testing.T) {
	_, client, ctx := setup(t)
	coll := prePostColl(t, ctx, client)
	type idValue struct {
		ID    int32  `bson:"_id"`
		Value string `bson:"value"`
	}
	if _, err := coll.InsertOne(ctx, idValue{ID: 1, Value: "q" + strings.Repeat("q", tenMiB)}); err != nil {
		t.Fatal(err)
	}
	cs, err := coll.Watch(ctx, mongo.Pipeline{{{Key: "$changeStreamSplitLargeEvent", Value: bson.D{}}}},
		options.ChangeStream().SetFullDocument(options.Required))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	newValue := "z" + strings.Repeat("q", tenMiB)
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: int32(1)}}, bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: newValue}}}}); err != nil {
		t.Fatal(err)
	}
	nextCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var whole bson.D
	for i := int32(1); i <= 2; i++ {
		if !cs.Next(nextCtx) {
			t.Fatalf("fragment %d: %v", i, cs.Err())
		}
		var got struct {
			SplitEvent splitInfo `bson:"splitEvent"`
		}
		if err := cs.Decode(&got); err != nil {
			t.Fatal(err)
		}
		if got.SplitEvent != (splitInfo{Fragment: i, Of: 2}) {
			t.Fatalf("fragment %d: splitEvent = %+v", i, got.SplitEvent)
		}
		if len(cs.Current) > 16*1024*1024+16*1024-8*1024 {
			t.Fatalf("fragment %d is %d bytes, over the limit", i, len(cs.Current))
		}
		if string(cs.ResumeToken()) != string(cs.Current.Lookup("_id").Document()) {
			t.Fatalf("fragment %d: resume token is not the fragment's _id", i)
		}
		var d bson.D
		if err := bson.Unmarshal(cs.Current, &d); err != nil {
			t.Fatal(err)
		}
		for _, e := range d {
			if e.Key != "_id" && e.Key != "splitEvent" {
				whole = append(whole, e)
			}
		}
	}
	// Reassembled, the fragments are the whole event.
	m := map[string]any{}
	for _, e := range whole {
		if _, dup := m[e.Key]; dup {
			t.Fatalf("field %s in two fragments", e.Key)
		}
		m[e.Key] = e.Value
	}
	if m["operationType"] != "update" {
		t.Fatalf("operationType = %v", m["operationType"])
	}
	full := m["fullDocument"].(bson.D)
	if full[1].Value != newValue {
		t.Fatal("fullDocument.value differs from the update")
	}
	upd := m["updateDescription"].(bson.D)
	if upd[0].Value.(bson.D)[0].Value != newValue {
		t.Fatal("updateDescription.updatedFields.value differs")
	}
}

// bigUpdate inserts a small document, a 10 MiB one, updates the latter to
// another 10 MiB value (about 30 MiB of event with pre- and post-images),
// then inserts another small document.
func bigUpdate(t *testing.T, ctx context.Context, coll *mongo.Collection) {
	t.Helper()
	mustInsert(t, ctx, coll, doc("_id", "small-1"), doc("_id", "big", "v", strings.Repeat("x", tenMiB)))
	if _, err := coll.UpdateOne(ctx, doc("_id", "big"), doc("$set", doc("v", strings.Repeat("y", tenMiB)))); err != nil {
		t.Fatal(err)
	}
	mustInsert(t, ctx, coll, doc("_id", "small-2"))
}

func TestOversizeEventFails(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := prePostColl(t, ctx, client)
	start, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	startTok := start.ResumeToken()
	_ = start.Close(ctx)
	bigUpdate(t, ctx, coll)

	t.Run("getMore fails with the whole batch", func(t *testing.T) {
		srv.ResetCommands()
		cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetBatchSize(0).SetResumeAfter(startTok).
			SetFullDocument(options.UpdateLookup).SetFullDocumentBeforeChange(options.Required))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close(ctx)
		// The first getMore would hold small-1, the insert of big (10 MiB)
		// and the 30 MiB update: the update fails the whole batch, so not
		// even small-1 is returned (getmore_cmd.cpp abandons the batch).
		if cs.Next(ctx) {
			t.Fatalf("got an event: %s", cs.Current.Lookup("documentKey"))
		}
		if code := serverCode(cs.Err()); code != 10334 {
			t.Fatalf("err = %v, want code 10334", cs.Err())
		}
		msg := cs.Err().Error()
		if !strings.Contains(msg, "Executor error during getMore :: caused by :: BSONObj size: ") ||
			!strings.Contains(msg, "is invalid. Size must be between 0 and 16793600(16MB) First element: _id: { _data: \"") {
			t.Fatalf("message: %s", msg)
		}
		if n := len(srv.CommandsNamed("aggregate")); n != 1 {
			t.Fatalf("the driver resumed after 10334: %d aggregates", n)
		}
	})

	t.Run("batchSize 1 returns the events before it", func(t *testing.T) {
		cs, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetBatchSize(1).SetResumeAfter(startTok).
			SetFullDocument(options.UpdateLookup).SetFullDocumentBeforeChange(options.Required))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close(ctx)
		if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != "small-1" {
			t.Fatalf("first: %v", ev.DocumentKey)
		}
		if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != "big" || ev.OperationType != "insert" {
			t.Fatalf("second: %v", ev.DocumentKey)
		}
		before := cs.ResumeToken()
		if cs.Next(ctx) {
			t.Fatal("the oversize update was returned")
		}
		if code := serverCode(cs.Err()); code != 10334 {
			t.Fatalf("err = %v", cs.Err())
		}
		// The error names the update's resume token: the position after
		// which a consumer that skips it resumes.
		tokData := strings.SplitN(strings.SplitN(cs.Err().Error(), `_data: "`, 2)[1], `"`, 2)[0]
		skip, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetStartAfter(bson.D{{Key: "_data", Value: tokData}}))
		if err != nil {
			t.Fatal(err)
		}
		defer skip.Close(ctx)
		if ev := next(t, ctx, skip); ev.DocumentKey["_id"] != "small-2" {
			t.Fatalf("after the skipped event: %v", ev.DocumentKey)
		}
		// Projecting the large fields out lets it through (as in
		// change_stream_large_event_resumption.js).
		proj, err := coll.Watch(ctx, mongo.Pipeline{{{Key: "$project", Value: doc("fullDocument", 0, "fullDocumentBeforeChange", 0)}}},
			watchOpts().SetResumeAfter(before).SetFullDocument(options.UpdateLookup).SetFullDocumentBeforeChange(options.Required))
		if err != nil {
			t.Fatal(err)
		}
		defer proj.Close(ctx)
		if ev := next(t, ctx, proj); ev.OperationType != "update" || ev.DocumentKey["_id"] != "big" {
			t.Fatalf("projected: %+v", ev.DocumentKey)
		}
	})

	t.Run("first batch of the aggregate", func(t *testing.T) {
		_, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts().SetResumeAfter(startTok).
			SetFullDocument(options.UpdateLookup).SetFullDocumentBeforeChange(options.Required))
		if code := serverCode(err); code != 10334 || !strings.Contains(err.Error(), "PlanExecutor error during aggregation") {
			t.Fatalf("err = %v", err)
		}
	})
}

// readFragments reads n fragments and checks their splitEvent fields.
func readFragments(t *testing.T, ctx context.Context, cs *mongo.ChangeStream, first, of int32) []bson.Raw {
	t.Helper()
	var toks []bson.Raw
	for i := first; i <= of; i++ {
		if !cs.Next(ctx) {
			t.Fatalf("fragment %d: %v", i, cs.Err())
		}
		var got struct {
			SplitEvent splitInfo `bson:"splitEvent"`
		}
		if err := cs.Decode(&got); err != nil {
			t.Fatal(err)
		}
		if got.SplitEvent != (splitInfo{Fragment: i, Of: of}) {
			t.Fatalf("want fragment %d of %d, got %+v", i, of, got.SplitEvent)
		}
		toks = append(toks, cs.ResumeToken())
	}
	return toks
}

func TestSplitResume(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := prePostColl(t, ctx, client)
	start, err := coll.Watch(ctx, mongo.Pipeline{}, watchOpts())
	if err != nil {
		t.Fatal(err)
	}
	startTok := start.ResumeToken()
	_ = start.Close(ctx)
	bigUpdate(t, ctx, coll)
	split := mongo.Pipeline{{{Key: "$changeStreamSplitLargeEvent", Value: bson.D{}}}}
	opts := func() *options.ChangeStreamOptionsBuilder {
		return watchOpts().SetFullDocument(options.UpdateLookup).SetFullDocumentBeforeChange(options.Required)
	}

	cs, err := coll.Watch(ctx, split, opts().SetResumeAfter(startTok))
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != "small-1" {
		t.Fatal(ev.DocumentKey)
	}
	if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != "big" || ev.OperationType != "insert" {
		t.Fatal("the 10 MiB insert is not split:", ev.DocumentKey)
	}
	// pre-image, post-image and updateDescription: three fragments.
	toks := readFragments(t, ctx, cs, 1, 3)
	if ev := next(t, ctx, cs); ev.DocumentKey["_id"] != "small-2" {
		t.Fatal(ev.DocumentKey)
	}
	_ = cs.Close(ctx)
	for i := 1; i < len(toks); i++ {
		if string(toks[i-1].Lookup("_data").StringValue()) >= toks[i].Lookup("_data").StringValue() {
			t.Fatal("fragment tokens do not sort in stream order")
		}
	}

	for i, tok := range toks {
		for _, key := range []string{"resumeAfter", "startAfter"} {
			o := opts()
			if key == "resumeAfter" {
				o.SetResumeAfter(tok)
			} else {
				o.SetStartAfter(tok)
			}
			rs, err := coll.Watch(ctx, split, o)
			if err != nil {
				t.Fatalf("%s fragment %d: %v", key, i+1, err)
			}
			if i+1 < len(toks) {
				// Continues with the next fragment.
				got := readFragments(t, ctx, rs, int32(i+2), 3)
				if string(got[0]) != string(toks[i+1]) {
					t.Fatalf("%s fragment %d: next fragment has another token", key, i+1)
				}
			}
			if ev := next(t, ctx, rs); ev.DocumentKey["_id"] != "small-2" {
				t.Fatalf("%s fragment %d: then %v", key, i+1, ev.DocumentKey)
			}
			_ = rs.Close(ctx)
		}
	}

	t.Run("without the stage", func(t *testing.T) {
		_, err := coll.Watch(ctx, mongo.Pipeline{}, opts().SetResumeAfter(toks[1]))
		if code := serverCode(err); code != 280 {
			t.Fatalf("err = %v, want 280", err)
		}
	})
	t.Run("a different split", func(t *testing.T) {
		// Without the pre-image the event splits in two: fragment 3 of 3
		// cannot be found.
		rs, err := coll.Watch(ctx, split, watchOpts().SetFullDocument(options.UpdateLookup).SetBatchSize(0).SetResumeAfter(toks[2]))
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close(ctx)
		if rs.Next(ctx) || serverCode(rs.Err()) != 280 || !strings.Contains(rs.Err().Error(), "different split") {
			t.Fatalf("err = %v", rs.Err())
		}
	})
	t.Run("not large enough", func(t *testing.T) {
		rs, err := coll.Watch(ctx, split, watchOpts().SetBatchSize(0).SetResumeAfter(toks[1]))
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close(ctx)
		if rs.Next(ctx) || serverCode(rs.Err()) != 280 || !strings.Contains(rs.Err().Error(), "not large enough") {
			t.Fatalf("err = %v", rs.Err())
		}
	})
	_ = srv
}

func TestSplitStageValidation(t *testing.T) {
	_, client, ctx := setup(t)
	db := client.Database("app")
	splitStage := bson.D{{Key: "$changeStreamSplitLargeEvent", Value: bson.D{}}}
	cases := []struct {
		name     string
		pipeline bson.A
		code     int32
	}{
		{"not a change stream", bson.A{splitStage}, 20},
		{"twice", bson.A{doc("$changeStream", bson.D{}), splitStage, splitStage}, 7182802},
		{"not last", bson.A{doc("$changeStream", bson.D{}), splitStage, doc("$project", doc("fullDocument", 0))}, 7182802},
		{"spec not empty", bson.A{doc("$changeStream", bson.D{}), doc("$changeStreamSplitLargeEvent", doc("x", 1))}, 7182800},
		{"last", bson.A{doc("$changeStream", bson.D{}), doc("$match", doc("operationType", "insert")), splitStage}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := db.RunCommand(ctx, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: tc.pipeline}, {Key: "cursor", Value: bson.D{}}}).Err()
			if got := serverCode(err); got != tc.code {
				t.Fatalf("err = %v, want code %d", err, tc.code)
			}
		})
	}
}

// TestHoldFragment: a hold on the last fragment stalls the getMore that
// would return it, after the client read the fragments before it, until
// Release.
func TestHoldFragment(t *testing.T) {
	srv, client, ctx := setup(t)
	coll := prePostColl(t, ctx, client)
	h := srv.HoldFragment(0)
	cs, err := coll.Watch(ctx, mongo.Pipeline{{{Key: "$changeStreamSplitLargeEvent", Value: bson.D{}}}},
		options.ChangeStream().SetFullDocument(options.Required).SetFullDocumentBeforeChange(options.Required))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	bigUpdate(t, ctx, coll)
	// small-1, the 10 MiB insert, then fragments 1 and 2 of 3 of the
	// update pass; the getMore for fragment 3 waits.
	for i := range 4 {
		if !cs.Next(ctx) {
			t.Fatal(cs.Err())
		}
		var got struct {
			SplitEvent *splitInfo `bson:"splitEvent"`
		}
		if err := cs.Decode(&got); err != nil {
			t.Fatal(err)
		}
		if i >= 2 && (got.SplitEvent == nil || *got.SplitEvent != splitInfo{Fragment: int32(i - 1), Of: 3}) {
			t.Fatalf("change %d: %+v, want fragment %d of 3", i, got.SplitEvent, i-1)
		}
	}
	next := make(chan bool, 1)
	go func() { next <- cs.Next(ctx) }()
	select {
	case <-h.Reached():
	case <-time.After(20 * time.Second):
		t.Fatal("no getMore reached the hold")
	}
	select {
	case <-next:
		t.Fatal("the last fragment came through the hold")
	case <-time.After(100 * time.Millisecond): // a negative check: can only pass wrongly, never fail wrongly
	}
	h.Release()
	if !<-next {
		t.Fatal(cs.Err())
	}
	var got struct {
		SplitEvent splitInfo `bson:"splitEvent"`
	}
	if err := cs.Decode(&got); err != nil || got.SplitEvent != (splitInfo{Fragment: 3, Of: 3}) {
		t.Fatalf("after release: %+v %v", got.SplitEvent, err)
	}
}
