package router

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/limit"
)

// A worker in a timed wait (a document's backoff) does not count as
// active: with a target of one worker, a partition whose batch waits must
// not hold up the other partitions (the pool starts another worker), while
// the waiting partition's own later items stay behind its batch.
func TestPoolWaitingWorkerDoesNotBlockOthers(t *testing.T) {
	q := newKeyQueue(OrderKey, 8, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	backoff := make(chan struct{})
	var mu sync.Mutex
	var got []uint64
	q.run(func() int { return 1 }, func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := q.next(ctx); p != nil; p = q.next(ctx) {
				for _, it := range first(q.take(ctx, p, 1, 0, nil)) {
					if it.key == 0 && it.attempts == 0 {
						it.attempts++ // first try fails: back off
						end := q.wait()
						<-backoff
						end()
					}
					mu.Lock()
					got = append(got, it.key)
					mu.Unlock()
					q.release(1)
				}
				q.done(p)
			}
		}()
	})
	push := func(key uint64) { it := newItem(posEvent(t, int(key)+1, int(key))); it.key = key; q.push(it) }
	push(0)
	waitUntil(t, "key 0 backing off", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.waiting == 1
	})
	push(8) // same partition as key 0: must wait for it
	for k := uint64(1); k < 8; k++ {
		push(k)
	}
	waitUntil(t, "the other partitions served", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 7
	})
	mu.Lock()
	for _, k := range got {
		if k == 8 {
			t.Fatal("key 8 overtook key 0's batch in their partition")
		}
	}
	mu.Unlock()
	close(backoff)
	waitUntil(t, "all served", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 9
	})
	mu.Lock()
	if got[7] != 0 || got[8] != 8 {
		t.Fatalf("served %v, want key 0 then key 8 last", got)
	}
	mu.Unlock()
	q.mu.Lock()
	if q.workers > 2 {
		t.Fatalf("%d workers for a target of 1 with one waiting", q.workers)
	}
	q.mu.Unlock()
	q.close()
	wg.Wait()
}

// The pool keeps the active workers at the target: with a limit of 3 (of a
// possible 64) and a sink that blocks, only 3 workers start and 3 requests
// run; then every event is delivered once, and stop ends every worker.
func TestPoolActiveWorkersFollowTarget(t *testing.T) {
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	bs := &blockingSink{inFlight: &inFlight, peak: &peak, release: release}
	l, err := newLaneClock(SinkSpec{
		Sink: bs, UseLimit: true, BatchSize: 1,
		Limit: limit.Config{Min: 1, Initial: 3, Max: 64, Cap: 100},
	}, nil, metrics.New(nil), slog.New(slog.DiscardHandler), realClock{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	l.start(ctx)
	var acked atomic.Int64
	for seq := 1; seq <= 50; seq++ {
		ev := posEvent(t, seq, seq)
		l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Add(1) })
	}
	waitUntil(t, "3 requests in flight", func() bool { return inFlight.Load() == 3 })
	l.q.mu.Lock()
	workers := l.q.workers
	l.q.mu.Unlock()
	if workers > 3 {
		t.Fatalf("%d workers started for a limit of 3", workers)
	}
	if p := peak.Load(); p > 3 {
		t.Fatalf("%d requests in flight at once, limit 3", p)
	}
	close(release)
	waitUntil(t, "all delivered", func() bool { return acked.Load() == 50 })
	if n := bs.calls.Load(); n != 50 {
		t.Fatalf("%d sends for 50 events", n)
	}
	cancel()
	l.stop()
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	if l.q.workers != 0 {
		t.Fatalf("%d workers still alive after stop", l.q.workers)
	}
}

type blockingSink struct {
	inFlight, peak *atomic.Int64
	calls          atomic.Int64
	release        chan struct{}
	mu             sync.Mutex
}

