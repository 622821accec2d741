package source_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/source"
	"github.com/changegate/changegate/test/mongowire"
)

// TestOpenPosition: where a source's first stream starts. Without a
// checkpoint it starts now (and persists that position before any event) or
// at start_at; with one it starts after the persisted token, whatever
// start_at says.
func TestOpenPosition(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// setup writes the history before the source starts and returns
		// the spec to run; tok is the persisted token it seeded, if any.
		setup      func(w *world) (spec source.Spec, tok bson.Raw)
		want       []string // events read, including insert 5 written once the stream is open
		wantOption string   // resume option of the first $changeStream
	}{{
		name: "no checkpoint: from now",
		setup: func(w *world) (source.Spec, bson.Raw) {
			w.insert(1, 2)
			return w.spec(), nil
		},
		want: inserts(5),
	}, {
		name: "no checkpoint, start_at: from that time",
		setup: func(w *world) (source.Spec, bson.Raw) {
			w.insert(1)
			// start_at has second precision: start at the next second,
			// so insert 1 is before it and insert 2 after it.
			next := time.Now().Truncate(time.Second).Add(time.Second)
			waitFor(w.t, 2*time.Second, "the next second", func() bool { return !time.Now().Before(next) })
			w.insert(2)
			sp := w.spec()
			sp.StartAt = next
			return sp, nil
		},
		want:       inserts(2, 5),
		wantOption: "startAtOperationTime",
	}, {
		name: "checkpoint: after the persisted token",
		setup: func(w *world) (source.Spec, bson.Raw) {
			toks := w.tokensOf(4, func() { w.insert(1, 2, 3, 4) })
			w.saveCheckpoint(toks[1])
			return w.spec(), toks[1]
		},
		want:       inserts(3, 4, 5),
		wantOption: "startAfter",
	}, {
		name: "checkpoint wins over start_at",
		setup: func(w *world) (source.Spec, bson.Raw) {
			toks := w.tokensOf(4, func() { w.insert(1, 2, 3, 4) })
			w.saveCheckpoint(toks[2])
			sp := w.spec()
			sp.StartAt = time.Now().Add(-time.Hour)
			return sp, toks[2]
		},
		want:       inserts(4, 5),
		wantOption: "startAfter",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			spec, seeded := tc.setup(w)
			rec := &recorder{}
			r := w.run(spec, rec)
			r.waitOpen(t)
			if seeded == nil {
				// A first start persists the stream's start before any
				// event arrives, so a crash now cannot skip what follows.
				waitFor(t, 5*time.Second, "the initial checkpoint", func() bool {
					_, ok := w.checkpoint()
					return ok
				})
			}
			w.insert(5)
			rec.waitEvents(t, tc.want...)
			last := rec.all()[len(tc.want)-1]
			waitFor(t, 5*time.Second, "the checkpoint at the last event", func() bool {
				cp, _ := w.checkpoint()
				return bytes.Equal(cp.Token, last.Token)
			})
			if w.srv == nil {
				return
			}
			opens := w.streamOpens()
			if len(opens) != 1 {
				t.Fatalf("source opened %d streams, want 1: %v", len(opens), opens)
			}
			opt, v := resumeOption(opens[0])
			if opt != tc.wantOption {
				t.Fatalf("first stream opened with %q (%v), want %q", opt, v, tc.wantOption)
			}
			switch opt {
			case "startAfter":
				if !bytes.Equal(v.Document(), seeded) {
					t.Fatalf("startAfter %v, want the persisted token %v", v, seeded)
				}
			case "startAtOperationTime":
				if ts, _ := v.Timestamp(); int64(ts) != spec.StartAt.Unix() {
					t.Fatalf("startAtOperationTime %v, want start_at %v", v, spec.StartAt)
				}
			}
		})
	}
}

