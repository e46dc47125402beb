package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/discovery"
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
		{"tokenizer", c.Tokenizer.Default.Kind, tokenize.KindRemote},
		{"header", c.Routing.DestinationHeader, "x-gateway-destination-endpoint"},
		{"session header", c.Routing.SessionHeader, "x-session-id"},
		{"block size", c.Routing.BlockSize, 16},
		{"approximate ttl", c.Routing.Approximate.TTL, 2 * time.Minute},
		{"approximate entries", c.Routing.Approximate.MaxEntries, 1 << 18},
		{"warm timeout", c.Readiness.WarmTimeout, DefaultWarmTimeout},
		{"log level", c.Telemetry.LogLevel, "info"},
		{"index budget", c.Index.MaxBytes, int64(DefaultIndexMaxBytes)},
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
    m: {kind: local, tokenizer_json: /t/tokenizer.json, timeout: 1s}
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
	if got := c.Tokenizer.Models["m"]; got.Kind != tokenize.KindLocal || got.TokenizerJSON != "/t/tokenizer.json" || got.Timeout != time.Second {
		t.Fatalf("tokenizer not decoded: %+v", got)
	}
	if a := c.Routing.Approximate; a.TTL != 30*time.Second || a.MaxEntries != 1000 {
		t.Fatalf("routing.approximate not decoded: %+v", a)
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
		{"events", minimal + "events: {queue_size: -1}\n", []string{"events.queue_size"}},
		{"fidelity", minimal + "load: {fidelity_floor: 2}\n", []string{"load.fidelity_floor"}},
		{"listener", minimal + "listeners: {admin: localhost}\n", []string{"listeners.admin"}},
		{"negative duration", minimal + "readiness: {warm_timeout: -1s}\n", []string{"readiness.warm_timeout"}},
		{"bad duration", minimal + "readiness: {warm_timeout: soon}\n", []string{"soon"}},
		{"header", minimal + "routing: {destination_header: X-Pick}\n", []string{"routing.destination_header"}},
		{"approximate ttl", minimal + "routing: {approximate: {ttl: -1s}}\n", []string{"routing.approximate.ttl"}},
		{"approximate entries", minimal + "routing: {approximate: {max_entries: -5}}\n", []string{"routing.approximate.max_entries"}},
		{"log level", minimal + "telemetry: {log_level: loud}\n", []string{"telemetry.log_level"}},
		{"several errors are all reported", minimal + "telemetry: {log_level: loud, log_format: xml}\n",
			[]string{"telemetry.log_level", "telemetry.log_format"}},
		{"two documents", minimal + "---\n" + minimal, []string{"single YAML document"}},
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
