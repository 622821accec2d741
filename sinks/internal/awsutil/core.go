package awsutil

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/changegate/changegate/sinks"
)

// Core is what the batching AWS sinks (EventBridge, SQS, SNS, Kinesis) hold
// besides their client and destination, and the start of their Send: a
// sink keeps one as a field, calls Init once in its constructor, and its
// Name and Close are Core's. It is safe for concurrent use once
// initialised.
type Core struct {
	name   string
	prefix string
	// MaxBytes caps one request (max_request_bytes, with its default).
	MaxBytes int
	// Oversize is the policy for an entry alone over MaxBytes.
	Oversize sinks.Oversize
	// Canonical selects canonical instead of relaxed Extended JSON.
	Canonical bool
	timeout   time.Duration
	closed    atomic.Bool
}

// Init sets c for the sink name of kind ("sqs") with its limits; maxBytes
// and timeout are the values in force (defaults applied).
func (c *Core) Init(kind, name string, maxBytes int, oversize sinks.Oversize, canonical bool, timeout time.Duration) {
	c.name, c.prefix = name, kind+" "+name
	c.MaxBytes, c.Oversize, c.Canonical, c.timeout = maxBytes, oversize, canonical, timeout
}

// Name returns the sink name.
func (c *Core) Name() string { return c.name }

// Prefix returns how the sink's errors start: its kind and name ("sqs
// audit").
func (c *Core) Prefix() string { return c.prefix }

// Close marks the sink closed; the SDK client holds no other resources that
// need releasing. No Send may follow Close.
func (c *Core) Close() error {
	c.closed.Store(true)
	return nil
}

// Begin starts one Send: a retryable error (reason "closed") after Close,
// otherwise ctx bounded by the sink's timeout (WithTimeout) and its cancel,
// which the Send defers.
func (c *Core) Begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if c.closed.Load() {
		return ctx, nil, sinks.Retryable("closed", 0, fmt.Errorf("%s: send after close", c.prefix))
	}
	ctx, cancel := WithTimeout(ctx, c.timeout)
	return ctx, cancel, nil
}
