package deadletter_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// Claims carry their owner process. A replay takes over at once the claim
// of a process on this machine that is no longer running (killed mid-replay)
// and respects a live one's, one from another machine until it expires, and
// the previous release's claims (claim and claimUntil, no owner) as that
// release did: live until claimUntil.
func TestReplayClaimOwners(t *testing.T) {
	machine := deadletter.SelfMachine()
	if machine == "" {
		t.Skip("no /proc: claim owners are judged by expiry only")
	}
	ctx := testCtx(t)
	db := testDB(t)
	s := deadletter.NewStore(db, "deadletters")
	// A process that runs, and one that ran.
	live := exec.Command("sleep", "60")
	dead := exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{live, dead} {
		if err := c.Start(); err != nil {
			t.Skip("cannot start sleep:", err)
		}
	}
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })
	liveStart, err := deadletter.ProcStart(live.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	deadStart, err := deadletter.ProcStart(dead.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = dead.Process.Kill()
	_ = dead.Wait()

	owner := func(machine string, pid int, start int64) bson.D {
		return bson.D{{Key: "process", Value: "0123456789abcdef"}, {Key: "host", Value: "h"}, {Key: "machine", Value: machine}, {Key: "pid", Value: pid}, {Key: "start", Value: start}}
	}
	hour := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name      string
		claim     bson.D
		delivered bool
	}{
		{"previous release, live", bson.D{{Key: "claim", Value: "old"}, {Key: "claimUntil", Value: hour}}, false},
		{"previous release, expired", bson.D{{Key: "claim", Value: "old"}, {Key: "claimUntil", Value: time.Now().Add(-time.Second)}}, true},
		{"dead owner here", bson.D{{Key: "claim", Value: "k"}, {Key: "claimUntil", Value: hour}, {Key: "claimBy", Value: owner(machine, dead.Process.Pid, deadStart)}}, true},
		{"pid reused here", bson.D{{Key: "claim", Value: "k"}, {Key: "claimUntil", Value: hour}, {Key: "claimBy", Value: owner(machine, live.Process.Pid, liveStart+1)}}, true},
		{"live owner here", bson.D{{Key: "claim", Value: "k"}, {Key: "claimUntil", Value: hour}, {Key: "claimBy", Value: owner(machine, live.Process.Pid, liveStart)}}, false},
		{"owner elsewhere", bson.D{{Key: "claim", Value: "k"}, {Key: "claimUntil", Value: hour}, {Key: "claimBy", Value: owner("another/machine", dead.Process.Pid, deadStart)}}, false},
		{"owner elsewhere, expired", bson.D{{Key: "claim", Value: "k"}, {Key: "claimUntil", Value: time.Now().Add(-time.Second)}, {Key: "claimBy", Value: owner("another/machine", live.Process.Pid, liveStart)}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := db.Collection("deadletters").DeleteMany(ctx, bson.D{}); err != nil {
				t.Fatal(err)
			}
			e := entry(t, ev(t, "orders", "orders", 1, 10), "a", deadletter.KindFailed)
			put(t, ctx, s, e)
			if _, err := db.Collection("deadletters").UpdateOne(ctx, bson.D{{Key: "_id", Value: e.ID}}, bson.D{{Key: "$set", Value: tc.claim}}); err != nil {
				t.Fatal(err)
			}
			var got []string
			res, err := s.Replay(ctx, deadletter.Filter{}, func(_ context.Context, _ string, ev *event.Event) error {
				got = append(got, ev.ID)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.delivered {
				if !slices.Equal(got, []string{e.EventID}) || res.Replayed != 1 {
					t.Fatalf("delivered %v, result %+v: want the entry taken over and replayed", got, res)
				}
				return
			}
			if len(got) != 0 || res.Skipped != 1 || len(res.Errors) != 1 || !errors.Is(res.Errors[0], deadletter.ErrClaimed) {
				t.Fatalf("delivered %v, result %+v: want the claim respected (ErrClaimed)", got, res)
			}
		})
	}
}
