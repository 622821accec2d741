package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestProcessMemoryAckedBehindSlowEvent is the memory hole fixed in
// checkpoint.Tracker.Ack, under a real memory limit: the binary runs in a
// memory cgroup limited to 128 MiB while a webhook receiver holds the
// request of one early document (_id 0) and answers every other one at
// once. The tracker's watermark stays behind that document, so every later
// change is acked out of order and waits in the tracker's ring until the
// watermark passes it; the byte budget releases it at its ack, so the source
// reads on. Before the fix the ring kept each such change's resume token as
// a slice of the whole change: the 223 changes of 1 MiB behind it stayed in
// memory, and the kernel killed the process after about 90 deliveries. Now
// the ring keeps a copy of the token alone: changegate must not be
// OOM-killed, every document must arrive, the held document's update after
// its insert, and the cgroup's peak stays below the limit (about 70 MiB:
// the byte budget is 25% of the limit, 32 MiB).
func TestProcessMemoryAckedBehindSlowEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary with 224 MiB of changes")
	}
	const (
		limit   = 128 << 20
		docSize = 1 << 20
		docs    = 224 // _id 0 (held) and 223 more
		batch   = 8   // documents per InsertMany
		// quiet is how long the deliveries may stop, once every document
		// is written, before the held one is answered anyway: documents
		// whose key shares the held one's lane partition wait behind it.
		quiet   = 5 * time.Second
		slowKey = `{"_id":0}`
	)
	cg := memCgroupOrSkip(t, limit)
	bin := changegateBinary(t)
	e := newEnv(t)

	release := make(chan struct{})
	var releaseOnce sync.Once
	var held atomic.Bool // the request of _id 0 arrived
	rcv := newSlowReceiver(0, func(d memDelivery) <-chan struct{} {
		if d.Key == slowKey && d.Op == "insert" {
			held.Store(true)
			return release
		}
		return nil
	})
	t.Cleanup(rcv.srv.Close)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before Close: it waits for the held request

	// The held request must outlast the test, not time out and retry:
	// timeout = "2m". The adaptive limit starts at max_in_flight_min, and
	// at 1 the held request would be the only one: 8 leave room for the
	// others, as a limit that has grown would.
	tmpl := hookConfig(itemsHead, rcv.srv.URL, `timeout = "2m"
max_in_flight_min = 8
max_request_bytes = 4194304
`)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	p := cg.start(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 30*time.Second, "the process to open its stream", func() bool {
		p.checkAlive(t, 0)
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})

	// _id 0 first, and its update, which must wait behind the held insert.
	ctx := context.Background()
	c := e.coll("items")
	pad := strings.Repeat("x", docSize)
	firstWrite := time.Now()
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 0}, {Key: "v", Value: 1}, {Key: "pad", Value: pad}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 0}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 2}}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the webhook request of _id 0 (held)", func() bool {
		p.checkAlive(t, len(rcv.deliveries()))
		return held.Load()
	})

	// Then the rest, answered at once: each is acked behind _id 0.
	for i := 1; i < docs; i += batch {
		var b []any
		for j := i; j < min(i+batch, docs); j++ {
			b = append(b, bson.D{{Key: "_id", Value: j}, {Key: "v", Value: 1}, {Key: "pad", Value: pad}})
		}
		if _, err := c.InsertMany(ctx, b); err != nil {
			t.Fatal(err)
		}
		p.checkAlive(t, len(rcv.deliveries()))
	}
	written := time.Now()
	writing := written.Sub(firstWrite)

	// Hold _id 0 until every other document arrived, or the deliveries
	// stopped (the documents of its lane partition wait behind it).
	distinct := func(ds []memDelivery) map[string]bool {
		seen := map[string]bool{}
		for _, d := range ds {
			seen[d.Key] = true
		}
		return seen
	}
	var hwm int64
	lastN, lastAt := -1, time.Now()
	waitFor(t, 2*time.Minute, "the other documents at the webhook", func() bool {
		ds := rcv.deliveries()
		p.checkAlive(t, len(ds))
		hwm = max(hwm, vmHWM(p.cmd.Process.Pid))
		if len(ds) != lastN {
			lastN, lastAt = len(ds), time.Now()
		}
		return len(distinct(ds)) == docs-1 || time.Since(lastAt) > quiet
	})
	behind := len(rcv.deliveries())
	peakHeld := cg.peak()
	releaseOnce.Do(func() { close(release) })

	waitFor(t, time.Minute, "every document and the update of _id 0 at the webhook", func() bool {
		ds := rcv.deliveries()
		p.checkAlive(t, len(ds))
		hwm = max(hwm, vmHWM(p.cmd.Process.Pid))
		if len(distinct(ds)) < docs {
			return false
		}
		for _, d := range ds {
			if d.Key == slowKey && d.Op == "update" {
				return true
			}
		}
		return false
	})
	took := time.Since(start)
	hwm = max(hwm, vmHWM(p.cmd.Process.Pid))
	p.stop(t)

	peak := cg.peak()
	t.Logf("%d of %d documents of 1 MiB delivered behind the held one (written in %v, all delivered %v after the last write); cgroup peak %.0f MiB while held, %.0f MiB in all (limit %d MiB, memory.failcnt %d), peak RSS %.0f MiB; %v in all",
		behind, docs-1, writing.Round(time.Millisecond), time.Since(written).Round(time.Millisecond), float64(peakHeld)/(1<<20), float64(peak)/(1<<20), limit>>20,
		cg.read("memory.failcnt"), float64(hwm)/(1<<20), took.Round(time.Millisecond))
	if n := cg.oomKills(); n != 0 {
		t.Fatalf("%d OOM kills in the cgroup", n)
	}
	if peak >= limit { // -1: the kernel does not keep a peak (cgroup v2 before Linux 5.19)
		t.Errorf("cgroup peak %d bytes, want below the limit %d", peak, limit)
	}
	// The scenario must be able to fail: what was acked behind the held
	// change, had it stayed in memory, is more than the limit.
	if int64(behind)*docSize <= limit {
		t.Errorf("only %d changes of %d bytes were acked behind the held one: not more than the %d MiB limit, so this run proves nothing", behind, docSize, limit>>20)
	}

	// No loss: every document; no stranger; _id 0's insert before its
	// update (a re-delivery repeats both in that order).
	ds := rcv.deliveries()
	seen := distinct(ds)
	for i := range docs {
		if !seen[fmt.Sprintf(`{"_id":%d}`, i)] {
			t.Errorf("document %d not delivered", i)
		}
	}
	if len(seen) != docs {
		t.Errorf("%d distinct documents delivered, want %d", len(seen), docs)
	}
	last := ""
	for _, d := range ds {
		if d.Key != slowKey {
			continue
		}
		if d.Op == "update" && last == "" {
			t.Fatalf("the update of _id 0 was delivered before its insert")
		}
		last = d.Op
	}
}
