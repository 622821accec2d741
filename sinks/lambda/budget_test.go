package lambda

import (
	"context"
	"testing"

	"github.com/changegate/changegate/sinks/internal/sinktest"
	awstest "github.com/changegate/changegate/test/aws"
)

// TestBudgetChargesPayload: the Invoke payload (one envelope, or the array
// a batching sink builds) is charged to the byte budget of Send's context,
// exactly its bytes, while the call runs, and returned after it on
// success, on a refusal and on cancellation.
func TestBudgetChargesPayload(t *testing.T) {
	for _, batch := range []int{1, 5} {
		evs := events(t, batch, 2000)
		t.Run(map[int]string{1: "single", 5: "batch"}[batch], func(t *testing.T) {
			sinktest.CheckBudget(t, func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
				srv := awstest.NewLambda(awstest.Options{})
				t.Cleanup(srv.Close)
				srv.AddFunction("step1", nil, nil)
				url := sinktest.Proxy(t, h, srv.URL())
				s := newSink(t, srv, func(c *Config) { c.Endpoint, c.BatchSize = url, batch })
				return func(ctx context.Context) error { return s.Send(ctx, evs) }
			}, sinktest.HeldBody(int64(batch)*2000))
		})
	}
}
