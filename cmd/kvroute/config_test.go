package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/extproc"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/telemetry"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

const minimal = `
replicas:
  static:
  - address: 127.0.0.1:8001
    model: m
`

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"extproc", c.Listeners.ExtProc, DefaultExtProcAddr},
		{"admin", c.Listeners.Admin, DefaultAdminAddr},
		{"metrics", c.Listeners.Metrics, DefaultMetricsAddr},
		{"drain", c.Listeners.DrainTimeout, DefaultDrainTimeout},
		{"policy", c.Policy.Name, "kvroute"},
		{"tokenizer", c.Tokenizer.Default.Kind, tokenize.KindAuto},
		{"session header", c.Routing.SessionHeader, "x-session-id"},
		{"block size", c.Routing.BlockSize, 16},
		{"approximate ttl", c.Routing.Approximate.TTL, 2 * time.Minute},
		{"approximate entries", c.Routing.Approximate.MaxEntries, 1 << 18},
		{"max request lifetime", c.Routing.MaxRequestLifetime, extproc.DefaultMaxRequestLifetime},
		{"max streams per connection", c.Routing.MaxStreamsPerConnection, extproc.DefaultMaxStreamsPerConnection},
		{"max connection idle", c.Routing.MaxConnectionIdle, extproc.DefaultMaxConnectionIdle},
		{"observer wait", c.Routing.ObserverWait, extproc.DefaultObserverWait},
		{"usage sample every", c.Routing.UsageSampleEvery, extproc.DefaultUsageSampleEvery},
		{"usage sample interval", c.Routing.UsageSampleInterval, extproc.DefaultUsageSampleInterval},
		{"warm timeout", c.Readiness.WarmTimeout, DefaultWarmTimeout},
		{"log level", c.Telemetry.LogLevel, "info"},
		{"index budget", c.Index.MaxBytes, int64(index.DefaultMaxBytes)},
		{"events queue", c.Events.QueueSize, events.DefaultQueueSize},
		{"events replay timeout", c.Events.ReplayTimeout, events.DefaultReplayTimeout},
		{"scrape interval", c.Load.ScrapeInterval, load.DefaultScrapeInterval},
		{"fidelity floor", c.Load.FidelityFloor, load.DefaultFidelityFloor},
		{"stale after", c.Load.StaleAfter, load.DefaultStaleAfter},
		{"service name", c.Telemetry.ServiceName, telemetry.DefaultServiceName},
		{"log format", c.Telemetry.LogFormat, "text"},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
}

