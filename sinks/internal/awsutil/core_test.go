package awsutil

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/changegate/changegate/sinks"
)

// TestCoreBegin checks the start of a Send that Core gives the AWS sinks:
// the sink's timeout (ErrSendTimeout as the cause) while open, and a
// retryable "closed" error naming the sink once closed.
func TestCoreBegin(t *testing.T) {
	var c Core
	c.Init("sqs", "audit", 1000, sinks.Oversize{}, true, 20*time.Millisecond)
	if c.Name() != "audit" || c.Prefix() != "sqs audit" || c.MaxBytes != 1000 || !c.Canonical {
		t.Fatalf("Init: name %q prefix %q maxBytes %d canonical %v", c.Name(), c.Prefix(), c.MaxBytes, c.Canonical)
	}
	ctx, cancel, err := c.Begin(context.Background())
	if err != nil {
		t.Fatalf("Begin on an open sink: %v", err)
	}
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), ErrSendTimeout) {
		t.Fatalf("cause %v, want ErrSendTimeout", context.Cause(ctx))
	}
	cancel()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Begin(context.Background())
	var se *sinks.Error
	if !errors.As(err, &se) || se.Permanent || se.Reason != "closed" || err.Error() != "sqs audit: send after close" {
		t.Fatalf("Begin after Close = %v, want a retryable closed error", err)
	}
}
