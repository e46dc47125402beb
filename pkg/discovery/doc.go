// Package discovery finds the engine replicas the router may send requests
// to and publishes them as immutable snapshots. It imports nothing of
// kvroute's; the composition root diffs successive snapshots (Diff) into
// event subscriptions, load scrapers and the routing replica set.
//
// # Contract
//
// Every source implements Source: Run(ctx, updates) publishes a complete
// Snapshot (never a delta) whenever the replica set changes and returns
// when ctx is cancelled, with nil; it returns an error only when it cannot
// run at all (for example a replica file that is invalid at start). The
// caller owns the updates channel (it must not be nil): sources never close
// it, so several sources may share one channel, told apart by
// Snapshot.Source. A send blocks until the receiver takes the snapshot or ctx
// ends; changes made meanwhile are folded into the next snapshot, so a slow
// receiver sees fewer snapshots, never a queue. A snapshot equal to the
// previous one is never sent. Snapshots are sorted by ID, have unique IDs and
// addresses, and are never mutated after the send: receivers may share them
// freely and must not modify them.
//
// Membership and readiness: a replica the source knows but that must not get
// new requests (endpoint not ready or terminating, pod not ready, drained in
// the file) is in the snapshot with Ready=false, so the consumer keeps its
// event subscription and index entries; a replica that is gone is absent.
//
// # Goroutines
//
// Constructors (NewFile, NewDNS, NewKubernetes) validate their
// configuration, register metrics and start nothing; Static validates its
// list when Run starts. Run runs in the
// caller's goroutine; the Kubernetes source additionally starts client-go
// informer goroutines, which Run owns, stops and joins before it returns.
// Run must not be called concurrently on one source; it may be called again
// after it returned.
//
// # Replicas
//
// Address is always an IP literal and port ("10.0.0.7:8000", "[fd00::7]:8000"):
// Envoy's original-destination cluster connects to the address it is given
// and does not resolve names, so a hostname in a static list is an error
// rather than being resolved once at load (use the DNS source for names).
// Defaults: ID = Address, Engine = "vllm", DPRanks = 1,
// MetricsURL = http://<Address>/metrics, HealthURL = http://<Address>/health.
// EventsEndpoint and ReplayEndpoint are endpoints the router connects to
// (tcp://host:port or ipc://path); with DPRanks > 1 they must be tcp and rank
// r uses port + r (OffsetEndpoint), as vLLM's data-parallel ranks do, so the
// event and replay port ranges must not overlap. Event endpoints and DP
// ranks come from configuration, annotations or named ports; recent vLLM also
// lists them at GET /kv_event_sources, which this package does not query.
//
// # Static list and file
//
// ParseReplicas strictly decodes (unknown keys are errors) a YAML document
// with a top-level "replicas" list whose entries have the snake_case keys
// id, address, model, engine, block_size, events_endpoint, replay_endpoint,
// topic, dp_ranks, metrics_url, health_url and ready (default true).
// Errors name the field: "replicas[2].address: ...". ReplicaSpec and
// BuildReplicas let a larger config embed the same list. Static(replicas)
// publishes a fixed list. NewFile watches a file by polling: every Interval
// (default 5s) it reads the file and compares the bytes with the last read,
// which follows Kubernetes ConfigMap symlink swaps and editors that replace
// files without an inotify dependency. A failed reload keeps the last good
// set, is logged and counted.
//
// # DNS
//
// NewDNS resolves A/AAAA records (the port from config) or SRV records (each
// target resolved, the port from the record) of, typically, a headless
// Service, every Interval (default 10s). Every replica is Ready; IDs are
// addresses; model, engine and event/replay/metrics ports come from
// DNSConfig.Defaults. "No such host" is an empty set; other failures keep the
// last set. The Resolver is injectable.
//
// # Kubernetes
//
// NewKubernetes watches discovery.k8s.io/v1 EndpointSlices in one namespace
// with client-go informers, selected by Service name (label
// kubernetes.io/service-name) or a label selector; slices of the other
// address family (IPv4 by default) are ignored. Each endpoint's first
// address is one replica:
//
//   - ID "namespace/pod" when the endpoint targets a Pod, else the address.
//   - Serving port: the slice port named KubernetesConfig.PortName ("http"
//     by default), or the slice's only port when it is unnamed.
//   - Ready = conditions.ready && conditions.serving && !conditions.terminating
//     (nil ready/serving count as true, nil terminating as false). A
//     terminating endpoint stays with Ready=false until it leaves the slice.
//   - Endpoints in several slices are merged by address, preferring a ready
//     one; the same pod with two addresses keeps one (the other is reported).
//
// Other fields come, in decreasing precedence, from slice ports named
// "kv-events", "kv-replay" and "metrics" (PortNameEvents, PortNameReplay,
// PortNameMetrics; for the events/replay/metrics ports only), from the pod's
// annotations, and from KubernetesConfig.Defaults:
//
//	kvroute.io/model         served model name
//	kvroute.io/engine        vllm | sglang
//	kvroute.io/block-size    KV block size in tokens
//	kvroute.io/events-port   KV-event PUB port on the pod IP
//	kvroute.io/replay-port   replay ROUTER port on the pod IP
//	kvroute.io/topic         event topic
//	kvroute.io/dp-ranks      data-parallel size
//	kvroute.io/metrics-port  /metrics port when not the serving port
//	kvroute.io/lora-adapters LoRA adapters served, comma separated (per pod only)
//	kvroute.io/group-kinds   KV-cache group kinds by index, comma separated (per pod only)
//
// Annotations are read through a Pod informer (cache trimmed to the fields
// above); IgnorePods turns it off for clusters that deny pod access.
// Endpoints that do not make a valid replica (no model, bad annotation, no
// serving port) are left out of the snapshot, counted in
// kvroute_discovery_replicas{state="invalid"} and logged when that set
// changes.
//
// With KubernetesConfig.InferencePool the source instead reads an
// inference.networking.k8s.io/v1 InferencePool through the dynamic client:
// Pods matching its spec.selector.matchLabels are the replicas, served on
// its first spec.targetPorts number, Ready when the pod's Ready condition is
// true and it is not being deleted; named container ports and annotations
// apply as above. A missing pool is an empty set.
//
// RBAC: list and watch on endpointslices (discovery.k8s.io) and pods, plus
// inferencepools (inference.networking.k8s.io) in InferencePool mode, in
// Namespace. Until the caches sync Run publishes nothing and warns every 30s.
//
// Informer events are coalesced Prometheus-style: handlers only set a
// 1-buffered trigger, and the Run loop rebuilds at most once per
// MinInterval (default 1s), so a burst of changes yields few snapshots.
//
// # Metrics
//
// Each constructor takes a prometheus.Registerer (nil: no metrics) and
// registers, with the constant label source="<name>":
// kvroute_discovery_snapshots_total, kvroute_discovery_refresh_errors_total
// and kvroute_discovery_replicas{state="ready|not_ready|invalid"}.
package discovery
