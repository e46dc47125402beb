package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func template(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// envoyView is what the tests read back from a rendered config.
type envoyView struct {
	Admin struct {
		Address socketAddress `yaml:"address"`
	} `yaml:"admin"`
	StaticResources struct {
		Listeners []struct {
			Name         string        `yaml:"name"`
			Address      socketAddress `yaml:"address"`
			FilterChains []struct {
				Filters []struct {
					Name        string `yaml:"name"`
					TypedConfig struct {
						RouteConfig struct {
							ResponseHeadersToAdd []struct {
								Header struct{ Key, Value string } `yaml:"header"`
							} `yaml:"response_headers_to_add"`
						} `yaml:"route_config"`
						HTTPFilters []struct {
							Name string `yaml:"name"`
						} `yaml:"http_filters"`
					} `yaml:"typed_config"`
				} `yaml:"filters"`
			} `yaml:"filter_chains"`
		} `yaml:"listeners"`
		Clusters []struct {
			Name           string `yaml:"name"`
			LoadAssignment struct {
				Endpoints []struct {
					LBEndpoints []struct {
						Endpoint struct {
							Address socketAddress `yaml:"address"`
						} `yaml:"endpoint"`
					} `yaml:"lb_endpoints"`
				} `yaml:"endpoints"`
			} `yaml:"load_assignment"`
		} `yaml:"clusters"`
	} `yaml:"static_resources"`
}

type socketAddress struct {
	SocketAddress struct {
		Address   string `yaml:"address"`
		PortValue int    `yaml:"port_value"`
	} `yaml:"socket_address"`
}

func parse(t *testing.T, b []byte) envoyView {
	t.Helper()
	var v envoyView
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("rendered config does not parse: %v\n%s", err, b)
	}
	return v
}

func (v envoyView) clusterPorts(name string) []int {
	for _, c := range v.StaticResources.Clusters {
		if c.Name != name {
			continue
		}
		ps := []int{}
		for _, e := range c.LoadAssignment.Endpoints {
			for _, le := range e.LBEndpoints {
				ps = append(ps, le.Endpoint.Address.SocketAddress.PortValue)
			}
		}
		return ps
	}
	return nil
}

func (v envoyView) httpFilters() []string {
	var out []string
	for _, f := range v.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.HTTPFilters {
		out = append(out, f.Name)
	}
	return out
}

func TestRenderEnvoyPorts(t *testing.T) {
	tmpl := template(t)
	out, err := RenderEnvoy(tmpl, EnvoyConfig{
		Listen: 20000, Admin: 20001, ExtProc: []int{20002, 20003}, Engines: []int{21000, 21001, 21002},
		UpstreamHeader: "x-upstream",
	})
	if err != nil {
		t.Fatal(err)
	}
	v := parse(t, out)
	if l := v.StaticResources.Listeners[0]; l.Name != ListenerName || l.Address.SocketAddress.PortValue != 20000 || l.Address.SocketAddress.Address != "127.0.0.1" {
		t.Errorf("listener: %+v", l.Address)
	}
	if a := v.Admin.Address.SocketAddress; a.PortValue != 20001 || a.Address != "127.0.0.1" {
		t.Errorf("admin: %+v", a)
	}
	if got := v.clusterPorts(ExtProcCluster); !slices.Equal(got, []int{20002, 20003}) {
		t.Errorf("ext_proc endpoints %v", got)
	}
	if got := v.clusterPorts(FallbackCluster); !slices.Equal(got, []int{21000, 21001, 21002}) {
		t.Errorf("fallback endpoints %v", got)
	}
	if !slices.Contains(v.httpFilters(), ExtProcFilterName) || !slices.Contains(v.httpFilters(), ObserverFilterName) {
		t.Errorf("ext_proc filters missing: %v", v.httpFilters())
	}
	hdrs := v.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.RouteConfig.ResponseHeadersToAdd
	if len(hdrs) != 1 || hdrs[0].Header.Key != "x-upstream" || hdrs[0].Header.Value != "%UPSTREAM_REMOTE_ADDRESS%" {
		t.Errorf("response headers %+v", hdrs)
	}
	// No port of the template survives, and its comments do.
	for _, p := range []string{"port_value: 10000", "port_value: 9002", "port_value: 9901", "port_value: 8001"} {
		if strings.Contains(string(out), p) {
			t.Errorf("rendered config still has %q", p)
		}
	}
	if !strings.Contains(string(out), "# Fail open") {
		t.Error("the template's comments were dropped")
	}
	// The template itself is untouched.
	if !strings.Contains(string(tmpl), "port_value: 10000") {
		t.Error("template modified")
	}
}

