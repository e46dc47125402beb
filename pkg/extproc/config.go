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
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/respstore"
	"github.com/kvroute/kvroute/pkg/route"
)

// Decider makes the routing decision (route.Decide's shape). It must honour
// ctx and be safe for concurrent use.
type Decider interface {
	Decide(ctx context.Context, req route.Request) (route.Decision, error)
}

// RateObserver learns from one finished request (route.Rates implements
// it).
type RateObserver interface {
	Observe(replica index.ReplicaID, s route.RateSample)
}

// ResponseStore knows which replica stores each response of the Responses
// API (respstore.Store implements it): a request continuing, retrieving or
// cancelling one is pinned to its holder (route.Request.Pin).
type ResponseStore interface {
	// Holder returns the address of the replica storing response id ("" when
	// none is known to); model is the request's, "" when it names none.
	Holder(ctx context.Context, model, id string) (string, respstore.Source)
	// Stored records that the replica at addr stores response id.
	Stored(id, addr string)
	// Elsewhere looks for id on the replicas other than the one at not (an
	// unhealthy holder), "" when none has it.
	Elsewhere(ctx context.Context, model, id, not string) (string, respstore.Source)
	// Lost forgets addr as the holder of id (it answered 404 for it).
	Lost(id, addr string)
}

// DeciderFunc adapts a function to Decider.
type DeciderFunc func(ctx context.Context, req route.Request) (route.Decision, error)

// Decide calls f.
func (f DeciderFunc) Decide(ctx context.Context, req route.Request) (route.Decision, error) {
	return f(ctx, req)
}

// Defaults of the Config settings, written once.
const (
	// DefaultMaxBodyBytes bounds a request body (16 MiB): the shipped Envoy
	// configs buffer exactly this much (request_body_buffer_limit), and the
	// gRPC receive limit of ServerOptions is derived from it.
	DefaultMaxBodyBytes = 16 << 20
	// DefaultMaxResponseBodyBytes bounds a non-streamed response buffered
	// to read its usage (4 MiB).
	DefaultMaxResponseBodyBytes = 4 << 20
	// LargeBody is the body size from which a decision takes one of the
	// DecideConcurrency slots (64 KiB: a few milliseconds of tokenizing).
	LargeBody = 64 << 10
	// DefaultDecideTimeout bounds one decision, tokenization included.
	DefaultDecideTimeout = 2 * time.Second
	// DefaultMaxRequestLifetime is how long a routed request counts as
	// load and may report its served cached tokens.
	DefaultMaxRequestLifetime = 15 * time.Minute
	// DefaultObserverWait is how long after its decision a routed request
	// waits for an observer stream to claim it once its router stream has
	// ended.
	DefaultObserverWait = 2 * time.Second
	// DefaultUsageSampleEvery: one streamed response in 64 is observed to
	// its end by count, besides the per-replica floor of
	// DefaultUsageSampleInterval; the others to their first token (see
	// Config.UsageSampleEvery and docs/benchmarks.md, "Usage sampling").
	DefaultUsageSampleEvery = 64
	// MaxDecisionHistory bounds Config.DecisionHistory.
	MaxDecisionHistory = 1 << 20
	// DefaultUsageSampleInterval: a replica's streamed responses are
	// observed to their end at least every 250 ms (all of them below four
	// requests a second).
	DefaultUsageSampleInterval = 250 * time.Millisecond
	// DefaultMaxStreamsPerConnection bounds concurrent ext_proc streams on
	// one HTTP/2 connection (Envoy opens another connection beyond it).
	DefaultMaxStreamsPerConnection = 1024
	// DefaultMaxConnectionIdle closes a connection with no stream for this
	// long.
	DefaultMaxConnectionIdle = 5 * time.Minute
)

