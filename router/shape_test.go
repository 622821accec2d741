package router

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// userEvent is an update of a user document with the given fields changed.
func userEvent(t testing.TB, seq int, email string, updated bson.D) *event.Event {
	t.Helper()
	ct := bson.Timestamp{T: ctBase, I: uint32(seq)}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "82" + strings.Repeat("0", 8) + string(rune('A'+seq%26))}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: ct},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "users"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: seq}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: seq}, {Key: "email", Value: email}, {Key: "status", Value: "paid"}, {Key: "note", Value: "n"}}},
		{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: updated}, {Key: "removedFields", Value: bson.A{}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.FromChange("users", uint64(seq), raw)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func shapeOf(t testing.TB, spec event.ShapeSpec) *event.Shape {
	t.Helper()
	s, err := event.CompileShape(spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func shapedEngine(t *testing.T, rules []RuleSpec, specs []SinkSpec, sinkShapes []*event.Shape) (*Engine, *memDL) {
	t.Helper()
	var names []string
	for _, s := range specs {
		names = append(names, s.Sink.Name())
	}
	rs, err := CompileRulesShaped(rules, names, sinkShapes)
	if err != nil {
		t.Fatal(err)
	}
	dl := newMemDL()
	e, err := NewEngine(rs, specs, dl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.Start(ctx)
	t.Cleanup(func() { cancel(); e.Stop() })
	return e, dl
}

// Sinks of one rule get their own shape of the same event, with the same
// id; the rule's filter sees the fields the shapes remove; sinks of equal
// shapes share one view (one encoding).
func TestShapedFanout(t *testing.T) {
	plain, noEmail, noEmail2, masked := &fakeSink{name: "plain"}, &fakeSink{name: "noemail"}, &fakeSink{name: "noemail2"}, &fakeSink{name: "masked"}
	excl := event.ShapeSpec{Fields: []event.Field{{Path: "fullDocument.email"}}}
	e, _ := shapedEngine(t,
		[]RuleSpec{{Name: "ann", Source: "users", Filter: bson.D{{Key: "fullDocument.email", Value: "ann@x.org"}}, Sinks: []string{"plain", "noemail", "noemail2", "masked"}}},
		[]SinkSpec{{Sink: plain, Retry: fastRetry(1)}, {Sink: noEmail, Retry: fastRetry(1)}, {Sink: noEmail2, Retry: fastRetry(1)}, {Sink: masked, Retry: fastRetry(1)}},
		[]*event.Shape{nil, shapeOf(t, excl), shapeOf(t, excl), shapeOf(t, event.ShapeSpec{Redact: []string{"fullDocument.email"}, Envelope: event.FormDocument})})
	var acks atomic.Int32
	ev := userEvent(t, 1, "ann@x.org", bson.D{{Key: "email", Value: "ann@x.org"}})
	e.Dispatch(ev, func() { acks.Add(1) })
	e.Dispatch(userEvent(t, 2, "bob@x.org", bson.D{{Key: "email", Value: "bob@x.org"}}), func() { acks.Add(1) })
	waitUntil(t, "deliveries", func() bool {
		return acks.Load() == 2 && len(plain.received()) == 1 && len(noEmail.received()) == 1 && len(noEmail2.received()) == 1 && len(masked.received()) == 1
	})
	got := map[string]*event.Event{"plain": plain.received()[0], "noemail": noEmail.received()[0], "noemail2": noEmail2.received()[0], "masked": masked.received()[0]}
	bodies := map[string]string{}
	for name, v := range got {
		if v.ID != ev.ID {
			t.Errorf("%s: id %q, want %q", name, v.ID, ev.ID)
		}
		b, err := v.Envelope(false)
		if err != nil {
			t.Fatal(err)
		}
		bodies[name] = string(b)
	}
	if got["plain"] != ev {
		t.Error("an unshaped sink must get the event itself")
	}
	if got["noemail"] != got["noemail2"] {
		t.Error("two sinks of the same shape must share one view")
	}
	if !strings.Contains(bodies["plain"], "ann@x.org") {
		t.Errorf("plain: %s", bodies["plain"])
	}
	for _, name := range []string{"noemail", "masked"} {
		if strings.Contains(bodies[name], "ann@x.org") {
			t.Errorf("%s leaks the email: %s", name, bodies[name])
		}
	}
	if !strings.Contains(bodies["masked"], `"email":"[REDACTED]"`) || strings.Contains(bodies["masked"], `"operationType"`) {
		t.Errorf("masked (document form): %s", bodies["masked"])
	}
	if strings.Contains(bodies["noemail"], `"email"`) || !strings.Contains(bodies["noemail"], `"updatedFields":{}`) {
		t.Errorf("noemail: %s", bodies["noemail"])
	}
}

// skip_empty_updates: an update with nothing left for a sink is not sent
// to it, and still acknowledged once, after the other sinks; nothing that
// should be sent is lost.
func TestSkipEmptyUpdatesAcks(t *testing.T) {
	status, all := &fakeSink{name: "status"}, &fakeSink{name: "all"}
	onlyStatus := shapeOf(t, event.ShapeSpec{Fields: []event.Field{{Path: "fullDocument.status", Include: true}}, SkipEmptyUpdates: true})
	e, _ := shapedEngine(t,
		[]RuleSpec{{Name: "r", Source: "users", Sinks: []string{"status", "all"}}, {Name: "solo", Source: "users", Filter: bson.D{{Key: "fullDocument._id", Value: 0}}, Sinks: []string{"status"}}},
		[]SinkSpec{{Sink: status, Retry: fastRetry(1), MaxInFlight: 4}, {Sink: all, Retry: fastRetry(1), MaxInFlight: 4}},
		[]*event.Shape{onlyStatus, nil})
	const n = 200
	var acks [n]atomic.Int32
	wantStatus := 0
	for i := 0; i < n; i++ {
		upd := bson.D{{Key: "note", Value: i}}
		if i%3 == 0 {
			upd = append(upd, bson.E{Key: "status", Value: "x"})
			wantStatus++
		}
		e.Dispatch(userEvent(t, i, "a@b.c", upd), func() { acks[i].Add(1) })
	}
	waitUntil(t, "acks", func() bool {
		for i := range acks {
			if acks[i].Load() == 0 {
				return false
			}
		}
		return true
	})
	waitUntil(t, "deliveries", func() bool { return len(all.received()) == n && len(status.received()) == wantStatus })
	for i := range acks {
		if acks[i].Load() != 1 {
			t.Fatalf("event %d acked %d times", i, acks[i].Load())
		}
	}
	for _, v := range status.received() {
		if _, err := v.Raw.LookupErr("updateDescription", "updatedFields", "status"); err != nil {
			t.Fatalf("status sink got an update without status: %s", v.Raw)
		}
	}
}

// Several rules routing an event to one sink: each one's shape applies.
func TestShapeOfSeveralRules(t *testing.T) {
	s := &fakeSink{name: "s"}
	e, _ := shapedEngine(t,
		[]RuleSpec{
			{Name: "a", Source: "users", Sinks: []string{"s"}, Shape: shapeOf(t, event.ShapeSpec{Redact: []string{"fullDocument.email"}})},
			{Name: "b", Source: "users", Sinks: []string{"s"}, Shape: shapeOf(t, event.ShapeSpec{Fields: []event.Field{{Path: "fullDocument.note"}}})},
		},
		[]SinkSpec{{Sink: s, Retry: fastRetry(1)}}, nil)
	var acked atomic.Bool
	e.Dispatch(userEvent(t, 1, "ann@x.org", bson.D{{Key: "note", Value: "x"}}), func() { acked.Store(true) })
	waitUntil(t, "delivery", func() bool { return acked.Load() && len(s.received()) == 1 })
	v := s.received()[0]
	if got := v.Raw.Lookup("fullDocument", "email").StringValue(); got != event.RedactMask {
		t.Errorf("email %q", got)
	}
	if _, err := v.Raw.LookupErr("fullDocument", "note"); err == nil {
		t.Error("note not excluded")
	}
	if !reflect.DeepEqual(v.Rules, []string{"a", "b"}) {
		t.Errorf("rules %v", v.Rules)
	}
}

// A replayed or re-driven dead letter (rebuilt from its raw change) is
// shaped with the current shaping; the dead letter of a shaped delivery
// shows the shaped payload and never the redacted value.
func TestReplayAndDeadLetterShaped(t *testing.T) {
	s := &fakeSink{name: "s"}
	e, dl := shapedEngine(t,
		[]RuleSpec{{Name: "r", Source: "users", Sinks: []string{"s"}}},
		[]SinkSpec{{Sink: s, Retry: fastRetry(1)}},
		[]*event.Shape{shapeOf(t, event.ShapeSpec{Redact: []string{"fullDocument.email"}})})
	s.setFail(func(*event.Event) error { return context.DeadlineExceeded })
	var acked atomic.Bool
	e.Dispatch(userEvent(t, 1, "ann@x.org", bson.D{{Key: "email", Value: "ann@x.org"}}), func() { acked.Store(true) })
	waitUntil(t, "dead letter", func() bool { return acked.Load() })
	var entry deadletter.Entry
	for _, en := range dl.entries {
		entry = en
	}
	if !entry.Shaped || len(entry.Change) == 0 {
		t.Fatalf("entry: shaped %t, change %d bytes", entry.Shaped, len(entry.Change))
	}
	shown, err := entry.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(shown), "ann@x.org") || !strings.Contains(string(shown), event.RedactMask) {
		t.Fatalf("dead letter shows %s", shown)
	}
	// Replay through DeliverNow: shaped again.
	s.setFail(func(*event.Event) error { return nil })
	ev, err := entry.Event()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.DeliverNow(context.Background(), "s", ev); err != nil {
		t.Fatal(err)
	}
	got := s.received()
	if len(got) != 1 || got[0].Raw.Lookup("fullDocument", "email").StringValue() != event.RedactMask || got[0].ID != ev.ID {
		t.Fatalf("replayed %v", got)
	}
	// The re-drive hook shapes too.
	if v, _, err := e.Lane("s").reshape(ev); err != nil || v.Raw.Lookup("fullDocument", "email").StringValue() != event.RedactMask {
		t.Fatal("re-drive not shaped")
	}
}

// Shaping never changes routing or the pushed-down $match: rules match the
// raw change.
func TestShapePushdownUnchanged(t *testing.T) {
	specs := []RuleSpec{{Name: "r", Source: "users", Filter: bson.D{{Key: "fullDocument.email", Value: "a"}}, Sinks: []string{"s"}}}
	plain, err := CompileRules(specs, []string{"s"})
	if err != nil {
		t.Fatal(err)
	}
	specs[0].Shape = shapeOf(t, event.ShapeSpec{Fields: []event.Field{{Path: "fullDocument.email"}}})
	shaped, err := CompileRulesShaped(specs, []string{"s"}, []*event.Shape{shapeOf(t, event.ShapeSpec{Envelope: event.FormKey})})
	if err != nil {
		t.Fatal(err)
	}
	p1, ok1 := plain.Pushdown("users")
	p2, ok2 := shaped.Pushdown("users")
	if ok1 != ok2 || !reflect.DeepEqual(p1, p2) {
		t.Fatalf("pushdown changed: %v vs %v", p1, p2)
	}
	ev := userEvent(t, 1, "a", bson.D{})
	if m := shaped.Route(ev); len(m.Sinks) != 1 {
		t.Fatal("a filter on a projected-away field must still match")
	}
	body, skip, err := shaped.Payload(ev, "r", "s", false)
	if err != nil || skip {
		t.Fatal(err, skip)
	}
	if want := `{"id":"` + ev.ID + `","operationType":"update","ns":{"db":"shop","coll":"users"},"documentKey":{"_id":1}}`; string(body) != want {
		t.Errorf("payload %s, want %s", body, want)
	}
	if _, _, err := shaped.Payload(ev, "nope", "s", false); err == nil {
		t.Error("unknown rule accepted")
	}
}

// A stored change (dead letter, parked entry) is never delivered less
// shaped than the current configuration shapes it live (issue 24): replay
// and re-drive route it through today's rules, so renaming the rule that
// carried a redaction keeps it; a change no current rule routes to the
// sink is refused (deadletter.ErrNotRouted) unless the operator asks for
// it, and then gets the strictest shape of the sink's rules.
func TestReplayShapedByTodaysRules(t *testing.T) {
	s := &fakeSink{name: "s"}
	redactEmail := shapeOf(t, event.ShapeSpec{Redact: []string{"fullDocument.email"}})
	e, dl := shapedEngine(t,
		[]RuleSpec{{Name: "old-name", Source: "users", Sinks: []string{"s"}, Shape: redactEmail}},
		[]SinkSpec{{Sink: s, Retry: fastRetry(1)}}, nil)
	s.setFail(func(*event.Event) error { return context.DeadlineExceeded })
	var acked atomic.Bool
	e.Dispatch(userEvent(t, 1, "ann@x.org", bson.D{{Key: "email", Value: "ann@x.org"}}), func() { acked.Store(true) })
	waitUntil(t, "dead letter", func() bool { return acked.Load() })
	var entry deadletter.Entry
	for _, en := range dl.entries {
		entry = en
	}
	if !slices.Equal(entry.Rules, []string{"old-name"}) {
		t.Fatalf("entry rules %v", entry.Rules)
	}
	s.setFail(func(*event.Event) error { return nil })
	reload := func(rules []RuleSpec) {
		t.Helper()
		rs, err := CompileRulesShaped(rules, []string{"s"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Reload(rs, []LaneUpdate{{Name: "s", Keep: true}}); err != nil {
			t.Fatal(err)
		}
	}
	replay := func(deliver func(context.Context, string, *event.Event) error) (*event.Event, error) {
		t.Helper()
		ev, err := entry.Event()
		if err != nil {
			t.Fatal(err)
		}
		n := len(s.received())
		if err := deliver(context.Background(), "s", ev); err != nil {
			if len(s.received()) != n {
				t.Fatal("delivered and failed")
			}
			return nil, err
		}
		got := s.received()
		if len(got) != n+1 {
			t.Fatalf("%d deliveries, want %d", len(got), n+1)
		}
		return got[n], nil
	}
	email := func(v *event.Event) string { return v.Raw.Lookup("fullDocument", "email").StringValue() }

	// The rule renamed, same redaction: still redacted, named as today.
	reload([]RuleSpec{{Name: "new-name", Source: "users", Sinks: []string{"s"}, Shape: redactEmail}})
	v, err := replay(e.DeliverNow)
	if err != nil || email(v) != event.RedactMask || !slices.Equal(v.Rules, []string{"new-name"}) {
		t.Fatalf("replay after a rename: %v, email %q, rules %v", err, email(v), v.Rules)
	}
	if rv, _, err := e.Lane("s").reshape(mustEvent(t, entry)); err != nil || email(rv) != event.RedactMask {
		t.Fatalf("re-drive after a rename: %v", err)
	}
	// Today's rule shapes more than the stored one did: today's shape.
	reload([]RuleSpec{{Name: "other", Source: "users", Sinks: []string{"s"}, Shape: shapeOf(t, event.ShapeSpec{Envelope: event.FormKey})}})
	v, err = replay(e.DeliverNow)
	if err != nil {
		t.Fatalf("replay under a stricter rule: %v", err)
	}
	if body, err := v.Envelope(false); err != nil || strings.Contains(string(body), "ann@x.org") {
		t.Fatalf("replay under a key-only rule sent %s (%v)", body, err)
	}

	// No rule routes the change to s any more (the filter no longer
	// matches): refused by replay and re-drive...
	unrouted := []RuleSpec{
		{Name: "paid-only", Source: "users", Filter: bson.D{{Key: "fullDocument.status", Value: "refunded"}}, Sinks: []string{"s"}, Shape: redactEmail},
		{Name: "notes", Source: "users", Filter: bson.D{{Key: "fullDocument.status", Value: "void"}}, Sinks: []string{"s"},
			Shape: shapeOf(t, event.ShapeSpec{Redact: []string{"fullDocument.note"}})},
	}
	reload(unrouted)
	if _, err := replay(e.DeliverNow); !errors.Is(err, deadletter.ErrNotRouted) {
		t.Fatalf("replay of an unrouted change: %v, want ErrNotRouted", err)
	}
	if _, _, err := e.Lane("s").reshape(mustEvent(t, entry)); !errors.Is(err, deadletter.ErrNotRouted) {
		t.Fatalf("re-drive of an unrouted change: %v, want ErrNotRouted", err)
	}
	// ...and delivered on request with the strictest shape of s's rules.
	v, err = replay(e.DeliverUnrouted)
	if err != nil || email(v) != event.RedactMask || v.Raw.Lookup("fullDocument", "note").StringValue() != event.RedactMask {
		t.Fatalf("unrouted replay on request: %v %s", err, v.Raw)
	}
	// A routed change is shaped as live even with the operator's flag.
	reload([]RuleSpec{{Name: "plain", Source: "users", Sinks: []string{"s"}}, unrouted[1]})
	v, err = replay(e.DeliverUnrouted)
	if err != nil || email(v) != "ann@x.org" || !slices.Equal(v.Rules, []string{"plain"}) {
		t.Fatalf("routed replay with the flag: %v %s %v", err, v.Raw, v.Rules)
	}
}

func mustEvent(t *testing.T, e deadletter.Entry) *event.Event {
	t.Helper()
	ev, err := e.Event()
	if err != nil {
		t.Fatal(err)
	}
	return ev
}
