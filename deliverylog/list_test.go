package deliverylog_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deliverylog"
)

// records returns n records over two sinks, rules and sources, one a
// second from t0, with outcomes, attempts and durations by index.
func records(t *testing.T, n int, t0 time.Time) []deliverylog.Record {
	outcomes := []deliverylog.Outcome{deliverylog.OutcomeRetrying, deliverylog.OutcomeDeadLettered, deliverylog.OutcomeParked, deliverylog.OutcomeDelivered, deliverylog.OutcomeSkipped}
	var recs []deliverylog.Record
	for i := range n {
		src := []string{"orders", "users"}[i%2]
		e := ev(t, src, "orders", i, uint32(i+1), fmt.Sprintf("rule%d", i%3))
		r := deliverylog.FromEvent(e, []string{"billing", "bus"}[i/2%2])
		r.Outcome = outcomes[i%len(outcomes)]
		r.Attempt = i%4 + 1
		r.Duration = time.Duration(i) * time.Millisecond
		r.Time = t0.Add(time.Duration(i) * time.Second)
		recs = append(recs, r)
	}
	return recs
}

func TestListFilters(t *testing.T) {
	l, _ := newLog(t, "all", deliverylog.Deps{})
	t0 := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	recs := records(t, 40, t0)
	write(t, l, recs...)
	// want lists the indexes of recs f selects, newest first.
	want := func(keep func(i int, r deliverylog.Record) bool) []int {
		var out []int
		for i := len(recs) - 1; i >= 0; i-- {
			if keep(i, recs[i]) {
				out = append(out, i)
			}
		}
		return out
	}
	key7 := recs[7].DocumentKey
	for _, c := range []struct {
		name string
		f    deliverylog.Filter
		want []int
	}{
		{"all", deliverylog.Filter{Limit: 1000}, want(func(int, deliverylog.Record) bool { return true })},
		{"sink", deliverylog.Filter{Sink: "bus"}, want(func(_ int, r deliverylog.Record) bool { return r.Sink == "bus" })},
		{"rule", deliverylog.Filter{Rule: "rule1"}, want(func(_ int, r deliverylog.Record) bool { return r.Rules[0] == "rule1" })},
		{"source", deliverylog.Filter{Source: "users"}, want(func(_ int, r deliverylog.Record) bool { return r.Source == "users" })},
		{"failed", deliverylog.Filter{Status: deliverylog.StatusFailed}, want(func(_ int, r deliverylog.Record) bool { return r.Outcome.Failed() })},
		{"retrying", deliverylog.Filter{Status: deliverylog.StatusRetrying}, want(func(_ int, r deliverylog.Record) bool { return r.Outcome == deliverylog.OutcomeRetrying })},
		{"parked", deliverylog.Filter{Status: deliverylog.StatusParked}, want(func(_ int, r deliverylog.Record) bool { return r.Outcome == deliverylog.OutcomeParked })},
		{"dead_lettered", deliverylog.Filter{Status: deliverylog.StatusDeadLettered}, want(func(_ int, r deliverylog.Record) bool { return r.Outcome == deliverylog.OutcomeDeadLettered })},
		{"delivered", deliverylog.Filter{Status: deliverylog.StatusDelivered}, want(func(_ int, r deliverylog.Record) bool { return r.Outcome == deliverylog.OutcomeDelivered })},
		{"since until", deliverylog.Filter{Since: t0.Add(10 * time.Second), Until: t0.Add(20 * time.Second)}, want(func(i int, _ deliverylog.Record) bool { return i >= 10 && i < 20 })},
		{"document key", deliverylog.Filter{DocumentKey: key7}, []int{7}},
		{"min attempts", deliverylog.Filter{MinAttempts: 3}, want(func(_ int, r deliverylog.Record) bool { return r.Attempt >= 3 })},
		{"min duration", deliverylog.Filter{MinDuration: 30 * time.Millisecond}, want(func(i int, _ deliverylog.Record) bool { return i >= 30 })},
		{"combined", deliverylog.Filter{Sink: "billing", Status: deliverylog.StatusFailed, MinAttempts: 2, Since: t0.Add(5 * time.Second)},
			want(func(i int, r deliverylog.Record) bool {
				return r.Sink == "billing" && r.Outcome.Failed() && r.Attempt >= 2 && i >= 5
			})},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := listAll(t, l, c.f, 4)
			if !slices.Equal(got, idsOf(recs, c.want)) {
				t.Errorf("List(%s) = %v, want %v", c.name, got, idsOf(recs, c.want))
			}
			if len(c.want) == 0 {
				t.Error("a case that selects nothing cannot fail")
			}
		})
	}
}