// Config configures a Server. The settings carry YAML tags (a config
// file's extproc section); the collaborators (Decider, Tracker, ...) are
// wired in code. Only Decider is required; every other zero field takes
// the default its comment names (WithDefaults).
type Config struct {
	Decider Decider `yaml:"-"`

	// Tracker receives the request lifecycle (Start on pick, FirstToken,
	// Done); nil disables lifecycle tracking.
	Tracker *load.Tracker `yaml:"-"`
	// Fidelity receives predicted vs served cached tokens; nil disables it.
	Fidelity *load.Fidelity `yaml:"-"`
	// Rates learns each replica's prefill speed and decode step from the
	// streamed (SSE) responses of requests kvroute routed: time from the
	// pick to the first content token and to the end, and the usage's
	// prompt, cached and output tokens (route.Rates); nil disables it. A
	// JSON response carries no first-token time and feeds nothing.
	Rates RateObserver `yaml:"-"`
	// Responses pins requests naming a stored response to its holder and
	// learns the holders of the responses it routes; nil: no pinning.
	Responses ResponseStore `yaml:"-"`
	// BlockSize returns a replica's KV block size in tokens, to turn matched
	// blocks into predicted cached tokens. Nil (or a result <= 0) falls
	// back to estimating it from the decision (PromptTokens/PromptBlocks).
	BlockSize func(index.ReplicaID) int `yaml:"-"`

	// DestinationHeader names the pick's header. Default
	// x-gateway-destination-endpoint. The envoy.lb metadata key, which
	// Envoy's override_host load balancer reads, is that default whatever
	// this says (MetadataDestinationKey); kvroute's config does not set it.
	DestinationHeader string `yaml:"destination_header"`
	// FallbackHeader names the header carrying the fallback list. Default
	// x-gateway-destination-endpoint-fallback.
	FallbackHeader string `yaml:"fallback_header"`
	// FallbacksInDestination folds the fallback list into the destination
	// value itself ("ip:port,ip:port,..."), as the Endpoint Picker protocol
	// allows, instead of FallbackHeader. Leave it off behind an Envoy
	// ORIGINAL_DST cluster, which needs a single address in the header.
	FallbacksInDestination bool `yaml:"fallbacks_in_destination"`
	// SessionHeader carries the session affinity key. Default x-session-id.
	SessionHeader string `yaml:"session_header"`
	// IgnoreSubsetHint disables the envoy.lb.subset_hint restriction.
	IgnoreSubsetHint bool `yaml:"ignore_subset_hint"`

	// MaxBodyBytes bounds a request body; a larger one gets a 413 from the
	// router (body_too_large), whatever the body mode. It is the one size
	// setting of the request path: ServerOptions derives the gRPC receive
	// limit from it, and the proxy must buffer exactly this much (Envoy's
	// request_body_buffer_limit; a test checks the shipped configs).
	// Default DefaultMaxBodyBytes.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// DecideConcurrency, when positive, bounds the decisions on large
	// bodies (LargeBody bytes and more: parsing, tokenization, scoring)
	// computed at once; a stream past the bound waits for a slot, at most
	// a quarter of DecideTimeout, then is decided anyway (counted in
	// kvroute_extproc_decide_slot_timeouts_total): late beats refused.
	// Smaller bodies are decided at once. Default 0: no bound, every core
	// decides. A bound below GOMAXPROCS keeps processors free for the
	// streams' per-chunk messages (Envoy holds each streamed response
	// chunk until kvroute answers it) while large prompts are tokenized;
	// on the 2-core benchmark machine it did not pay (docs/benchmarks.md,
	// "Large bodies").
	DecideConcurrency int `yaml:"decide_concurrency"`
	// MaxResponseBodyBytes bounds a non-streamed response buffered to read
	// its usage; beyond it usage is not read (the response still flows).
	// Default DefaultMaxResponseBodyBytes.
	MaxResponseBodyBytes int `yaml:"max_response_body_bytes"`
	// DecideTimeout bounds one decision, tokenization included. Default
	// DefaultDecideTimeout.
	DecideTimeout time.Duration `yaml:"decide_timeout"`
	// MaxRequestLifetime is a routed request's deadline: after it the
	// request no longer counts as load on its replica (a stream held open
	// without a response cannot pin phantom load) and its usage, if it
	// ever comes, is not fed to Fidelity. Default DefaultMaxRequestLifetime;
	// keep it above the longest generation you serve.
	MaxRequestLifetime time.Duration `yaml:"max_request_lifetime"`
	// ObserverWait is how long after its decision a routed request waits
	// for its observer stream (the request headers of Envoy's
	// observability-mode filter, which carry DecisionHeader) once its router
	// stream has ended; a request no stream observed ends then (counted in
	// kvroute_extproc_unobserved_total). Default DefaultObserverWait.
	ObserverWait time.Duration `yaml:"observer_wait"`
	// UsageSampleEvery: one streamed (SSE) response in this many is
	// observed to its end, for its usage (Fidelity's cached tokens, the
	// learned speeds of Rates, the span's usage attributes); the others,
	// when their router stream's close marks the request's end (a buffered
	// body), are observed only to their first token, then the observer
	// stream is closed and Envoy sends it none of the remaining chunks
	// (each chunk is one gRPC message, most of kvroute's CPU per streamed
	// request). The load view loses nothing: first token and end are seen
	// for every request, and so does the learned prefill speed (Rates is
	// fed at the first token, with the prompt's uncached tokens as
	// predicted, when the decision's tokens were exact). What sampling
	// thins is the engine-reported cached tokens (Fidelity), the learned
	// decode step and the span's usage attributes. Default
	// DefaultUsageSampleEvery; 1 observes every response to its end.
	UsageSampleEvery int `yaml:"usage_sample_every"`
	// UsageSampleInterval is a per-replica floor under UsageSampleEvery: a
	// response is also observed to its end when no response of its replica
	// was in the last interval, so that each replica's cached-token
	// fidelity and decode step keep getting samples at a low request rate
	// (below one request per interval every response is). Default
	// DefaultUsageSampleInterval; a long one (1h) leaves the count alone.
	UsageSampleInterval time.Duration `yaml:"usage_sample_interval"`
	// MaxStreamsPerConnection and MaxConnectionIdle bound the gRPC server
	// (ServerOptions): concurrent streams on one connection and how long a
	// connection without streams stays open. Defaults
	// DefaultMaxStreamsPerConnection, DefaultMaxConnectionIdle.
	MaxStreamsPerConnection uint32        `yaml:"max_streams_per_connection"`
	MaxConnectionIdle       time.Duration `yaml:"max_connection_idle"`
	// DecisionHistory keeps the newest this many routing decisions, each
	// with every candidate's match, load and cost, for Server.Decisions
	// (the admin API's GET /debug/decisions): what was decided, not only
	// what Explain would decide now. Each kept decision costs a few
	// hundred bytes per candidate; at most MaxDecisionHistory. Default 0:
	// none kept, nothing recorded.
	DecisionHistory int `yaml:"decision_history"`

	// RequestBodyMode and ResponseBodyMode are the body modes assumed when
	// the proxy does not announce its protocol configuration on the
	// stream. Default FULL_DUPLEX_STREAMED for both.
	RequestBodyMode  filterv3.ProcessingMode_BodySendMode `yaml:"-"`
	ResponseBodyMode filterv3.ProcessingMode_BodySendMode `yaml:"-"`

	// TracerProvider makes the request and decision spans; nil means no-op.
	TracerProvider trace.TracerProvider `yaml:"-"`
	// Propagator extracts the caller's trace context from the request
	// headers and injects ours upstream. Default W3C trace context.
	Propagator propagation.TextMapPropagator `yaml:"-"`
	// Registerer receives the request-path metrics unless nil.
	Registerer prometheus.Registerer `yaml:"-"`
	// Ready gates every stream: while it returns false a stream is
	// refused at once with UNAVAILABLE, so the proxy fails open (to its
	// fallback) instead of kvroute answering from a replica set it has not
	// probed yet. Nil means always ready. cmd/kvroute passes Health.Ready.
	Ready func() bool `yaml:"-"`
	// Logger defaults to discarding.
	Logger *slog.Logger `yaml:"-"`
}