// TestInvalidateReopensAfterIt: a drop or rename of the watched collection
// ends the stream with an invalidate; the source counts it and reopens with
// startAfter that position, so later changes to a new collection of the same
// name are read, once.
func TestInvalidateReopensAfterIt(t *testing.T) {
	t.Parallel()
	drop := func(w *world) {
		if err := w.coll.Drop(context.Background()); err != nil {
			w.t.Fatal(err)
		}
	}
	rename := func(w *world) {
		err := w.client.Database("admin").RunCommand(context.Background(), bson.D{
			{Key: "renameCollection", Value: w.db + ".items"}, {Key: "to", Value: w.db + ".renamed"},
		}).Err()
		if err != nil {
			w.t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		end  func(*world)
		want []string // after insert 1, before insert 2
	}{
		{name: "drop", end: drop, want: []string{"drop", "invalidate"}},
		{name: "rename", end: rename, want: []string{"rename", "invalidate"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			rec := &recorder{}
			r := w.run(w.spec(), rec)
			r.waitOpen(t)
			w.insert(1)
			rec.waitEvents(t, "insert:1")
			tc.end(w)
			want := append(inserts(1), tc.want...)
			rec.waitEvents(t, want...)
			waitFor(t, 10*time.Second, "the invalidate to be counted", func() bool {
				return value(w.m.StreamInvalidates.WithLabelValues("items")) == 1
			})
			w.insert(2)
			rec.waitEvents(t, append(want, "insert:2")...)
			if n := value(w.m.StreamReconnects.WithLabelValues("items")); n != 0 {
				t.Fatalf("reconnects = %v; an invalidate is not an error", n)
			}
			if w.srv == nil {
				return
			}
			opens := w.streamOpens()
			if len(opens) != 2 {
				t.Fatalf("source opened %d streams, want 2", len(opens))
			}
			opt, v := resumeOption(opens[1])
			if opt != "startAfter" {
				t.Fatalf("reopened with %q, want startAfter (resumeAfter refuses an invalidate token)", opt)
			}
			if inv := rec.all()[len(want)-1]; !bytes.Equal(v.Document(), inv.Token) {
				t.Fatalf("reopened startAfter %v, want the invalidate event's token %v", v, inv.Token)
			}
		})
	}
}

// TestHistoryLost: the persisted token has fallen off the oplog (code 286).
// With "fail" Run returns ErrHistoryLost and leaves the checkpoint alone; with
// "resume_from_now" the gap is recorded in the dead-letter collection and the
// stream restarts from now.
func TestHistoryLost(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{source.HistoryLostFail, source.HistoryLostResumeFromNow} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.needServer()
			toks := w.tokensOf(1, func() { w.insert(1) })
			w.saveCheckpoint(toks[0])
			w.insert(2) // lost: never read
			w.srv.DiscardHistory()
			spec := w.spec()
			spec.OnHistoryLost = policy
			rec := &recorder{}
			r := w.run(spec, rec)
			lost := func() float64 { return value(w.m.HistoryLost.WithLabelValues("items")) }
			gaps := func() []deadletter.Entry {
				es, err := w.dls.List(context.Background(), deadletter.Filter{Kind: deadletter.KindGap})
				if err != nil {
					t.Fatal(err)
				}
				return es
			}

			if policy == source.HistoryLostFail {
				var err error
				select {
				case err = <-r.done:
					r.done <- err
				case <-time.After(10 * time.Second):
					t.Fatal("Run did not fail on lost history")
				}
				if !errors.Is(err, source.ErrHistoryLost) || !strings.Contains(err.Error(), `on_history_lost = "resume_from_now"`) {
					t.Fatalf("Run = %v, want ErrHistoryLost naming the way out", err)
				}
				// Run has returned: the source is stopped, and says why.
				if st := r.src.Status(); st.State != source.StateStopped || !strings.Contains(st.LastError, "ChangeStreamHistoryLost") {
					t.Fatalf("status %+v, want stopped with the history-lost error", st)
				}
				if cp, _ := w.checkpoint(); !bytes.Equal(cp.Token, toks[0]) {
					t.Fatalf("checkpoint moved to %v; it must stay at %v until an operator decides", cp.Token, toks[0])
				}
				if n := len(gaps()); n != 0 {
					t.Fatalf("%d gaps recorded with policy fail", n)
				}
				if lost() != 1 || len(rec.all()) != 0 {
					t.Fatalf("history_lost = %v, events %v; want 1, none", lost(), rec.summary())
				}
				return
			}

			var gap []deadletter.Entry
			waitFor(t, 10*time.Second, "the gap to be recorded", func() bool { gap = gaps(); return len(gap) == 1 })
			g := gap[0]
			if g.Source != "items" || g.Reason != "history_lost" || !bytes.Equal(g.LastToken, toks[0]) || g.GapTo.Before(g.GapFrom) {
				t.Fatalf("gap entry %+v", g)
			}
			r.waitOpen(t)
			w.insert(3)
			rec.waitEvents(t, inserts(3)...)
			waitFor(t, 5*time.Second, "the checkpoint at insert 3", func() bool {
				cp, _ := w.checkpoint()
				return bytes.Equal(cp.Token, rec.all()[0].Token)
			})
			if lost() != 1 {
				t.Fatalf("history_lost = %v, want 1", lost())
			}
			opens := w.streamOpens()
			if len(opens) != 2 {
				t.Fatalf("source opened %d streams, want 2", len(opens))
			}
			if opt, _ := resumeOption(opens[0]); opt != "startAfter" {
				t.Fatalf("first open %q, want startAfter the checkpoint", opt)
			}
			if opt, v := resumeOption(opens[1]); opt != "" {
				t.Fatalf("after lost history reopened with %s %v, want from now", opt, v)
			}
		})
	}
}

