// Package telemetry sets up the process's observability plumbing, and
// nothing else: the OpenTelemetry tracer provider and propagator (from the
// standard OTEL_* environment variables), a Prometheus registry with the Go
// and process collectors and its /metrics HTTP handler, and the slog
// logger. Metrics themselves are defined where they are recorded (extproc,
// load, ...) by constructors taking a prometheus.Registerer; nothing here is
// global and nothing registers itself.
//
// Tracing (NewTracing):
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none, or neither
//     OTEL_TRACES_EXPORTER nor an OTLP endpoint variable set: a no-op
//     provider. Trace context still propagates: the caller's traceparent is
//     forwarded upstream unchanged.
//   - OTEL_TRACES_EXPORTER=otlp, or OTEL_EXPORTER_OTLP_ENDPOINT /
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set: an SDK provider with a batch
//     span processor and an OTLP exporter over gRPC or HTTP/protobuf
//     (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL:
//     "grpc" | "http/protobuf", default "http/protobuf"). The exporters read
//     their own OTEL_EXPORTER_OTLP_* variables (endpoint, headers, timeout,
//     TLS); the sampler follows OTEL_TRACES_SAMPLER(_ARG) (default
//     parentbased_always_on); the resource takes OTEL_SERVICE_NAME and
//     OTEL_RESOURCE_ATTRIBUTES over the default service name.
//   - Any other exporter or protocol value is a configuration error.
//
// The propagator is W3C trace context plus baggage. Tracing.Shutdown
// flushes pending spans; call it once at exit with a bounded context.
//
// Nothing in this package starts a goroutine of its own, except the span
// batcher inside an exporting SDK provider, which Shutdown stops.
package telemetry