func (b *blockingSink) Name() string  { return "blocking" }
func (b *blockingSink) MaxBatch() int { return 1 }
func (b *blockingSink) Close() error  { return nil }
func (b *blockingSink) Send(ctx context.Context, batch []*event.Event) error {
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	b.mu.Lock()
	if n > b.peak.Load() {
		b.peak.Store(n)
	}
	b.mu.Unlock()
	b.calls.Add(1)
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A permanent failure is the sink's last error in its status (the console
// shows it) without marking the sink failing: it concerns one event.
func TestPermanentFailureIsLastError(t *testing.T) {
	sink := &fakeSink{name: "s", max: 1}
	sink.setFail(func(e *event.Event) error {
		return sinks.Permanent("http_400", errors.New("webhook s: HTTP 400 bad field"))
	})
	dl := newMemDL()
	l, err := newLaneClock(SinkSpec{Sink: sink, MaxInFlight: 1}, dl, metrics.New(nil), slog.New(slog.DiscardHandler), realClock{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); l.stop() }()
	l.start(ctx)
	var acked atomic.Bool
	ev := posEvent(t, 1, 1)
	l.enqueue(ev, ev.OrderingKeyHash(), func() { acked.Store(true) })
	waitUntil(t, "dead-lettered", acked.Load)
	if n, _ := dl.Count(ctx, deadletter.Filter{Sink: "s"}); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	st := l.Status()
	if st.LastError != "webhook s: HTTP 400 bad field" || st.Failing {
		t.Fatalf("status: last error %q, failing %v; want the 400 and not failing", st.LastError, st.Failing)
	}
}

// When the target goes down (the limiter's limit fell) while workers are
// busy and partitions are ready, the workers of a lane that does not batch
// (follow) beyond the new target go idle as they finish instead of taking
// the ready partitions: they would only queue in the limiter. A batching
// lane's keep going (their partitions fill batches while they queue).
func TestPoolWorkersBeyondTargetGoIdle(t *testing.T) {
	t.Run("one event per request", func(t *testing.T) { testPoolBeyondTarget(t, true) })
	t.Run("batching", func(t *testing.T) { testPoolBeyondTarget(t, false) })
}

func testPoolBeyondTarget(t *testing.T, follow bool) {
	q := newKeyQueue(OrderKey, 8, realClock{}, metrics.New(nil).QueueDepth.WithLabelValues("s"))
	q.follow = follow
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var target atomic.Int64
	target.Store(4)
	pre, post := make(chan struct{}), make(chan struct{})
	var inPre, inPost, maxPost, served atomic.Int64
	var wg sync.WaitGroup
	defer func() { cancel(); q.close(); wg.Wait() }()
	q.run(func() int { return int(target.Load()) }, func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := q.next(ctx); p != nil; p = q.next(ctx) {
				for _, it := range first(q.take(ctx, p, 1, 0, nil)) {
					if it.key < 4 {
						inPre.Add(1)
						<-pre
						inPre.Add(-1)
					} else {
						n := inPost.Add(1)
						for m := maxPost.Load(); n > m && !maxPost.CompareAndSwap(m, n); m = maxPost.Load() {
						}
						select {
						case <-post:
						case <-ctx.Done():
						}
						inPost.Add(-1)
					}
					served.Add(1)
					q.release(1)
				}
				q.done(p)
			}
		}()
	})
	for k := uint64(0); k < 8; k++ {
		q.push(&item{key: k, ev: posEvent(t, int(k)+1, int(k))})
	}
	waitUntil(t, "4 workers busy", func() bool { return inPre.Load() == 4 })
	target.Store(1)
	close(pre)
	if !follow {
		waitUntil(t, "the 4 workers serving the ready partitions", func() bool { return inPost.Load() == 4 })
		close(post)
		waitUntil(t, "all served", func() bool { return served.Load() == 8 })
		return
	}
	waitUntil(t, "3 workers idle, 1 serving the ready partitions", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.idle == 3 && inPost.Load() == 1
	})
	if m := maxPost.Load(); m != 1 {
		t.Fatalf("%d workers served the ready partitions at once after the target fell to 1", m)
	}
	close(post)
	waitUntil(t, "all served", func() bool { return served.Load() == 8 })
}

// first returns a batch of keyQueue.take without its more.
func first(batch []*item, _ bool) []*item { return batch }
