package deadletter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/sinks"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestTxnKept: an entry keeps its event's transaction metadata (index and
// last depend on the stream, not on the change alone), and Get, Event,
// Replay and the JSON form give it back; the replayed envelope is the
// original one, txn included.
func TestTxnKept(t *testing.T) {
	s, ctx := newStore(t)
	e := ev(t, "orders", "orders", 42, 1, "r")
	e.Txn = &event.Txn{ID: "0123456789abcdef0123456789abcdef", Index: 2, Last: true}
	en := entry(t, e, "billing", deadletter.KindFailed)
	en.LastError = "http 500"
	put(t, ctx, s, en)
	got, ok, err := s.Get(ctx, en.ID)
	if err != nil || !ok {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	if got.Txn == nil || *got.Txn != *e.Txn {
		t.Fatalf("stored txn = %+v, want %+v", got.Txn, e.Txn)
	}
	want, _ := e.Envelope(false)
	if !strings.Contains(string(want), `"txn":{"id":"0123456789abcdef0123456789abcdef","index":2,"last":true}`) {
		t.Fatalf("envelope without txn: %s", want)
	}
	re, err := got.Event()
	if err != nil {
		t.Fatal(err)
	}
	if env, _ := re.Envelope(false); !bytes.Equal(env, want) {
		t.Fatalf("rebuilt envelope\n%s\nwant\n%s", env, want)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var back deadletter.Entry
	if err := json.Unmarshal(b, &back); err != nil || back.Txn == nil || *back.Txn != *e.Txn {
		t.Fatalf("JSON round trip txn = %+v, %v (%s)", back.Txn, err, b)
	}
	var replayed []string
	if _, err := s.Replay(ctx, deadletter.Filter{}, func(_ context.Context, _ string, ev *event.Event) error {
		env, err := ev.Envelope(false)
		replayed = append(replayed, string(env))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(replayed) != 1 || replayed[0] != string(want) {
		t.Fatalf("replayed %q, want %s", replayed, want)
	}
}

// TestTxnUpgrade: an entry stored by the previous release (no txn field)
// reads back without txn and replays as that release delivered it.
func TestTxnUpgrade(t *testing.T) {
	db := testDB(t)
	ctx := testCtx(t)
	s := deadletter.NewStore(db, "deadletters")
	e := ev(t, "orders", "orders", 7, 3, "r")
	env, _ := e.Envelope(false)
	var envDoc bson.Raw
	if err := bson.UnmarshalExtJSON(env, false, &envDoc); err != nil {
		t.Fatal(err)
	}
	// The document as the previous release wrote it.
	old := bson.D{
		{Key: "_id", Value: e.ID + "/billing"}, {Key: "kind", Value: "failed"}, {Key: "eventId", Value: e.ID},
		{Key: "source", Value: "orders"}, {Key: "sink", Value: "billing"}, {Key: "unit", Value: "orders"},
		{Key: "rules", Value: bson.A{"r"}}, {Key: "operation", Value: "update"}, {Key: "namespace", Value: "shop.orders"},
		{Key: "documentKey", Value: e.DocumentKey}, {Key: "change", Value: e.Raw}, {Key: "envelope", Value: envDoc},
		{Key: "changeDropped", Value: false}, {Key: "shaped", Value: false}, {Key: "clusterTime", Value: e.ClusterTime},
		{Key: "attempts", Value: int64(8)}, {Key: "reason", Value: "exhausted"}, {Key: "lastError", Value: "http 503"},
		{Key: "firstFailedAt", Value: base}, {Key: "lastFailedAt", Value: base}, {Key: "createdAt", Value: base},
		{Key: "order", Value: int64(0)}, {Key: "ver", Value: int64(1)},
	}
	if _, err := db.Collection("deadletters").InsertOne(ctx, old); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Get(ctx, e.ID+"/billing")
	if err != nil || !ok {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	if got.Txn != nil {
		t.Fatalf("old entry has txn %+v", got.Txn)
	}
	re, err := got.Event()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := re.Envelope(false); !bytes.Equal(b, env) {
		t.Fatalf("old entry replays as\n%s\nwant\n%s", b, env)
	}
}

// TestReplayGroupedBudget: ReplayGrouped delivers the failed entries of one
// transaction to a grouped sink together, in txn.index order, and returns
// every byte; a sink that is not grouped gets them one at a time. With
// room for the whole transaction it is one group (no sinks.TxnPart); under
// a byte budget of one whole entry it goes in parts (issue 39), one entry
// each, numbered 1, 2, 3, the last marked, the budget never holding more
// than one entry (before, the later entries were charged without waiting
// and the group held them all).
func TestReplayGroupedBudget(t *testing.T) {
	for _, c := range []struct {
		name   string
		budget int64
		groups string
		parts  string
	}{
		{"room for all", 16 * deadletter.MaxEntryBytes, "[[0 1 2]]", "[<nil>]"},
		{"one entry", deadletter.MaxEntryBytes, "[[0] [1] [2]]", "[1 2 3+]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, ctx := newStore(t)
			for _, i := range []int{2, 0, 1} {
				e := ev(t, "orders", "orders", i, 5) // one transaction: one cluster time
				e.Txn = &event.Txn{ID: "0123456789abcdef0123456789abcdef", Index: i, Last: i == 2}
				put(t, ctx, s, entry(t, e, "g", deadletter.KindFailed), entry(t, e, "n", deadletter.KindFailed))
			}
			b := memory.NewBudget(c.budget, nil, nil)
			var singles []int
			var groups [][]int
			var parts []string
			res, err := s.ReplayGrouped(memory.WithBudget(ctx, b), deadletter.Filter{}, func(_ context.Context, sink string, e *event.Event) error {
				if sink != "n" {
					t.Errorf("single delivery to sink %s", sink)
				}
				singles = append(singles, e.Txn.Index)
				return nil
			}, deadletter.GroupDelivery{
				Grouped: func(sink string) bool { return sink == "g" },
				Deliver: func(ctx context.Context, sink string, evs []*event.Event) error {
					var idx []int
					for _, e := range evs {
						if e.Mem.Bytes() < int64(len(e.Raw)) {
							t.Errorf("grouped event charged %d bytes, its change is %d", e.Mem.Bytes(), len(e.Raw))
						}
						idx = append(idx, e.Txn.Index)
					}
					if b.InUse() > b.Limit() {
						t.Errorf("%d bytes held during a grouped replay in a budget of %d", b.InUse(), b.Limit())
					}
					groups = append(groups, idx)
					switch p := sinks.TxnPartOf(ctx); {
					case p == nil:
						parts = append(parts, "<nil>")
					case p.Final:
						parts = append(parts, fmt.Sprint(p.First, "+"))
						p.Used = 1
					default:
						parts = append(parts, fmt.Sprint(p.First))
						p.Used = 1
					}
					return nil
				},
			})
			if err != nil || res.Replayed != 6 {
				t.Fatalf("ReplayGrouped = %+v, %v", res, err)
			}
			if fmt.Sprint(groups) != c.groups || fmt.Sprint(parts) != c.parts || fmt.Sprint(singles) != "[0 1 2]" {
				t.Fatalf("groups %v (parts %v), singles %v; want groups %s (parts %s)", groups, parts, singles, c.groups, c.parts)
			}
			if n, err := s.Count(ctx, deadletter.Filter{}); err != nil || n != 0 {
				t.Fatalf("%d entries left, %v", n, err)
			}
			if b.InUse() != 0 {
				t.Fatalf("%d bytes still charged", b.InUse())
			}
		})
	}
}