// WithDefaults returns c with every zero setting replaced by its default
// and header names lower-cased.
func (c Config) WithDefaults() Config {
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
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBodyBytes == 0 {
		c.MaxResponseBodyBytes = DefaultMaxResponseBodyBytes
	}
	if c.DecideTimeout == 0 {
		c.DecideTimeout = DefaultDecideTimeout
	}
	if c.MaxRequestLifetime == 0 {
		c.MaxRequestLifetime = DefaultMaxRequestLifetime
	}
	if c.ObserverWait == 0 {
		c.ObserverWait = DefaultObserverWait
	}
	if c.UsageSampleEvery == 0 {
		c.UsageSampleEvery = DefaultUsageSampleEvery
	}
	if c.UsageSampleInterval == 0 {
		c.UsageSampleInterval = DefaultUsageSampleInterval
	}
	if c.MaxStreamsPerConnection == 0 {
		c.MaxStreamsPerConnection = DefaultMaxStreamsPerConnection
	}
	if c.MaxConnectionIdle == 0 {
		c.MaxConnectionIdle = DefaultMaxConnectionIdle
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
	return c
}

// Validate reports every problem of the settings (after WithDefaults),
// each prefixed with its field path (e.g. "max_body_bytes: must be
// positive"). Zero settings are valid: they take defaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Decider == nil {
		bad("decider", "required")
	}
	for _, h := range []struct{ field, name string }{
		{"destination_header", c.DestinationHeader}, {"fallback_header", c.FallbackHeader}, {"session_header", c.SessionHeader},
	} {
		if strings.HasPrefix(h.name, ":") || strings.ContainsAny(h.name, " \t\r\n,") {
			bad(h.field, "invalid header name %q", h.name)
		}
	}
	if c.DestinationHeader != "" && strings.EqualFold(c.DestinationHeader, c.FallbackHeader) {
		bad("fallback_header", "must differ from destination_header (%q)", c.DestinationHeader)
	}
	if c.MaxBodyBytes < 0 {
		bad("max_body_bytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	if c.MaxBodyBytes > MaxBodyBytesLimit {
		bad("max_body_bytes", "must be at most %d, got %d", MaxBodyBytesLimit, c.MaxBodyBytes)
	}
	if c.MaxResponseBodyBytes < 0 {
		bad("max_response_body_bytes", "must be positive, got %d", c.MaxResponseBodyBytes)
	}
	if c.DecideConcurrency < 0 {
		bad("decide_concurrency", "must not be negative (0: no bound), got %d", c.DecideConcurrency)
	}
	if c.MaxRequestLifetime < 0 {
		bad("max_request_lifetime", "must be positive, got %v", c.MaxRequestLifetime)
	}
	if c.ObserverWait < 0 {
		bad("observer_wait", "must be positive, got %v", c.ObserverWait)
	}
	if c.UsageSampleEvery < 0 {
		bad("usage_sample_every", "must be positive (1: every response), got %d", c.UsageSampleEvery)
	}
	if c.UsageSampleInterval < 0 {
		bad("usage_sample_interval", "must be positive, got %v", c.UsageSampleInterval)
	}
	if c.DecisionHistory < 0 || c.DecisionHistory > MaxDecisionHistory {
		bad("decision_history", "must be in [0, %d] (0: none kept), got %d", MaxDecisionHistory, c.DecisionHistory)
	}
	if c.MaxConnectionIdle < 0 {
		bad("max_connection_idle", "must be positive, got %v", c.MaxConnectionIdle)
	}
	if c.DecideTimeout < 0 {
		bad("decide_timeout", "must be positive, got %v", c.DecideTimeout)
	}
	return errors.Join(errs...)
}

