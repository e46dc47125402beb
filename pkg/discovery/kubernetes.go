package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Pod annotations the Kubernetes source reads (all optional; each overrides
// the matching KubernetesConfig.Defaults field for that pod).
const (
	// AnnotationPrefix is the prefix of every annotation below.
	AnnotationPrefix = "kvroute.io/"
	// AnnotationModel is the served model name.
	AnnotationModel = "kvroute.io/model"
	// AnnotationEngine is "vllm" or "sglang".
	AnnotationEngine = "kvroute.io/engine"
	// AnnotationBlockSize is the KV block size in tokens.
	AnnotationBlockSize = "kvroute.io/block-size"
	// AnnotationEventsPort is the KV-event PUB port on the pod IP (used when
	// no port is named PortNameEvents).
	AnnotationEventsPort = "kvroute.io/events-port"
	// AnnotationReplayPort is the replay ROUTER port (used when no port is
	// named PortNameReplay).
	AnnotationReplayPort = "kvroute.io/replay-port"
	// AnnotationTopic is the engine's event topic.
	AnnotationTopic = "kvroute.io/topic"
	// AnnotationDPRanks is the data-parallel size.
	AnnotationDPRanks = "kvroute.io/dp-ranks"
	// AnnotationMetricsPort is the /metrics port when it is not the serving
	// port (used when no port is named PortNameMetrics).
	AnnotationMetricsPort = "kvroute.io/metrics-port"
	// AnnotationLoRAAdapters is a comma-separated list of the LoRA adapters
	// the pod serves (vLLM --lora-modules names).
	AnnotationLoRAAdapters = "kvroute.io/lora-adapters"
	// AnnotationGroupKinds is a comma-separated list of the pod's KV-cache
	// group kinds by group index (Replica.GroupKinds).
	AnnotationGroupKinds = "kvroute.io/group-kinds"
)

// Port names the Kubernetes source looks for (Service ports, as they appear
// in EndpointSlices; container ports in InferencePool mode).
const (
	// DefaultPortName names the OpenAI HTTP port unless
	// KubernetesConfig.PortName says otherwise.
	DefaultPortName = "http"
	// PortNameEvents names the KV-event PUB port.
	PortNameEvents = "kv-events"
	// PortNameReplay names the replay ROUTER port.
	PortNameReplay = "kv-replay"
	// PortNameMetrics names the /metrics port.
	PortNameMetrics = "metrics"
)

// InferencePoolGVR is the Gateway API Inference Extension's InferencePool
// resource the source can take its pod selector from.
var InferencePoolGVR = schema.GroupVersionResource{
	Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools",
}

// KubernetesConfig configures a KubernetesSource. Exactly one of Service,
// Selector and InferencePool selects the replicas.
type KubernetesConfig struct {
	// Name is the snapshots' Source; default "kubernetes".
	Name string `yaml:"-"`
	// Client is required by NewKubernetes (Config.NewSource makes one
	// in-cluster, or from $KUBECONFIG).
	Client kubernetes.Interface `yaml:"-"`
	// Namespace to watch. Required (Config.WithDefaults takes
	// $POD_NAMESPACE).
	Namespace string `yaml:"namespace"`
	// Service selects the EndpointSlices of this Service (label
	// kubernetes.io/service-name).
	Service string `yaml:"service"`
	// Selector selects EndpointSlices by label selector (EndpointSlices
	// carry their Service's labels).
	Selector string `yaml:"selector"`
	// InferencePool names an InferencePool (inference.networking.k8s.io/v1)
	// in Namespace: its spec.selector.matchLabels selects Pods and its first
	// spec.targetPorts entry is the serving port. Needs Dynamic.
	InferencePool string `yaml:"inference_pool"`
	// Dynamic is the client for InferencePool; required with it.
	Dynamic dynamic.Interface `yaml:"-"`
	// PortName names the serving port in EndpointSlices; default "http". A
	// slice with a single unnamed port uses that port.
	PortName string `yaml:"port_name"`
	// AddressType is the EndpointSlice address family to use, IPv4 (default)
	// or IPv6; a dual-stack Service has one slice set per family.
	AddressType string `yaml:"address_type"`
	// IgnorePods disables the Pod watch in EndpointSlice mode: annotations
	// are not read (only Defaults and named ports apply) and the source
	// needs no RBAC on pods.
	IgnorePods bool `yaml:"ignore_pods"`
	// PodSelector narrows the Pod watch in EndpointSlice mode (label
	// selector); empty watches every pod in Namespace.
	PodSelector string `yaml:"pod_selector"`
	// Defaults for fields neither annotations nor named ports give.
	Defaults Defaults `yaml:"defaults"`
	// MinInterval is the minimum time between two rebuilds of the replica
	// set: informer events within it are coalesced. Default
	// DefaultKubernetesMinInterval.
	MinInterval time.Duration `yaml:"min_interval"`
	// Logger; nil discards.
	Logger *slog.Logger `yaml:"-"`
	// Registerer for the source's metrics; nil registers none.
	Registerer prometheus.Registerer `yaml:"-"`
}

// WithDefaults returns c with Name, PortName and MinInterval defaulted.
func (c KubernetesConfig) WithDefaults() KubernetesConfig {
	if c.Name == "" {
		c.Name = "kubernetes"
	}
	if c.PortName == "" {
		c.PortName = DefaultPortName
	}
	if c.MinInterval == 0 {
		c.MinInterval = DefaultKubernetesMinInterval
	}
	return c
}

// Validate reports every problem of the YAML fields (not the clients),
// each prefixed with its field's YAML path ("namespace: is required").
func (c KubernetesConfig) Validate() error { return errors.Join(c.check("")...) }

func (c KubernetesConfig) check(prefix string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{prefix + field, fmt.Sprintf(format, args...)})
	}
	if c.Namespace == "" {
		bad("namespace", "is required")
	}
	modes := 0
	for _, s := range []string{c.Service, c.Selector, c.InferencePool} {
		if s != "" {
			modes++
		}
	}
	if modes != 1 {
		bad("service", "exactly one of service, selector and inference_pool must be set")
	}
	if c.Selector != "" {
		if sel, err := labels.Parse(c.Selector); err != nil {
			bad("selector", "%v", err)
		} else if sel.Empty() {
			bad("selector", "must not be empty")
		}
	}
	if c.PodSelector != "" {
		if _, err := labels.Parse(c.PodSelector); err != nil {
			bad("pod_selector", "%v", err)
		}
	}
	switch c.AddressType {
	case "", IPv4, IPv6:
	default:
		bad("address_type", "%q is not %q or %q", c.AddressType, IPv4, IPv6)
	}
	if c.MinInterval < 0 {
		bad("min_interval", "must not be negative")
	}
	if err := validateDefaults(prefix+"defaults", c.Defaults); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// KubernetesSource watches EndpointSlices (or an InferencePool's Pods) with
