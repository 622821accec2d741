package deliverylog_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/deliverylog"
)

func TestLifecycle(t *testing.T) {
	db := testDB(t)
	ctx := testCtx(t)
	cps := checkpoint.NewStore(db, "checkpoints")
	dls := deadletter.NewStore(db, "deadletters")
	if err := dls.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	routes := map[string][]deliverylog.Route{"orders": {
		{Sink: "billing", Rules: []string{"paid"}}, {Sink: "bus", Rules: []string{"paid"}}, {Sink: "audit", Rules: []string{"all"}},
		{Sink: "crm", Rules: []string{"all"}}, {Sink: "skipper", Rules: []string{"all"}}, {Sink: "late", Rules: []string{"all"}},
	}}
	l := deliverylog.NewLog(db.Collection("deliveries"), 72*time.Hour, "failures", deliverylog.Deps{
		Checkpoints: cps, DeadLetters: dls, Routes: func(s string) []deliverylog.Route { return routes[s] },
	})
	if err := l.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	e := ev(t, "orders", "orders", 42, 10, "paid", "all")
	t0 := time.Now().Add(-time.Minute)
	rec := func(sink string, attempt int, o deliverylog.Outcome, status int, at time.Duration) deliverylog.Record {
		r := deliverylog.FromEvent(e, sink)
		r.Attempt, r.Outcome, r.Status, r.Duration, r.Time = attempt, o, status, 20*time.Millisecond, t0.Add(at)
		if o.Failed() {
			r.Error = "http 503"
		}
		return r
	}
	write(t, l,
		rec("billing", 1, deliverylog.OutcomeRetrying, 503, 0), rec("billing", 2, deliverylog.OutcomeDelivered, 200, time.Second),
		rec("bus", 1, deliverylog.OutcomeRetrying, 503, 0), rec("bus", 2, deliverylog.OutcomeDeadLettered, 400, time.Second),
		rec("audit", 1, deliverylog.OutcomeRetrying, 503, 0), rec("audit", 0, deliverylog.OutcomeParked, 0, time.Second),
		rec("skipper", 0, deliverylog.OutcomeSkipped, 0, 0),
		rec("late", 1, deliverylog.OutcomeRetrying, 503, 0),
	)
	for _, p := range []struct {
		sink string
		kind deadletter.Kind
	}{{"bus", deadletter.KindFailed}, {"audit", deadletter.KindParked}} {
		en, err := deadletter.EntryFor(e, p.sink, p.kind)
		if err != nil {
			t.Fatal(err)
		}
		en.Attempts, en.Reason, en.LastError = 2, "http_400", "400"
		en.FirstFailedAt, en.LastFailedAt = t0, t0
		if err := dls.Put(ctx, en); err != nil {
			t.Fatal(err)
		}
	}
	save := func(ct uint32) {
		ts := bson.Timestamp{T: 1795000000 + ct, I: 1}
		tok, _ := bson.Marshal(bson.D{{Key: "_data", Value: tokenData(ts)}})
		if err := cps.Save(ctx, checkpoint.Checkpoint{Source: "orders", Token: tok, ClusterTime: ts}); err != nil {
			t.Fatal(err)
		}
	}
	type want struct {
		state   deliverylog.State
		derived bool
		tries   int
		link    string
	}
	check := func(lc deliverylog.Lifecycle, acked bool, wants map[string]want) {
		t.Helper()
		if lc.Acknowledged == nil || *lc.Acknowledged != acked {
			t.Errorf("acknowledged = %v, want %v", lc.Acknowledged, acked)
		}
		if lc.ClusterTime == nil || lc.ClusterTime.Unix() != 1795000010 {
			t.Errorf("cluster time = %v", lc.ClusterTime)
		}
		got := map[string]deliverylog.SinkLifecycle{}
		for _, s := range lc.Sinks {
			got[s.Sink] = s
		}
		if len(got) != len(wants) {
			t.Errorf("sinks = %+v", lc.Sinks)
		}
		for sink, w := range wants {
			s := got[sink]
			link := ""
			if s.DeadLetter != nil {
				link = "dl " + s.DeadLetter.Href
			}
			if s.Parked != nil {
				link = "parked " + s.Parked.Href
			}
			if s.State != w.state || s.Derived != w.derived || len(s.Attempts) != w.tries || link != w.link {
				t.Errorf("%s: state %s derived %v, %d attempts, link %q; want %+v", sink, s.State, s.Derived, len(s.Attempts), link, w)
			}
		}
	}
	entryHref := func(sink string) string {
		return "/api/v1/deadletters/" + strings.ReplaceAll(deadletter.EntryID(e.ID, sink), "/", "%2F")
	}

	// The checkpoint before the event.
	save(5)
	lc, err := l.Lifecycle(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	check(lc, false, map[string]want{
		"billing": {deliverylog.StateDelivered, false, 2, ""},
		"bus":     {deliverylog.StateDeadLettered, false, 2, "dl " + entryHref("bus")},
		"audit":   {deliverylog.StateParked, false, 2, "parked " + entryHref("audit")},
		"skipper": {deliverylog.StateSkipped, false, 1, ""},
		"late":    {deliverylog.StateRetrying, false, 1, ""},
		"crm":     {deliverylog.StateInFlight, true, 0, ""},
	})
	if a := lc.Sinks[0].Attempts; lc.Sinks[0].Sink != "billing" || a[0].Status != 503 || a[0].Error != "http 503" || a[0].DurationMS != 20 || a[0].Replica != "r1" || !a[0].At.Before(a[1].At) {
		t.Errorf("billing attempts = %+v", lc.Sinks[0].Attempts)
	}

	// Past it: what was not recorded as finished is derived delivered; the
	// parked entry re-driven (deleted) too; the dead letter stays.
	save(20)
	if _, err := dls.Delete(ctx, deadletter.EntryID(e.ID, "audit")); err != nil {
		t.Fatal(err)
	}
	lc, err = l.Lifecycle(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	check(lc, true, map[string]want{
		"billing": {deliverylog.StateDelivered, false, 2, ""},
		"bus":     {deliverylog.StateDeadLettered, false, 2, "dl " + entryHref("bus")},
		"audit":   {deliverylog.StateDelivered, true, 2, ""},
		"skipper": {deliverylog.StateSkipped, false, 1, ""},
		"late":    {deliverylog.StateDelivered, true, 1, ""},
		"crm":     {deliverylog.StateDelivered, true, 0, ""},
	})

	// A partitioned source with a partition not saved cannot tell.
	if err := cps.Save(ctx, checkpoint.Checkpoint{Source: "orders#0/2", Token: bson.Raw(bsonDoc(t, "_data", tokenData(bson.Timestamp{T: 1795000099, I: 1})))}); err != nil {
		t.Fatal(err)
	}
	if lc, err = l.Lifecycle(ctx, e.ID); err != nil || lc.Acknowledged != nil {
		t.Errorf("with orders#1/2 missing: acknowledged %v, %v; want unknown", lc.Acknowledged, err)
	}
	for _, s := range lc.Sinks {
		if s.Sink == "crm" {
			t.Errorf("crm listed without a record or a checkpoint to place it: %+v", s)
		}
	}

	// Nothing known of it, or not an event id.
	if _, err := l.Lifecycle(ctx, "users:82000000000000000001"); !errors.Is(err, deliverylog.ErrNotFound) {
		t.Errorf("unknown event: %v, want ErrNotFound", err)
	}
	if _, err := l.Lifecycle(ctx, "nocolon"); !errors.Is(err, deliverylog.ErrBadFilter) {
		t.Errorf("bad id: %v, want ErrBadFilter", err)
	}
}

func bsonDoc(t *testing.T, k string, v any) bson.Raw {
	b, err := bson.Marshal(bson.D{{Key: k, Value: v}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
