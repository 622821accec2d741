package app

import (
	"io"
	"log/slog"
	"testing"

	"github.com/changegate/changegate/config"
)

// TestAdaptiveCeilingDefault: with max_in_flight = "auto" and no
// max_in_flight_max, a sink's limit may rise past the 1024 of earlier
// releases up to the sources' max_in_flight_events (a 200 ms receiver was
// held at 1024 / 0.2 s ≈ 5,100 events/s); max_in_flight_max, when set, is
// the user's cap; a fixed max_in_flight keeps its number of connections.
func TestAdaptiveCeilingDefault(t *testing.T) {
	nofile := openFileLimit()
	if nofile > 0 && nofile/2 <= legacyCeiling {
		t.Skipf("open-file limit %d: the default ceiling stays at %d here", nofile, legacyCeiling)
	}
	const head = "[mongo]\nuri = \"mongodb://localhost\"\n[[sources]]\nname = \"orders\"\ndatabase = \"shop\"\ncollection = \"orders\"\nmax_in_flight_events = 6000\n"
	for _, tc := range []struct {
		name, sink string
		wantMax    int // the limiter's Max; 0: fixed
		wantFixed  int
	}{
		{"defaults", "", min(6000, max(legacyCeiling, nofile/2)), 0},
		{"explicit max", "max_in_flight_max = 300\n", 300, 0},
		{"explicit max above the events", "max_in_flight_max = 8000\n", 8000, 0},
		{"fixed", "max_in_flight = 64\n", 0, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if nofile == 0 && tc.name == "defaults" {
				tc.wantMax = 6000
			}
			src := head + "[[sinks]]\nname = \"hook\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:1/\"\n" + tc.sink
			cfg, err := config.Parse("gw.toml", []byte(src), nil)
			if err != nil {
				t.Fatal(err)
			}
			sp, err := buildSink(cfg, cfg.Sinks[0], slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantFixed > 0 {
				if sp.MaxInFlight != tc.wantFixed {
					t.Fatalf("fixed max_in_flight: got %d, want %d", sp.MaxInFlight, tc.wantFixed)
				}
				return
			}
			if sp.Limit.Max != tc.wantMax {
				t.Fatalf("adaptive ceiling: got %d, want %d", sp.Limit.Max, tc.wantMax)
			}
		})
	}
}

// TestCeilingFor: the default ceiling is the events in flight, within half
// the open files shared by the auto sinks, never below 1024.
func TestCeilingFor(t *testing.T) {
	for _, tc := range []struct{ events, nofile, sinks, want int }{
		{10000, 0, 1, 10000},       // open-file limit unknown
		{10000, 1 << 20, 1, 10000}, // plenty of files: the events
		{10000, 20000, 1, 10000},
		{10000, 20000, 4, 2500}, // four auto sinks share 10,000 files
		{10000, 4096, 1, 2048},  // half of 4096
		{10000, 1024, 1, 1024},  // never below the earlier default
		{500, 1 << 20, 1, 1024}, // (the lane then caps it at the events)
		{0, 1 << 20, 1, 10000},  // no sources: the default events
		{10000, 1 << 20, 0, 10000},
	} {
		if got := ceilingFor(tc.events, tc.nofile, tc.sinks); got != tc.want {
			t.Errorf("ceilingFor(%d, %d, %d) = %d, want %d", tc.events, tc.nofile, tc.sinks, got, tc.want)
		}
	}
}
