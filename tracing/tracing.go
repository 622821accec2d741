// Package tracing is changegate's OpenTelemetry tracing: one trace per
// change, from its read to its acknowledgement, with a subtree per sink
// delivery (attempts, park, dead letter), and the trace context each sink
// carries to its receiver.
//
// It is configured only from the standard OTEL_* environment variables
// (FromEnv). When none enables it, FromEnv returns a nil *Tracer: every
// method of a nil *Tracer, *Change, *Delivery and *Attempt is a no-op that
// allocates nothing, and the helpers sinks call (InjectHTTP, Entry,
// XRayHeader, SetHTTPStatus) find nothing in their context, so the
// delivery path pays a nil check per hook.
//
// The router calls it at its stage edges only: a *Tracer is an
// observe.Observer with observe.Hooks (observer.go), which turns a
// change's dispatch, each request and each outcome into the spans below
// (change.go, delivery.go, attempt.go). The trace context sinks carry is
// in propagate.go, span names and attributes in attrs.go, configuration
// from the environment in env.go.
//
// On, the sampler decides once per change, when its root span starts: an
// unsampled change makes no other span and builds no attribute, but its
// trace context (sampled flag off) is still propagated. The root starts
// before its source's dispatch lock (BeforeDispatch) and the spans
// recorded under the lock are made after it (AfterDispatch; Change.HoldSpans,
// ReleaseSpans).
//
// Attributes are ids, namespaces, sizes and outcomes only, never document
// data.
package tracing

import (
	"context"
	"sync"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of changegate's spans.
const ScopeName = "github.com/changegate/changegate"

// Tracer makes changegate's spans. A nil *Tracer is tracing turned off.
// It is safe for concurrent use.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	sinks  sync.Map // sinkKey → *sinkSpans
	roots  sync.Map // sinkKey{db, coll} → the root span's name
}

// New returns a Tracer making spans with tp (tests pass one with their own
// exporter). Shutdown shuts tp down.
func New(tp *sdktrace.TracerProvider) *Tracer {
	return &Tracer{tp: tp, tracer: tp.Tracer(ScopeName)}
}

// Shutdown flushes the spans still buffered and stops the exporters; a nil
// Tracer has nothing to do.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}
