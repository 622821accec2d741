package chaos

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/test/receiver"
)

// The cluster campaign's checks run in the default suite: a lease log that
// is not parsed, or a stale send that is not counted, would make the
// campaign report zero whatever changegate does.

func TestParseLeaseEvents(t *testing.T) {
	log := `time=2026-11-26T15:59:56.870Z level=INFO msg="acquired unit" instance=cg-0 component=cluster unit=items#2/6 epoch=1
time=2026-11-26T15:59:57.000Z level=INFO msg="delivered" instance=cg-0 unit=items#2/6
time=2026-11-26T15:59:57.100Z level=INFO msg="resuming from checkpoint" instance=cg-0 source=items unit=items#2/6 epoch=1 cluster_time="{T:1 I:2}"
time=2026-11-26T15:59:58.534Z level=INFO msg="released unit" instance=cg-0 component=cluster unit=items#4/6 epoch=1
time=2026-11-26T15:59:59.100Z level=ERROR msg="lost the lease of a unit: stopped reading it; what it still held is dropped unacknowledged and re-read by its next owner" instance=cg-0 component=cluster unit=items#2/6 epoch=1 reason="lease expired"
time=2026-11-26T15:59:59.200Z level=WARN msg="shutdown grace period over" instance=cg-0 unit=items#2/6 epoch=1
time=2026-11-26T16:00:00.100Z level=INFO msg="resuming from checkpoint" instance=cg-0 source=items unit=items#2/6 epoch=3 cluster_time="{T:1 I:2}"
time=2026-11-26T16:00:00.101Z level=INFO msg="large change events are split by the server and reassembled" instance=cg-0 source=items unit=items#2/6 epoch=3
time=2026-11-26T16:00:00.104Z level=INFO msg="acquired unit" instance=cg-0 component=cluster unit=items#2/6 epoch=3
`
	evs, err := parseLeaseEvents(bufio.NewScanner(strings.NewReader(log)))
	if err != nil {
		t.Fatal(err)
	}
	want := []leaseEvent{
		{At: time.Date(2026, 11, 26, 15, 59, 56, 870e6, time.UTC), Unit: "items#2/6", Held: true, What: "acquired"},
		{At: time.Date(2026, 11, 26, 15, 59, 58, 534e6, time.UTC), Unit: "items#4/6", What: "released"},
		{At: time.Date(2026, 11, 26, 15, 59, 59, 100e6, time.UTC), Unit: "items#2/6", What: "lost the lease of"},
		// a line of the old epoch after the loss changes nothing; the new
		// epoch's source holds the unit from its first line
		{At: time.Date(2026, 11, 26, 16, 0, 0, 100e6, time.UTC), Unit: "items#2/6", Held: true, What: "started"},
	}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want %+v", evs, want)
	}
	for i := range want {
		if !evs[i].At.Equal(want[i].At) || evs[i].Unit != want[i].Unit || evs[i].Held != want[i].Held || evs[i].What != want[i].What {
			t.Errorf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}
}

func TestStaleSends(t *testing.T) {
	at := func(ms int) time.Time { return v0.Add(time.Duration(ms) * time.Millisecond) }
	unit := func(doc int32) string { return map[int32]string{1: "u1", 2: "u2"}[doc] }
	leases := map[string][]leaseEvent{
		"a": {{At: at(0), Unit: "u1", Held: true}, {At: at(1000), Unit: "u1", What: "lost the lease of"}, {At: at(3000), Unit: "u1", Held: true}},
		"b": {{At: at(0), Unit: "u2", Held: true}},
	}
	reqs := []request{
		{Replica: "a", Doc: 1, HasDoc: true, At: at(500)},         // held
		{Replica: "a", Doc: 1, HasDoc: true, At: at(1000)},        // same millisecond as the loss: on the wire
		{Replica: "a", Doc: 1, HasDoc: true, At: at(1001)},        // stale
		{Replica: "a", Doc: 1, HasDoc: true, At: at(2500)},        // stale
		{Replica: "a", Doc: 1, HasDoc: true, At: at(3500)},        // re-acquired
		{Replica: "b", Doc: 2, HasDoc: true, At: at(2000)},        // held
		{Replica: "a", Doc: 2, HasDoc: true, At: at(2000)},        // never held u2: not counted (no loss line)
		{Replica: "", Doc: 1, HasDoc: true, At: at(2000)},         // no replica in the path
		{Replica: "b", HasDoc: false, At: at(2000), EventID: "x"}, // no document
	}
	r := staleSends(reqs, leases, unit)
	if len(r.Stale) != 2 || r.Requests != 7 || r.Unattached != 2 {
		t.Fatalf("%s; stale %+v", r.Summary(), r.Stale)
	}
	if r.Lag[0] != time.Millisecond || r.Lag[1] != 1500*time.Millisecond {
		t.Errorf("lags %v, want [1ms 1.5s]", r.Lag)
	}
	if d := r.Details(10, v0); !strings.Contains(d, "a sent event") || !strings.Contains(d, "1.5s after it lost the lease of the unit") {
		t.Errorf("details:\n%s", d)
	}
}

// A stale replica's late send is what reorders a document across replicas:
// the new owner delivered change 3, then the old owner's queued change 2
// lands. verify must report it as a reorder.
func TestVerifyStaleReorder(t *testing.T) {
	ins1, upd2, upd3 := change{Seq: 1, Op: "insert"}, change{Seq: 2, Op: "update"}, change{Seq: 3, Op: "update"}
	j := &journal{docs: map[int32][]change{7: {ins1, upd2, upd3}}, total: 3}
	// Old owner delivered insert 1, lost the lease with update 2 queued;
	// the new owner re-read from insert 1 and went on; the old owner's
	// update 2 arrives after the new owner's update 3.
	ds := []receiver.Delivery{env(7, ins1, 1000), env(7, ins1, 2000), env(7, upd3, 2500), env(7, upd2, 3000)}
	r := verify(j, ds, v0)
	if r.OK() || len(r.Reorders) != 1 {
		t.Fatalf("want one reorder: %s\n%s", r.Summary(), r.Details(10))
	}
}
