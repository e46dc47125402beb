package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/enginehttp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/extproc"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/respstore"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/telemetry"
	"github.com/kvroute/kvroute/pkg/tlsfiles"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// Config is kvroute's configuration file (YAML). It is decoded strictly
// (unknown keys are errors), defaults are applied, then it is validated; every
// error names its field ("replicas.static[2].address: ...").
//
// Each section a package owns is that package's own config struct, embedded
// as is (its YAML keys, defaults and Validate live there): replicas
// (discovery.Config), policy (policy.Config), tokenizer, events, load,
// index, routing.approximate (route.ApproxConfig) and telemetry. The
// sections about the process itself (listeners, readiness, and the routing
// headers and default block size) are this command's.
type Config struct {
	Listeners ListenersConfig  `yaml:"listeners"`
	Replicas  discovery.Config `yaml:"replicas"`
	Policy    PolicyConfig     `yaml:"policy"`
	Tokenizer tokenize.Config  `yaml:"tokenizer"`
	Events    events.Config    `yaml:"events"`
	Load      load.Config      `yaml:"load"`
	Index     index.Config     `yaml:"index"`
	Routing   RoutingConfig    `yaml:"routing"`
	Telemetry telemetry.Config `yaml:"telemetry"`
	Readiness ReadinessConfig  `yaml:"readiness"`
	TLS       TLSConfig        `yaml:"tls"`
	// EngineAuth is the engines' API key (vLLM or SGLang --api-key), sent
	// on every request kvroute makes of them.
	EngineAuth enginehttp.Config `yaml:"engine_auth"`
	// Responses is the memory of which replica stores each response of the
	// Responses API (pkg/respstore), and its lookups.
	Responses respstore.Config `yaml:"responses"`
}

// TLSConfig is each listener's TLS (tlsfiles.Config); a listener without a
// certificate is plaintext. extproc with client_ca_file set is mutual TLS:
// only a proxy holding a certificate from that CA can open streams.
type TLSConfig struct {
	ExtProc tlsfiles.Config `yaml:"extproc"`
	Admin   tlsfiles.Config `yaml:"admin"`
	Metrics tlsfiles.Config `yaml:"metrics"`
}

