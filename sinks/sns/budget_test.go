package sns

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// TestBudgetChargesRequestBody: the PublishBatch body the SDK encodes is
// charged to the byte budget of Send's context, exactly its bytes, while
// the call runs, and returned after it on success, on a refusal and on
// cancellation.
func TestBudgetChargesRequestBody(t *testing.T) {
	evs := sinktest.Changes(t, 5, 2000)
	sinktest.CheckBudget(t, func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
		srv := newServer(t, 0)
		url := sinktest.Proxy(t, h, srv.URL())
		s := newSink(t, srv, "changes", func(c *Config) { c.Endpoint = url })
		return func(ctx context.Context) error { return s.Send(ctx, evs) }
	}, sinktest.HeldBody(5*2000))
}