// listAll pages through f with pages of size (or f.Limit when set) and
// returns the event ids in order.
func listAll(t *testing.T, l *deliverylog.Log, f deliverylog.Filter, size int) []string {
	t.Helper()
	if f.Limit == 0 {
		f.Limit = size
	}
	var out []string
	for pages := 0; ; pages++ {
		p, err := l.List(testCtx(t), f)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) > f.Limit || p.Next != "" && len(p.Records) != f.Limit {
			t.Fatalf("page of %d records with next %q, limit %d", len(p.Records), p.Next, f.Limit)
		}
		for _, r := range p.Records {
			out = append(out, r.EventID)
		}
		if p.Next == "" {
			return out
		}
		f.Cursor = p.Next
	}
}

func idsOf(recs []deliverylog.Record, idx []int) []string {
	out := []string{}
	for _, i := range idx {
		out = append(out, recs[i].EventID)
	}
	return out
}

// Records written in the same millisecond page by _id without loss or
// repetition.
func TestListCursorSameMillisecond(t *testing.T) {
	l, _ := newLog(t, "all", deliverylog.Deps{})
	recs := records(t, 9, time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC))
	for i := range recs {
		recs[i].Time = recs[0].Time
	}
	write(t, l, recs...)
	got := listAll(t, l, deliverylog.Filter{}, 2)
	slices.Sort(got)
	var want []string
	for _, r := range recs {
		want = append(want, r.EventID)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("paged = %v, want %v", got, want)
	}
}

// User input never becomes an operator: a key holding "$" names is
// refused, a key's values are matched literally, bad statuses and cursors
// are errors.
func TestListRefusesOperators(t *testing.T) {
	l, ctx := newLog(t, "all", deliverylog.Deps{})
	write(t, l, records(t, 5, time.Now().Add(-time.Minute))...)
	for _, s := range []string{`{"_id": {"$ne": null}}`, `{"$where": "1"}`, `{"_id": {"$gt": {"$minKey": 1}}}`, `{}`, `[1]`, `"x"`, `{"_id": `} {
		k, err := deliverylog.ParseDocumentKey(s)
		if !errors.Is(err, deliverylog.ErrBadFilter) {
			t.Errorf("ParseDocumentKey(%s) = %s, %v; want ErrBadFilter", s, k, err)
		}
	}
	k, err := deliverylog.ParseDocumentKey(`{"_id": {"$oid": "5f1d3c2b1a0f4e3d2c1b0a99"}}`)
	if err != nil || k.Lookup("_id").Type != bson.TypeObjectID {
		t.Errorf("Extended JSON key = %s, %v", k, err)
	}
	// A raw key with an operator inside is refused by List too.
	raw, _ := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "$ne", Value: nil}}}})
	if _, err := l.List(ctx, deliverylog.Filter{DocumentKey: raw}); !errors.Is(err, deliverylog.ErrBadFilter) {
		t.Errorf("List with {_id: {$ne: null}}: %v, want ErrBadFilter", err)
	}
	// Names are compared literally: a sink named like an operator finds nothing.
	if p, err := l.List(ctx, deliverylog.Filter{Sink: "$ne"}); err != nil || len(p.Records) != 0 {
		t.Errorf("sink $ne: %d records, %v", len(p.Records), err)
	}
	for _, f := range []deliverylog.Filter{{Status: "lost"}, {Cursor: "nope"}, {Cursor: "AQAAAAAAAAAA"}, {MinAttempts: -1}, {Limit: -1}} {
		if _, err := l.List(ctx, f); !errors.Is(err, deliverylog.ErrBadFilter) {
			t.Errorf("List(%+v): %v, want ErrBadFilter", f, err)
		}
	}
}

// EnsureIndexes makes the TTL index with the retention and the query
// indexes; a new retention changes the TTL.
func TestEnsureIndexes(t *testing.T) {
	l, ctx := newLog(t, "failures", deliverylog.Deps{})
	ttl := func() int32 {
		specs, err := l.Collection().Indexes().ListSpecifications(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		var secs int32 = -1
		for _, s := range specs {
			names = append(names, s.Name)
			if s.Name == "ttl_at" && s.ExpireAfterSeconds != nil {
				secs = *s.ExpireAfterSeconds
			}
		}
		slices.Sort(names)
		if w := []string{"_id_", "at_id", "event_ids", "keys_at", "outcome_at", "rules_at", "sink_at", "source_at", "ttl_at"}; !slices.Equal(names, w) {
			t.Errorf("indexes = %v, want %v", names, w)
		}
		return secs
	}
	if got := ttl(); got != 72*3600 {
		t.Errorf("TTL = %ds, want %d", got, 72*3600)
	}
	l2 := deliverylog.NewLog(l.Collection(), 24*time.Hour, "failures", deliverylog.Deps{})
	if err := l2.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ttl(); got != 24*3600 {
		t.Errorf("TTL after a new retention = %ds, want %d", got, 24*3600)
	}
}