func TestRenderEnvoyPlain(t *testing.T) {
	out, err := RenderEnvoy(template(t), EnvoyConfig{Listen: 1, Admin: 2, Engines: []int{3}})
	if err != nil {
		t.Fatal(err)
	}
	v := parse(t, out)
	if slices.Contains(v.httpFilters(), ExtProcFilterName) || slices.Contains(v.httpFilters(), ObserverFilterName) {
		t.Errorf("plain Envoy keeps an ext_proc filter: %v", v.httpFilters())
	}
	if v.clusterPorts(ExtProcCluster) != nil {
		t.Error("plain Envoy keeps the ext_proc cluster")
	}
	// No per-route or per-host ext_proc settings are left either (the
	// template enables ext_proc per virtual host).
	for _, name := range []string{ExtProcFilterName, ObserverFilterName} {
		if path := findKey(parseAny(t, out), name, ""); path != "" {
			t.Errorf("plain Envoy keeps %s settings at %s", name, path)
		}
	}
	if path := findKey(parseAny(t, template(t)), ExtProcFilterName, ""); path == "" {
		t.Log("the template has no per-filter ext_proc settings (nothing to remove)")
	}
	if got := v.clusterPorts(FallbackCluster); !slices.Equal(got, []int{3}) {
		t.Errorf("fallback endpoints %v", got)
	}
	if strings.Contains(string(out), "UPSTREAM_REMOTE_ADDRESS") {
		t.Error("response header added without UpstreamHeader")
	}
}

func TestRenderEnvoyErrors(t *testing.T) {
	tmpl := string(template(t))
	cfg := EnvoyConfig{Listen: 1, Admin: 2, ExtProc: []int{3}, Engines: []int{4}}
	cases := []struct {
		name, tmpl string
		cfg        EnvoyConfig
		want       []string
	}{
		{"not yaml", "a: [", cfg, []string{"envoy template"}},
		{"no engines", tmpl, EnvoyConfig{Listen: 1, Admin: 2}, []string{"no engines"}},
		{"renamed clusters", strings.NewReplacer("name: kvroute_extproc", "name: other", "name: fallback_round_robin", "name: rr").Replace(tmpl), cfg,
			[]string{`no cluster "kvroute_extproc"`, `no cluster "fallback_round_robin"`}},
		{"no listener", strings.Replace(tmpl, "- name: inference\n    address:", "- name: other\n    address:", 1), cfg, []string{`no listener "inference"`}},
		{"no admin", tmpl[:strings.Index(tmpl, "\nadmin:")], cfg, []string{"no admin section"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := RenderEnvoy([]byte(c.tmpl), c.cfg)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// findKey returns the path of the first mapping key named key under v, or "".
func findKey(v any, key, at string) string {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == key {
				return at + "." + k
			}
			if p := findKey(e, key, at+"."+k); p != "" {
				return p
			}
		}
	case []any:
		for i, e := range v {
			if p := findKey(e, key, fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	}
	return ""
}

func parseAny(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// kvroute's config lists an engine's event endpoints only when it has
// them: a fleet without events is configured without any.
func TestKVRouteYAMLEventEndpoints(t *testing.T) {
	k := &KVRoute{Model: "m", ExtProc: 1, Admin: 2, Metrics: 3, Engines: []*Engine{
		{Port: 8001, Events: "ipc:///tmp/ev0", Replay: "ipc:///tmp/rp0"},
		{Port: 8002},
	}}
	y := k.YAML()
	for _, want := range []string{
		`- {address: "127.0.0.1:8001", model: m, events_endpoint: "ipc:///tmp/ev0", replay_endpoint: "ipc:///tmp/rp0"}`,
		`- {address: "127.0.0.1:8002", model: m}` + "\n",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("config lacks %q:\n%s", want, y)
		}
	}
}
