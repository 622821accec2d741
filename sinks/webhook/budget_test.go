package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// TestBudgetChargesStrippedBody: a stripped envelope (oversize = "strip")
// sent alone, or in a batch whose array is charged too, is charged to the
// byte budget of Send's context while it is sent, and returned after it
// on success, on a refusal and on cancellation.
func TestBudgetChargesStrippedBody(t *testing.T) {
	for _, batchSize := range []int{1, 10} {
		t.Run(fmt.Sprint("batch_size=", batchSize), func(t *testing.T) {
			big := bigEvent(t, 100, 64<<10)
			batch := []*event.Event{big}
			if batchSize > 1 {
				batch = append(batch, testEvent(t, 1))
			}
			sinktest.CheckBudget(t, func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
				srv := httptest.NewServer(h.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), nil))
				t.Cleanup(srv.Close)
				w := newSink(t, Config{URL: srv.URL, BatchSize: batchSize, MaxRequestBytes: 8192, AllowPrivateNetworks: true,
					Oversize: sinks.Oversize{Strip: true}})
				return func(ctx context.Context) error { return w.Send(ctx, batch) }
			}, func(held, body int64) string {
				want := body // the stripped body alone
				if batchSize > 1 {
					want = body + 200 // the array and the stripped envelope in it
				}
				if body == 0 || body > 8192 || held < want {
					return fmt.Sprintf("want at least %d", want)
				}
				return ""
			})
		})
	}
}
