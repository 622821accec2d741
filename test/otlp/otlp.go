// Package otlp is an in-process OpenTelemetry collector for tests: an
// HTTP server that takes OTLP/HTTP protobuf trace exports
// (POST /v1/traces) and keeps the spans.
package otlp

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, ids in hex.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	// Kind is the OTLP span kind (1 internal, 2 server, 3 client, 4
	// producer, 5 consumer).
	Kind int
	// Attrs holds the attribute values as text (arrays joined with ",").
	Attrs map[string]string
	// Events are the span events' names.
	Events []string
	// Links are the linked span contexts, "traceid-spanid".
	Links []string
	// Error is true when the span's status is Error.
	Error bool
	// Service is the resource's service.name.
	Service string
	Start   uint64 // unix nanos
}

// Receiver is the collector. Its URL (the httptest server's) is the
// OTEL_EXPORTER_OTLP_ENDPOINT to give an exporter.
type Receiver struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []Span
	count    int  // spans received
	discard  bool // count the spans, keep none (NewCounter)
	requests int
	errs     []string
}

// NewReceiver starts a Receiver that keeps every span; Close it when done.
func NewReceiver() *Receiver {
	r := &Receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	return r
}

// NewCounter starts a Receiver that decodes every export, as a collector
// does, but only counts the spans (SpanCount): for benchmarks, where
// keeping millions of spans would cost the measuring process more memory
// than the measured one. Spans and Trace return nothing.
func NewCounter() *Receiver {
	r := &Receiver{discard: true}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.requests++
	r.mu.Unlock()
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		r.fail(fmt.Sprintf("%s %s: not an OTLP trace export", req.Method, req.URL.Path))
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			r.fail(err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		r.fail(err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		r.fail("content type " + ct)
		http.Error(w, "want application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		r.fail(err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.discard {
		n := 0
		for _, rs := range msg.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
		r.mu.Lock()
		r.count += n
		r.mu.Unlock()
		r.reply(w)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = text(kv.GetValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: int(s.GetKind()),
					Attrs: map[string]string{}, Error: s.GetStatus().GetCode() == 2, Service: service,
					Start: s.GetStartTimeUnixNano(),
				}
				for _, kv := range s.GetAttributes() {
					sp.Attrs[kv.GetKey()] = text(kv.GetValue())
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, hex.EncodeToString(l.GetTraceId())+"-"+hex.EncodeToString(l.GetSpanId()))
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.count += len(got)
	r.mu.Unlock()
	r.reply(w)
}

// reply answers an export: every span accepted.
func (r *Receiver) reply(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// SpanCount returns how many spans the receiver got so far.
func (r *Receiver) SpanCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

func (r *Receiver) fail(msg string) {
	r.mu.Lock()
	r.errs = append(r.errs, msg)
	r.mu.Unlock()
}

// text renders an attribute value.
func text(v *common.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *common.AnyValue_StringValue:
		return x.StringValue
	case *common.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *common.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *common.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *common.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, text(e))
		}
		return strings.Join(parts, ",")
	case *common.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	}
	return ""
}

// Spans returns every span received so far, in start order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]Span(nil), r.spans...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// Trace returns the spans of one trace, in start order.
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Requests returns how many requests the receiver got (exports or not).
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Errors returns what the receiver could not take (a malformed export).
func (r *Receiver) Errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// Find returns the spans named name (in start order).
func Find(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}
