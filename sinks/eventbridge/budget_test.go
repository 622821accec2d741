package eventbridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// budgetSink returns the Send of an EventBridge sink whose endpoint is
// held by h.
func budgetSink(evs []*event.Event, mod func(*Config)) func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
	return func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
		url := sinktest.Server(t, h, &fakeBus{})
		b := sinktest.Open(t, New, Config{
			Name: "bus", EventBus: "orders", Region: "us-east-1", Endpoint: url,
			Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
			Timeout:     time.Minute,
		}, mod)
		return func(ctx context.Context) error { return b.Send(ctx, evs) }
	}
}

// TestBudgetChargesRequestBody: the PutEvents body the SDK encodes is
// charged to the byte budget of Send's context, exactly its bytes, while
// the call runs, and returned after it on success, on a refusal and on
// cancellation.
func TestBudgetChargesRequestBody(t *testing.T) {
	evs := events(t, 5, 2000)
	sinktest.CheckBudget(t, budgetSink(evs, nil), sinktest.HeldBody(5*2000))
}

// TestBudgetChargesStrippedPayload: with oversize = "strip", the stripped
// envelope made for the Send is charged too, besides the request body.
func TestBudgetChargesStrippedPayload(t *testing.T) {
	evs := []*event.Event{testEvent(t, 0, 10), testEvent(t, 1, 2000)}
	sinktest.CheckBudget(t, budgetSink(evs, func(c *Config) {
		c.MaxRequestBytes = 1000
		c.Oversize = sinks.Oversize{Strip: true}
	}), func(held, body int64) string {
		if body == 0 || body > 2000 || held < body+200 {
			return fmt.Sprintf("want the body plus the stripped envelope (at least %d)", body+200)
		}
		return ""
	})
}
