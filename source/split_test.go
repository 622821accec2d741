package source_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/test/mongowire"
)

const tenMiB = 10 * 1024 * 1024

// largeWorld is a world whose collection keeps pre- and post-images, with a
// checkpoint after a first small insert (id 1) and, written before the
// source starts, a 10 MiB insert (id 2), its update to another 10 MiB value
// (about 30 MiB of event with both images) and a small insert (id 3). It
// returns the resume token of the insert of id 2.
func largeWorld(t *testing.T) (*world, bson.Raw) {
	w := newWorld(t)
	ctx := context.Background()
	err := w.client.Database(w.db).CreateCollection(ctx, "items", options.CreateCollection().SetChangeStreamPreAndPostImages(bson.M{"enabled": true}))
	if err != nil {
		t.Fatal(err)
	}
	toks := w.tokensOf(2, func() {
		w.insert(1)
		if _, err := w.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}, {Key: "v", Value: strings.Repeat("x", tenMiB)}}); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := w.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 2}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: strings.Repeat("y", tenMiB)}}}}); err != nil {
		t.Fatal(err)
	}
	w.insert(3)
	w.saveCheckpoint(toks[0])
	return w, toks[1]
}

func (w *world) largeSpec() source.Spec {
	sp := w.spec()
	sp.FullDocument, sp.FullDocumentBeforeChange = "updateLookup", "required"
	return sp
}

func TestSplitEventReassembled(t *testing.T) {
	w, _ := largeWorld(t)
	rec := &recorder{}
	r := w.run(w.largeSpec(), rec)
	rec.waitEvents(t, "insert:2", "update:2", "insert:3")
	up := rec.all()[1]
	if up.Raw.Lookup("splitEvent").Type != 0 {
		t.Fatal("the routed event still has splitEvent")
	}
	if got := up.Raw.Lookup("fullDocument", "v").StringValue(); got != strings.Repeat("y", tenMiB) {
		t.Fatalf("fullDocument.v is %d bytes, not the update's value", len(got))
	}
	if got := up.Raw.Lookup("fullDocumentBeforeChange", "v").StringValue(); got != strings.Repeat("x", tenMiB) {
		t.Fatal("fullDocumentBeforeChange.v is not the old value")
	}
	if got := up.Raw.Lookup("updateDescription", "updatedFields", "v").StringValue(); len(got) != tenMiB {
		t.Fatal("updateDescription lost")
	}
	if n := metricValue(w.m.SplitEvents.WithLabelValues("items")); n != 1 {
		t.Fatalf("split events = %v", n)
	}
	// The event's id and position are its last fragment's token: the
	// checkpoint after it resumes with the next change.
	waitFor(t, 5*time.Second, "the checkpoint past the large event", func() bool {
		cp, _ := w.checkpoint()
		return len(cp.Token) > 0 && event.TokenData(cp.Token) >= event.TokenData(rec.all()[2].Token)
	})
	if w.srv != nil {
		opens := w.srv.CommandsNamed("aggregate")
		last := opens[len(opens)-1].Body.Lookup("pipeline").Array()
		vals, _ := last.Values()
		if k := vals[len(vals)-1].Document().Index(0).Key(); k != "$changeStreamSplitLargeEvent" {
			t.Fatalf("last stage %s, want $changeStreamSplitLargeEvent", k)
		}
	}
	_ = r
}

// TestSplitEventCrashBetweenFragments fails the stream after its first
// fragment: the checkpoint never holds a fragment's token, and the reopened
// stream delivers the whole event once.
func TestSplitEventCrashBetweenFragments(t *testing.T) {
	w, insert2 := largeWorld(t)
	w.needServer()
	// The aggregate returns the insert of id 2, the first getMore the first
	// fragment (fragments are near 16 MiB: one per batch), the second fails.
	w.srv.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, Skip: 1, Times: 1, ErrorCode: 2, AppName: srcApp})
	rec := &recorder{}
	r1 := w.run(w.largeSpec(), rec)
	waitFor(t, 10*time.Second, "the stream failure", func() bool {
		return metricValue(w.m.StreamReconnects.WithLabelValues("items")) >= 1
	})
	rec.waitEvents(t, "insert:2", "update:2", "insert:3")
	for _, ev := range rec.all() {
		if ev.Raw.Lookup("splitEvent").Type != 0 {
			t.Fatal("a fragment was routed")
		}
	}
	// A restart (kill -9: the checkpoint is whatever was last saved) from
	// the insert of id 2 re-reads the fragments from the first.
	_ = r1.stop(t)
	w.saveCheckpoint(insert2)
	rec2 := &recorder{}
	w.run(w.largeSpec(), rec2)
	rec2.waitEvents(t, "update:2", "insert:3")
	if rec2.all()[0].ID != rec.all()[1].ID {
		t.Fatal("the re-delivered event has another id")
	}
}

