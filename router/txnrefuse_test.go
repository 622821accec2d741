package router

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks/webhook"
)

// A receiver that refuses (400) a grouped transaction too large for one
// request (20 inserts of 100 KB, max_request_bytes 400 KiB: 5 or more
// parts; the 20 of 1 MB in 4 MiB, scaled down for -race)
// gets its first part once; that part and every later one are dead-lettered
// at once with its answer, unsent, and the sink is neither retried nor
// marked failing (so never parked), and a single change queued behind the
// transaction is delivered. It used to dead-letter the refused part only;
// the later parts failed "not_sent" (retryable) and went round with
// backoff, one part per round, until parking held the sink up.
func TestTxnGroupRefusedPartDeadLettersTheRest(t *testing.T) {
	var reqs, singles atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if len(body) > 0 && body[0] == '[' {
			reqs.Add(1)
			http.Error(w, "refused: no transactions here", http.StatusBadRequest)
			return
		}
		singles.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	wh, err := webhook.New(webhook.Config{Name: "s", URL: srv.URL, MaxRequestBytes: 400 << 10, AllowPrivateNetworks: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	dl := newMemDL()
	retry := fastRetry(50)
	retry.InitialInterval, retry.MaxInterval = 20*time.Millisecond, 20*time.Millisecond
	eng := newTestEngine(t, dl, SinkSpec{Sink: wh, Retry: retry, MaxInFlight: 4, Group: true, ParkAfter: 100 * time.Millisecond})
	var acked atomic.Int64
	ack := func() { acked.Add(1) }
	const n = 20
	for i := range n {
		ev := bigEvent(t, i+1, i, 100<<10)
		ev.Txn = &event.Txn{ID: "tx", Index: i, Last: i == n-1, Unit: "orders"}
		eng.Dispatch(ev, ack)
	}
	// A single change of another document, queued behind the transaction.
	eng.Dispatch(bigEvent(t, n+1, 999, 10), ack)
	waitUntil(t, "all acked", func() bool { return acked.Load() == n+1 })
	if got := reqs.Load(); got != 1 {
		t.Errorf("the receiver got %d transaction requests, want 1 (the first part; the later ones are not sent)", got)
	}
	if got := singles.Load(); got != 1 {
		t.Errorf("the single change was delivered %d times, want 1", got)
	}
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.entries) != n {
		t.Fatalf("%d dead letters, want %d", len(dl.entries), n)
	}
	for _, e := range dl.entries {
		if e.Reason != "http_400" || e.Attempts != 1 || e.Txn == nil || e.Txn.ID != "tx" {
			t.Errorf("dead letter %s: reason %q, %d attempts, txn %+v: want http_400 after 1 attempt, in transaction tx", e.ID, e.Reason, e.Attempts, e.Txn)
		}
		if !strings.Contains(e.LastError, "refused: no transactions here") {
			t.Errorf("dead letter %s: error %q does not carry the receiver's answer", e.ID, e.LastError)
		}
	}
	st := eng.state.Load().lanes[0].Status()
	if st.Parked || st.Failing {
		t.Errorf("sink status %+v: want neither parked nor failing", st)
	}
}
