package main

import (
	"strings"
	"testing"
)

func TestParseCPUs(t *testing.T) {
	eight := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for _, tc := range []struct {
		spec          string
		avail         []int
		on            bool
		consumer, bch string
		err, desc     string
	}{
		{spec: "", avail: eight, desc: "not pinned"},
		{spec: "auto", avail: []int{0, 1}, desc: "not pinned: -cpus auto needs 4 CPUs (2 for the consumer, 2 for mongowire and the receiver), 2 available"},
		{spec: "auto", avail: eight, on: true, consumer: "4,5,6,7", bch: "0,1,2,3"},
		{spec: "auto", avail: []int{2, 3, 5, 7, 9}, on: true, consumer: "5,7,9", bch: "2,3"},
		{spec: "2-3/0-1", avail: eight, on: true, consumer: "2,3", bch: "0,1"},
		{spec: "4,6/0-3,5", avail: eight, on: true, consumer: "4,6", bch: "0,1,2,3,5"},
		{spec: "1/0", avail: []int{0, 1}, on: true, consumer: "1", bch: "0"},
		{spec: "0-2/2-3", avail: eight, err: `-cpus "0-2/2-3": CPU 2 is in both sets`},
		{spec: "2-3", avail: eight, err: `want "auto" or CONSUMER/BENCH`},
		{spec: "8/0", avail: eight, err: "consumer: CPU 8 is not available to this process (available: 0,1,2,3,4,5,6,7)"},
		{spec: "1/3-2", avail: eight, err: `bench: bad CPU range "3-2"`},
		{spec: "1/", avail: eight, err: "bench: empty CPU list"},
		{spec: "x/0", avail: eight, err: `consumer: bad CPU "x"`},
	} {
		p, err := parseCPUs(tc.spec, tc.avail)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		if p.on != tc.on {
			t.Errorf("%q: on = %v", tc.spec, p.on)
		}
		if tc.desc != "" && p.desc != tc.desc {
			t.Errorf("%q: desc %q, want %q", tc.spec, p.desc, tc.desc)
		}
		if !tc.on {
			continue
		}
		if got := cpuList(&p.consumer); got != tc.consumer {
			t.Errorf("%q: consumer %s, want %s", tc.spec, got, tc.consumer)
		}
		if got := cpuList(&p.bench); got != tc.bch {
			t.Errorf("%q: bench %s, want %s", tc.spec, got, tc.bch)
		}
	}
}
