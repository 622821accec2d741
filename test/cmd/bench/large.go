package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// largeSizes are scenario 14's workloads: changes of 1 MiB and of 8 MiB.
var largeSizes = []struct{ n, size int }{{1000, 1 << 20}, {100, 8 << 20}}

// defaultBudget is max_in_flight_bytes on a machine without a container
// memory limit (memory.DefaultBudget), the budget scenario 14 runs with.
const defaultBudget = 256 << 20

// largeDoc is benchDoc padded to about size bytes.
func largeDoc(seq int, wts int64, size int) bson.D {
	return append(benchDoc(seq, wts), bson.E{Key: "pad", Value: strings.Repeat("x", size)})
}

// writeLarge inserts n large documents from two writers.
func writeLarge(ctx context.Context, coll *mongo.Collection, n, size int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 2 {
				if _, err := coll.InsertOne(ctx, largeDoc(i, time.Now().UnixNano(), size)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// scenarioLarge (14): large documents. For each of largeSizes, the bare
// POST ceiling of the same bodies (the http role, -concurrency workers,
// pre-encoded envelopes of the same size), the minimal consumer of those
// changes (scenario 15's role), then changegate catching up a
// backlog of those changes to one webhook sink (max_request_bytes =
// 16777216, one event per request): MB/s of request bodies next to the
// ceiling's, and changegate's peak RSS next to its byte budget.
func (b *bench) scenarioLarge() []*result {
	var out []*result
	for _, w := range largeSizes {
		mib := w.size >> 20
		ceilRow := &result{id: 14, name: fmt.Sprintf("HTTP ceiling: %d pre-encoded POSTs of %d MiB, %d concurrent", w.n, mib, b.o.concurrency)}
		rcv, err := newReceiver(int64(w.n), w.n, false)
		if err != nil {
			ceilRow.err = err
			return append(out, ceilRow)
		}
		e0 := selfCPU()
		res, err := b.runRole("http", "-url", rcv.url+"/s0", "-n", strconv.Itoa(w.n), "-c", strconv.Itoa(b.o.concurrency), "-size", strconv.Itoa(w.size))
		ceilRow.envCPU = selfCPU() - e0
		ceilRow.err = err
		ceilRow.events, ceilRow.deliveries, ceilRow.elapsed, ceilRow.cpu, ceilRow.rss = res.Events, int(rcv.count.Load()), res.Elapsed, res.CPU, res.HWM
		ceilMBs := 0.0
		if res.Elapsed > 0 {
			ceilMBs = float64(w.n) * float64(w.size) / (1 << 20) / res.Elapsed.Seconds()
		}
		ceilRow.note = fmt.Sprintf("%.0f MB/s", ceilMBs)
		rcv.Close()
		out = append(out, ceilRow)

		// The minimal consumer (scenario 15's role) of the same changes:
		// what reading, encoding and signing them costs on their own.
		pair := fmt.Sprintf("large %d MiB", mib)
		mr := &result{id: 14, pair: pair, minimal: true, name: fmt.Sprintf("minimal consumer: %d changes of %d MiB, read, encode, sign, POST (%d concurrent)", w.n, mib, b.o.concurrency)}
		b.runMinimal(mr, w.n, 1, func(e *env) error { return writeLarge(context.Background(), e.coll, w.n, w.size) })
		mr.ceiling, mr.ceilName = ceilRow.rate(), "the HTTP ceiling of the same bodies"
		if mr.elapsed > 0 {
			mr.note = fmt.Sprintf("%.0f MB/s (ceiling %.0f MB/s)", float64(w.n)*float64(w.size)/(1<<20)/mr.elapsed.Seconds(), ceilMBs)
		}
		out = append(out, mr)

		r := &result{id: 14, pair: pair, name: fmt.Sprintf("changegate, %d changes of %d MiB, webhook max_request_bytes = 16777216", w.n, mib)}
		out = append(out, r)
		e, err := newEnv()
		if err != nil {
			r.err = err
			continue
		}
		start := time.Now().Unix() - 1
		t := time.Now()
		if err := writeLarge(context.Background(), e.coll, w.n, w.size); err != nil {
			r.err = err
			e.Close()
			continue
		}
		b.logf("  wrote %d documents of %d MiB in %s", w.n, mib, time.Since(t).Round(time.Millisecond))
		rcv, err = newReceiver(int64(w.n), w.n, false)
		if err != nil {
			r.err = err
			e.Close()
			continue
		}
		c, err := b.startGateway(fmt.Sprintf("large-%d", mib), gwConf{uri: e.srv.URI(), url: rcv.url, sinks: 1, batch: 1, startAt: start,
			maxInFlight: b.o.maxInFlight, sinkTOML: "max_request_bytes = 16777216\ntimeout = \"60s\""}, false)
		if err != nil {
			r.err = err
			rcv.Close()
			e.Close()
			continue
		}
		m, err := b.watchGateway(c, rcv, false)
		c.stop()
		r.err = err
		r.events, r.deliveries, r.elapsed = w.n, int(rcv.count.Load()), rcv.window()
		r.cpu, r.envCPU, r.rss = m.cpu, m.envCPU, m.hwm
		mbs := 0.0
		if r.elapsed > 0 {
			mbs = float64(w.n) * float64(w.size) / (1 << 20) / r.elapsed.Seconds()
		}
		r.ceiling, r.ceilName = ceilRow.rate(), "the HTTP ceiling of the same bodies"
		r.note = fmt.Sprintf("%.0f MB/s (ceiling %.0f MB/s); peak RSS %.0f MiB with max_in_flight_bytes %d MiB (the default without a container limit)",
			mbs, ceilMBs, float64(r.rss)/(1<<20), defaultBudget>>20)
		if d := rcv.dups.Load(); d > 0 {
			r.note += fmt.Sprintf("; %d duplicates", d)
		}
		rcv.Close()
		e.Close()
	}
	return out
}