// MaxBodyBytesLimit is the largest accepted MaxBodyBytes (1 GiB): a gRPC
// message carries the whole buffered body.
const MaxBodyBytesLimit = 1 << 30

// grpcMessageSlack is what a body message carries beyond the body itself
// (the ProcessingRequest framing, metadata context, protocol config).
const grpcMessageSlack = 1 << 20

// Flow-control windows of the ext_proc gRPC server. gRPC-Go starts at
// 64 KiB and grows windows by round-trip (BDP) estimation, which on a busy
// host keeps a proxy connection's window small: every large body then
// waits for several window updates while sharing the one connection with
// every other stream. Fixed large windows let a 16 MiB body and dozens of
// concurrent 200 KB bodies flow without waiting on the router.
const (
	streamWindowBytes = 16 << 20
	connWindowBytes   = 64 << 20
	connBufferBytes   = 256 << 10
	// streamWorkers serve streams on reused goroutines (whose stacks have
	// already grown to what a decision needs) instead of a new goroutine
	// per stream; beyond them gRPC starts one per stream as before.
	streamWorkers = 64
)

// MaxRecvMsgBytes is the gRPC receive limit that admits a body of
// MaxBodyBytes in one message (the BUFFERED body mode), so that a body at
// the limit is never refused by the transport (the proxy would fail open
// and route it blind) but reaches the router, which answers 413 above it.
func (c Config) MaxRecvMsgBytes() int {
	return c.WithDefaults().MaxBodyBytes + grpcMessageSlack
}

// ServerOptions are the gRPC server options the ext_proc service needs:
// the receive limit derived from MaxBodyBytes, flow-control windows that
// do not serialize large bodies, reused stream goroutines and the codec
// with the per-message shortcuts (codec.go). Append them to the caller's own
// (keepalive, credentials) in grpc.NewServer.
func (c Config) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.MaxRecvMsgBytes()),
		grpc.InitialWindowSize(streamWindowBytes),
		grpc.InitialConnWindowSize(connWindowBytes),
		grpc.ReadBufferSize(connBufferBytes),
		grpc.WriteBufferSize(connBufferBytes),
		grpc.MaxConcurrentStreams(c.MaxStreamsPerConnection),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: c.MaxConnectionIdle}),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.ForceServerCodecV2(codec{}),
	}
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
