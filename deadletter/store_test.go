package deadletter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// testDB returns a fresh database for one test (see package mongotest: a
// real MongoDB with CHANGEGATE_TEST_MONGODB_URI, otherwise test/mongowire).
func testDB(t *testing.T) *mongo.Database {
	return mongotest.Database(t, "cgtest_deadletter_")
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newStore(t *testing.T) (*deadletter.Store, context.Context) {
	t.Helper()
	ctx := testCtx(t)
	s := deadletter.NewStore(testDB(t), "deadletters")
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatalf("EnsureIndexes: %v", err)
	}
	return s, ctx
}

var base = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// change returns a change stream document: an update of shop.<coll> document
// docID at cluster time (1795000000+ct, 1).
func change(t *testing.T, coll string, docID any, ct uint32) bson.Raw {
	t.Helper()
	ts := bson.Timestamp{T: 1795000000 + ct, I: 1}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%s%v", ts.T, coll, docID)}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ts},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.Unix(int64(ts.T), 0))},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: coll}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: docID}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: docID}, {Key: "status", Value: "paid"}, {Key: "total", Value: 120.5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func ev(t *testing.T, source, coll string, docID any, ct uint32, rules ...string) *event.Event {
	t.Helper()
	e, err := event.FromChange(source, uint64(ct), change(t, coll, docID, ct))
	if err != nil {
		t.Fatal(err)
	}
	e.Rules = rules
	return e
}

func entry(t *testing.T, e *event.Event, sink string, kind deadletter.Kind) deadletter.Entry {
	t.Helper()
	en, err := deadletter.EntryFor(e, sink, kind)
	if err != nil {
		t.Fatalf("EntryFor: %v", err)
	}
	return en
}

func put(t *testing.T, ctx context.Context, s *deadletter.Store, es ...deadletter.Entry) {
	t.Helper()
	for _, e := range es {
		if err := s.Put(ctx, e); err != nil {
			t.Fatalf("Put %s: %v", e.ID, err)
		}
	}
}