func TestParseConfigValues(t *testing.T) {
	c, err := ParseConfig([]byte(`
listeners: {extproc: "127.0.0.1:19002", drain_timeout: 3s}
replicas:
  file: {path: /etc/kvroute/replicas.yaml, interval: 2s}
policy:
  name: hardswitch
  hardswitch: {cache_threshold: 0.5}
tokenizer:
  models:
    m: {kind: local, tokenizer_json: /t/tokenizer.json, timeout: 1s, default_chat_template_kwargs: '{"enable_thinking": false}'}
readiness: {warm_timeout: 500ms}
routing:
  approximate: {ttl: 30s, max_entries: 1000}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listeners.DrainTimeout != 3*time.Second || c.Replicas.File.Interval != 2*time.Second ||
		c.Readiness.WarmTimeout != 500*time.Millisecond {
		t.Fatalf("durations not decoded: %+v %+v %+v", c.Listeners, c.Replicas.File, c.Readiness)
	}
	if c.Policy.Name != "hardswitch" || c.Policy.HardSwitch.CacheThreshold == nil || *c.Policy.HardSwitch.CacheThreshold != 0.5 {
		t.Fatalf("policy not decoded: %+v", c.Policy)
	}
	if got := c.Tokenizer.Models["m"]; got.Kind != tokenize.KindLocal || got.TokenizerJSON != "/t/tokenizer.json" || got.Timeout != time.Second ||
		got.DefaultKwargs != `{"enable_thinking": false}` {
		t.Fatalf("tokenizer not decoded: %+v", got)
	}
	if a := c.Routing.Approximate; a.TTL != 30*time.Second || a.MaxEntries != 1000 {
		t.Fatalf("routing.approximate not decoded: %+v", a)
	}
}

// TestAbuseLimits: the ext_proc abuse limits decode from routing and reach
// the extproc.Config kvroute serves with, next to the routing headers.
func TestAbuseLimits(t *testing.T) {
	c, err := ParseConfig([]byte(minimal + `
routing: {max_request_lifetime: 90s, max_streams_per_connection: 64, max_connection_idle: 45s, session_header: x-user, decide_concurrency: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Routing.ExtProc()
	if got.MaxRequestLifetime != 90*time.Second || got.MaxStreamsPerConnection != 64 || got.MaxConnectionIdle != 45*time.Second ||
		got.SessionHeader != "x-user" || got.DecideConcurrency != 3 {
		t.Errorf("extproc config %+v", got)
	}
	// Defaults survive extproc's own WithDefaults unchanged (written once).
	d, err := ParseConfig([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	e := d.Routing.ExtProc()
	if w := e.WithDefaults(); w.MaxRequestLifetime != e.MaxRequestLifetime || w.MaxStreamsPerConnection != e.MaxStreamsPerConnection ||
		w.MaxConnectionIdle != e.MaxConnectionIdle || e.MaxStreamsPerConnection != extproc.DefaultMaxStreamsPerConnection ||
		w.DecideConcurrency != e.DecideConcurrency || e.DecideConcurrency != 0 {
		t.Errorf("defaulted limits %+v differ from extproc's %+v", e, w)
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings the error must contain
	}{
		{"empty", ``, []string{"replicas: one of static, file, dns or kubernetes is required"}},
		{"unknown top-level key", minimal + "bogus: 1\n", []string{"field bogus not found"}},
		{"unknown nested key", minimal + "listeners: {extprocc: ':1'}\n", []string{"field extprocc not found"}},
		{"unknown replica key", "replicas:\n  static:\n  - {address: 127.0.0.1:1, model: m, port: 3}\n", []string{"field port not found"}},
		{"bad replica address", `
replicas:
  static:
  - {address: 127.0.0.1:8001, model: m}
  - {address: 127.0.0.1:8002, model: m}
  - {address: not-an-ip, model: m}
`, []string{"replicas.static[2].address"}},
		{"duplicate replica", `
replicas:
  static:
  - {address: 127.0.0.1:8001, model: m}
  - {address: 127.0.0.1:8001, model: m}
`, []string{"replicas.static[1]", "duplicate"}},
		{"bad engine", "replicas:\n  static:\n  - {address: 127.0.0.1:1, model: m, engine: trt}\n", []string{"replicas.static[0].engine"}},
		{"two sources", minimal + "  file: {path: /x}\n", []string{"replicas: set only one"}},
		{"file without path", "replicas:\n  file: {interval: 1s}\n", []string{"replicas.file.path"}},
		{"dns without host", "replicas:\n  dns: {port: 80, defaults: {model: m}}\n", []string{"replicas.dns"}},
		{"kubernetes without namespace", "replicas:\n  kubernetes: {service: vllm, defaults: {model: m}}\n", []string{"replicas.kubernetes.namespace"}},
		{"kubernetes with two modes", "replicas:\n  kubernetes: {namespace: ns, service: vllm, selector: app=vllm, defaults: {model: m}}\n", []string{"replicas.kubernetes.service", "exactly one"}},
		{"kubernetes bad address type", "replicas:\n  kubernetes: {namespace: ns, service: vllm, address_type: v5, defaults: {model: m}}\n", []string{"replicas.kubernetes.address_type"}},
		{"unknown policy", minimal + "policy: {name: fastest}\n", []string{"policy:", "fastest"}},
		{"policy knob", minimal + "policy: {name: blended, blended: {host_cache_hit_weight: 2}}\n", []string{"policy:", "host_cache_hit_weight"}},
		{"tokenizer kind", minimal + "tokenizer: {default: {kind: magic}}\n", []string{"tokenizer:", "magic"}},
		{"local tokenizer without file", minimal + "tokenizer: {models: {m: {kind: local}}}\n", []string{"tokenizer:", "tokenizer_json"}},
		{"unknown tokenizer key", minimal + "tokenizer: {models: {m: {kind: remote, url: x}}}\n", []string{"field url not found"}},
		{"engine content format", minimal + "tokenizer: {models: {m: {kind: auto, chat_template_content_format: list}}}\n", []string{"tokenizer:", "chat_template_content_format"}},
		{"events", minimal + "events: {queue_size: -1}\n", []string{"events.queue_size"}},
		{"fidelity", minimal + "load: {fidelity_floor: 2}\n", []string{"load.fidelity_floor"}},
		{"listener", minimal + "listeners: {admin: localhost}\n", []string{"listeners.admin"}},
		{"negative duration", minimal + "readiness: {warm_timeout: -1s}\n", []string{"readiness.warm_timeout"}},
		{"bad duration", minimal + "readiness: {warm_timeout: soon}\n", []string{"soon"}},
		{"header", minimal + "routing: {destination_header: X-Pick}\n", []string{"routing.destination_header"}},
		{"approximate ttl", minimal + "routing: {approximate: {ttl: -1s}}\n", []string{"routing.approximate.ttl"}},
		{"approximate entries", minimal + "routing: {approximate: {max_entries: -5}}\n", []string{"routing.approximate.max_entries"}},
		{"request lifetime", minimal + "routing: {max_request_lifetime: -1s}\n", []string{"routing.max_request_lifetime"}},
		{"response lookup timeout", minimal + "responses: {lookup_timeout: 2s}\n", []string{"responses.lookup_timeout", "deadline"}},
		{"response memory", minimal + "responses: {memory: -1}\n", []string{"responses.memory"}},
		{"connection idle", minimal + "routing: {max_connection_idle: -1m}\n", []string{"routing.max_connection_idle"}},
		{"negative stream limit", minimal + "routing: {max_streams_per_connection: -1}\n", []string{"routing.max_streams_per_connection", "-1"}},
		{"negative decide concurrency", minimal + "routing: {decide_concurrency: -1}\n", []string{"routing.decide_concurrency", "-1"}},
		{"negative decision history", minimal + "routing: {decision_history: -1}\n", []string{"routing.decision_history", "-1"}},
		{"decision history too long", minimal + "routing: {decision_history: 2000000}\n", []string{"routing.decision_history", "2000000"}},
		{"log level", minimal + "telemetry: {log_level: loud}\n", []string{"telemetry.log_level"}},
		{"several errors are all reported", minimal + "telemetry: {log_level: loud, log_format: xml}\n",
			[]string{"telemetry.log_level", "telemetry.log_format"}},
		{"two documents", minimal + "---\n" + minimal, []string{"single YAML document"}},
		{"events poll interval", minimal + "events: {poll_interval: -1s}\n", []string{"events.poll_interval"}},
		{"scrape timeout", minimal + "load: {scrape_timeout: -1s}\n", []string{"load.scrape_timeout"}},
		{"index budget", minimal + "index: {max_bytes: -1}\n", []string{"index.max_bytes"}},
		{"dns port", "replicas:\n  dns: {host: h, defaults: {model: m}}\n", []string{"replicas.dns.port"}},
		{"dns defaults", "replicas:\n  dns: {host: h, port: 1, defaults: {model: m, dp_ranks: -1}}\n", []string{"replicas.dns.defaults.dp_ranks"}},
		{"kubernetes defaults engine", "replicas:\n  kubernetes: {namespace: ns, service: s, defaults: {engine: trt}}\n", []string{"replicas.kubernetes.defaults.engine"}},
		{"kubernetes client is not a setting", "replicas:\n  kubernetes: {namespace: ns, service: s, client: x}\n", []string{"field client not found"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.yaml))
			if err == nil {
				t.Fatal("ParseConfig succeeded")
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v does not match ErrConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestChartShapedConfig parses the configuration the Helm chart renders
// (charts/kvroute/templates/_helpers.tpl, kvroute.config) with its
// default values.
func TestChartShapedConfig(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "inference")
	c, err := ParseConfig([]byte(`
listeners:
  admin: 127.0.0.1:9003
  drain_timeout: 15s
  extproc: :9002
  metrics: :9090
replicas:
  kubernetes:
    address_type: IPv4
    defaults:
      block_size: 16
      engine: vllm
      events_port: 5557
      model: meta-llama/Llama-3.1-8B-Instruct
      replay_port: 5558
    min_interval: 1s
    port_name: http
    service: vllm
`))
	if err != nil {
		t.Fatal(err)
	}
	if k := c.Replicas.Kubernetes; k.Namespace != "inference" || k.Service != "vllm" || k.MinInterval != time.Second || k.Defaults.EventsPort != 5557 {
		t.Fatalf("kubernetes source = %+v", k)
	}
}

// TestEveryErrorNamesItsPath: a config wrong in every section reports
// every problem at once, one line each, each starting with its full field
// path from the top of the file, each matching ErrConfig.
func TestEveryErrorNamesItsPath(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	_, err := ParseConfig([]byte(`
listeners: {admin: nope, drain_timeout: -1s}
replicas:
  kubernetes: {service: vllm, selector: 'a=b', min_interval: -1s, defaults: {block_size: -1}}
events: {queue_size: -1, replay_timeout: -1s, backoff_min: 2s, backoff_max: 1s}
load: {scrape_interval: -1s, fidelity_alpha: 2, fidelity_min_samples: -1}
index: {max_bytes: -1}
routing: {block_size: -1, session_header: X, approximate: {ttl: -1s, max_entries: -1}, max_request_lifetime: -1s, max_streams_per_connection: -2, max_connection_idle: -1s}
telemetry: {log_level: loud, log_format: xml}
readiness: {warm_timeout: -1s}
engine_auth: {reload_interval: 5s}
`))
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		"listeners.admin", "listeners.drain_timeout",
		"replicas.kubernetes.namespace", "replicas.kubernetes.service", "replicas.kubernetes.min_interval",
		"replicas.kubernetes.defaults.block_size",
		"events.queue_size", "events.replay_timeout", "events.backoff_max",
		"load.scrape_interval", "load.fidelity_alpha", "load.fidelity_min_samples",
		"index.max_bytes",
		"routing.block_size", "routing.session_header", "routing.approximate.ttl", "routing.approximate.max_entries",
		"routing.max_request_lifetime", "routing.max_streams_per_connection", "routing.max_connection_idle",
		"telemetry.log_level", "telemetry.log_format",
		"readiness.warm_timeout",
		"engine_auth.reload_interval",
	}
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "config: "))
	}
	for _, w := range want {
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, w+": ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d errors start with %q, want 1", n, w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatal("not a joined error")
	}
	for _, e := range joined.Unwrap() {
		if !errors.Is(e, ErrConfig) {
			t.Errorf("%v does not match ErrConfig", e)
		}
	}
}

// TestConfigKeysBackwardCompatible: every key the config file accepted
// before the sections moved into their packages still decodes into the
// same setting.
func TestConfigKeysBackwardCompatible(t *testing.T) {
	c, err := ParseConfig([]byte(`
replicas:
  dns:
    host: vllm.svc
    port: 8000
    srv: false
    srv_service: ""
    srv_proto: ""
    ip_family: IPv4
    interval: 7s
    timeout: 3s
    defaults: {model: m, engine: sglang, block_size: 32, events_port: 5557, replay_port: 5558, topic: kv, dp_ranks: 2, metrics_port: 9100}
events:
  workers: 3
  queue_size: 10
  replay_timeout: 1s
  replay_buffer: 20
  backoff_min: 50ms
  backoff_max: 5s
  silent_after: 1m
  resync_quiet: 10s
load:
  scrape_interval: 100ms
  scrape_timeout: 90ms
  stale_after: 1s
  fidelity_alpha: 0.5
  fidelity_floor: 0.5
  fidelity_min_samples: 4
index: {max_bytes: 4096}
routing: {approximate: {ttl: 1m, max_entries: 10}}
telemetry: {service_name: kv, log_level: debug, log_format: json}
`))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Replicas.DNS
	checks := []struct {
		name      string
		got, want any
	}{
		{"dns.interval", d.Interval, 7 * time.Second},
		{"dns.timeout", d.Timeout, 3 * time.Second},
		{"dns.ip_family", d.IPFamily, "IPv4"},
		{"dns.defaults", d.Defaults, discovery.Defaults{Model: "m", Engine: "sglang", BlockSize: 32, EventsPort: 5557, ReplayPort: 5558, Topic: "kv", DPRanks: 2, MetricsPort: 9100}},
		{"events.workers", c.Events.Workers, 3},
		{"events.queue_size", c.Events.QueueSize, 10},
		{"events.replay_buffer", c.Events.ReplayBuffer, 20},
		{"events.backoff_max", c.Events.BackoffMax, 5 * time.Second},
		{"events.silent_after", c.Events.SilentAfter, time.Minute},
		{"events.resync_quiet", c.Events.ResyncQuiet, 10 * time.Second},
		{"load.scrape_timeout", c.Load.ScrapeTimeout, 90 * time.Millisecond},
		{"load.stale_after", c.Load.StaleAfter, time.Second},
		{"load.fidelity", c.Load.Fidelity(), load.FidelityConfig{Alpha: 0.5, Floor: 0.5, MinSamples: 4}},
		{"index.max_bytes", c.Index.MaxBytes, int64(4096)},
		{"routing.approximate.max_entries", c.Routing.Approximate.MaxEntries, 10},
		{"telemetry", c.Telemetry, telemetry.Config{ServiceName: "kv", LogLevel: "debug", LogFormat: "json"}},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
}

func TestReplicaErrorsKeepDiscoveryClass(t *testing.T) {
	_, err := ParseConfig([]byte("replicas:\n  static:\n  - {address: bad, model: m}\n"))
	if !errors.Is(err, discovery.ErrInvalid) {
		t.Fatalf("error %v does not match discovery.ErrInvalid", err)
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "kvroute.yaml")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigFile(path); err != nil {
		t.Fatalf("examples/kvroute.yaml: %v", err)
	}
}

func TestLoadConfigFileMissing(t *testing.T) {
	_, err := LoadConfigFile(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, ErrConfig) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v", err)
	}
}

// TestRemovedDestinationHeader: routing.destination_header, which no longer
// changes what Envoy routes on, is refused with the reason, not ignored and
// not a generic unknown-key error.
func TestRemovedDestinationHeader(t *testing.T) {
	for _, v := range []string{"x-gateway-destination-endpoint", "x-kv-pick", "''"} {
		_, err := ParseConfig([]byte(minimal + "routing: {destination_header: " + v + "}\n"))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "routing.destination_header: removed") {
			t.Errorf("destination_header %s: %v, want a config error saying it was removed", v, err)
		}
	}
	if _, err := ParseConfig([]byte(minimal)); err != nil {
		t.Fatalf("without the key: %v", err)
	}
}
