package discovery

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

func decodeConfig(t *testing.T, s string) Config {
	t.Helper()
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader([]byte(s)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return c
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // every error, by its text; none: valid
	}{
		{"static", "static: [{address: 127.0.0.1:1, model: m}]", nil},
		{"file", "file: {path: /r.yaml}", nil},
		{"dns", "dns: {host: vllm, port: 80, defaults: {model: m}}", nil},
		{"kubernetes", "kubernetes: {namespace: ns, inference_pool: p, defaults: {model: m}}", nil},
		{"none", "{}", []string{": one of static, file, dns or kubernetes is required"}},
		{"two", "{static: [{address: 127.0.0.1:1, model: m}], file: {path: /x}}", []string{": set only one of static, file, dns or kubernetes"}},
		{"static address", "static: [{address: 127.0.0.1:1, model: m}, {address: nope, model: m}]", []string{"static[1].address: "}},
		{"file", "file: {interval: -1s}", []string{"file.path: is required", "file.interval: must not be negative"}},
		{"dns", "dns: {port: 0, ip_family: v6, timeout: -1s, defaults: {engine: trt}}", []string{
			"dns.host: is required", "dns.port: 0 is outside [1, 65535] (required without srv)", `dns.ip_family: "v6" is not`,
			"dns.timeout: must not be negative", "dns.defaults.model: is required", `dns.defaults.engine: "trt" is not`}},
		{"kubernetes", "kubernetes: {namespace: ns, service: s, selector: 'a=b', address_type: v5, min_interval: -1s, pod_selector: '=='}", []string{
			"kubernetes.service: exactly one of service, selector and inference_pool must be set",
			`kubernetes.address_type: "v5" is not`, "kubernetes.min_interval: must not be negative", "kubernetes.pod_selector: "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", "")
			err := decodeConfig(t, tt.yaml).WithDefaults().Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v does not match ErrInvalid", err)
			}
			lines := strings.Split(err.Error(), "\n")
			for _, w := range tt.want {
				found := false
				for _, l := range lines {
					found = found || strings.HasPrefix(l, w)
				}
				if !found {
					t.Errorf("no error starts with %q:\n%v", w, err)
				}
			}
			if len(lines) != len(tt.want) {
				t.Errorf("%d errors, want %d:\n%v", len(lines), len(tt.want), err)
			}
		})
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "inference")
	c := decodeConfig(t, "kubernetes: {service: vllm, defaults: {model: m, events_port: 5557}}")
	d := c.WithDefaults()
	k := d.Kubernetes
	if k.Namespace != "inference" || k.PortName != DefaultPortName || k.MinInterval != DefaultKubernetesMinInterval || k.Defaults.EventsPort != 5557 {
		t.Fatalf("kubernetes defaults: %+v", k)
	}
	if c.Kubernetes.Namespace != "" {
		t.Fatal("WithDefaults modified its receiver's source")
	}
	f := decodeConfig(t, "file: {path: /x}").WithDefaults().File
	if f.Interval != DefaultFileInterval {
		t.Errorf("file interval %v", f.Interval)
	}
	dn := decodeConfig(t, "dns: {host: h, port: 1, interval: 3s, defaults: {model: m}}").WithDefaults().DNS
	if dn.Interval != 3*time.Second || dn.Timeout != 3*time.Second {
		t.Errorf("dns interval %v timeout %v, want 3s and the interval", dn.Interval, dn.Timeout)
	}
}

// TestConfigRuntimeFieldsNotInYAML: clients, loggers and names are wiring,
// not settings: the file cannot set them.
func TestConfigRuntimeFieldsNotInYAML(t *testing.T) {
	for _, s := range []string{"kubernetes: {client: x}", "dns: {resolver: x}", "file: {name: x}", "dns: {logger: x}"} {
		var c Config
		dec := yaml.NewDecoder(bytes.NewReader([]byte(s)))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err == nil {
			t.Errorf("%q decoded", s)
		}
	}
}