// TestReopenAfterStreamError: when the stream fails in a way the driver does
// not recover from by itself, the source reopens it (startAfter) from the
// last position it handed over, not from the persisted checkpoint: events
// still in flight are not read twice, and nothing after them is skipped.
func TestReopenAfterStreamError(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		fault     func(*mongowire.Server)
		reconnect bool // the source (not the driver) reopens the stream
		opens     int  // aggregates with $changeStream expected in all (0: not checked)
		// driverResume: the second aggregate is the driver's own resume
		// (resumeAfter; the source opens with startAfter).
		driverResume bool
	}{{
		name: "getMore error the driver does not resume",
		fault: func(s *mongowire.Server) {
			s.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, ErrorCode: 2, AppName: srcApp})
		},
		reconnect: true,
	}, {
		name: "the driver's own resume fails too",
		fault: func(s *mongowire.Server) {
			// A resumable getMore failure after the cursor checkout (a
			// failCommand fault before it is not labelled resumable): the
			// driver resumes by itself, and that aggregate fails.
			s.FailCommand(mongowire.FailPoint{Commands: []string{"aggregate"}, Times: 1, ErrorCode: 2, AppName: srcApp})
			s.FailCommand(mongowire.FailPoint{Commands: []string{"getMore"}, Times: 1, ErrorCode: 6, AppName: srcApp, AfterCursorCheckout: true})
		},
		reconnect:    true,
		opens:        3, // the source's, the driver's failed resume, the source's reopen
		driverResume: true,
	}, {
		name: "server restart",
		fault: func(s *mongowire.Server) {
			_ = s.Stop()
			_ = s.Restart()
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.needServer()
			rec := &recorder{hold: true}
			r := w.run(w.spec(), rec)
			r.waitOpen(t)
			initial, _ := w.checkpoint()
			w.insert(1, 2)
			rec.waitEvents(t, inserts(1, 2)...)
			tc.fault(w.srv)
			if tc.reconnect {
				waitFor(t, 10*time.Second, "the source to reopen", func() bool {
					return value(w.m.StreamReconnects.WithLabelValues("items")) == 1
				})
			}
			w.insert(3, 4)
			rec.waitEvents(t, inserts(1, 2, 3, 4)...)
			evs := rec.all()
			// A post-batch token saved after initial was read may move the
			// checkpoint, but never to insert 1 or past it: it is held.
			if cp, _ := w.checkpoint(); !bytes.Equal(cp.Token, initial.Token) {
				ct, ok := event.TokenClusterTime(cp.Token)
				if !ok || ct.Compare(evs[0].ClusterTime) >= 0 {
					t.Fatalf("checkpoint moved past events that were never acknowledged")
				}
			}
			rec.release()
			waitFor(t, 5*time.Second, "the checkpoint at insert 4", func() bool {
				cp, _ := w.checkpoint()
				return bytes.Equal(cp.Token, evs[3].Token)
			})
			rec.waitEvents(t, inserts(1, 2, 3, 4)...) // still no duplicate
			if !tc.reconnect {
				return
			}
			opens := w.streamOpens()
			if tc.opens != 0 && len(opens) != tc.opens {
				t.Fatalf("%d change stream aggregates, want %d", len(opens), tc.opens)
			}
			if opt, _ := resumeOption(opens[1]); tc.driverResume && opt != "resumeAfter" {
				t.Fatalf("second aggregate with %q, want the driver's own resume (resumeAfter)", opt)
			}
			last := opens[len(opens)-1]
			opt, v := resumeOption(last)
			if opt != "startAfter" {
				t.Fatalf("the source reopened with %q, want startAfter", opt)
			}
			if tokenData(v.Document()) < tokenData(evs[1].Token) || tokenData(v.Document()) >= tokenData(evs[2].Token) {
				t.Fatalf("reopened startAfter %v, want at or after insert 2 (%v) and before insert 3", v, evs[1].Token)
			}
		})
	}
}

