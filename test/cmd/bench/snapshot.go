package main

import (
	"context"
	"fmt"
	"time"
)

// scenarioSnapshot (13): o.snapN documents exist before changegate's first
// start, with snapshot = "initial" and one webhook sink batching 100
// envelopes per request. events/s is documents delivered per second from
// the first request to the last; RSS is changegate's peak.
func (b *bench) scenarioSnapshot() []*result {
	n := b.o.snapN
	r := &result{id: 13, name: fmt.Sprintf("initial snapshot of %d documents, webhook batch_size = 100", n)}
	e, err := newEnv()
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer e.Close()
	t := time.Now()
	if err := writeBacklog(context.Background(), e.coll, 0, n); err != nil {
		r.err = err
		return []*result{r}
	}
	b.logf("  wrote %d documents in %s", n, time.Since(t).Round(time.Millisecond))
	rcv, err := newReceiver(int64(n), n, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer rcv.Close()
	t0 := time.Now()
	c, err := b.startGateway("snapshot", gwConf{uri: e.srv.URI(), url: rcv.url, sinks: 1, batch: 100, snapshot: true, maxInFlight: b.o.maxInFlight}, false)
	if err != nil {
		r.err = err
		return []*result{r}
	}
	defer c.stop()
	m, err := b.watchGateway(c, rcv, false)
	r.err = err
	r.events, r.deliveries, r.elapsed = n, int(rcv.count.Load()), rcv.window()
	r.cpu, r.envCPU, r.rss = m.cpu, m.envCPU, m.hwm
	mb := func(v int64) string { return fmt.Sprintf("%.0f", float64(v)/(1<<20)) }
	r.note = fmt.Sprintf("first request %s after process start; RSS MB at 10/50/90%%: %s/%s/%s",
		(time.Duration(rcv.first.Load() - t0.UnixNano())).Round(10*time.Millisecond), mb(m.rss.at(int64(n)/10)), mb(m.rss.at(int64(n)/2)), mb(m.rss.at(int64(n)*9/10)))
	if reqs := rcv.requests.Load(); reqs > 0 {
		r.note += fmt.Sprintf("; %.1f events/request", float64(r.deliveries)/float64(reqs))
	}
	if d := rcv.dups.Load(); d > 0 {
		r.note += fmt.Sprintf("; %d duplicates", d)
	}
	return []*result{r}
}