func TestOversizeEvent(t *testing.T) {
	for _, policy := range []string{source.OversizeFail, source.OversizeSkip} {
		t.Run(policy, func(t *testing.T) {
			w, insert2 := largeWorld(t)
			sp := w.largeSpec()
			sp.SplitLargeEvents, sp.OnOversizeEvent = source.SplitOff, policy
			rec := &recorder{}
			r := w.run(sp, rec)
			if policy == source.OversizeSkip {
				rec.waitEvents(t, "insert:2", "insert:3")
				var gaps []deadletter.Entry
				waitFor(t, 5*time.Second, "the gap entry", func() bool {
					res, err := w.dls.List(context.Background(), deadletter.Filter{Source: "items", Kind: deadletter.KindGap})
					if err != nil {
						t.Fatal(err)
					}
					gaps = res
					return len(gaps) == 1
				})
				g := gaps[0]
				if g.Reason != "oversize_event" || g.ClusterTime.T == 0 || len(g.LastToken) == 0 ||
					event.TokenData(g.LastToken) <= event.TokenData(insert2) || event.TokenData(g.LastToken) >= event.TokenData(rec.all()[1].Token) {
					t.Fatalf("gap entry: %+v", g)
				}
				return
			}
			rec.waitEvents(t, "insert:2")
			waitFor(t, 10*time.Second, "the source to stop", func() bool {
				return r.src.Status().State == source.StateFailed
			})
			st := r.src.Status()
			if !strings.Contains(st.LastError, "resume token 8") || !strings.Contains(st.LastError, "BSONObjectTooLarge") ||
				!strings.Contains(st.LastError, `on_oversize_event = "skip"`) {
				t.Fatalf("error: %s", st.LastError)
			}
			time.Sleep(300 * time.Millisecond) // nothing more is read
			rec.waitEvents(t, "insert:2")
			waitFor(t, 5*time.Second, "the checkpoint at the insert of id 2", func() bool {
				cp, _ := w.checkpoint()
				return string(cp.Token) == string(insert2)
			})
			if err := r.stop(t); err != nil && !errors.Is(err, source.ErrOversizeEvent) {
				t.Fatal(err)
			}
		})
	}
}

// TestReopenBackoffGrows: a getMore that fails every time after a
// successful open backs off more and more, reports the failures, and the
// source reads again once the fault clears.
func TestReopenBackoffGrows(t *testing.T) {
	w := newWorld(t)
	w.needServer()
	rec := &recorder{}
	r := w.run(w.spec(), rec)
	r.waitOpen(t)
	w.srv.ResetCommands()
	w.srv.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, ErrorCode: 1, AppName: srcApp})
	time.Sleep(3 * time.Second)
	opens := len(w.streamOpens())
	// 100+200+400+800+1600 ms: at most 6 opens in 3s (30 with a backoff
	// reset by every successful open).
	if opens > 6 {
		t.Fatalf("%d reopens in 3s", opens)
	}
	if n := metricValue(w.m.StreamFailures.WithLabelValues("items")); n < 3 {
		t.Fatalf("consecutive failures gauge = %v", n)
	}
	if st := r.src.Status(); st.State != source.StateReconnect || !strings.Contains(st.LastError, "InternalError") {
		t.Fatalf("status %s: %s", st.State, st.LastError)
	}
	w.srv.ClearFailPoints()
	w.insert(1)
	waitFor(t, 40*time.Second, "events after the fault", func() bool { return len(rec.all()) == 1 })
	r.waitOpen(t)
	if n := metricValue(w.m.StreamFailures.WithLabelValues("items")); n != 0 {
		t.Fatalf("consecutive failures gauge = %v after recovery", n)
	}
}

// metricValue reads a counter or gauge.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return -1
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
