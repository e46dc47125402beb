package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ErrConfig is wrapped by errors about unsupported OTEL_* values.
var ErrConfig = errors.New("telemetry: invalid configuration")

// TracingConfig names the service; everything else comes from OTEL_*.
type TracingConfig struct {
	// ServiceName is the default service.name (OTEL_SERVICE_NAME wins).
	// Default "kvroute".
	ServiceName    string
	ServiceVersion string
}

// Tracing is a configured tracer provider and propagator.
type Tracing struct {
	Provider   trace.TracerProvider
	Propagator propagation.TextMapPropagator
	// Exporter names what spans are sent with: "none", "otlp/grpc" or
	// "otlp/http".
	Exporter string
	shutdown func(context.Context) error
}

// Shutdown flushes buffered spans and stops the exporter. It is a no-op
// for the non-exporting provider and safe to call more than once.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	f := t.shutdown
	t.shutdown = nil
	return f(ctx)
}

// NewTracing builds the tracer provider the environment asks for (see the
// package comment). It does not install anything globally.
func NewTracing(ctx context.Context, cfg TracingConfig) (*Tracing, error) {
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	none := &Tracing{Provider: noop.NewTracerProvider(), Propagator: prop, Exporter: "none"}

	if v, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED"))); v {
		return none, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	if exporter == "" {
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return none, nil
		}
		exporter = "otlp"
	}
	switch exporter {
	case "none":
		return none, nil
	case "otlp":
	default:
		return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q (supported: otlp, none)", ErrConfig, exporter)
	}
	protocol := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")))
	if protocol == "" {
		protocol = strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")))
	}
	var (
		exp  *otlptrace.Exporter
		err  error
		name string
	)
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
		name = "otlp/http"
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
		name = "otlp/grpc"
	default:
		return nil, fmt.Errorf("%w: OTLP protocol %q (supported: grpc, http/protobuf)", ErrConfig, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	res, err := newResource(ctx, cfg)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, Propagator: prop, Exporter: name, shutdown: tp.Shutdown}, nil
}

func newResource(ctx context.Context, cfg TracingConfig) (*resource.Resource, error) {
	name := cfg.ServiceName
	if name == "" {
		name = "kvroute"
	}
	attrs := resource.WithAttributes(semconv.ServiceName(name))
	if cfg.ServiceVersion != "" {
		attrs = resource.WithAttributes(semconv.ServiceName(name), semconv.ServiceVersion(cfg.ServiceVersion))
	}
	// Later detectors win: the environment overrides the defaults.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), attrs, resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}
