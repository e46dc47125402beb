package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// Config is kvroute's configuration file (YAML). It is decoded strictly
// (unknown keys are errors), defaults are applied, then it is validated; every
// error names its field ("replicas.static[2].address: ...").
type Config struct {
	Listeners ListenersConfig `yaml:"listeners"`
	Replicas  ReplicasConfig  `yaml:"replicas"`
	Policy    PolicyConfig    `yaml:"policy"`
	Tokenizer tokenize.Config `yaml:"tokenizer"`
	Events    EventsConfig    `yaml:"events"`
	Load      LoadConfig      `yaml:"load"`
	Index     IndexConfig     `yaml:"index"`
	Routing   RoutingConfig   `yaml:"routing"`
	Telemetry TelemetryConfig `yaml:"telemetry"`
	Readiness ReadinessConfig `yaml:"readiness"`
}

// ListenersConfig are the addresses kvroute listens on.
type ListenersConfig struct {
	// ExtProc is the Envoy ext_proc gRPC listener (also serves the gRPC
	// health service Envoy checks). Default ":9002".
	ExtProc string `yaml:"extproc"`
	// Admin serves the admin API, gRPC and its HTTP JSON mirror on one
	// port. Default "127.0.0.1:9003" (loopback: it can explain any prompt).
	Admin string `yaml:"admin"`
	// Metrics serves /metrics, /healthz and /readyz. Default ":9090".
	Metrics string `yaml:"metrics"`
	// DrainTimeout bounds how long in-flight ext_proc streams may finish
	// after a shutdown signal. Default 15s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// ReplicasConfig names exactly one replica source.
type ReplicasConfig struct {
	// Static lists the replicas inline.
	Static []discovery.ReplicaSpec `yaml:"static"`
	// File is a replica file (the same list under a top-level "replicas:"
	// key), reloaded when it changes.
	File *FileSourceConfig `yaml:"file"`
	// DNS resolves a name (A/AAAA or SRV) at an interval.
	DNS *DNSSourceConfig `yaml:"dns"`
	// Kubernetes watches EndpointSlices (of a Service, or by selector) or
	// an InferencePool's Pods.
	Kubernetes *KubernetesSourceConfig `yaml:"kubernetes"`
}

// KubernetesSourceConfig configures the Kubernetes replica source
// (discovery.KubernetesConfig). The API client is in-cluster, or from
// $KUBECONFIG outside a cluster.
type KubernetesSourceConfig struct {
	// Namespace of the engines; default $POD_NAMESPACE.
	Namespace string `yaml:"namespace"`
	// Exactly one of Service, Selector and InferencePool.
	Service       string `yaml:"service"`
	Selector      string `yaml:"selector"`
	InferencePool string `yaml:"inference_pool"`
	// PortName of the serving port in EndpointSlices (default "http").
	PortName string `yaml:"port_name"`
	// AddressType IPv4 (default) or IPv6.
	AddressType string `yaml:"address_type"`
	// IgnorePods: do not read pod annotations (no RBAC on pods).
	IgnorePods  bool   `yaml:"ignore_pods"`
	PodSelector string `yaml:"pod_selector"`
	// MinInterval coalesces bursts of changes (default 1s).
	MinInterval time.Duration `yaml:"min_interval"`
	// Defaults for what annotations and named ports do not give.
	Defaults DNSDefaultsConfig `yaml:"defaults"`
}

func (k *KubernetesSourceConfig) discovery() discovery.KubernetesConfig {
	return discovery.KubernetesConfig{
		Namespace: k.Namespace, Service: k.Service, Selector: k.Selector, InferencePool: k.InferencePool,
		PortName: k.PortName, AddressType: k.AddressType, IgnorePods: k.IgnorePods, PodSelector: k.PodSelector,
		MinInterval: k.MinInterval, Defaults: k.Defaults.discovery(),
	}
}

// FileSourceConfig configures the replica file source.
type FileSourceConfig struct {
	Path     string        `yaml:"path"`
	Interval time.Duration `yaml:"interval"` // default 5s
}

// DNSSourceConfig configures the DNS replica source.
type DNSSourceConfig struct {
	Host       string            `yaml:"host"`
	Port       int               `yaml:"port"`
	SRV        bool              `yaml:"srv"`
	SRVService string            `yaml:"srv_service"`
	SRVProto   string            `yaml:"srv_proto"`
	IPFamily   string            `yaml:"ip_family"`
	Interval   time.Duration     `yaml:"interval"`
	Timeout    time.Duration     `yaml:"timeout"`
	Defaults   DNSDefaultsConfig `yaml:"defaults"`
}

// DNSDefaultsConfig fills what DNS cannot tell (discovery.Defaults).
type DNSDefaultsConfig struct {
	Model       string `yaml:"model"`
	Engine      string `yaml:"engine"`
	BlockSize   int    `yaml:"block_size"`
	EventsPort  int    `yaml:"events_port"`
	ReplayPort  int    `yaml:"replay_port"`
	Topic       string `yaml:"topic"`
	DPRanks     int    `yaml:"dp_ranks"`
	MetricsPort int    `yaml:"metrics_port"`
}

// PolicyConfig picks the policy and carries every policy's knobs
// (policy.Config, inline: blended, hardswitch, prefixaffinity, session).
type PolicyConfig struct {
	// Name is one of policy.Names(); default "kvroute".
	Name string `yaml:"name"`
	// Seed seeds the policies' randomness (tie breaks); 0 = random.
	Seed          uint64 `yaml:"seed"`
	policy.Config `yaml:",inline"`
}

// EventsConfig tunes the KV-event subscribers (events.Config).
type EventsConfig struct {
	// Workers applying batches to the index; 0 = GOMAXPROCS.
	Workers int `yaml:"workers"`
	// QueueSize bounds each worker's queue, in batches (default 1024).
	QueueSize int `yaml:"queue_size"`
	// ReplayTimeout bounds each wait for a replay reply (default 2s).
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// ReplayBuffer bounds live batches buffered during a replay (default 4096).
	ReplayBuffer int `yaml:"replay_buffer"`
	// BackoffMin and BackoffMax bound reconnect backoff (100ms, 10s).
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	// SilentAfter flags a replica that was routed requests but published
	// no event for this long (default 60s).
	SilentAfter time.Duration `yaml:"silent_after"`
	// ResyncQuiet is the gap-free window after which a replica that could
	// not be replayed counts as caught up (default 30s).
	ResyncQuiet time.Duration `yaml:"resync_quiet"`
}

// LoadConfig tunes the load view: engine scrapes and cache fidelity.
type LoadConfig struct {
	// ScrapeInterval between probes of one engine's /health and /metrics
	// (default 200ms); ScrapeTimeout bounds each request (default 300ms).
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	ScrapeTimeout  time.Duration `yaml:"scrape_timeout"`
	// StaleAfter: older scraped figures are not used (default 2s).
	StaleAfter time.Duration `yaml:"stale_after"`
	// FidelityAlpha, FidelityFloor, FidelityMinSamples tune the cache
	// credit derived from served vs predicted cached tokens (defaults 0.1,
	// 0.25, 8).
	FidelityAlpha      float64 `yaml:"fidelity_alpha"`
	FidelityFloor      float64 `yaml:"fidelity_floor"`
	FidelityMinSamples int     `yaml:"fidelity_min_samples"`
}

// IndexConfig bounds the prefix index.
type IndexConfig struct {
	// MaxBytes bounds the index's estimated memory; 0 = unbounded.
	// Default 1 GiB.
	MaxBytes int64 `yaml:"max_bytes"`
}

// RoutingConfig holds request-path settings.
type RoutingConfig struct {
	// DestinationHeader is the header naming the pick. Default
	// "x-gateway-destination-endpoint".
	DestinationHeader string `yaml:"destination_header"`
	// SessionHeader carries the session affinity key. Default "x-session-id".
	SessionHeader string `yaml:"session_header"`
	// BlockSize is the KV block size in tokens for replicas that do not set
	// their own. Default 16 (vLLM's default).
	BlockSize int `yaml:"block_size"`
	// Approximate tunes the dispatch-learned index used for replicas
	// without an events endpoint (route.ApproxConfig).
	Approximate ApproximateConfig `yaml:"approximate"`
}

// ApproximateConfig tunes the approximate mode: which replica was sent which
// prompt blocks, remembered for TTL, at most MaxEntries (block, replica)
// entries (least recently dispatched evicted first).
type ApproximateConfig struct {
	// TTL is how long a dispatch is remembered. Default 2m.
	TTL time.Duration `yaml:"ttl"`
	// MaxEntries bounds the (block, replica) entries. Default 262144.
	MaxEntries int `yaml:"max_entries"`
}

// TelemetryConfig configures logs and traces. Tracing follows the standard
// OTEL_* environment variables (OTEL_EXPORTER_OTLP_ENDPOINT, ...).
type TelemetryConfig struct {
	ServiceName string `yaml:"service_name"` // default "kvroute"
	LogLevel    string `yaml:"log_level"`    // debug|info|warn|error; default info
	LogFormat   string `yaml:"log_format"`   // text|json; default text
}

// ReadinessConfig says when kvroute reports ready.
type ReadinessConfig struct {
	// WarmTimeout: kvroute is ready once every event stream is warm (its
	// first replay or first batch applied), or after this long, whichever
	// comes first. Default 30s; 0 after defaults is impossible, use
	// "1ns" to be ready at once.
	WarmTimeout time.Duration `yaml:"warm_timeout"`
}

// Defaults.
const (
	DefaultExtProcAddr       = ":9002"
	DefaultAdminAddr         = "127.0.0.1:9003"
	DefaultMetricsAddr       = ":9090"
	DefaultDrainTimeout      = 15 * time.Second
	DefaultPolicy            = policy.NameKVRoute
	DefaultIndexMaxBytes     = 1 << 30
	DefaultDestinationHeader = "x-gateway-destination-endpoint"
	DefaultSessionHeader     = "x-session-id"
	DefaultBlockSize         = 16
	DefaultWarmTimeout       = 30 * time.Second
	DefaultServiceName       = "kvroute"
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
	c.ApplyDefaults()
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

// ApplyDefaults fills every unset field with its default.
func (c *Config) ApplyDefaults() {
	str := func(p *string, d string) {
		if *p == "" {
			*p = d
		}
	}
	dur := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	str(&c.Listeners.ExtProc, DefaultExtProcAddr)
	str(&c.Listeners.Admin, DefaultAdminAddr)
	str(&c.Listeners.Metrics, DefaultMetricsAddr)
	dur(&c.Listeners.DrainTimeout, DefaultDrainTimeout)
	if k := c.Replicas.Kubernetes; k != nil {
		str(&k.Namespace, os.Getenv("POD_NAMESPACE"))
	}
	str(&c.Policy.Name, DefaultPolicy)
	if len(c.Tokenizer.Models) == 0 && c.Tokenizer.Default == nil {
		c.Tokenizer.Default = &tokenize.ModelConfig{Kind: tokenize.KindRemote}
	}
	if c.Index.MaxBytes == 0 {
		c.Index.MaxBytes = DefaultIndexMaxBytes
	}
	str(&c.Routing.DestinationHeader, DefaultDestinationHeader)
	str(&c.Routing.SessionHeader, DefaultSessionHeader)
	if c.Routing.BlockSize == 0 {
		c.Routing.BlockSize = DefaultBlockSize
	}
	dur(&c.Routing.Approximate.TTL, route.DefaultApproxTTL)
	if c.Routing.Approximate.MaxEntries == 0 {
		c.Routing.Approximate.MaxEntries = route.DefaultApproxMaxEntries
	}
	str(&c.Telemetry.ServiceName, DefaultServiceName)
	str(&c.Telemetry.LogLevel, "info")
	str(&c.Telemetry.LogFormat, "text")
	dur(&c.Readiness.WarmTimeout, DefaultWarmTimeout)
}

// Validate checks a defaulted config; all problems are reported, joined,
// each naming its field.
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

	sources := 0
	if len(c.Replicas.Static) > 0 {
		sources++
		if _, err := discovery.BuildReplicas("replicas.static", c.Replicas.Static); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	if f := c.Replicas.File; f != nil {
		sources++
		if f.Path == "" {
			bad("replicas.file.path", "is required")
		}
		if f.Interval < 0 {
			bad("replicas.file.interval", "must not be negative")
		}
	}
	if d := c.Replicas.DNS; d != nil {
		sources++
		if _, err := discovery.NewDNS(d.discovery()); err != nil {
			errs = append(errs, fmt.Errorf("%w: replicas.dns: %w", ErrConfig, err))
		}
	}
	if k := c.Replicas.Kubernetes; k != nil {
		sources++
		// Validated with placeholder clients: NewKubernetes makes no call.
		kc := k.discovery()
		kc.Client, kc.Dynamic = &kubernetes.Clientset{}, &dynamic.DynamicClient{}
		if _, err := discovery.NewKubernetes(kc); err != nil {
			errs = append(errs, fmt.Errorf("%w: replicas.%w", ErrConfig, err))
		}
	}
	switch {
	case sources == 0:
		bad("replicas", "one of static, file, dns or kubernetes is required")
	case sources > 1:
		bad("replicas", "set only one of static, file, dns or kubernetes")
	}

	if _, err := policy.New(c.Policy.Name, c.Policy.Config); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err)) // "policy: invalid config: blended.<knob>: ..."
	}

	if err := c.Tokenizer.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: tokenizer: %w", ErrConfig, err))
	}
	for field, d := range map[string]time.Duration{
		"events.replay_timeout": c.Events.ReplayTimeout, "events.backoff_min": c.Events.BackoffMin,
		"events.backoff_max": c.Events.BackoffMax, "events.silent_after": c.Events.SilentAfter,
		"events.resync_quiet": c.Events.ResyncQuiet, "load.scrape_interval": c.Load.ScrapeInterval,
		"load.scrape_timeout": c.Load.ScrapeTimeout, "load.stale_after": c.Load.StaleAfter,
	} {
		if d < 0 {
			bad(field, "must not be negative")
		}
	}
	for field, n := range map[string]int{
		"events.workers": c.Events.Workers, "events.queue_size": c.Events.QueueSize,
		"events.replay_buffer": c.Events.ReplayBuffer, "load.fidelity_min_samples": c.Load.FidelityMinSamples,
	} {
		if n < 0 {
			bad(field, "must not be negative")
		}
	}
	if a := c.Load.FidelityAlpha; !(a >= 0 && a <= 1) {
		bad("load.fidelity_alpha", "%v: must be in (0, 1] (0 = default)", a)
	}
	if f := c.Load.FidelityFloor; !(f >= 0 && f <= 1) {
		bad("load.fidelity_floor", "%v: must be in [0, 1]", f)
	}
	if c.Index.MaxBytes < 0 {
		bad("index.max_bytes", "must not be negative")
	}
	if h := c.Routing.DestinationHeader; h != strings.ToLower(h) || strings.ContainsAny(h, " :") {
		bad("routing.destination_header", "%q must be a lower-case header name", h)
	}
	if h := c.Routing.SessionHeader; h != strings.ToLower(h) || strings.ContainsAny(h, " :") {
		bad("routing.session_header", "%q must be a lower-case header name", h)
	}
	if c.Routing.BlockSize <= 0 || c.Routing.BlockSize > discovery.MaxBlockSize {
		bad("routing.block_size", "%d: must be in [1, %d]", c.Routing.BlockSize, discovery.MaxBlockSize)
	}
	if c.Routing.Approximate.TTL < 0 {
		bad("routing.approximate.ttl", "must not be negative")
	}
	if c.Routing.Approximate.MaxEntries < 0 {
		bad("routing.approximate.max_entries", "must not be negative")
	}
	switch c.Telemetry.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("telemetry.log_level", "%q: want debug, info, warn or error", c.Telemetry.LogLevel)
	}
	switch c.Telemetry.LogFormat {
	case "text", "json":
	default:
		bad("telemetry.log_format", "%q: want text or json", c.Telemetry.LogFormat)
	}
	if c.Readiness.WarmTimeout < 0 {
		bad("readiness.warm_timeout", "must not be negative")
	}
	return errors.Join(errs...)
}

func (d *DNSSourceConfig) discovery() discovery.DNSConfig {
	return discovery.DNSConfig{
		Host: d.Host, Port: d.Port, SRV: d.SRV, SRVService: d.SRVService, SRVProto: d.SRVProto,
		IPFamily: d.IPFamily, Interval: d.Interval, Timeout: d.Timeout,
		Defaults: d.Defaults.discovery(),
	}
}

func (d DNSDefaultsConfig) discovery() discovery.Defaults {
	return discovery.Defaults{
		Model: d.Model, Engine: d.Engine, BlockSize: d.BlockSize,
		EventsPort: d.EventsPort, ReplayPort: d.ReplayPort, Topic: d.Topic,
		DPRanks: d.DPRanks, MetricsPort: d.MetricsPort,
	}
}
