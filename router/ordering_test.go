package router

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// A batch API that fails one entry and accepts the next must not let a later
// event of the same document overtake the failed one: the retry of the failed
// entry would then arrive after its successor.
func TestEnginePartialBatchFailureKeepsPerKeyOrder(t *testing.T) {
	// With more than one request in flight a batch gathers events of
	// several partitions (keyQueue.gather).
	for _, tc := range []struct{ docs, batch, inFlight int }{{4, 10, 1}, {30, 50, 1}, {30, 50, 8}, {200, 20, 16}} {
		t.Run(fmt.Sprintf("docs=%d,batch=%d,in_flight=%d", tc.docs, tc.batch, tc.inFlight), func(t *testing.T) {
			testPartialBatchOrder(t, tc.docs, tc.batch, tc.inFlight)
		})
	}
}

func testPartialBatchOrder(t *testing.T, docs, batch, inFlight int) {
	s := &fakeSink{name: "s", max: batch}
	var failedOnce sync.Map
	s.setFail(func(e *event.Event) error {
		if e.Seq%3 == 0 {
			if _, done := failedOnce.LoadOrStore(e.Seq, true); !done {
				return sinks.Retryable("throttled", 0, errors.New("throttled"))
			}
		}
		return nil
	})
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: s, Retry: fastRetry(5), MaxInFlight: inFlight, BatchSize: batch, BatchWait: 20 * time.Millisecond})
	const n = 300
	var acked atomic.Int64
	for i := 0; i < n; i++ {
		eng.Dispatch(posEvent(t, i, i%docs), func() { acked.Add(1) })
	}
	waitUntil(t, "all acked", func() bool { return acked.Load() == n })
	if got := len(s.received()); got != n {
		t.Fatalf("delivered %d of %d", got, n)
	}
	checkPerDocOrder(t, s.received())
}
