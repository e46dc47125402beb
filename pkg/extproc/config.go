package extproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

// Decider makes the routing decision (route.Decide's shape). It must honour
// ctx and be safe for concurrent use.
type Decider interface {
	Decide(ctx context.Context, req route.Request) (route.Decision, error)
}

// DeciderFunc adapts a function to Decider.
type DeciderFunc func(ctx context.Context, req route.Request) (route.Decision, error)

// Decide calls f.
func (f DeciderFunc) Decide(ctx context.Context, req route.Request) (route.Decision, error) {
	return f(ctx, req)
}

// Config configures a Server. Only Decider is required; every other zero
// field takes the default its comment names.
type Config struct {
	Decider Decider

	// Tracker receives the request lifecycle (Start on pick, FirstToken,
	// Done); nil disables lifecycle tracking.
	Tracker *load.Tracker
	// Fidelity receives predicted vs served cached tokens; nil disables it.
	Fidelity *load.Fidelity
	// BlockSize returns a replica's KV block size in tokens, to turn matched
	// blocks into predicted cached tokens. Nil (or a result <= 0) falls
	// back to estimating it from the decision (PromptTokens/PromptBlocks).
	BlockSize func(index.ReplicaID) int

	// DestinationHeader names the pick's header. Default
	// x-gateway-destination-endpoint.
	DestinationHeader string
	// FallbackHeader names the header carrying the fallback list. Default
	// x-gateway-destination-endpoint-fallback.
	FallbackHeader string
	// FallbacksInDestination folds the fallback list into the destination
	// value itself ("ip:port,ip:port,..."), as the Endpoint Picker protocol
	// allows, instead of FallbackHeader. Leave it off behind an Envoy
	// ORIGINAL_DST cluster, which needs a single address in the header.
	FallbacksInDestination bool
	// SessionHeader carries the session affinity key. Default x-session-id.
	SessionHeader string
	// IgnoreSubsetHint disables the envoy.lb.subset_hint restriction.
	IgnoreSubsetHint bool

	// MaxRequestBody bounds a buffered request body; larger requests get
	// 413. Default 16 MiB.
	MaxRequestBody int
	// MaxResponseBody bounds a non-streamed response buffered to read its
	// usage; beyond it usage is not read (the response still flows).
	// Default 4 MiB.
	MaxResponseBody int
	// DecideTimeout bounds one decision, tokenization included. Default 2s.
	DecideTimeout time.Duration

	// RequestBodyMode and ResponseBodyMode are the body modes assumed when
	// the proxy does not announce its protocol configuration on the
	// stream. Default FULL_DUPLEX_STREAMED for both.
	RequestBodyMode  filterv3.ProcessingMode_BodySendMode
	ResponseBodyMode filterv3.ProcessingMode_BodySendMode

	// TracerProvider makes the request and decision spans; nil means no-op.
	TracerProvider trace.TracerProvider
	// Propagator extracts the caller's trace context from the request
	// headers and injects ours upstream. Default W3C trace context.
	Propagator propagation.TextMapPropagator
	// Registerer receives the request-path metrics unless nil.
	Registerer prometheus.Registerer
	// Logger defaults to discarding.
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Decider == nil {
		return c, errors.New("extproc: Config.Decider is required")
	}
	if c.DestinationHeader == "" {
		c.DestinationHeader = DefaultDestinationHeader
	}
	if c.FallbackHeader == "" {
		c.FallbackHeader = DefaultFallbackHeader
	}
	if c.SessionHeader == "" {
		c.SessionHeader = DefaultSessionHeader
	}
	c.DestinationHeader = strings.ToLower(c.DestinationHeader)
	c.FallbackHeader = strings.ToLower(c.FallbackHeader)
	c.SessionHeader = strings.ToLower(c.SessionHeader)
	for _, h := range []string{c.DestinationHeader, c.FallbackHeader, c.SessionHeader} {
		if strings.HasPrefix(h, ":") || strings.ContainsAny(h, " \t\r\n,") {
			return c, fmt.Errorf("extproc: invalid header name %q", h)
		}
	}
	if c.DestinationHeader == c.FallbackHeader {
		return c, errors.New("extproc: destination and fallback headers must differ")
	}
	if c.MaxRequestBody == 0 {
		c.MaxRequestBody = 16 << 20
	}
	if c.MaxResponseBody == 0 {
		c.MaxResponseBody = 4 << 20
	}
	if c.DecideTimeout == 0 {
		c.DecideTimeout = 2 * time.Second
	}
	if c.MaxRequestBody < 0 || c.MaxResponseBody < 0 || c.DecideTimeout < 0 {
		return c, errors.New("extproc: limits and timeouts must be positive")
	}
	if c.RequestBodyMode == filterv3.ProcessingMode_NONE {
		c.RequestBodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	if c.ResponseBodyMode == filterv3.ProcessingMode_NONE {
		c.ResponseBodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// isStripped reports whether a client-sent header must be removed.
func (c *Config) isStripped(name string) bool {
	return strings.HasPrefix(name, DestinationPrefix) || name == c.DestinationHeader || name == c.FallbackHeader
}

// statusText is the OpenAI-style error type for an HTTP status.
func statusText(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusServiceUnavailable:
		return "service_unavailable"
	}
	return "internal_error"
}
