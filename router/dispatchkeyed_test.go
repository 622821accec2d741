package router

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// DispatchKeyed queues an event where Dispatch queues it: changes of one
// document dispatched either way stay in order across the lane's
// partitions, while the first attempt of every other change fails and is
// retried (a change queued in another partition than its predecessor
// would overtake it during the retry).
func TestDispatchKeyedKeepsPerKeyOrder(t *testing.T) {
	s := &fakeSink{name: "s", max: 1}
	var failedOnce sync.Map
	s.setFail(func(e *event.Event) error {
		if e.Seq%2 == 0 {
			if _, done := failedOnce.LoadOrStore(e.Seq, true); !done {
				return sinks.Retryable("throttled", 0, errors.New("throttled"))
			}
		}
		return nil
	})
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: 8, BatchSize: 1, BatchWait: time.Millisecond})
	const n, docs = 400, 20
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	for i := 0; i < n; i++ {
		ev := posEvent(t, i, i%docs)
		ev.Seq = uint64(i)
		if i%3 == 0 {
			eng.Dispatch(ev, ack)
		} else {
			eng.DispatchKeyed(ev, ev.OrderingKeyHash(), ack)
		}
	}
	waitUntil(t, "all acked", func() bool { return acked.Load() == n })
	if got := len(s.received()); got != n {
		t.Fatalf("delivered %d of %d", got, n)
	}
	checkPerDocOrder(t, s.received())
}