// client-go informers and publishes the replica set. See the package
// documentation for how endpoints map to replicas.
type KubernetesSource struct {
	cfg         KubernetesConfig
	sliceSel    labels.Selector
	podSel      labels.Selector
	log         *slog.Logger
	m           *metrics
	addressType discoveryv1.AddressType
}

var _ Source = (*KubernetesSource)(nil)

// NewKubernetes validates cfg and registers the source's metrics. It starts
// nothing and makes no API call.
func NewKubernetes(cfg KubernetesConfig) (*KubernetesSource, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{"kubernetes." + field, fmt.Sprintf(format, args...)})
	}
	if cfg.Client == nil {
		bad("client", "is required")
	}
	if cfg.InferencePool != "" && cfg.Dynamic == nil {
		bad("inference_pool", "needs a dynamic client")
	}
	errs = append(errs, cfg.check("kubernetes.")...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s := &KubernetesSource{cfg: cfg.WithDefaults(), sliceSel: labels.Everything(), podSel: labels.Everything()}
	// The selectors parse: check said so.
	switch {
	case cfg.Service != "":
		s.sliceSel = labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: cfg.Service})
	case cfg.Selector != "":
		s.sliceSel, _ = labels.Parse(cfg.Selector)
	}
	if cfg.PodSelector != "" {
		s.podSel, _ = labels.Parse(cfg.PodSelector)
	}
	s.addressType = discoveryv1.AddressTypeIPv4
	if cfg.AddressType == IPv6 {
		s.addressType = discoveryv1.AddressTypeIPv6
	}
	s.log = loggerOr(cfg.Logger)
	m, err := newMetrics(cfg.Registerer, s.cfg.Name)
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

// listers are the informer caches a build reads.
type listers struct {
	slices func() ([]*discoveryv1.EndpointSlice, error)
	pods   corelisters.PodLister // nil when pods are not watched
	pool   cache.GenericNamespaceLister
}