func ids(es []deadletter.Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

func docKey(t *testing.T, id any) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(bson.D{{Key: "_id", Value: id}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEntryFor(t *testing.T) {
	oid := bson.NewObjectID()
	e := ev(t, "orders", "orders", oid, 5, "paid", "audit")
	en := entry(t, e, "billing", deadletter.KindFailed)
	if en.ID != e.ID+"/billing" || en.ID != deadletter.EntryID(e.ID, "billing") {
		t.Errorf("ID = %q", en.ID)
	}
	if en.Kind != deadletter.KindFailed || en.EventID != e.ID || en.Source != "orders" || en.Sink != "billing" ||
		en.Operation != "update" || en.Namespace != "shop.orders" || en.ClusterTime != e.ClusterTime {
		t.Errorf("EntryFor = %+v", en)
	}
	if !slices.Equal(en.Rules, []string{"paid", "audit"}) {
		t.Errorf("Rules = %v", en.Rules)
	}
	e.Rules[0] = "changed"
	if en.Rules[0] != "paid" {
		t.Error("Rules shares the event's slice")
	}
	if !bytes.Equal(en.DocumentKey, docKey(t, oid)) || !bytes.Equal(en.Change, e.Raw) {
		t.Error("DocumentKey or Change differ from the event")
	}
	// The envelope is stored as a document with BSON types restored from
	// the relaxed Extended JSON.
	if got := en.Envelope.Lookup("id").StringValue(); got != e.ID {
		t.Errorf("envelope id = %q", got)
	}
	if got := en.Envelope.Lookup("documentKey", "_id").ObjectID(); got != oid {
		t.Errorf("envelope documentKey._id = %v, want %v", got, oid)
	}
	if got := en.Envelope.Lookup("fullDocument", "total").Double(); got != 120.5 {
		t.Errorf("envelope fullDocument.total = %v", got)
	}
	if _, err := deadletter.EntryFor(e, "billing", deadletter.KindGap); err == nil {
		t.Error("EntryFor with KindGap: no error")
	}
}

func TestPutGet(t *testing.T) {
	s, ctx := newStore(t)
	if _, ok, err := s.Get(ctx, "nope"); ok || err != nil {
		t.Fatalf("Get missing = %v, %v", ok, err)
	}
	e := ev(t, "orders", "orders", 42, 1, "paid")
	en := entry(t, e, "billing", deadletter.KindFailed)
	en.Attempts = 8
	en.Reason = "exhausted"
	en.FirstError, en.LastError = "http 503", "http 502"
	en.FirstFailedAt = base
	en.LastFailedAt = base.Add(time.Minute)
	en.CreatedAt = base.Add(time.Minute + time.Millisecond).In(time.FixedZone("x", 7200))
	put(t, ctx, s, en)

	got, ok, err := s.Get(ctx, en.ID)
	if err != nil || !ok {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	if got.ID != en.ID || got.Kind != en.Kind || got.EventID != en.EventID || got.Source != en.Source ||
		got.Sink != en.Sink || !slices.Equal(got.Rules, en.Rules) || got.Operation != en.Operation ||
		got.Namespace != en.Namespace || got.ClusterTime != en.ClusterTime || got.Attempts != 8 ||
		got.Reason != "exhausted" || got.FirstError != "http 503" || got.LastError != "http 502" {
		t.Errorf("Get = %+v\nwant %+v", got, en)
	}
	for name, pair := range map[string][2]time.Time{
		"FirstFailedAt": {got.FirstFailedAt, en.FirstFailedAt},
		"LastFailedAt":  {got.LastFailedAt, en.LastFailedAt},
		"CreatedAt":     {got.CreatedAt, en.CreatedAt},
	} {
		if !pair[0].Equal(pair[1]) || pair[0].Location() != time.UTC {
			t.Errorf("%s = %v, want %v in UTC", name, pair[0], pair[1])
		}
	}
	if !bytes.Equal(got.Change, e.Raw) || !bytes.Equal(got.DocumentKey, e.DocumentKey) || !bytes.Equal(got.Envelope, en.Envelope) {
		t.Error("raw documents did not round-trip")
	}
	re, err := got.Event()
	if err != nil {
		t.Fatalf("Event: %v", err)
	}
	if re.ID != e.ID || re.OperationType != "update" || !slices.Equal(re.Rules, []string{"paid"}) {
		t.Errorf("rebuilt event = %+v", re)
	}
	envA, _ := e.Envelope(false)
	envB, _ := re.Envelope(false)
	if !bytes.Equal(envA, envB) {
		t.Errorf("rebuilt envelope differs:\n%s\n%s", envA, envB)
	}

	// Defaults: times are filled with now, FirstError with LastError.
	before := time.Now().Add(-time.Second)
	en2 := entry(t, ev(t, "orders", "orders", 43, 2), "billing", deadletter.KindFailed)
	en2.LastError = "http 400"
	put(t, ctx, s, en2)
	got, _, err = s.Get(ctx, en2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.FirstError != "http 400" || got.CreatedAt.Before(before) || got.FirstFailedAt.Before(before) || got.LastFailedAt.Before(before) {
		t.Errorf("defaults not applied: %+v", got)
	}
}

func TestPutIdempotent(t *testing.T) {
	s, ctx := newStore(t)
	en := entry(t, ev(t, "orders", "orders", 1, 1), "billing", deadletter.KindFailed)
	en.Attempts, en.Reason = 3, "exhausted"
	en.FirstError, en.LastError = "first", "third"
	en.FirstFailedAt, en.LastFailedAt, en.CreatedAt = base, base.Add(time.Second), base.Add(time.Second)
	put(t, ctx, s, en)

	// The same event and sink after a crash: a new round of attempts.
	again := en
	again.Attempts, again.Reason = 2, "http_400"
	again.FirstError, again.LastError = "again first", "again last"
	again.FirstFailedAt, again.LastFailedAt, again.CreatedAt = base.Add(time.Hour), base.Add(time.Hour+time.Second), base.Add(time.Hour)
	put(t, ctx, s, again)

	got, _, err := s.Get(ctx, en.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempts != 5 {
		t.Errorf("Attempts = %d, want 5", got.Attempts)
	}
	if !got.CreatedAt.Equal(en.CreatedAt) || !got.FirstFailedAt.Equal(en.FirstFailedAt) || got.FirstError != "first" {
		t.Errorf("first fields not kept: createdAt %v firstFailedAt %v firstError %q", got.CreatedAt, got.FirstFailedAt, got.FirstError)
	}
	if !got.LastFailedAt.Equal(again.LastFailedAt) || got.LastError != "again last" || got.Reason != "http_400" {
		t.Errorf("last fields not updated: %+v", got)
	}
	if n, err := s.Count(ctx, deadletter.Filter{}); err != nil || n != 1 {
		t.Errorf("Count = %d, %v; want 1", n, err)
	}
}

// fixture stores a set of entries with distinct createdAt times (entry i
// created at base+i minutes) and returns them by name.
func fixture(t *testing.T, ctx context.Context, s *deadletter.Store) map[string]deadletter.Entry {
	t.Helper()
	specs := []struct {
		name         string
		source, sink string
		doc          int
		kind         deadletter.Kind
		order        int64
	}{
		{"s1-a-1", "s1", "a", 1, deadletter.KindFailed, 0},
		{"s1-b-1", "s1", "b", 1, deadletter.KindFailed, 0},
		{"s2-a-2", "s2", "a", 2, deadletter.KindFailed, 0},
		{"s1-a-3p", "s1", "a", 3, deadletter.KindParked, 20},
		{"s1-a-4p", "s1", "a", 4, deadletter.KindParked, 10},
		{"s2-b-5", "s2", "b", 5, deadletter.KindFailed, 0},
		{"s1-b-6p", "s1", "b", 6, deadletter.KindParked, 5},
	}
	out := map[string]deadletter.Entry{}
	for i, sp := range specs {
		en := entry(t, ev(t, sp.source, "orders", sp.doc, uint32(i+1)), sp.sink, sp.kind)
		en.CreatedAt = base.Add(time.Duration(i) * time.Minute)
		en.Order = sp.order
		en.Attempts = 1
		put(t, ctx, s, en)
		out[sp.name] = en
	}
	gap := deadletter.Entry{
		Kind: deadletter.KindGap, Source: "s2", Reason: "history_lost",
		GapFrom: base.Add(-time.Hour), GapTo: base.Add(-time.Minute),
		LastToken: docKey(t, "tok"), CreatedAt: base.Add(30 * time.Second),
	}
	gap.ID = deadletter.GapID("s2", gap.GapFrom)
	put(t, ctx, s, gap)
	out["gap"] = gap
	return out
}

func TestListFilters(t *testing.T) {
	s, ctx := newStore(t)
	fx := fixture(t, ctx, s)
	id := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, fx[n].ID)
		}
		return out
	}
	tests := []struct {
		name string
		f    deadletter.Filter
		want []string
	}{
		{"all newest first", deadletter.Filter{}, id("s1-b-6p", "s2-b-5", "s1-a-4p", "s1-a-3p", "s2-a-2", "s1-b-1", "gap", "s1-a-1")},
		{"failed", deadletter.Filter{Kind: deadletter.KindFailed}, id("s2-b-5", "s2-a-2", "s1-b-1", "s1-a-1")},
		// Stream order (cluster time), whatever the legacy order says.
		{"parked in stream order", deadletter.Filter{Kind: deadletter.KindParked}, id("s1-a-3p", "s1-a-4p", "s1-b-6p")},
		{"parked of sink a in stream order", deadletter.Filter{Kind: deadletter.KindParked, Sink: "a"}, id("s1-a-3p", "s1-a-4p")},
		{"gap", deadletter.Filter{Kind: deadletter.KindGap}, id("gap")},
		{"sink", deadletter.Filter{Sink: "b"}, id("s1-b-6p", "s2-b-5", "s1-b-1")},
		{"source", deadletter.Filter{Source: "s2"}, id("s2-b-5", "s2-a-2", "gap")},
		{"failed sink source", deadletter.Filter{Kind: deadletter.KindFailed, Sink: "a", Source: "s1"}, id("s1-a-1")},
		{"since", deadletter.Filter{Since: base.Add(4 * time.Minute)}, id("s1-b-6p", "s2-b-5", "s1-a-4p")},
		{"until", deadletter.Filter{Until: base.Add(time.Minute)}, id("gap", "s1-a-1")},
		{"since until", deadletter.Filter{Since: base.Add(time.Minute), Until: base.Add(3 * time.Minute)}, id("s2-a-2", "s1-b-1")},
		{"document key", deadletter.Filter{DocumentKey: docKey(t, 1)}, id("s1-b-1", "s1-a-1")},
		{"document key and sink", deadletter.Filter{DocumentKey: docKey(t, 1), Sink: "a"}, id("s1-a-1")},
		{"document key of another type", deadletter.Filter{DocumentKey: docKey(t, "1")}, nil},
		{"ids", deadletter.Filter{IDs: id("s1-a-1", "gap", "s2-b-5")}, id("s2-b-5", "gap", "s1-a-1")},
		{"empty ids", deadletter.Filter{IDs: []string{}}, nil},
		{"limit", deadletter.Filter{Kind: deadletter.KindFailed, Limit: 2}, id("s2-b-5", "s2-a-2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.List(ctx, tt.f)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if !slices.Equal(ids(got), tt.want) {
				t.Errorf("List = %v\nwant %v", ids(got), tt.want)
			}
			n, err := s.Count(ctx, tt.f)
			if err != nil {
				t.Fatalf("Count: %v", err)
			}
			if n != int64(len(tt.want)) {
				t.Errorf("Count = %d, want %d", n, len(tt.want))
			}
		})
	}
}

func TestListPaging(t *testing.T) {
	s, ctx := newStore(t)
	fx := fixture(t, ctx, s)
	// Two entries created at the same instant page by _id.
	twin := entry(t, ev(t, "s1", "orders", 99, 99), "a", deadletter.KindFailed)
	twin.CreatedAt = fx["s2-b-5"].CreatedAt
	put(t, ctx, s, twin)

	for _, f := range []deadletter.Filter{{}, {Kind: deadletter.KindFailed}, {Kind: deadletter.KindParked}, {Sink: "a"}} {
		t.Run(fmt.Sprintf("%+v", f), func(t *testing.T) {
			all, err := s.List(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			var paged []string
			pf := f
			pf.Limit = 2
			for pages := 0; ; pages++ {
				if pages > 10 {
					t.Fatal("paging does not end")
				}
				page, err := s.List(ctx, pf)
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					break
				}
				paged = append(paged, ids(page)...)
				pf.AfterID = page[len(page)-1].ID
			}
			if !slices.Equal(paged, ids(all)) {
				t.Errorf("pages = %v\nall   = %v", paged, ids(all))
			}
		})
	}
	if _, err := s.List(ctx, deadletter.Filter{AfterID: "gone"}); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("List after a missing id = %v, want ErrNotFound", err)
	}
}

func TestPutManyOrder(t *testing.T) {
	s, ctx := newStore(t)
	var es []deadletter.Entry
	for i := range 50 {
		en := entry(t, ev(t, "orders", "orders", i%7, uint32(i+1)), "slow", deadletter.KindParked)
		en.Order = int64(1000 + i)
		en.Reason = "parked"
		es = append(es, en)
	}
	if err := s.PutMany(ctx, es); err != nil {
		t.Fatalf("PutMany: %v", err)
	}
	if err := s.PutMany(ctx, nil); err != nil {
		t.Fatalf("PutMany(nil): %v", err)
	}
	got, err := s.List(ctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(got), ids(es)) {
		t.Errorf("parked order = %v\nwant %v", ids(got), ids(es))
	}
	// Re-parking the same events (after a crash) does not duplicate them.
	if err := s.PutMany(ctx, es[:10]); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Count(ctx, deadletter.Filter{Kind: deadletter.KindParked}); err != nil || n != 50 {
		t.Errorf("Count = %d, %v; want 50", n, err)
	}
	if got, _ := s.List(ctx, deadletter.Filter{Kind: deadletter.KindParked, Sink: "slow"}); !slices.Equal(ids(got), ids(es)) {
		t.Errorf("after re-parking, parked order = %v\nwant %v", ids(got), ids(es))
	}
	// An invalid entry is refused before anything is written.
	bad := []deadletter.Entry{entry(t, ev(t, "orders", "orders", 1, 100), "slow", deadletter.KindParked), {ID: "x", Kind: "weird"}}
	if err := s.PutMany(ctx, bad); err == nil {
		t.Error("PutMany with an invalid kind: no error")
	}
	if _, ok, _ := s.Get(ctx, bad[0].ID); ok {
		t.Error("PutMany wrote entries of a refused batch")
	}
}

func TestCountBySink(t *testing.T) {
	s, ctx := newStore(t)
	fixture(t, ctx, s)
	tests := []struct {
		kind deadletter.Kind
		want map[string]int64
	}{
		{deadletter.KindFailed, map[string]int64{"a": 2, "b": 2}},
		{deadletter.KindParked, map[string]int64{"a": 2, "b": 1}},
		{deadletter.KindGap, map[string]int64{"": 1}},
		{"", map[string]int64{"a": 4, "b": 3, "": 1}},
	}
	for _, tt := range tests {
		got, err := s.CountBySink(ctx, tt.kind)
		if err != nil {
			t.Fatalf("CountBySink(%q): %v", tt.kind, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("CountBySink(%q) = %v, want %v", tt.kind, got, tt.want)
		}
	}
}

func TestDeletePurge(t *testing.T) {
	s, ctx := newStore(t)
	fx := fixture(t, ctx, s)
	if ok, err := s.Delete(ctx, fx["s1-a-1"].ID); err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if ok, err := s.Delete(ctx, fx["s1-a-1"].ID); err != nil || ok {
		t.Fatalf("second Delete = %v, %v", ok, err)
	}
	n, err := s.Purge(ctx, deadletter.Filter{Kind: deadletter.KindFailed, Sink: "b"})
	if err != nil || n != 2 {
		t.Fatalf("Purge failed/b = %d, %v; want 2", n, err)
	}
	// With a limit, the first entries in List order go.
	n, err = s.Purge(ctx, deadletter.Filter{Kind: deadletter.KindParked, Limit: 2})
	if err != nil || n != 2 {
		t.Fatalf("Purge parked limit 2 = %d, %v; want 2", n, err)
	}
	left, err := s.List(ctx, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{fx["s1-b-6p"].ID, fx["s2-a-2"].ID, fx["gap"].ID}; !slices.Equal(ids(left), want) {
		t.Errorf("left = %v, want %v", ids(left), want)
	}
	n, err = s.Purge(ctx, deadletter.Filter{Since: base.Add(-time.Hour)})
	if err != nil || n != 3 {
		t.Fatalf("Purge since = %d, %v; want 3", n, err)
	}
	if n, err := s.Purge(ctx, deadletter.Filter{}); err != nil || n != 0 {
		t.Fatalf("Purge empty store = %d, %v", n, err)
	}
}

// A re-park never moves an entry: its place is its change's position, not
// the time of the write; a later write with another Order keeps the first
// one. Every write draws a new version, and DeleteVersion deletes only the
// version it names, so a re-drive cannot delete a re-park written after it
// read the entry.
func TestReparkKeepsPlaceAndDeleteVersion(t *testing.T) {
	s, ctx := newStore(t)
	var es []deadletter.Entry
	for i := range 3 {
		en := entry(t, ev(t, "orders", "orders", 1, uint32(10+i)), "slow", deadletter.KindParked)
		en.Order = int64(100 - i) // legacy orders, against stream order: ignored
		es = append(es, en)
	}
	// Written newest first, as a re-read after a restart can.
	put(t, ctx, s, es[2], es[1], es[0])
	first, err := s.List(ctx, deadletter.Filter{Kind: deadletter.KindParked})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(first), ids(es)) {
		t.Fatalf("parked order = %v, want stream order %v", ids(first), ids(es))
	}
	// Re-park the middle one with a different legacy order.
	again := es[1]
	again.Order = -5
	put(t, ctx, s, again)
	got, _, _ := s.Get(ctx, es[1].ID)
	if got.Order != first[1].Order {
		t.Errorf("re-park moved the entry: order %d, want %d", got.Order, first[1].Order)
	}
	if got.Version == first[1].Version || got.Version == 0 {
		t.Errorf("re-park kept version %d (was %d): a re-drive could delete it", got.Version, first[1].Version)
	}
	// The re-drive read version first[1]; the entry was written again since.
	if ok, err := s.DeleteVersion(ctx, es[1].ID, first[1].Version); err != nil || ok {
		t.Fatalf("DeleteVersion of a superseded version = %v, %v; want false", ok, err)
	}
	if ok, err := s.DeleteVersion(ctx, es[1].ID, got.Version); err != nil || !ok {
		t.Fatalf("DeleteVersion of the current version = %v, %v; want true", ok, err)
	}
	// A failed entry is never deleted by a re-drive's DeleteVersion.
	failed := entry(t, ev(t, "orders", "orders", 2, 20), "slow", deadletter.KindFailed)
	put(t, ctx, s, failed)
	f, _, _ := s.Get(ctx, failed.ID)
	if ok, err := s.DeleteVersion(ctx, failed.ID, f.Version); err != nil || ok {
		t.Fatalf("DeleteVersion of a failed entry = %v, %v; want false", ok, err)
	}
	// RetryAt round-trips and is cleared by a write without it.
	at := base.Add(time.Minute)
	withRA := es[0]
	withRA.RetryAt = at
	put(t, ctx, s, withRA)
	if g, _, _ := s.Get(ctx, es[0].ID); !g.RetryAt.Equal(at) {
		t.Errorf("RetryAt = %v, want %v", g.RetryAt, at)
	}
	put(t, ctx, s, es[0])
	if g, _, _ := s.Get(ctx, es[0].ID); !g.RetryAt.IsZero() {
		t.Errorf("RetryAt = %v after a write without it, want zero", g.RetryAt)
	}
}

func TestConvert(t *testing.T) {
	s, ctx := newStore(t)
	en := entry(t, ev(t, "orders", "orders", 1, 1), "slow", deadletter.KindParked)
	en.Order, en.Attempts, en.Reason, en.LastError = 7, 2, "parked", "http 503"
	en.CreatedAt, en.FirstFailedAt, en.LastFailedAt = base, base, base
	put(t, ctx, s, en)

	before := time.Now().Add(-time.Second)
	if err := s.Convert(ctx, en.ID, deadletter.KindFailed, "exhausted", "http 500"); err != nil {
		t.Fatalf("Convert: %v", err)
	}
	got, _, err := s.Get(ctx, en.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != deadletter.KindFailed || got.Reason != "exhausted" || got.LastError != "http 500" ||
		got.Attempts != 2 || !got.CreatedAt.Equal(base) || got.LastFailedAt.Before(before) {
		t.Errorf("after Convert: %+v", got)
	}
	if l, _ := s.List(ctx, deadletter.Filter{Kind: deadletter.KindParked}); len(l) != 0 {
		t.Errorf("still parked: %v", ids(l))
	}
	// Empty reason and error keep the stored ones.
	if err := s.Convert(ctx, en.ID, deadletter.KindParked, "", ""); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, en.ID); got.Kind != deadletter.KindParked || got.Reason != "exhausted" || got.LastError != "http 500" {
		t.Errorf("after Convert back: %+v", got)
	}

	if err := s.Convert(ctx, "missing", deadletter.KindFailed, "x", "y"); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("Convert missing = %v, want ErrNotFound", err)
	}
	gap := deadletter.Entry{ID: "gap/x/1", Kind: deadletter.KindGap, Source: "x"}
	put(t, ctx, s, gap)
	if err := s.Convert(ctx, gap.ID, deadletter.KindFailed, "x", "y"); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("Convert gap = %v, want ErrNotFound", err)
	}
	if err := s.Convert(ctx, en.ID, deadletter.KindGap, "x", "y"); err == nil {
		t.Error("Convert to gap: no error")
	}
}

