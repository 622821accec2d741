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
// and does nothing when it owns exactly its share.
func TestDecide(t *testing.T) {
	units := []string{"o#0/4", "o#1/4", "o#2/4", "o#3/4"}
	for _, tc := range []struct {
		name        string
		owned, free []string
		members     int
		acquire     int // how many candidates (all free units not owned)
		release     []string
	}{
		{"alone: take everything", nil, units, 1, 4, nil},
		{"two members, none owned: candidates are every free unit", nil, units, 2, 4, nil},
		{"two members, share reached", []string{"o#0/4", "o#1/4"}, []string{"o#2/4"}, 2, 0, nil},
		{"one joined: hand over two", units, nil, 2, 0, []string{"o#2/4", "o#3/4"}},
		{"three members: share 2, own 3: hand over one", []string{"o#3/4", "o#0/4", "o#1/4"}, nil, 3, 0, []string{"o#3/4"}},
		{"one left: take the free ones", []string{"o#0/4", "o#1/4"}, []string{"o#2/4", "o#3/4", "o#1/4"}, 1, 2, nil},
		{"nothing free", []string{"o#0/4"}, nil, 2, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := cluster.Decide("replica-a", units, tc.owned, tc.free, tc.members)
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
	// Replicas start their candidate lists at different places.
	starts := map[string]bool{}
	for _, self := range []string{"a", "b", "c", "d", "e", "f"} {
		starts[cluster.Decide(self, units, nil, units, 4).Acquire[0]] = true
	}
	if len(starts) < 2 {
		t.Errorf("every replica tries %v first", starts)
	}
}
