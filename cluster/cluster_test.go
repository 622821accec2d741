package cluster_test

import (
	"slices"
	"testing"

	"github.com/changegate/changegate/cluster"
)

func TestFairShare(t *testing.T) {
	for _, tc := range []struct{ units, members, want int }{
		{0, 3, 0}, {1, 3, 1}, {4, 1, 4}, {4, 2, 2}, {4, 3, 2}, {5, 2, 3}, {8, 3, 3}, {3, 0, 3},
	} {
		if got := cluster.FairShare(tc.units, tc.members); got != tc.want {
			t.Errorf("FairShare(%d, %d) = %d, want %d", tc.units, tc.members, got, tc.want)
		}
	}
}

// TestDecide: a replica acquires free units up to its fair share (never
// one it owns), hands over the surplus from the end of its sorted units,
// does nothing when it owns exactly its share, and leaves units to a member
// below floor(units/members) — releasing one when none is free and it is
// the greatest-named member at the ceiling.
func TestDecide(t *testing.T) {
	units := []string{"o#0/4", "o#1/4", "o#2/4", "o#3/4"}
	for _, tc := range []struct {
		name        string
		owned, free []string
		others      map[string]int // other live members and the units they hold
		acquire     int            // how many candidates (all free units not owned)
		release     []string
	}{
		{"alone: take everything", nil, units, nil, 4, nil},
		{"two members, none owned: candidates are every free unit", nil, units, map[string]int{"b": 0}, 4, nil},
		{"two members, share reached", []string{"o#0/4", "o#1/4"}, []string{"o#2/4"}, map[string]int{"b": 1}, 0, nil},
		{"one joined: hand over two", units, nil, map[string]int{"b": 0}, 0, []string{"o#2/4", "o#3/4"}},
		{"three members: share 2, own 3: hand over one", []string{"o#3/4", "o#0/4", "o#1/4"}, nil, map[string]int{"b": 1, "c": 0}, 0, []string{"o#3/4"}},
		{"one left: take the free ones", []string{"o#0/4", "o#1/4"}, []string{"o#2/4", "o#3/4", "o#1/4"}, nil, 2, nil},
		{"nothing free", []string{"o#0/4"}, nil, map[string]int{"b": 3}, 0, nil},
		{"2/2/0: another has the greatest name and releases", []string{"o#0/4", "o#1/4"}, nil, map[string]int{"x": 2, "y": 0}, 0, nil},
		{"2/2/0 as the greatest at the ceiling: release one", []string{"o#2/4", "o#3/4"}, nil, map[string]int{"b": 2, "c": 0}, 0, []string{"o#3/4"}},
		{"2/1/0, one free: leave it to the starved member", []string{"o#0/4"}, []string{"o#3/4"}, map[string]int{"b": 2, "c": 0}, 0, nil},
		{"starved self takes the free unit", nil, []string{"o#3/4"}, map[string]int{"b": 2, "c": 1}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			members := []string{"replica-a"}
			for m := range tc.others {
				members = append(members, m)
			}
			fresh := map[string]bool{}
			for _, u := range tc.free {
				fresh[u] = true // every free unit just became free
			}
			p := cluster.Decide("replica-a", units, tc.owned, tc.free, members, tc.others, fresh)
			if len(p.Acquire) != tc.acquire {
				t.Errorf("acquire %v, want %d candidates", p.Acquire, tc.acquire)
			}
			for _, u := range p.Acquire {
				if slices.Contains(tc.owned, u) || !slices.Contains(tc.free, u) {
					t.Errorf("candidate %s is owned or not free", u)
				}
			}
			if !slices.Equal(p.Release, tc.release) {
				t.Errorf("release %v, want %v", p.Release, tc.release)
			}
		})
	}
	// A unit free for more than a round is taken even while another member
	// is starved: no unit stays without an owner because of the rule.
	if p := cluster.Decide("replica-a", units, []string{"o#0/4"}, []string{"o#3/4"}, []string{"replica-a", "b", "c"},
		map[string]int{"b": 2, "c": 0}, map[string]bool{}); len(p.Acquire) != 1 {
		t.Errorf("a unit free for two rounds: acquire %v, want it", p.Acquire)
	}
	// Replicas start their candidate lists at different places.
	starts := map[string]bool{}
	for _, self := range []string{"a", "b", "c", "d", "e", "f"} {
		starts[cluster.Decide(self, units, nil, units, []string{"a", "b", "c", "d"}, nil, nil).Acquire[0]] = true
	}
	if len(starts) < 2 {
		t.Errorf("every replica tries %v first", starts)
	}
}
