package tracing

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Environment variables that turn tracing on (any one, set and not
// empty), unless OTEL_SDK_DISABLED is "true" or OTEL_TRACES_EXPORTER is
// "none".
var enablingEnv = []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}

// FromEnv returns the Tracer the OTEL_* environment variables configure,
// or nil (tracing off) when none of OTEL_TRACES_EXPORTER,
// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// set, OTEL_TRACES_EXPORTER is "none" or OTEL_SDK_DISABLED is "true".
//
//   - OTEL_TRACES_EXPORTER: "otlp" (the default), "console" (JSON spans on
//     console, one a line) or "none"; a comma-separated list sends to each.
//   - OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL: "http/protobuf" (default),
//     "http/json" or "grpc"; OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT,
//     _HEADERS, _TIMEOUT, _COMPRESSION, _INSECURE and the TLS files are
//     read by the OTLP exporters themselves.
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES: the resource
//     (service.name defaults to "changegate").
//   - OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG: read by the SDK
//     (default parentbased_always_on).
//
// The caller must call Shutdown, which flushes what is buffered.
func FromEnv(ctx context.Context, version string, console io.Writer) (*Tracer, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	on := false
	for _, k := range enablingEnv {
		if strings.TrimSpace(os.Getenv(k)) != "" {
			on = true
		}
	}
	if !on {
		return nil, nil
	}
	names := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if names == "" {
		names = "otlp"
	}
	var exps []sdktrace.SpanExporter
	for _, name := range strings.Split(names, ",") {
		switch name = strings.TrimSpace(name); name {
		case "none":
			if names == "none" {
				return nil, nil
			}
		case "otlp":
			e, err := otlpFromEnv(ctx)
			if err != nil {
				return nil, err
			}
			exps = append(exps, e)
		case "console":
			e, err := stdouttrace.New(stdouttrace.WithWriter(console))
			if err != nil {
				return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: console: %w", err)
			}
			exps = append(exps, e)
		default:
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: unsupported exporter %q (otlp, console or none)", name)
		}
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName("changegate"), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: last, they win
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	bsp, err := batchOptions()
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, e := range exps {
		opts = append(opts, sdktrace.WithBatcher(e, bsp...))
	}
	return New(sdktrace.NewTracerProvider(opts...)), nil
}

// MaxQueueSize is the most ended spans the batch span processor holds for
// export (per exporter): OTEL_BSP_MAX_QUEUE_SIZE (default 2048) is capped
// to it. When the queue is full, spans are dropped, never waited for, so
// the spans waiting for an exporter that is slow or down take at most the
// queue plus the batch being exported (OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
// default 512, at most the queue).
const MaxQueueSize = 1 << 16

// batchOptions returns the batch span processor's queue and batch sizes:
// the OTEL_BSP_* values, bounded (MaxQueueSize). The schedule delay and
// the export timeout are the SDK's reading of OTEL_BSP_SCHEDULE_DELAY and
// OTEL_BSP_EXPORT_TIMEOUT.
func batchOptions() ([]sdktrace.BatchSpanProcessorOption, error) {
	size := func(key string, def int) (int, error) {
		v := strings.TrimSpace(os.Getenv(key))
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s: %q is not a positive number", key, v)
		}
		return n, nil
	}
	queue, err := size("OTEL_BSP_MAX_QUEUE_SIZE", sdktrace.DefaultMaxQueueSize)
	if err != nil {
		return nil, err
	}
	batch, err := size("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", sdktrace.DefaultMaxExportBatchSize)
	if err != nil {
		return nil, err
	}
	queue = min(queue, MaxQueueSize)
	return []sdktrace.BatchSpanProcessorOption{
		sdktrace.WithMaxQueueSize(queue), sdktrace.WithMaxExportBatchSize(min(batch, queue)),
	}, nil
}

// otlpFromEnv returns the OTLP exporter of the protocol the environment
// names; its endpoint and options are the exporter's own reading of the
// OTEL_EXPORTER_OTLP_* variables.
func otlpFromEnv(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	key := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if proto == "" {
		proto, key = strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch proto {
	case "", "http/protobuf", "http/json":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	}
	return nil, fmt.Errorf("%s: unsupported protocol %q (http/protobuf, http/json or grpc)", key, proto)
}
