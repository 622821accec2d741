package kinesis

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// TestBudgetChargesRequestBody: the PutRecords body the SDK encodes (the
// records in base64) is charged to the byte budget of Send's context,
// exactly its bytes, while the call runs, and returned after it on
// success, on a refusal and on cancellation.
func TestBudgetChargesRequestBody(t *testing.T) {
	evs := sinktest.Changes(t, 5, 2000)
	sinktest.CheckBudget(t, func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
		srv := newServer(t, awstest.Options{})
		url := sinktest.Proxy(t, h, srv.URL())
		k := newSink(t, srv, func(c *Config) { c.Endpoint = url })
		return func(ctx context.Context) error { return k.Send(ctx, evs) }
	}, sinktest.HeldBody(5*2000*4/3))
}