type delivery struct{ sink, event string }

func TestReplay(t *testing.T) {
	s, ctx := newStore(t)
	// Failed entries written out of stream order; doc 1 has three changes
	// for sink a, the first of which keeps failing.
	type spec struct {
		sink string
		doc  int
		ct   uint32
	}
	specs := []spec{
		{"a", 1, 30}, {"b", 2, 20}, {"a", 1, 10}, {"a", 3, 25}, {"a", 1, 40}, {"b", 1, 15},
	}
	byCT := map[uint32]deadletter.Entry{}
	for i, sp := range specs {
		en := entry(t, ev(t, "orders", "orders", sp.doc, sp.ct, "r"), sp.sink, deadletter.KindFailed)
		en.Attempts, en.LastError = 8, "http 503"
		en.CreatedAt = base.Add(time.Duration(i) * time.Second)
		put(t, ctx, s, en)
		byCT[sp.ct] = en
	}
	// Not replayed: a parked entry and a gap.
	parked := entry(t, ev(t, "orders", "orders", 9, 5), "a", deadletter.KindParked)
	put(t, ctx, s, parked, deadletter.Entry{ID: "gap/orders/1", Kind: deadletter.KindGap, Source: "orders", GapFrom: base, GapTo: base.Add(time.Hour)})

	var got []delivery
	failing := byCT[10].EventID
	deliver := func(_ context.Context, sink string, e *event.Event) error {
		if !slices.Equal(e.Rules, []string{"r"}) {
			t.Errorf("event %s rules = %v", e.ID, e.Rules)
		}
		got = append(got, delivery{sink, e.ID})
		if e.ID == failing && sink == "a" {
			return errors.New("http 500")
		}
		return nil
	}
	res, err := s.Replay(ctx, deadletter.Filter{}, deliver)
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	// Stream order; doc 1 on sink a stops at its failed first change.
	want := []delivery{
		{"a", byCT[10].EventID}, {"b", byCT[15].EventID}, {"b", byCT[20].EventID}, {"a", byCT[25].EventID},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("deliveries = %v\nwant %v", got, want)
	}
	if res.Replayed != 3 || res.Failed != 1 || res.Skipped != 3 {
		t.Errorf("result = %+v, want 3 replayed, 1 failed, 3 skipped (2 held back, 1 gap)", res)
	}
	var held int
	for _, e := range res.Errors {
		if errors.Is(e, deadletter.ErrHeldBack) {
			held++
		}
	}
	if len(res.Errors) != 3 || held != 2 {
		t.Errorf("errors = %v", res.Errors)
	}

	left, err := s.List(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{byCT[40].ID, byCT[10].ID, byCT[30].ID}; fmt.Sprint(sortedIDs(left)) != fmt.Sprint(sortedStrings(want)) {
		t.Errorf("left = %v, want %v", ids(left), want)
	}
	f, _, _ := s.Get(ctx, byCT[10].ID)
	if f.Attempts != 9 || f.LastError != "http 500" {
		t.Errorf("failed again: attempts %d lastError %q; want 9, http 500", f.Attempts, f.LastError)
	}
	if h, _, _ := s.Get(ctx, byCT[30].ID); h.Attempts != 8 || h.LastError != "http 503" {
		t.Errorf("held back entry changed: %+v", h)
	}
	if _, ok, _ := s.Get(ctx, parked.ID); !ok {
		t.Error("parked entry was replayed")
	}

	// The receiver recovers: the rest goes in order.
	got, failing = nil, ""
	res, err = s.Replay(ctx, deadletter.Filter{Kind: deadletter.KindFailed, Sink: "a"}, deliver)
	if err != nil {
		t.Fatal(err)
	}
	want = []delivery{{"a", byCT[10].EventID}, {"a", byCT[30].EventID}, {"a", byCT[40].EventID}}
	if fmt.Sprint(got) != fmt.Sprint(want) || res.Replayed != 3 || res.Failed != 0 || res.Skipped != 0 {
		t.Errorf("second replay: %+v, deliveries %v", res, got)
	}
	if n, _ := s.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed}); n != 0 {
		t.Errorf("%d failed entries left", n)
	}

	// Gaps only: nothing delivered, all skipped; parked: refused.
	got = nil
	res, err = s.Replay(ctx, deadletter.Filter{Kind: deadletter.KindGap}, deliver)
	if err != nil || res.Skipped != 1 || len(got) != 0 {
		t.Errorf("gap replay = %+v, %v, deliveries %v", res, err, got)
	}
	if _, err := s.Replay(ctx, deadletter.Filter{Kind: deadletter.KindParked}, deliver); err == nil {
		t.Error("replay of parked entries: no error")
	}
}