// Run starts the informers (owned by Run and joined before it returns),
// waits for their caches, publishes the first snapshot and then a new one
// whenever the set changes, at most one rebuild per MinInterval. It
// publishes nothing until the caches have synced.
func (s *KubernetesSource) Run(ctx context.Context, updates chan<- Snapshot) error {
	ctx, cancel := context.WithCancel(ctx)
	// Informer handlers only set this 1-buffered trigger; the loop below
	// rebuilds from the caches.
	trigger := make(chan struct{}, 1)
	fire := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	w, err := s.newWatch(fire)
	defer func() {
		cancel()
		w.shutdown() // joins the informer goroutines
	}()
	if err != nil {
		return err
	}
	w.start(ctx)
	if !w.waitSynced(ctx, s) {
		return nil // ctx ended first
	}
	s.log.Info("discovery: kubernetes caches synced", "source", s.cfg.Name, "namespace", s.cfg.Namespace)

	pub := &publisher{source: s.cfg.Name, log: s.log, m: s.m}
	var last time.Time
	var lastErr string
	fire()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
		}
		if wait := s.cfg.MinInterval - time.Since(last); !last.IsZero() && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		last = time.Now()
		rs, invalid, errs, err := s.build(w.listers)
		switch {
		case errors.Is(err, errPoolNotFound):
			// A missing (or deleted) pool selects nothing.
			if err.Error() != lastErr {
				lastErr = err.Error()
				s.log.Warn("discovery: inferencepool not found, publishing an empty set",
					"source", s.cfg.Name, "error", err)
			}
		case err != nil:
			s.m.errors.Inc()
			if err.Error() != lastErr {
				lastErr = err.Error()
				s.log.Warn("discovery: cannot build the replica set, keeping the last one",
					"source", s.cfg.Name, "error", err)
			}
			continue
		case lastErr != "":
			lastErr = ""
			s.log.Info("discovery: replica set can be built again", "source", s.cfg.Name)
		}
		pub.setInvalid(invalid, errs)
		if !pub.publish(ctx, updates, rs) {
			return nil
		}
	}
}

// watch is the informers of one Run.
type watch struct {
	listers
	starts    []func(<-chan struct{})
	shutdowns []func()
	synced    []cache.InformerSynced
}

