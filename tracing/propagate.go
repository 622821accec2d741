package tracing

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

type carrierKey struct{}

// carrier is what a sink finds in its Send context: the attempt's span
// (nil: not recorded) and context (the request's), and each entry's
// context.
type carrier struct {
	att       *Attempt // nil: not recorded
	span      trace.Span
	sc        trace.SpanContext
	propagate bool
	entries   []trace.SpanContext
	one       [1]trace.SpanContext // entries of a single delivery
}

func carrierOf(ctx context.Context) *carrier {
	c, _ := ctx.Value(carrierKey{}).(*carrier)
	return c
}

// Active reports whether ctx is the Send context of a recorded (sampled)
// attempt: SetAWSCall and SetHTTPStatus record something.
func Active(ctx context.Context) bool {
	c := carrierOf(ctx)
	return c != nil && c.span != nil
}

// InjectHTTP sets the W3C traceparent (and tracestate) headers of a
// request sent in ctx (a sink's Send context) to the attempt's context, as
// the W3C propagator does; nothing without tracing or with trace_context =
// false.
func InjectHTTP(ctx context.Context, h http.Header) {
	c := carrierOf(ctx)
	if c == nil || !c.propagate || !c.sc.IsValid() {
		return
	}
	if ts := c.sc.TraceState().String(); ts != "" {
		h["Tracestate"] = []string{ts}
	}
	// The propagator keeps only the flags the W3C defines: sampled and
	// random. The keys are canonical already (Header.Set's).
	h["Traceparent"] = []string{traceparent(c.sc, c.sc.TraceFlags()&(trace.FlagsSampled|trace.FlagsRandom))}
}

// Entry returns the W3C traceparent and tracestate of entry i of the batch
// sent in ctx ("" without tracing or with trace_context = false).
func Entry(ctx context.Context, i int) (traceparent, tracestate string) {
	c := carrierOf(ctx)
	if c == nil || i < 0 || i >= len(c.entries) || !c.entries[i].IsValid() {
		return "", ""
	}
	sc := c.entries[i]
	return Traceparent(sc), sc.TraceState().String()
}

// Traceparent formats sc as a W3C traceparent (version 00).
func Traceparent(sc trace.SpanContext) string {
	return traceparent(sc, sc.TraceFlags())
}

// traceparent formats sc with flags as a W3C traceparent, in one
// allocation.
func traceparent(sc trace.SpanContext, flags trace.TraceFlags) string {
	var b [55]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(flags)})
	return string(b[:])
}

// XRayHeader returns the AWS X-Ray trace header (X-Amzn-Trace-Id, an
// EventBridge entry's TraceHeader) of entry i of the batch sent in ctx, or
// of the request for i < 0; "" without tracing or with trace_context =
// false. The W3C trace id's first 8 hex digits are X-Ray's epoch part, as
// in the OpenTelemetry X-Ray propagator.
func XRayHeader(ctx context.Context, i int) string {
	c := carrierOf(ctx)
	if c == nil || !c.propagate {
		return ""
	}
	sc := c.sc
	if i >= 0 {
		if i >= len(c.entries) {
			return ""
		}
		sc = c.entries[i]
	}
	return XRay(sc)
}

// XRay formats sc as an X-Ray trace header:
// Root=1-xxxxxxxx-xxxxxxxxxxxxxxxxxxxxxxxx;Parent=xxxxxxxxxxxxxxxx;Sampled=1.
func XRay(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	tid := sc.TraceID().String()
	sampled := "0"
	if sc.IsSampled() {
		sampled = "1"
	}
	return "Root=1-" + tid[:8] + "-" + tid[8:] + ";Parent=" + sc.SpanID().String() + ";Sampled=" + sampled
}

// SetHTTPStatus records the HTTP status of the attempt sent in ctx.
func SetHTTPStatus(ctx context.Context, code int) {
	if c := carrierOf(ctx); c != nil && c.span != nil {
		c.span.SetAttributes(semconv.HTTPResponseStatusCode(code))
	}
}

// SetAWSCall records the AWS API call of the attempt sent in ctx (service,
// operation, request id and HTTP status, as the AWS SDK conventions name
// them).
func SetAWSCall(ctx context.Context, service, operation, requestID string, status int) {
	c := carrierOf(ctx)
	if c == nil || c.span == nil {
		return
	}
	as := []attribute.KeyValue{attribute.String("rpc.system.name", "aws-api"), semconv.RPCMethod(service + "/" + operation)}
	if requestID != "" {
		as = append(as, semconv.AWSRequestID(requestID))
	}
	if status > 0 {
		as = append(as, semconv.HTTPResponseStatusCode(status))
	}
	c.span.SetAttributes(as...)
}

// ParseTraceparent parses a W3C traceparent header (version 00); tests and
// receivers use it.
func ParseTraceparent(s string) (trace.SpanContext, error) {
	parts := strings.Split(s, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return trace.SpanContext{}, fmt.Errorf("malformed traceparent %q", s)
	}
	tid, err := trace.TraceIDFromHex(parts[1])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: %w", s, err)
	}
	sid, err := trace.SpanIDFromHex(parts[2])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: %w", s, err)
	}
	flags, err := hex.DecodeString(parts[3])
	if err != nil {
		return trace.SpanContext{}, fmt.Errorf("traceparent %q: %w", s, err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
	if !sc.IsValid() {
		return sc, errors.New("traceparent with a zero trace or span id")
	}
	return sc, nil
}