func TestReplayLimitAndCancel(t *testing.T) {
	s, ctx := newStore(t)
	for i := range 5 {
		put(t, ctx, s, entry(t, ev(t, "orders", "orders", i, uint32(i+1)), "a", deadletter.KindFailed))
	}
	n := 0
	res, err := s.Replay(ctx, deadletter.Filter{Limit: 2}, func(context.Context, string, *event.Event) error { n++; return nil })
	if err != nil || res.Replayed != 2 || n != 2 {
		t.Fatalf("limited replay = %+v, %v (%d deliveries)", res, err, n)
	}
	cctx, cancel := context.WithCancel(ctx)
	res, err = s.Replay(cctx, deadletter.Filter{}, func(ctx context.Context, _ string, _ *event.Event) error {
		cancel()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || res.Replayed != 0 || res.Failed != 0 {
		t.Fatalf("cancelled replay = %+v, %v", res, err)
	}
	if c, _ := s.Count(ctx, deadletter.Filter{}); c != 3 {
		t.Errorf("%d entries left, want 3", c)
	}
}

func TestOversize(t *testing.T) {
	s, ctx := newStore(t)
	e := ev(t, "orders", "orders", 1, 1)
	en := entry(t, e, "a", deadletter.KindFailed)
	// Change and envelope together too large: the envelope is left out.
	en.Change = bigChange(t, e.Raw, 9<<20)
	en.Envelope = bigChange(t, en.Envelope, 9<<20)
	put(t, ctx, s, en)
	got, _, err := s.Get(ctx, en.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Envelope) != 0 || !bytes.Equal(got.Change, en.Change) || got.ChangeDropped {
		t.Errorf("envelope %d bytes, change %d bytes, dropped %v", len(got.Envelope), len(got.Change), got.ChangeDropped)
	}
	// A change too large on its own is left out; the entry is still recorded.
	en2 := entry(t, ev(t, "orders", "orders", 2, 2), "a", deadletter.KindFailed)
	en2.Change = bigChange(t, en2.Change, 17<<20)
	put(t, ctx, s, en2)
	got, _, err = s.Get(ctx, en2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.ChangeDropped || len(got.Change) != 0 || len(got.Envelope) == 0 {
		t.Errorf("change dropped %v, change %d bytes, envelope %d bytes", got.ChangeDropped, len(got.Change), len(got.Envelope))
	}
	res, err := s.Replay(ctx, deadletter.Filter{IDs: []string{en2.ID}}, func(context.Context, string, *event.Event) error {
		t.Error("entry without its change was delivered")
		return nil
	})
	if err != nil || res.Skipped != 1 || len(res.Errors) != 1 || !errors.Is(res.Errors[0], deadletter.ErrNotReplayable) {
		t.Errorf("replay of dropped change = %+v, %v", res, err)
	}
}

// bigChange returns doc with a padding field that makes it about n bytes.
func bigChange(t *testing.T, doc bson.Raw, n int) bson.Raw {
	t.Helper()
	var d bson.D
	if err := bson.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	d = append(d, bson.E{Key: "padding", Value: strings.Repeat("x", n)})
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEnsureIndexesIdempotent(t *testing.T) {
	ctx := testCtx(t)
	db := testDB(t)
	s := deadletter.NewStore(db, "dl")
	for range 2 {
		if err := s.EnsureIndexes(ctx); err != nil {
			t.Fatalf("EnsureIndexes: %v", err)
		}
	}
	specs, err := db.Collection("dl").Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sp := range specs {
		names = append(names, sp.Name)
	}
	slices.Sort(names)
	want := []string{"_id_", "createdAt_id", "documentKey_id", "kind_clusterTime_order_id", "kind_sink_clusterTime_order_id", "kind_sink_createdAt_id", "kind_source_createdAt_id"}
	if !slices.Equal(names, want) {
		t.Errorf("indexes = %v, want %v", names, want)
	}
}

func TestMarshalJSON(t *testing.T) {
	oid, _ := bson.ObjectIDFromHex("65a1b2c3d4e5f60718293a4b")
	e := ev(t, "orders", "orders", oid, 1, "paid")
	en := entry(t, e, "billing", deadletter.KindFailed)
	en.Attempts, en.Reason, en.LastError = 3, "http_400", "http 400: bad <request>"
	en.CreatedAt = time.Date(2026, 11, 22, 11, 0, 0, 0, time.FixedZone("CET", 3600))
	b, err := json.Marshal(en)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if got := fmt.Sprint(m["documentKey"]); got != "map[_id:map[$oid:65a1b2c3d4e5f60718293a4b]]" {
		t.Errorf("documentKey = %s", got)
	}
	if m["createdAt"] != "2026-11-22T10:00:00Z" {
		t.Errorf("createdAt = %v", m["createdAt"])
	}
	if got := fmt.Sprint(m["clusterTime"]); got != "map[$timestamp:map[i:1 t:1.795000001e+09]]" {
		t.Errorf("clusterTime = %s", got)
	}
	if m["lastError"] != "http 400: bad <request>" || m["kind"] != "failed" || m["attempts"] != 3.0 {
		t.Errorf("JSON = %s", b)
	}
	change, _ := m["change"].(map[string]any)
	env, _ := m["envelope"].(map[string]any)
	if change["operationType"] != "update" || env["id"] != e.ID {
		t.Errorf("change/envelope not rendered as objects: %s", b)
	}
	for _, absent := range []string{"gapFrom", "gapTo", "lastToken", "firstFailedAt", "changeDropped"} {
		if _, ok := m[absent]; ok {
			t.Errorf("zero field %s rendered: %s", absent, b)
		}
	}
}

func sortedIDs(es []deadletter.Entry) []string { return sortedStrings(ids(es)) }

func sortedStrings(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestJSONRoundTrip(t *testing.T) {
	oid := bson.NewObjectID()
	en := entry(t, ev(t, "orders", "orders", oid, 3, "paid"), "billing", deadletter.KindParked)
	en.Attempts, en.Order, en.Reason = 2, 77, "parked"
	en.FirstError, en.LastError = "a", "b"
	en.CreatedAt, en.FirstFailedAt, en.LastFailedAt = base, base, base.Add(time.Second)
	gap := deadletter.Entry{ID: "gap/orders/x", Kind: deadletter.KindGap, Source: "orders",
		GapFrom: base, GapTo: base.Add(time.Hour), LastToken: docKey(t, "tok"), CreatedAt: base}
	for _, want := range []deadletter.Entry{en, gap, en.Summary()} {
		b, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var got deadletter.Entry
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		b2, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, b2) {
			t.Errorf("round trip differs:\n%s\n%s", b, b2)
		}
		if !bytes.Equal(got.Change, want.Change) || !bytes.Equal(got.DocumentKey, want.DocumentKey) ||
			!bytes.Equal(got.LastToken, want.LastToken) || got.ClusterTime != want.ClusterTime || !got.GapTo.Equal(want.GapTo) {
			t.Errorf("decoded %+v\nwant %+v", got, want)
		}
	}
	if s := en.Summary(); s.Change != nil || s.Envelope != nil || s.ID != en.ID {
		t.Errorf("Summary = %+v", s)
	}
}

func TestInvalidFilter(t *testing.T) {
	s, ctx := newStore(t)
	fixture(t, ctx, s)
	for _, f := range []deadletter.Filter{
		{Kind: "weird"},
		{DocumentKey: bson.Raw{}},
		{DocumentKey: bson.Raw{1, 2, 3}},
	} {
		if _, err := s.Purge(ctx, f); err == nil {
			t.Errorf("Purge(%+v): no error", f)
		}
		if _, err := s.List(ctx, f); err == nil {
			t.Errorf("List(%+v): no error", f)
		}
		if _, err := s.Count(ctx, f); err == nil {
			t.Errorf("Count(%+v): no error", f)
		}
		if _, err := s.Replay(ctx, f, func(context.Context, string, *event.Event) error { return nil }); err == nil {
			t.Errorf("Replay(%+v): no error", f)
		}
	}
	if n, err := s.Count(ctx, deadletter.Filter{}); err != nil || n != 8 {
		t.Errorf("Count = %d, %v; want 8 (nothing purged)", n, err)
	}
}

// TestDocumentKeyIsLiteral: a document key is matched literally ($eq), and
// one that holds a query operator is refused by every method before it
// reaches MongoDB, so {"_id": {"$ne": null}} can neither list nor purge
// everything.
func TestDocumentKeyIsLiteral(t *testing.T) {
	s, ctx := newStore(t)
	fixture(t, ctx, s)
	// An entry whose _id is itself a document matches only that document.
	nested := entry(t, ev(t, "s1", "orders", bson.D{{Key: "a", Value: 1}, {Key: "b", Value: 2}}, 50), "a", deadletter.KindFailed)
	put(t, ctx, s, nested)
	if es, err := s.List(ctx, deadletter.Filter{DocumentKey: docKey(t, bson.D{{Key: "a", Value: 1}, {Key: "b", Value: 2}})}); err != nil || len(es) != 1 || es[0].ID != nested.ID {
		t.Fatalf("literal embedded key: %v %v", ids(es), err)
	}
	if es, err := s.List(ctx, deadletter.Filter{DocumentKey: docKey(t, bson.D{{Key: "a", Value: 1}})}); err != nil || len(es) != 0 {
		t.Fatalf("a part of an embedded key matched: %v %v", ids(es), err)
	}
	for _, key := range []bson.D{
		{{Key: "_id", Value: bson.D{{Key: "$ne", Value: nil}}}},
		{{Key: "_id", Value: bson.D{{Key: "$regex", Value: "."}}}},
		{{Key: "$where", Value: "true"}},
		{{Key: "_id", Value: bson.A{bson.D{{Key: "$gt", Value: 0}}}}},
		{{Key: "_id", Value: bson.D{{Key: "x", Value: bson.D{{Key: "$exists", Value: true}}}}}},
	} {
		raw, err := bson.Marshal(key)
		if err != nil {
			t.Fatal(err)
		}
		f := deadletter.Filter{DocumentKey: raw}
		var oe *deadletter.OperatorError
		if _, err := s.List(ctx, f); !errors.As(err, &oe) {
			t.Errorf("List(%v): %v, want an OperatorError", key, err)
		}
		if _, err := s.Purge(ctx, f); !errors.As(err, &oe) {
			t.Errorf("Purge(%v): %v, want an OperatorError", key, err)
		}
		if _, err := s.Count(ctx, f); !errors.As(err, &oe) {
			t.Errorf("Count(%v): %v, want an OperatorError", key, err)
		}
		if _, err := s.Replay(ctx, f, func(context.Context, string, *event.Event) error { return nil }); !errors.As(err, &oe) {
			t.Errorf("Replay(%v): %v, want an OperatorError", key, err)
		}
	}
	if n, err := s.Count(ctx, deadletter.Filter{}); err != nil || n != 9 {
		t.Errorf("Count = %d, %v; want 9 (nothing purged)", n, err)
	}
}

// TestConcurrentReplays: four replays at once deliver each entry once and
// report it replayed once; the others skip it as claimed, and hold back the
// later entries of its document meanwhile.
func TestConcurrentReplays(t *testing.T) {
	s, ctx := newStore(t)
	for i, doc := range []int{1, 2, 1} {
		put(t, ctx, s, entry(t, ev(t, "orders", "orders", doc, uint32(10+i)), "a", deadletter.KindFailed))
	}
	var mu sync.Mutex
	delivered := map[string]int{}
	var order []string
	deliver := func(_ context.Context, _ string, e *event.Event) error {
		time.Sleep(20 * time.Millisecond) // overlap
		mu.Lock()
		defer mu.Unlock()
		delivered[e.ID]++
		order = append(order, e.ID)
		return nil
	}
	var wg sync.WaitGroup
	results := make([]deadletter.ReplayResult, 4)
	for i := range results {
		wg.Go(func() {
			res, err := s.Replay(ctx, deadletter.Filter{}, deliver)
			if err != nil {
				t.Errorf("replay %d: %v", i, err)
			}
			results[i] = res
		})
	}
	wg.Wait()
	// Entries another replay still held are left for a later replay.
	for {
		res, err := s.Replay(ctx, deadletter.Filter{}, deliver)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
		if n, _ := s.Count(ctx, deadletter.Filter{}); n == 0 {
			break
		}
	}
	replayed := 0
	for _, r := range results {
		replayed += r.Replayed
		for _, err := range r.Errors {
			if !errors.Is(err, deadletter.ErrClaimed) && !errors.Is(err, deadletter.ErrHeldBack) {
				t.Errorf("unexpected error: %v", err)
			}
		}
	}
	if len(delivered) != 3 || replayed != 3 {
		t.Errorf("delivered %v, %d reported replayed; want 3 entries once each", delivered, replayed)
	}
	for id, n := range delivered {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	// Document 1's changes in stream order, whoever delivered them.
	var doc1 []string
	for _, id := range order {
		if id != ev(t, "orders", "orders", 2, 11).ID {
			doc1 = append(doc1, id)
		}
	}
	if want := []string{ev(t, "orders", "orders", 1, 10).ID, ev(t, "orders", "orders", 1, 12).ID}; !slices.Equal(doc1, want) {
		t.Errorf("document 1 delivered in order %v, want %v", doc1, want)
	}
}

// TestReplayHoldsBackBehindUndeliverable: an entry stored without its change
// and an entry claimed by another (live) replay hold back the later entries
// of their document; an expired claim (a replay that died) does not.
func TestReplayHoldsBackBehindUndeliverable(t *testing.T) {
	ctx := testCtx(t)
	db := testDB(t)
	s := deadletter.NewStore(db, "deadletters")
	dropped := entry(t, ev(t, "orders", "orders", 1, 10), "a", deadletter.KindFailed)
	dropped.Change = nil // as stored when the change was too large
	later := entry(t, ev(t, "orders", "orders", 1, 11), "a", deadletter.KindFailed)
	claimed := entry(t, ev(t, "orders", "orders", 2, 12), "a", deadletter.KindFailed)
	after := entry(t, ev(t, "orders", "orders", 2, 13), "a", deadletter.KindFailed)
	stale := entry(t, ev(t, "orders", "orders", 3, 14), "a", deadletter.KindFailed)
	put(t, ctx, s, dropped, later, claimed, after, stale)
	setClaim := func(id string, until time.Time) {
		if _, err := db.Collection("deadletters").UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "claim", Value: "other"}, {Key: "claimUntil", Value: until}}}}); err != nil {
			t.Fatal(err)
		}
	}
	setClaim(claimed.ID, time.Now().Add(time.Hour))
	setClaim(stale.ID, time.Now().Add(-time.Second))
	var got []string
	res, err := s.Replay(ctx, deadletter.Filter{}, func(_ context.Context, _ string, e *event.Event) error {
		got = append(got, e.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{stale.EventID}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want only %v", got, want)
	}
	if res.Replayed != 1 || res.Skipped != 4 {
		t.Errorf("result %+v, want 1 replayed, 4 skipped", res)
	}
	var held, claimedErr, notReplayable int
	for _, err := range res.Errors {
		switch {
		case errors.Is(err, deadletter.ErrHeldBack):
			held++
		case errors.Is(err, deadletter.ErrClaimed):
			claimedErr++
		case errors.Is(err, deadletter.ErrNotReplayable):
			notReplayable++
		}
	}
	if held != 2 || claimedErr != 1 || notReplayable != 1 {
		t.Errorf("errors %v", res.Errors)
	}
}

// TestExactDocumentKey: a key whose JSON cannot name it (invalid UTF-8
// becomes U+FFFD) is listed with its raw BSON (documentKeyBSON), which
// reads back losslessly and finds the entry; the JSON form does not.
func TestExactDocumentKey(t *testing.T) {
	s, ctx := newStore(t)
	odd := entry(t, ev(t, "s1", "orders", "a\xffb", 5), "a", deadletter.KindFailed)
	plain := entry(t, ev(t, "s1", "orders", 7, 6), "a", deadletter.KindFailed)
	put(t, ctx, s, odd, plain)
	if !deadletter.DocumentKeyLossy(odd.DocumentKey) || deadletter.DocumentKeyLossy(plain.DocumentKey) {
		t.Fatal("DocumentKeyLossy: want true for the invalid UTF-8 key only")
	}
	b, err := json.Marshal(odd.Summary())
	if err != nil {
		t.Fatal(err)
	}
	var back deadletter.Entry
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.DocumentKey, odd.DocumentKey) || !strings.Contains(string(b), `"documentKeyBSON":`) {
		t.Fatalf("round trip lost the key: %s", b)
	}
	if pb, _ := json.Marshal(plain.Summary()); strings.Contains(string(pb), "documentKeyBSON") {
		t.Errorf("a plain key carries its BSON too: %s", pb)
	}
	if es, err := s.List(ctx, deadletter.Filter{ExactDocumentKey: back.DocumentKey}); err != nil || len(es) != 1 || es[0].ID != odd.ID {
		t.Errorf("exact look-up: %v %v", ids(es), err)
	}
	if es, err := s.List(ctx, deadletter.Filter{DocumentKey: docKey(t, "a\ufffdb")}); err != nil || len(es) != 0 {
		t.Errorf("the U+FFFD form found %v (%v)", ids(es), err)
	}
	if es, err := s.List(ctx, deadletter.Filter{ExactDocumentKey: plain.DocumentKey}); err != nil || len(es) != 1 || es[0].ID != plain.ID {
		t.Errorf("exact look-up of a plain key: %v %v", ids(es), err)
	}
	if _, err := s.List(ctx, deadletter.Filter{ExactDocumentKey: docKey(t, bson.D{{Key: "$gt", Value: 1}})}); err == nil {
		t.Error("an operator in an exact key was accepted")
	}
}