// newWatch builds (does not start) the informers, with handlers calling
// fire. On error the partial watch can still be shut down.
func (s *KubernetesSource) newWatch(fire func()) (*watch, error) {
	w := &watch{}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { fire() },
		UpdateFunc: func(any, any) { fire() },
		DeleteFunc: func(any) { fire() },
	}
	if s.cfg.InferencePool == "" {
		f := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0,
			informers.WithNamespace(s.cfg.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.sliceSel.String() }))
		w.starts, w.shutdowns = append(w.starts, f.Start), append(w.shutdowns, f.Shutdown)
		inf := f.Discovery().V1().EndpointSlices()
		if _, err := inf.Informer().AddEventHandler(handler); err != nil {
			return w, fmt.Errorf("discovery: kubernetes: %w", err)
		}
		lister := inf.Lister().EndpointSlices(s.cfg.Namespace)
		// Filter again: the server applies the selector, but the cache must
		// never yield more than it selects.
		w.slices = func() ([]*discoveryv1.EndpointSlice, error) { return lister.List(s.sliceSel) }
		w.synced = append(w.synced, inf.Informer().HasSynced)
	} else {
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.cfg.Dynamic, 0, s.cfg.Namespace,
			func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + s.cfg.InferencePool })
		w.starts, w.shutdowns = append(w.starts, f.Start), append(w.shutdowns, f.Shutdown)
		inf := f.ForResource(InferencePoolGVR)
		if _, err := inf.Informer().AddEventHandler(handler); err != nil {
			return w, fmt.Errorf("discovery: kubernetes: %w", err)
		}
		w.pool = inf.Lister().ByNamespace(s.cfg.Namespace)
		w.synced = append(w.synced, inf.Informer().HasSynced)
	}
	if s.cfg.InferencePool == "" && s.cfg.IgnorePods {
		return w, nil
	}
	sel := s.podSel
	if s.cfg.InferencePool != "" {
		sel = labels.Everything() // the pool's selector may change at any time
	}
	f := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0,
		informers.WithNamespace(s.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	w.starts, w.shutdowns = append(w.starts, f.Start), append(w.shutdowns, f.Shutdown)
	inf := f.Core().V1().Pods()
	if err := inf.Informer().SetTransform(stripPod); err != nil {
		return w, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	podHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { fire() },
		UpdateFunc: func(oldObj, newObj any) {
			if podChanged(oldObj, newObj) {
				fire()
			}
		},
		DeleteFunc: func(any) { fire() },
	}
	if _, err := inf.Informer().AddEventHandler(podHandler); err != nil {
		return w, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	w.pods = inf.Lister()
	w.synced = append(w.synced, inf.Informer().HasSynced)
	return w, nil
}

func (w *watch) start(ctx context.Context) {
	for _, start := range w.starts {
		start(ctx.Done())
	}
}

func (w *watch) shutdown() {
	for _, shutdown := range w.shutdowns {
		shutdown()
	}
}

// waitSynced waits for every cache, warning every syncWarnAfter so a source
// that cannot sync (RBAC, wrong namespace) says so instead of hanging
// silently. It returns false when ctx ends first.
func (w *watch) waitSynced(ctx context.Context, s *KubernetesSource) bool {
	for {
		wctx, wcancel := context.WithTimeout(ctx, syncWarnAfter)
		ok := cache.WaitForCacheSync(wctx.Done(), w.synced...)
		wcancel()
		if ok {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		s.log.Warn("discovery: kubernetes caches not synced yet; check the API server and RBAC (list/watch endpointslices, pods, inferencepools)",
			"source", s.cfg.Name, "namespace", s.cfg.Namespace, "waited", syncWarnAfter)
	}
}

var errPoolNotFound = errors.New("not found")

// syncWarnAfter is how long Run waits for the informer caches before each
// warning.
const syncWarnAfter = 30 * time.Second

// candidate is one endpoint on its way to a replica.
type candidate struct {
	r   Replica
	err error
}

// build computes the replica set from the caches.
func (s *KubernetesSource) build(l listers) (rs []Replica, invalid []string, errs []error, err error) {
	var cands []candidate
	if l.pool != nil {
		cands, err = s.fromPool(l)
	} else {
		cands, err = s.fromSlices(l)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	// Deduplicate by address (the same endpoint may sit in two slices while
	// the controller moves it) and then by ID, preferring ready endpoints.
	rank := func(c candidate) int {
		switch {
		case c.err != nil:
			return 0
		case !c.r.Ready:
			return 1
		}
		return 2
	}
	better := func(a, b candidate) bool { return rank(a) > rank(b) }
	byAddr := make(map[string]candidate, len(cands))
	var addrs []string
	for _, c := range cands {
		old, ok := byAddr[c.r.Address]
		if !ok {
			addrs = append(addrs, c.r.Address)
			byAddr[c.r.Address] = c
		} else if better(c, old) {
			byAddr[c.r.Address] = c
		}
	}
	slices.Sort(addrs)
	drop := func(c, kept candidate) {
		invalid = append(invalid, c.r.Address)
		if c.err != nil {
			errs = append(errs, c.err)
			return
		}
		errs = append(errs, &FieldError{c.r.ID, fmt.Sprintf("address %s dropped: the same pod also has address %s", c.r.Address, kept.r.Address)})
	}
	byID := make(map[string]candidate, len(addrs))
	for _, a := range addrs {
		c := byAddr[a]
		old, ok := byID[c.r.ID]
		switch {
		case !ok:
			byID[c.r.ID] = c
		case better(c, old):
			drop(old, c)
			byID[c.r.ID] = c
		default:
			drop(c, old)
		}
	}
	for _, c := range byID {
		if c.err != nil {
			invalid = append(invalid, c.r.ID)
			errs = append(errs, c.err)
			continue
		}
		rs = append(rs, c.r)
	}
	sortByID(rs)
	slices.SortFunc(errs, func(a, b error) int { return cmp.Compare(a.Error(), b.Error()) })
	return rs, invalid, errs, nil
}

func (s *KubernetesSource) fromSlices(l listers) ([]candidate, error) {
	list, err := l.slices()
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: list endpointslices: %w", err)
	}
	list = slices.Clone(list)
	slices.SortFunc(list, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	var cands []candidate
	for _, sl := range list {
		if sl.AddressType != s.addressType {
			continue
		}
		var serving int
		var named overrides
		for _, p := range sl.Ports {
			if p.Port == nil {
				continue
			}
			port := int(*p.Port)
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			switch name {
			case s.cfg.PortName:
				serving = port
			case PortNameEvents:
				named.eventsPort = &port
			case PortNameReplay:
				named.replayPort = &port
			case PortNameMetrics:
				named.metricsPort = &port
			}
		}
		if serving == 0 && len(sl.Ports) == 1 && sl.Ports[0].Port != nil &&
			(sl.Ports[0].Name == nil || *sl.Ports[0].Name == "") {
			serving = int(*sl.Ports[0].Port)
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			ip := ep.Addresses[0]
			id := hostPort(ip, serving)
			var pod *corev1.Pod
			if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" && ref.Name != "" {
				ns := cmp.Or(ref.Namespace, sl.Namespace)
				id = ns + "/" + ref.Name
				if l.pods != nil {
					pod, _ = l.pods.Pods(ns).Get(ref.Name) // absent: annotations unknown yet
				}
			}
			c := candidate{r: Replica{ID: id, Address: hostPort(ip, serving)}}
			if serving == 0 {
				c.err = &FieldError{id + ".port", fmt.Sprintf("endpointslice %s has no port named %q", sl.Name, s.cfg.PortName)}
				cands = append(cands, c)
				continue
			}
			o, err := podOverrides(id, pod)
			if err != nil {
				c.err = err
				cands = append(cands, c)
				continue
			}
			o.named(named)
			c.r, c.err = newReplica(id, ip, serving, s.cfg.Defaults, o, endpointReady(ep.Conditions))
			if c.err != nil {
				c.r = Replica{ID: id, Address: hostPort(ip, serving)}
			}
			cands = append(cands, c)
		}
	}
	return cands, nil
}

// endpointReady: ready (nil = true) and serving (nil = true) and not
// terminating. A terminating endpoint that still serves stays in the set
// with Ready=false until it leaves the slice, so in-flight requests finish
// and its index entries survive a short drain.
func endpointReady(c discoveryv1.EndpointConditions) bool {
	isTrue := func(b *bool, def bool) bool {
		if b == nil {
			return def
		}
		return *b
	}
	return isTrue(c.Ready, true) && isTrue(c.Serving, true) && !isTrue(c.Terminating, false)
}

func (s *KubernetesSource) fromPool(l listers) ([]candidate, error) {
	obj, err := l.pool.Get(s.cfg.InferencePool)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("discovery: kubernetes: inferencepool %s/%s: %w", s.cfg.Namespace, s.cfg.InferencePool, errPoolNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: get inferencepool: %w", err)
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("discovery: kubernetes: inferencepool: unexpected type %T", obj)
	}
	sel, port, err := poolSpec(u)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: inferencepool %s/%s: %w", s.cfg.Namespace, s.cfg.InferencePool, err)
	}
	pods, err := l.pods.Pods(s.cfg.Namespace).List(sel)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: list pods: %w", err)
	}
	var cands []candidate
	for _, pod := range pods {
		if pod.Status.PodIP == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		id := pod.Namespace + "/" + pod.Name
		c := candidate{r: Replica{ID: id, Address: hostPort(pod.Status.PodIP, port)}}
		o, err := podOverrides(id, pod)
		if err != nil {
			c.err = err
			cands = append(cands, c)
			continue
		}
		o.named(containerPorts(pod))
		r, err := newReplica(id, pod.Status.PodIP, port, s.cfg.Defaults, o, podReady(pod))
		if err != nil {
			c.err = err
		} else {
			c.r = r
		}
		cands = append(cands, c)
	}
	return cands, nil
}