// ListenersConfig are the addresses kvroute listens on.
type ListenersConfig struct {
	// ExtProc is the Envoy ext_proc gRPC listener (also serves the gRPC
	// health service Envoy checks). Default DefaultExtProcAddr.
	ExtProc string `yaml:"extproc"`
	// Admin serves the admin API, gRPC and its HTTP JSON mirror on one
	// port. Default DefaultAdminAddr (loopback: it can explain any prompt).
	Admin string `yaml:"admin"`
	// Metrics serves /metrics, /healthz and /readyz. Default
	// DefaultMetricsAddr.
	Metrics string `yaml:"metrics"`
	// DrainTimeout bounds how long in-flight ext_proc streams may finish
	// after a shutdown signal. Default DefaultDrainTimeout.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// PolicyConfig picks the policy and carries every policy's knobs
// (policy.Config, inline: blended, hardswitch, prefixaffinity, session).
type PolicyConfig struct {
	// Name is one of policy.Names(); default DefaultPolicy.
	Name string `yaml:"name"`
	// Seed seeds the policies' randomness (tie breaks); 0 = random.
	Seed          uint64 `yaml:"seed"`
	policy.Config `yaml:",inline"`
}

// RoutingConfig holds request-path settings.
type RoutingConfig struct {
	// RemovedDestinationHeader catches the removed key destination_header
	// so that an old file gets an error saying so (Validate), not a generic
	// unknown-key one: the pick always travels as
	// x-gateway-destination-endpoint, the name Envoy's override_host reads.
	RemovedDestinationHeader any `yaml:"destination_header"`
	// SessionHeader carries the session affinity key. Default
	// extproc.DefaultSessionHeader.
	SessionHeader string `yaml:"session_header"`
	// BlockSize is the KV block size in tokens for replicas that do not set
	// their own. Default kvblock.DefaultBlockSize (vLLM's default).
	BlockSize int `yaml:"block_size"`
	// Approximate tunes the dispatch-learned index used for replicas
	// without an events endpoint.
	Approximate route.ApproxConfig `yaml:"approximate"`
	// PendingTTL is how long the router remembers the prefixes it just
	// sent to event-fed replicas (route.Options.Pending): the part of a
	// prefix no replica's events show yet is in flight there, which the
	// kvroute policy weighs (fan-out siblings and GRPO samples of a new
	// task can join the replica prefilling their prompt instead of each
	// prefilling it again). Default route.DefaultPendingTTL; a negative
	// value turns it off.
	PendingTTL time.Duration `yaml:"pending_ttl"`

	// The ext_proc abuse limits (extproc.Config):
	// MaxRequestLifetime is a routed request's deadline: past it the
	// request no longer counts as load on its replica and its usage is not
	// fed back. Keep it above the longest generation served. Default
	// extproc.DefaultMaxRequestLifetime.
	MaxRequestLifetime time.Duration `yaml:"max_request_lifetime"`
	// MaxStreamsPerConnection bounds concurrent ext_proc streams on one
	// connection. Default extproc.DefaultMaxStreamsPerConnection.
	MaxStreamsPerConnection int `yaml:"max_streams_per_connection"`
	// MaxConnectionIdle closes an ext_proc connection without streams for
	// this long. Default extproc.DefaultMaxConnectionIdle.
	MaxConnectionIdle time.Duration `yaml:"max_connection_idle"`
	// DecideConcurrency, when positive, bounds the decisions on large
	// request bodies computed at once (extproc.Config.DecideConcurrency).
	// Default 0: no bound.
	DecideConcurrency int `yaml:"decide_concurrency"`
	// ObserverWait is how long after its decision a routed request waits
	// for its observer stream (Envoy's observability-mode ext_proc filter)
	// once its router stream has ended (extproc.Config.ObserverWait).
	// Default extproc.DefaultObserverWait.
	ObserverWait time.Duration `yaml:"observer_wait"`
	// UsageSampleEvery: one streamed response in this many is observed to
	// its end for its usage; the others only to their first token
	// (extproc.Config.UsageSampleEvery). Default
	// extproc.DefaultUsageSampleEvery (64; 1: all).
	UsageSampleEvery int `yaml:"usage_sample_every"`
	// UsageSampleInterval: besides the count, a replica's response is
	// observed to its end when none of that replica's was in the last
	// interval (extproc.Config.UsageSampleInterval). Default
	// extproc.DefaultUsageSampleInterval.
	UsageSampleInterval time.Duration `yaml:"usage_sample_interval"`
	// DecisionHistory keeps the newest this many routing decisions, with
	// every candidate's match, load and cost, for the admin API's
	// GET /debug/decisions (extproc.Config.DecisionHistory). Default 0:
	// none kept.
	DecisionHistory int `yaml:"decision_history"`
}

// ExtProc is the part of extproc.Config this section sets: the routing
// headers and the abuse limits (the caller adds the decider, trackers and
// telemetry).
func (r RoutingConfig) ExtProc() extproc.Config {
	return extproc.Config{
		SessionHeader:           r.SessionHeader,
		MaxRequestLifetime:      r.MaxRequestLifetime,
		MaxStreamsPerConnection: uint32(min(max(int64(r.MaxStreamsPerConnection), 0), math.MaxUint32)), // Validate bounds it
		MaxConnectionIdle:       r.MaxConnectionIdle,
		DecideConcurrency:       r.DecideConcurrency,
		ObserverWait:            r.ObserverWait,
		UsageSampleEvery:        r.UsageSampleEvery,
		UsageSampleInterval:     r.UsageSampleInterval,
		DecisionHistory:         r.DecisionHistory,
	}
}

// ReadinessConfig says when kvroute reports ready.
type ReadinessConfig struct {
	// WarmTimeout: kvroute is ready once every event stream is warm (its
	// first replay or first batch applied), or after this long, whichever
	// comes first. Default DefaultWarmTimeout; 0 after defaults is
	// impossible, use "1ns" to be ready at once.
	WarmTimeout time.Duration `yaml:"warm_timeout"`
}

// Defaults of the sections this command owns.
const (
	DefaultExtProcAddr  = ":9002"
	DefaultAdminAddr    = "127.0.0.1:9003"
	DefaultMetricsAddr  = ":9090"
	DefaultDrainTimeout = 15 * time.Second
	DefaultPolicy       = policy.NameKVRoute
	DefaultWarmTimeout  = 30 * time.Second
)

// ErrConfig classifies configuration errors.
var ErrConfig = errors.New("config")

// LoadConfigFile reads, decodes, defaults and validates a config file.
func LoadConfigFile(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig strictly decodes one YAML document, applies defaults and
// validates. An empty document is the defaults (and fails validation for
// want of replicas).
func ParseConfig(b []byte) (*Config, error) {
	c, err := decodeConfig(b)
	if err != nil {
		return nil, err
	}
	*c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeConfigFile reads and strictly decodes a file, without defaults.
func decodeConfigFile(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := decodeConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// decodeConfig strictly decodes one YAML document.
func decodeConfig(b []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: want a single YAML document", ErrConfig)
	}
	return c, nil
}

// WithDefaults returns c with every unset field defaulted, each section by
// its owner's WithDefaults.
func (c Config) WithDefaults() Config {
	str := func(p *string, d string) {
		if *p == "" {
			*p = d
		}
	}
	str(&c.Listeners.ExtProc, DefaultExtProcAddr)
	str(&c.Listeners.Admin, DefaultAdminAddr)
	str(&c.Listeners.Metrics, DefaultMetricsAddr)
	if c.Listeners.DrainTimeout == 0 {
		c.Listeners.DrainTimeout = DefaultDrainTimeout
	}
	c.Replicas = c.Replicas.WithDefaults()
	str(&c.Policy.Name, DefaultPolicy)
	if len(c.Tokenizer.Models) == 0 && c.Tokenizer.Default == nil {
		c.Tokenizer.Default = &tokenize.ModelConfig{Kind: tokenize.KindAuto}
	}
	c.Events = c.Events.WithDefaults()
	c.Load = c.Load.WithDefaults()
	c.Index = c.Index.WithDefaults()
	str(&c.Routing.SessionHeader, extproc.DefaultSessionHeader)
	if c.Routing.BlockSize == 0 {
		c.Routing.BlockSize = kvblock.DefaultBlockSize
	}
	c.Routing.Approximate = c.Routing.Approximate.WithDefaults()
	if c.Routing.PendingTTL == 0 {
		c.Routing.PendingTTL = route.DefaultPendingTTL
	}
	// The abuse limits' defaults are extproc's, applied by its WithDefaults.
	lim := extproc.Config{
		MaxRequestLifetime:      c.Routing.MaxRequestLifetime,
		MaxStreamsPerConnection: uint32(min(max(int64(c.Routing.MaxStreamsPerConnection), 0), math.MaxUint32)),
		MaxConnectionIdle:       c.Routing.MaxConnectionIdle,
		DecideConcurrency:       c.Routing.DecideConcurrency,
		ObserverWait:            c.Routing.ObserverWait,
		UsageSampleEvery:        c.Routing.UsageSampleEvery,
		UsageSampleInterval:     c.Routing.UsageSampleInterval,
	}.WithDefaults()
	c.Routing.MaxRequestLifetime = lim.MaxRequestLifetime
	c.Routing.ObserverWait = lim.ObserverWait
	c.Routing.UsageSampleEvery = lim.UsageSampleEvery
	c.Routing.UsageSampleInterval = lim.UsageSampleInterval
	if c.Routing.MaxStreamsPerConnection == 0 {
		c.Routing.MaxStreamsPerConnection = int(lim.MaxStreamsPerConnection)
	}
	c.Routing.MaxConnectionIdle = lim.MaxConnectionIdle
	c.Telemetry = c.Telemetry.WithDefaults()
	c.TLS.ExtProc = c.TLS.ExtProc.WithDefaults()
	c.TLS.Admin = c.TLS.Admin.WithDefaults()
	c.TLS.Metrics = c.TLS.Metrics.WithDefaults()
	if c.Readiness.WarmTimeout == 0 {
		c.Readiness.WarmTimeout = DefaultWarmTimeout
	}
	c.Responses = c.Responses.WithDefaults()
	return c
}

// Validate checks a defaulted config; all problems are reported, joined,
// each naming its full field path ("events.replay_timeout: ...") and
// matching ErrConfig.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...)))
	}
	addr := func(field, v string) {
		if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
			bad(field, "%q is not host:port", v)
		}
	}
	addr("listeners.extproc", c.Listeners.ExtProc)
	addr("listeners.admin", c.Listeners.Admin)
	addr("listeners.metrics", c.Listeners.Metrics)
	if c.Listeners.DrainTimeout < 0 {
		bad("listeners.drain_timeout", "must not be negative")
	}
	errs = append(errs, inSection("replicas", c.Replicas.Validate())...)
	errs = append(errs, inSection("tls.extproc", c.TLS.ExtProc.Validate())...)
	errs = append(errs, inSection("tls.admin", c.TLS.Admin.Validate())...)
	errs = append(errs, inSection("tls.metrics", c.TLS.Metrics.Validate())...)
	if err := c.EngineAuth.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	if _, err := policy.New(c.Policy.Name, c.Policy.Config); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err)) // "policy: invalid config: blended.<knob>: ..."
	}
	if err := c.Tokenizer.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: tokenizer: %w", ErrConfig, err))
	}
	errs = append(errs, inSection("events", c.Events.Validate())...)
	errs = append(errs, inSection("load", c.Load.Validate())...)
	errs = append(errs, inSection("responses", c.Responses.Validate())...)
	if c.Responses.LookupTimeout >= extproc.DefaultDecideTimeout {
		bad("responses.lookup_timeout", "%v: must be below the routing decision's deadline (%v), which a lookup spends", c.Responses.LookupTimeout, extproc.DefaultDecideTimeout)
	}
	errs = append(errs, inSection("index", c.Index.Validate())...)
	if c.Routing.RemovedDestinationHeader != nil {
		bad("routing.destination_header", "removed: the pick is always sent as %s (header, and the envoy.lb metadata key Envoy's override_host load balancer reads, which the shipped Envoy configs and the chart use); delete this key", extproc.DefaultDestinationHeader)
	}
	if h := c.Routing.SessionHeader; h != strings.ToLower(h) || strings.ContainsAny(h, " :") {
		bad("routing.session_header", "%q must be a lower-case header name", h)
	}
	if c.Routing.BlockSize <= 0 || c.Routing.BlockSize > discovery.MaxBlockSize {
		bad("routing.block_size", "%d: must be in [1, %d]", c.Routing.BlockSize, discovery.MaxBlockSize)
	}
	errs = append(errs, inSection("routing.approximate", c.Routing.Approximate.Validate())...)
	if c.Routing.MaxRequestLifetime <= 0 {
		bad("routing.max_request_lifetime", "must be positive, got %v", c.Routing.MaxRequestLifetime)
	}
	if n := int64(c.Routing.MaxStreamsPerConnection); n <= 0 || n > math.MaxUint32 {
		bad("routing.max_streams_per_connection", "%d: must be in [1, %d]", n, uint32(math.MaxUint32))
	}
	if c.Routing.MaxConnectionIdle <= 0 {
		bad("routing.max_connection_idle", "must be positive, got %v", c.Routing.MaxConnectionIdle)
	}
	if c.Routing.ObserverWait <= 0 {
		bad("routing.observer_wait", "must be positive, got %v", c.Routing.ObserverWait)
	}
	if c.Routing.UsageSampleEvery <= 0 {
		bad("routing.usage_sample_every", "must be positive (1: every response), got %d", c.Routing.UsageSampleEvery)
	}
	if c.Routing.UsageSampleInterval <= 0 {
		bad("routing.usage_sample_interval", "must be positive, got %v", c.Routing.UsageSampleInterval)
	}
	if c.Routing.DecideConcurrency < 0 {
		bad("routing.decide_concurrency", "must not be negative (0: no bound), got %d", c.Routing.DecideConcurrency)
	}
	if n := c.Routing.DecisionHistory; n < 0 || n > extproc.MaxDecisionHistory {
		bad("routing.decision_history", "must be in [0, %d] (0: none kept), got %d", extproc.MaxDecisionHistory, n)
	}
	errs = append(errs, inSection("telemetry", c.Telemetry.Validate())...)
	if c.Readiness.WarmTimeout < 0 {
		bad("readiness.warm_timeout", "must not be negative")
	}
	return errors.Join(errs...)
}

// inSection prefixes each error of a section's Validate (joined errors,
// each "path: problem" relative to the section) with the section's path,
// and classifies it as ErrConfig; the original error stays in the chain.
// An error about the section as a whole has an empty path (": problem").
func inSection(section string, err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, inSection(section, e)...)
		}
		return out
	}
	sep := "."
	if strings.HasPrefix(err.Error(), ": ") {
		sep = ""
	}
	return []error{fmt.Errorf("%w: %s%s%w", ErrConfig, section, sep, err)}
}