// TestQuietStreamAdvancesCheckpoint: post-batch resume tokens move the
// checkpoint of a stream whose pushed-down filter drops every change, so it
// does not fall off the oplog; but never past an event still in flight.
func TestQuietStreamAdvancesCheckpoint(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{false, true} {
		name := "nothing in flight"
		if held {
			name = "an unacknowledged event holds it"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			spec := w.spec()
			spec.Pushdown = bson.D{{Key: "$match", Value: bson.D{{Key: "fullDocument.kind", Value: "rare"}}}}
			rec := &recorder{hold: held}
			r := w.run(spec, rec)
			r.waitOpen(t)
			var initial bson.Raw
			waitFor(t, 5*time.Second, "the initial checkpoint", func() bool {
				cp, ok := w.checkpoint()
				initial = cp.Token
				return ok
			})
			n := 10
			toks := w.tokensOf(n+1, func() {
				kinds := []string{"rare"}
				if !held {
					kinds[0] = "common"
				}
				for range n {
					kinds = append(kinds, "common")
				}
				for i, k := range kinds {
					if _, err := w.coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: i}, {Key: "kind", Value: k}}); err != nil {
						t.Fatal(err)
					}
				}
			})
			lastWrite := toks[n]
			if held {
				rec.waitEvents(t, "insert:0")
				// Two getMores after the writes: their post-batch tokens are
				// past every write.
				written := time.Now()
				waitFor(t, 5*time.Second, "the stream to poll past the writes", func() bool {
					return r.src.Status().LastPoll.After(written.Add(2 * spec.MaxAwait))
				})
				if cp, _ := w.checkpoint(); !bytes.Equal(cp.Token, initial) {
					t.Fatalf("checkpoint moved to %v while insert 0 is unacknowledged", cp.Token)
				}
				rec.release()
			}
			waitFor(t, 5*time.Second, "the checkpoint to pass the filtered writes", func() bool {
				cp, _ := w.checkpoint()
				return tokenData(cp.Token) >= tokenData(lastWrite)
			})
			if got := rec.summary(); held && len(got) != 1 || !held && len(got) != 0 {
				t.Fatalf("events read %v through a filter that matches none of them", got)
			}
			// The saver counts a save after the store has it: wait for
			// the count too.
			waitFor(t, 5*time.Second, "the initial save and an advance counted in checkpoint saves", func() bool {
				return value(w.m.CheckpointSaves.WithLabelValues("items")) >= 2
			})
		})
	}
}

// tokenData returns a resume token's _data; they sort as the positions do.
func tokenData(tok bson.Raw) string {
	return event.TokenData(tok)
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