// poolSpec reads spec.selector.matchLabels and spec.targetPorts[0].number of
// an inference.networking.k8s.io/v1 InferencePool.
func poolSpec(u *unstructured.Unstructured) (labels.Selector, int, error) {
	ml, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return nil, 0, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	if !found || len(ml) == 0 {
		return nil, 0, errors.New("spec.selector.matchLabels is empty")
	}
	sel, err := labels.ValidatedSelectorFromSet(ml)
	if err != nil {
		return nil, 0, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	tps, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil || !found || len(tps) == 0 {
		return nil, 0, errors.New("spec.targetPorts is empty")
	}
	tp, ok := tps[0].(map[string]any)
	if !ok {
		return nil, 0, errors.New("spec.targetPorts[0] is not an object")
	}
	n, found, err := unstructured.NestedInt64(tp, "number")
	if err != nil || !found || n < 1 || n > 65535 {
		return nil, 0, errors.New("spec.targetPorts[0].number is not a port")
	}
	return sel, int(n), nil
}

func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerPorts reads the named event/replay/metrics container ports.
func containerPorts(pod *corev1.Pod) overrides {
	var o overrides
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			port := int(p.ContainerPort)
			switch p.Name {
			case PortNameEvents:
				o.eventsPort = &port
			case PortNameReplay:
				o.replayPort = &port
			case PortNameMetrics:
				o.metricsPort = &port
			}
		}
	}
	return o
}

