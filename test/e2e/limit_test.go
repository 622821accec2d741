package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/test/receiver"
)

// limitConfig routes every change of %DB%.items to one webhook sink with
// the given max_in_flight line ("" for the defaults).
func limitConfig(url, maxInFlight string) string {
	head := strings.Replace(itemsHead, `shutdown_grace = "10s"`, `shutdown_grace = "2s"`, 1)
	return hookConfig(head, url, "secret = \"${TEST_SECRET}\"\n"+maxInFlight)
}

// steadyRate runs changegate with max_in_flight line mif against a receiver
// that answers every request after latency, writes n changes and returns
// the delivery rate from the n/4-th delivery to the last (the first quarter
// is the warm-up: connections, the adaptive limit's slow start), the
// largest concurrencyLimit seen in /api/v1/status, the most requests the
// receiver held at once, and checks that every change arrived exactly once.
func steadyRate(t *testing.T, mif string, latency time.Duration, n int) (rate float64, maxLimit, peak int) {
	t.Helper()
	e := newEnv(t)
	// Signatures are not verified: under -race that would cost more CPU
	// than the rest of the receiver, and this test is about concurrency.
	rcv := receiver.New()
	t.Cleanup(rcv.Close)
	var inFlight, top atomic.Int64
	rcv.SetResponder(func([]byte) *receiver.Response {
		n := inFlight.Add(1)
		for cur := top.Load(); n > cur && !top.CompareAndSwap(cur, n); cur = top.Load() {
		}
		time.Sleep(latency)
		inFlight.Add(-1)
		return nil
	})
	cfg := e.config(limitConfig(rcv.URL(), mif))
	cfg.Server.PublicRead = true // the test reads /api/v1/status without a token
	g := e.start(cfg)
	insertN(t, e.coll("items"), 0, n)
	waitFor(t, 60*time.Second, fmt.Sprintf("%d deliveries (%s)", n, rcv), func() bool {
		var st struct {
			Sinks []struct {
				Limit int `json:"concurrencyLimit"`
			} `json:"sinks"`
		}
		if api(t, "GET", g.admin, "/api/v1/status", "", &st) == 200 && len(st.Sinks) == 1 {
			maxLimit = max(maxLimit, st.Sinks[0].Limit)
		}
		return rcv.Count() >= n
	})
	seen := map[string]bool{}
	var at []time.Time
	for _, d := range rcv.Deliveries() {
		if seen[d.ID] {
			t.Fatalf("%s: event %s delivered twice", mif, d.ID)
		}
		seen[d.ID] = true
		at = append(at, d.At)
	}
	if len(seen) != n {
		t.Fatalf("%s: %d distinct events, want %d", mif, len(seen), n)
	}
	slices.SortFunc(at, time.Time.Compare)
	rate = float64(n-1-n/4) / at[n-1].Sub(at[n/4]).Seconds()
	if err := g.stop(t, false); err != nil {
		t.Fatalf("stop: %v", err)
	}
	return rate, maxLimit, int(top.Load())
}

// TestAdaptiveConcurrencyBeatsFixed16 is issue 11's end-to-end check:
// against a receiver that takes 1 s per request, the defaults
// (max_in_flight = "auto") hold many more requests at once than
// max_in_flight = 16 and deliver several times as fast, both measured in
// this test. 16 fixed is bounded at 16 requests at once and 16 events/s;
// auto's ceiling (max_in_flight_events / 1 s) is far above that.
//
// The margins are set for a loaded machine, where the test used to fail:
// under -race on 2 cores the CPU, not the limit, caps auto at a few hundred
// events/s alone (31–34×) and far less with other test processes (5–10×
// with seven of them at 400 ms latency; the 10× this asserted needed 160
// events/s). The concurrency at the receiver is the direct measure and
// costs little CPU (a request sleeps): 64 at once needs only 64 requests
// started within one latency. The rate must still be 4× (64 events/s).
// A limit that stops growing at 16–40, or a lane that does not run
// enough workers for it, fails both.
func TestAdaptiveConcurrencyBeatsFixed16(t *testing.T) {
	const latency = time.Second
	fixed, fixedLimit, fixedPeak := steadyRate(t, "max_in_flight = 16", latency, 80)
	auto, autoLimit, autoPeak := steadyRate(t, "", latency, 4000)
	t.Logf("max_in_flight = 16: %.0f events/s (limit %d, %d requests at once); defaults: %.0f events/s (limit up to %d, %d requests at once); ratio %.1f×",
		fixed, fixedLimit, fixedPeak, auto, autoLimit, autoPeak, auto/fixed)
	if fixedLimit != 16 || fixedPeak > 16 {
		t.Errorf("max_in_flight = 16 reported a concurrency limit of %d and held %d requests at once", fixedLimit, fixedPeak)
	}
	if autoPeak < 4*16 {
		t.Errorf("defaults held at most %d requests at once (limit up to %d), want at least 64", autoPeak, autoLimit)
	}
	if auto < 4*fixed {
		t.Fatalf("defaults deliver %.0f events/s, max_in_flight = 16 %.0f: %.1f×, want at least 4×", auto, fixed, auto/fixed)
	}
}
