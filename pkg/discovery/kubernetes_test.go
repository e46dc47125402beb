package discovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

const ns = "inference"

func ptr[T any](v T) *T { return &v }

type port struct {
	name string
	num  int32
}

func mkSlice(name, svc string, ports []port, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, "app": svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
	}
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr(p.name), Port: ptr(p.num)})
	}
	return s
}

func mkEndpoint(ip, pod string, ready bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)},
	}
	if pod != "" {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}
	}
	return e
}

func mkPod(name, ip string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann,
			Labels: map[string]string{"pool": "llama"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
			Args: []string{"--model", "llama"}, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

var stdPorts = []port{{"http", 8000}, {PortNameEvents, 5557}}

// k8sHarness runs a KubernetesSource against a fake clientset.
type k8sHarness struct {
	t       *testing.T
	client  kubernetes.Interface
	src     *KubernetesSource
	updates chan Snapshot
	cancel  context.CancelFunc
	done    <-chan error
	once    sync.Once
}

func startK8s(t *testing.T, cfg KubernetesConfig, objs ...runtime.Object) *k8sHarness {
	t.Helper()
	client := fake.NewClientset(objs...)
	cfg.Client = client
	cfg.Namespace = ns
	if cfg.MinInterval == 0 {
		cfg.MinInterval = time.Millisecond
	}
	src, err := NewKubernetes(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	h := &k8sHarness{t: t, client: client, src: src, updates: make(chan Snapshot), cancel: cancel}
	h.done = runSource(ctx, src, h.updates)
	t.Cleanup(h.stop)
	return h
}

// stop cancels Run and waits for it; idempotent.
func (h *k8sHarness) stop() {
	h.once.Do(func() {
		h.cancel()
		if err := waitDone(h.t, h.done); err != nil {
			h.t.Errorf("Run = %v, want nil", err)
		}
	})
}

func (h *k8sHarness) updateSlice(s *discoveryv1.EndpointSlice) {
	h.t.Helper()
	if _, err := h.client.DiscoveryV1().EndpointSlices(ns).Update(h.t.Context(), s, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *k8sHarness) createSlice(s *discoveryv1.EndpointSlice) {
	h.t.Helper()
	if _, err := h.client.DiscoveryV1().EndpointSlices(ns).Create(h.t.Context(), s, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *k8sHarness) updatePod(p *corev1.Pod) {
	h.t.Helper()
	if _, err := h.client.CoreV1().Pods(ns).Update(h.t.Context(), p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// until waits for a snapshot satisfying ok.
func (h *k8sHarness) until(what string, ok func([]Replica) bool) []Replica {
	h.t.Helper()
	s, _ := recvUntil(h.t, h.updates, what, func(s Snapshot) bool { return ok(s.Replicas) })
	return s.Replicas
}

func field(id string, get func(Replica) any, want any) func([]Replica) bool {
	return func(rs []Replica) bool {
		r, ok := byID(rs, id)
		return ok && cmp.Equal(get(r), want)
	}
}

func TestKubernetesEndpointSlices(t *testing.T) {
	t.Parallel()
	pod0 := mkPod("vllm-0", "10.0.0.1", map[string]string{
		AnnotationModel: "llama", AnnotationDPRanks: "2", AnnotationReplayPort: "5600",
		AnnotationEventsPort: "6000", // loses to the kv-events named port
		AnnotationTopic:      "kv@vllm-0", AnnotationBlockSize: "16", "unrelated.io/x": "y",
		AnnotationLoRAAdapters: " sql-lora, ,chat-lora",
		AnnotationGroupKinds:   "full_attention, sliding_window",
	})
	pod1 := mkPod("vllm-1", "10.0.0.2", nil)
	slice := mkSlice("vllm-abc", "vllm", stdPorts,
		mkEndpoint("10.0.0.1", "vllm-0", true),
		mkEndpoint("10.0.0.2", "vllm-1", false))
	other := mkSlice("other-abc", "other", stdPorts, mkEndpoint("10.9.9.9", "x-0", true))
	h := startK8s(t, KubernetesConfig{Service: "vllm", Defaults: Defaults{Model: "dflt", MetricsPort: 9000}},
		pod0, pod1, slice, other)

	snap := recvSnapshot(t, h.updates)
	want := []Replica{
		{ID: ns + "/vllm-0", Address: "10.0.0.1:8000", Model: "llama", Engine: EngineVLLM, BlockSize: 16,
			EventsEndpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5600", Topic: "kv@vllm-0", DPRanks: 2,
			MetricsURL: "http://10.0.0.1:9000/metrics", HealthURL: "http://10.0.0.1:8000/health", Ready: true,
			LoRAAdapters: []string{"chat-lora", "sql-lora"}, GroupKinds: []string{"full_attention", "sliding_window"}},
		{ID: ns + "/vllm-1", Address: "10.0.0.2:8000", Model: "dflt", Engine: EngineVLLM,
			EventsEndpoint: "tcp://10.0.0.2:5557", DPRanks: 1,
			MetricsURL: "http://10.0.0.2:9000/metrics", HealthURL: "http://10.0.0.2:8000/health", Ready: false},
	}
	if snap.Source != "kubernetes" {
		t.Errorf("Source = %q", snap.Source)
	}
	if diff := cmp.Diff(want, snap.Replicas); diff != "" {
		t.Fatalf("first snapshot (-want +got):\n%s", diff)
	}

	t.Log("readiness flip")
	slice.Endpoints[1] = mkEndpoint("10.0.0.2", "vllm-1", true)
	h.updateSlice(slice)
	h.until("vllm-1 ready", field(ns+"/vllm-1", func(r Replica) any { return r.Ready }, true))

	t.Log("irrelevant pod change, then an annotation change")
	pod1.Annotations = map[string]string{"other.io/note": "x"}
	pod1.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", RestartCount: 1}}
	h.updatePod(pod1)
	pod1.Annotations = map[string]string{AnnotationModel: "qwen", AnnotationEngine: EngineSGLang}
	h.updatePod(pod1)
	// Snapshots equal to the last one are never sent, so the next snapshot
	// already carries the annotation change.
	snap = recvSnapshot(t, h.updates)
	if r, _ := byID(snap.Replicas, ns+"/vllm-1"); r.Model != "qwen" || r.Engine != EngineSGLang {
		t.Errorf("vllm-1 = %+v, want model qwen on sglang", r)
	}

	t.Log("second slice: one new endpoint and a stale not-ready copy of vllm-0")
	h.createSlice(mkSlice("vllm-aaa", "vllm", stdPorts, // sorts first
		mkEndpoint("10.0.0.1", "vllm-0", false),
		mkEndpoint("10.0.0.3", "", true)))
	rs := h.until("three replicas", func(rs []Replica) bool { return len(rs) == 3 })
	if got := ids(rs); !cmp.Equal(got, []string{"10.0.0.3:8000", ns + "/vllm-0", ns + "/vllm-1"}) {
		t.Errorf("IDs = %v", got)
	}
	if r, _ := byID(rs, ns+"/vllm-0"); !r.Ready {
		t.Error("merged vllm-0 is not ready; the ready copy must win")
	}

	t.Log("terminating but serving")
	slice.Endpoints[1].Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
	h.updateSlice(slice)
	h.until("vllm-1 not ready", field(ns+"/vllm-1", func(r Replica) any { return r.Ready }, false))

	t.Log("removal")
	slice.Endpoints = slice.Endpoints[:1]
	h.updateSlice(slice)
	h.until("vllm-1 gone", func(rs []Replica) bool { _, ok := byID(rs, ns+"/vllm-1"); return !ok && len(rs) == 2 })

	t.Log("all slices deleted")
	for _, name := range []string{"vllm-abc", "vllm-aaa"} {
		if err := h.client.DiscoveryV1().EndpointSlices(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.until("empty set", func(rs []Replica) bool { return len(rs) == 0 })
}

func TestKubernetesInvalidEndpoints(t *testing.T) {
	t.Parallel()
	bad := mkPod("vllm-0", "10.0.0.1", map[string]string{AnnotationBlockSize: "sixteen"})
	good := mkPod("vllm-1", "10.0.0.2", nil)
	slice := mkSlice("vllm-abc", "vllm", stdPorts,
		mkEndpoint("10.0.0.1", "vllm-0", true),
		mkEndpoint("10.0.0.2", "vllm-1", true))
	noPort := mkSlice("vllm-xyz", "vllm", []port{{"grpc", 9000}, {"other", 9001}}, mkEndpoint("10.0.0.5", "vllm-5", true))
	// The same pod under a second address (not ready): one is kept, the
	// ready one, and the other is reported.
	twin := mkSlice("vllm-twin", "vllm", stdPorts, mkEndpoint("10.0.0.10", "vllm-1", false)) // sorts first
	h := startK8s(t, KubernetesConfig{Service: "vllm", Defaults: Defaults{Model: "m"}}, bad, good, slice, noPort, twin)

	snap := recvSnapshot(t, h.updates)
	if got := ids(snap.Replicas); !cmp.Equal(got, []string{ns + "/vllm-1"}) {
		t.Fatalf("IDs = %v, want only the valid vllm-1", got)
	}
	if r := snap.Replicas[0]; r.Address != "10.0.0.2:8000" || !r.Ready {
		t.Errorf("vllm-1 = %+v, want the ready address 10.0.0.2", r)
	}
	if v := testutil.ToFloat64(h.src.m.replicas.WithLabelValues("invalid")); v != 3 {
		t.Errorf("invalid gauge = %v, want 3 (bad annotation, no port, second address)", v)
	}

	bad.Annotations[AnnotationBlockSize] = "16"
	h.updatePod(bad)
	rs := h.until("vllm-0 back", func(rs []Replica) bool { _, ok := byID(rs, ns+"/vllm-0"); return ok })
	if r, _ := byID(rs, ns+"/vllm-0"); r.BlockSize != 16 {
		t.Errorf("block size = %d, want 16", r.BlockSize)
	}
	if v := testutil.ToFloat64(h.src.m.replicas.WithLabelValues("invalid")); v != 2 {
		t.Errorf("invalid gauge = %v, want 2 (no port, second address)", v)
	}
}

func TestKubernetesSelectorAndIgnorePods(t *testing.T) {
	t.Parallel()
	pod := mkPod("vllm-0", "10.0.0.1", map[string]string{AnnotationModel: "from-annotation"})
	// A single unnamed port is the serving port.
	s := mkSlice("vllm-abc", "vllm", nil, mkEndpoint("10.0.0.1", "vllm-0", true))
	s.Ports = []discoveryv1.EndpointPort{{Port: ptr(int32(8080))}}
	// IPv6 slices are ignored by default.
	v6 := mkSlice("vllm-v6", "vllm", stdPorts, mkEndpoint("fd00::1", "vllm-0", true))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	h := startK8s(t, KubernetesConfig{Selector: "app=vllm", IgnorePods: true, Defaults: Defaults{Model: "dflt"}}, pod, s, v6)
	snap := recvSnapshot(t, h.updates)
	want := []Replica{{ID: ns + "/vllm-0", Address: "10.0.0.1:8080", Model: "dflt", Engine: EngineVLLM, DPRanks: 1,
		MetricsURL: "http://10.0.0.1:8080/metrics", HealthURL: "http://10.0.0.1:8080/health", Ready: true}}
	if diff := cmp.Diff(want, snap.Replicas); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
}

func TestKubernetesIPv6(t *testing.T) {
	t.Parallel()
	v6 := mkSlice("vllm-v6", "vllm", stdPorts, mkEndpoint("fd00::1", "vllm-0", true))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	v4 := mkSlice("vllm-v4", "vllm", stdPorts, mkEndpoint("10.0.0.1", "vllm-0", true))
	h := startK8s(t, KubernetesConfig{Service: "vllm", AddressType: IPv6, Defaults: Defaults{Model: "m"}}, v6, v4)
	snap := recvSnapshot(t, h.updates)
	if len(snap.Replicas) != 1 || snap.Replicas[0].Address != "[fd00::1]:8000" ||
		snap.Replicas[0].EventsEndpoint != "tcp://[fd00::1]:5557" {
		t.Errorf("snapshot = %+v, want the IPv6 endpoint only", snap.Replicas)
	}
}

// TestKubernetesBurstCoalesced: many informer events in a short window give
// few snapshots, and the last one has everything.
func TestKubernetesBurstCoalesced(t *testing.T) {
	t.Parallel()
	const n = 120
	// A long MinInterval: the whole burst lands inside one window.
	h := startK8s(t, KubernetesConfig{Service: "vllm", MinInterval: 500 * time.Millisecond, Defaults: Defaults{Model: "m"}})
	if snap := recvSnapshot(t, h.updates); len(snap.Replicas) != 0 {
		t.Fatalf("first snapshot = %+v, want empty", snap)
	}
	// The receiver keeps reading during the burst, so only MinInterval
	// limits the snapshot rate.
	type result struct {
		count   int
		elapsed time.Duration
	}
	got := make(chan result, 1)
	ctx := t.Context()
	start := time.Now()
	go func() {
		count := 0
		for {
			select {
			case s := <-h.updates:
				count++
				if len(s.Replicas) == n {
					got <- result{count, time.Since(start)}
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	for i := range n {
		h.createSlice(mkSlice(fmt.Sprintf("vllm-%03d", i), "vllm", stdPorts,
			mkEndpoint(fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), fmt.Sprintf("vllm-%03d", i), true)))
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(waitLimit):
		t.Fatalf("no snapshot with %d replicas", n)
	}
	// Rebuilds are at least MinInterval apart, so within the elapsed time
	// there can be at most elapsed/MinInterval + 1 of them (+1 for slack).
	limit := 2 + int(r.elapsed/(500*time.Millisecond))
	if r.count > limit || r.count >= n/4 {
		t.Errorf("%d events gave %d snapshots in %v, want <= %d", n, r.count, r.elapsed, limit)
	}
	t.Logf("%d events over %v -> %d snapshots", n, r.elapsed, r.count)
	h.stop() // the counter is incremented after the receive: read it after Run returned
	if v := testutil.ToFloat64(h.src.m.snapshots); int(v) != 1+r.count {
		t.Errorf("snapshots_total = %v, want %d", v, 1+r.count)
	}
}

func TestKubernetesCancelWhileSending(t *testing.T) {
	t.Parallel()
	// Nothing receives: Run blocks in the send and must still return.
	h := startK8s(t, KubernetesConfig{Service: "vllm", Defaults: Defaults{Model: "m"}},
		mkSlice("vllm-abc", "vllm", stdPorts, mkEndpoint("10.0.0.1", "vllm-0", true)))
	h.cancel()
}

// TestKubernetesNeverSynced: an API server that refuses the list (RBAC)
// leaves the caches unsynced; Run publishes nothing and still returns
// promptly on cancel.
func TestKubernetesNeverSynced(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	refused := make(chan struct{})
	var once sync.Once
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(refused) })
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("rbac"))
	})
	src, err := NewKubernetes(KubernetesConfig{Client: client, Namespace: ns, Service: "vllm", IgnorePods: true, Defaults: Defaults{Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	updates := make(chan Snapshot, 1)
	done := runSource(ctx, src, updates)
	select {
	case <-refused:
	case <-time.After(waitLimit):
		t.Fatal("the informer never listed")
	}
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	expectNoSnapshot(t, updates)
}

func TestNewKubernetesConfig(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	ok := KubernetesConfig{Client: client, Namespace: ns, Service: "vllm"}
	tests := []struct {
		name    string
		mutate  func(c *KubernetesConfig)
		wantErr string
	}{
		{"valid", func(*KubernetesConfig) {}, ""},
		{"valid selector", func(c *KubernetesConfig) { c.Service = ""; c.Selector = "app in (a,b)" }, ""},
		{"no client", func(c *KubernetesConfig) { c.Client = nil }, "kubernetes.client"},
		{"no namespace", func(c *KubernetesConfig) { c.Namespace = "" }, "kubernetes.namespace"},
		{"no mode", func(c *KubernetesConfig) { c.Service = "" }, "exactly one of"},
		{"two modes", func(c *KubernetesConfig) { c.Selector = "a=b" }, "exactly one of"},
		{"bad selector", func(c *KubernetesConfig) { c.Service = ""; c.Selector = "a=(" }, "kubernetes.selector"},
		{"pool without dynamic", func(c *KubernetesConfig) { c.Service = ""; c.InferencePool = "p" }, "kubernetes.inference_pool"},
		{"bad pod selector", func(c *KubernetesConfig) { c.PodSelector = "!!" }, "kubernetes.pod_selector"},
		{"bad address type", func(c *KubernetesConfig) { c.AddressType = "FQDN" }, "kubernetes.address_type"},
		{"bad defaults", func(c *KubernetesConfig) { c.Defaults.DPRanks = -1 }, "kubernetes.defaults.dp_ranks"},
		{"negative interval", func(c *KubernetesConfig) { c.MinInterval = -1 }, "kubernetes.min_interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := ok
			tt.mutate(&c)
			_, err := NewKubernetes(c)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewKubernetes: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
				t.Errorf("NewKubernetes error = %v, want ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestEndpointReady(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		c    discoveryv1.EndpointConditions
		want bool
	}{
		{"all nil", discoveryv1.EndpointConditions{}, true},
		{"ready", discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}, true},
		{"not ready", discoveryv1.EndpointConditions{Ready: ptr(false)}, false},
		{"publishNotReady: ready but not serving", discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(false)}, false},
		{"terminating but serving", discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}, false},
		{"ready and terminating", discoveryv1.EndpointConditions{Ready: ptr(true), Terminating: ptr(true)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := endpointReady(tt.c); got != tt.want {
				t.Errorf("endpointReady(%+v) = %v, want %v", tt.c, got, tt.want)
			}
		})
	}
}

func TestStripPod(t *testing.T) {
	t.Parallel()
	p := mkPod("vllm-0", "10.0.0.1", map[string]string{AnnotationModel: "m", "other.io/big": strings.Repeat("x", 1000)})
	p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: PortNameEvents, ContainerPort: 5557})
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	got, err := stripPod(p)
	if err != nil {
		t.Fatal(err)
	}
	sp := got.(*corev1.Pod)
	if len(sp.Annotations) != 1 || sp.Annotations[AnnotationModel] != "m" {
		t.Errorf("annotations = %v, want only kvroute.io ones", sp.Annotations)
	}
	if sp.ManagedFields != nil || sp.Spec.Containers[0].Image != "" || len(sp.Spec.Containers[0].Ports) != 1 {
		t.Errorf("stripped pod keeps too much: %+v", sp)
	}
	if !podReady(sp) || sp.Status.PodIP != "10.0.0.1" || sp.Labels["pool"] != "llama" {
		t.Errorf("stripped pod lost what the source reads: %+v", sp)
	}
	if podChanged(p, p) {
		t.Error("podChanged(p, p) = true")
	}
	q := p.DeepCopy()
	q.Status.ContainerStatuses = []corev1.ContainerStatus{{RestartCount: 3}}
	sq, _ := stripPod(q)
	if podChanged(sp, sq) {
		t.Error("a restart count change counts as a change")
	}
	q.Annotations[AnnotationModel] = "n"
	sq, _ = stripPod(q)
	if !podChanged(sp, sq) {
		t.Error("an annotation change does not count as a change")
	}
}

func mkPool(name string, match map[string]any, port int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": match},
			"targetPorts":       []any{map[string]any{"number": port}},
			"endpointPickerRef": map[string]any{"name": "kvroute", "portNumber": int64(9002)},
		},
	}}
}

func TestKubernetesInferencePool(t *testing.T) {
	t.Parallel()
	pool := mkPool("llama", map[string]any{"pool": "llama"}, 8000)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{InferencePoolGVR: "InferencePoolList"}, pool)
	p0 := mkPod("vllm-0", "10.0.0.1", map[string]string{AnnotationModel: "llama"})
	p0.Spec.Containers[0].Ports = append(p0.Spec.Containers[0].Ports, corev1.ContainerPort{Name: PortNameEvents, ContainerPort: 5557})
	p1 := mkPod("vllm-1", "10.0.0.2", map[string]string{AnnotationModel: "llama"})
	p1.Status.Conditions[0].Status = corev1.ConditionFalse
	pending := mkPod("vllm-2", "", map[string]string{AnnotationModel: "llama"}) // no IP yet: absent
	stranger := mkPod("web-0", "10.0.0.9", nil)
	stranger.Labels = map[string]string{"app": "web"}
	h := startK8s(t, KubernetesConfig{InferencePool: "llama", Dynamic: dyn, Defaults: Defaults{Model: "fallback"}}, p0, p1, pending, stranger)

	snap := recvSnapshot(t, h.updates)
	want := []Replica{
		{ID: ns + "/vllm-0", Address: "10.0.0.1:8000", Model: "llama", Engine: EngineVLLM, EventsEndpoint: "tcp://10.0.0.1:5557",
			DPRanks: 1, MetricsURL: "http://10.0.0.1:8000/metrics", HealthURL: "http://10.0.0.1:8000/health", Ready: true},
		{ID: ns + "/vllm-1", Address: "10.0.0.2:8000", Model: "llama", Engine: EngineVLLM,
			DPRanks: 1, MetricsURL: "http://10.0.0.2:8000/metrics", HealthURL: "http://10.0.0.2:8000/health", Ready: false},
	}
	if diff := cmp.Diff(want, snap.Replicas); diff != "" {
		t.Fatalf("first snapshot (-want +got):\n%s", diff)
	}

	t.Log("pod becomes ready, pending pod gets an IP")
	p1.Status.Conditions[0].Status = corev1.ConditionTrue
	h.updatePod(p1)
	pending.Status.PodIP = "10.0.0.3"
	h.updatePod(pending)
	h.until("three replicas, all ready", func(rs []Replica) bool { return len(rs) == 3 && countReady(rs) == 3 })

	t.Log("pod being deleted")
	p0.DeletionTimestamp = ptr(metav1.Now())
	h.updatePod(p0)
	h.until("vllm-0 not ready", field(ns+"/vllm-0", func(r Replica) any { return r.Ready }, false))

	t.Log("pool selector and port change")
	pool = mkPool("llama", map[string]any{"app": "web"}, 8080)
	if _, err := dyn.Resource(InferencePoolGVR).Namespace(ns).Update(t.Context(), pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rs := h.until("only web-0", func(rs []Replica) bool { return len(rs) == 1 && rs[0].ID == ns+"/web-0" })
	if rs[0].Address != "10.0.0.9:8080" || rs[0].Model != "fallback" {
		t.Errorf("web-0 = %+v", rs[0])
	}

	t.Log("invalid pool spec keeps the last set")
	bad := mkPool("llama", map[string]any{}, 8080)
	if _, err := dyn.Resource(InferencePoolGVR).Namespace(ns).Update(t.Context(), bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, h.src.m.errors, 1)
	expectNoSnapshot(t, h.updates)

	t.Log("pool deleted")
	if err := dyn.Resource(InferencePoolGVR).Namespace(ns).Delete(t.Context(), "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.until("empty set", func(rs []Replica) bool { return len(rs) == 0 })
}

// BenchmarkKubernetesBuild measures one rebuild of a 1,000-endpoint replica
// set (10 slices of 100, every endpoint with an annotated pod): the work
// each coalesced informer burst costs.
func BenchmarkKubernetesBuild(b *testing.B) {
	const slicesN, perSlice = 10, 100
	src, err := NewKubernetes(KubernetesConfig{Client: fake.NewClientset(), Namespace: ns, Service: "vllm",
		Defaults: Defaults{Model: "m", EventsPort: 5557}})
	if err != nil {
		b.Fatal(err)
	}
	podIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	var list []*discoveryv1.EndpointSlice
	for s := range slicesN {
		var eps []discoveryv1.Endpoint
		for e := range perSlice {
			name := fmt.Sprintf("vllm-%d-%d", s, e)
			ip := fmt.Sprintf("10.%d.%d.%d", s, e/250, e%250+1)
			eps = append(eps, mkEndpoint(ip, name, e%10 != 0))
			p, _ := stripPod(mkPod(name, ip, map[string]string{AnnotationModel: "llama", AnnotationDPRanks: "2", AnnotationReplayPort: "5600"}))
			if err := podIdx.Add(p); err != nil {
				b.Fatal(err)
			}
		}
		list = append(list, mkSlice(fmt.Sprintf("vllm-%02d", s), "vllm", stdPorts, eps...))
	}
	l := listers{
		slices: func() ([]*discoveryv1.EndpointSlice, error) { return list, nil },
		pods:   corelisters.NewPodLister(podIdx),
	}
	b.ReportAllocs()
	for b.Loop() {
		rs, _, _, err := src.build(l)
		if err != nil || len(rs) != slicesN*perSlice {
			b.Fatalf("build = %d replicas, %v", len(rs), err)
		}
	}
}

func TestPoolSpec(t *testing.T) {
	t.Parallel()
	spec := func(sel, ports any) *unstructured.Unstructured {
		u := mkPool("p", nil, 1)
		spec := u.Object["spec"].(map[string]any)
		spec["selector"] = sel
		spec["targetPorts"] = ports
		return u
	}
	match := map[string]any{"matchLabels": map[string]any{"app": "vllm"}}
	tests := []struct {
		name     string
		u        *unstructured.Unstructured
		wantSel  string
		wantPort int
		wantErr  string
	}{
		{"valid", spec(match, []any{map[string]any{"number": int64(8000)}}), "app=vllm", 8000, ""},
		{"no selector", spec(nil, []any{map[string]any{"number": int64(8000)}}), "", 0, "matchLabels is empty"},
		{"empty matchLabels", spec(map[string]any{"matchLabels": map[string]any{}}, []any{map[string]any{"number": int64(8000)}}), "", 0, "matchLabels is empty"},
		{"bad label value", spec(map[string]any{"matchLabels": map[string]any{"app": "a b"}}, []any{map[string]any{"number": int64(8000)}}), "", 0, "matchLabels"},
		{"non-string label", spec(map[string]any{"matchLabels": map[string]any{"app": int64(1)}}, []any{map[string]any{"number": int64(8000)}}), "", 0, "matchLabels"},
		{"no ports", spec(match, []any{}), "", 0, "targetPorts is empty"},
		{"port not an object", spec(match, []any{"8000"}), "", 0, "not an object"},
		{"port out of range", spec(match, []any{map[string]any{"number": int64(70000)}}), "", 0, "not a port"},
		{"port missing", spec(match, []any{map[string]any{}}), "", 0, "not a port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sel, port, err := poolSpec(tt.u)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("poolSpec error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sel.String() != tt.wantSel || port != tt.wantPort {
				t.Errorf("poolSpec = %q, %d; want %q, %d", sel, port, tt.wantSel, tt.wantPort)
			}
		})
	}
}