// named lets named ports win over annotations.
func (o *overrides) named(n overrides) {
	if n.eventsPort != nil {
		o.eventsPort = n.eventsPort
	}
	if n.replayPort != nil {
		o.replayPort = n.replayPort
	}
	if n.metricsPort != nil {
		o.metricsPort = n.metricsPort
	}
}

// podOverrides reads the kvroute.io/ annotations of pod (nil: none).
func podOverrides(id string, pod *corev1.Pod) (overrides, error) {
	var o overrides
	if pod == nil {
		return o, nil
	}
	ann := pod.Annotations
	var errs []error
	str := func(key string) *string {
		if v, ok := ann[key]; ok {
			v = strings.TrimSpace(v)
			return &v
		}
		return nil
	}
	num := func(key string) *int {
		v, ok := ann[key]
		if !ok {
			return nil
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, &FieldError{id + ".annotations[" + key + "]", fmt.Sprintf("%q is not an integer", v)})
			return nil
		}
		return &n
	}
	o.model = str(AnnotationModel)
	o.engine = str(AnnotationEngine)
	o.topic = str(AnnotationTopic)
	o.blockSize = num(AnnotationBlockSize)
	o.eventsPort = num(AnnotationEventsPort)
	o.replayPort = num(AnnotationReplayPort)
	o.dpRanks = num(AnnotationDPRanks)
	o.metricsPort = num(AnnotationMetricsPort)
	if v, ok := ann[AnnotationLoRAAdapters]; ok {
		for a := range strings.SplitSeq(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				o.loraAdapters = append(o.loraAdapters, a)
			}
		}
	}
	if v, ok := ann[AnnotationGroupKinds]; ok {
		for k := range strings.SplitSeq(v, ",") {
			o.groupKinds = append(o.groupKinds, strings.TrimSpace(k)) // positional: empty entries are errors
		}
	}
	for _, p := range []struct {
		key string
		v   *int
	}{{AnnotationEventsPort, o.eventsPort}, {AnnotationReplayPort, o.replayPort}, {AnnotationMetricsPort, o.metricsPort}} {
		if p.v != nil && (*p.v < 0 || *p.v > 65535) {
			errs = append(errs, &FieldError{id + ".annotations[" + p.key + "]", fmt.Sprintf("%d is not a port", *p.v)})
		}
	}
	return o, errors.Join(errs...)
}

// stripPod keeps only what the source reads from a Pod, so a namespace full
// of large pods costs little memory in the informer cache.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			Labels:            pod.Labels,
			DeletionTimestamp: pod.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP},
	}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			if out.Annotations == nil {
				out.Annotations = make(map[string]string)
			}
			out.Annotations[k] = v
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	for _, c := range pod.Spec.Containers {
		var ports []corev1.ContainerPort
		for _, p := range c.Ports {
			switch p.Name {
			case PortNameEvents, PortNameReplay, PortNameMetrics:
				ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort})
			}
		}
		if len(ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: ports})
		}
	}
	return out, nil
}

// podChanged reports whether an update changes anything the source reads
// (pods are already stripped, so compare everything but the version).
func podChanged(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	if o.Status.PodIP != n.Status.PodIP || o.Status.Phase != n.Status.Phase ||
		podReady(o) != podReady(n) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
		return true
	}
	if !maps.Equal(o.Labels, n.Labels) || !maps.Equal(o.Annotations, n.Annotations) {
		return true
	}
	return !slices.EqualFunc(o.Spec.Containers, n.Spec.Containers, func(a, b corev1.Container) bool {
		return a.Name == b.Name && slices.Equal(a.Ports, b.Ports)
	})
}
