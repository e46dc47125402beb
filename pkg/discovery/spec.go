package discovery

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"

	"gopkg.in/yaml.v3"
)

// ReplicaSpec is the configuration form of a Replica (YAML, snake_case keys).
// Embed []ReplicaSpec in a larger config decoded with KnownFields(true) and
// turn it into replicas with BuildReplicas, so every config that lists
// replicas shares one format and one validation.
type ReplicaSpec struct {
	ID             string `yaml:"id"`
	Address        string `yaml:"address"`
	Model          string `yaml:"model"`
	Engine         string `yaml:"engine"`
	BlockSize      int    `yaml:"block_size"`
	EventsEndpoint string `yaml:"events_endpoint"`
	ReplayEndpoint string `yaml:"replay_endpoint"`
	Topic          string `yaml:"topic"`
	DPRanks        int    `yaml:"dp_ranks"`
	MetricsURL     string `yaml:"metrics_url"`
	HealthURL      string `yaml:"health_url"`
	// LoRAAdapters lists the LoRA adapters the replica serves (the names
	// of vLLM's --lora-modules); kvroute also reads them from /v1/models.
	LoRAAdapters []string `yaml:"lora_adapters"`
	// GroupKinds labels the engine's KV-cache groups by index
	// (kv_cache_spec_kind values, e.g. [full_attention, sliding_window]).
	GroupKinds []string `yaml:"group_kinds"`
	// Ready defaults to true; false keeps a replica known (events, index)
	// but out of picks, e.g. while draining it.
	Ready *bool `yaml:"ready"`
}

// replicasFile is the document ParseReplicas reads.
type replicasFile struct {
	Replicas []ReplicaSpec `yaml:"replicas"`
}

// BuildReplicas turns specs into validated replicas sorted by ID (see
// Normalize for defaults and errors; path prefixes field names).
func BuildReplicas(path string, specs []ReplicaSpec) ([]Replica, error) {
	rs := make([]Replica, len(specs))
	for i, s := range specs {
		rs[i] = Replica{
			ID:             s.ID,
			Address:        s.Address,
			Model:          s.Model,
			Engine:         s.Engine,
			BlockSize:      s.BlockSize,
			EventsEndpoint: s.EventsEndpoint,
			ReplayEndpoint: s.ReplayEndpoint,
			Topic:          s.Topic,
			DPRanks:        s.DPRanks,
			MetricsURL:     s.MetricsURL,
			HealthURL:      s.HealthURL,
			LoRAAdapters:   slices.Clone(s.LoRAAdapters),
			GroupKinds:     slices.Clone(s.GroupKinds),
			Ready:          s.Ready == nil || *s.Ready,
		}
	}
	return Normalize(path, rs)
}

// ParseReplicas strictly decodes a YAML document of the form
//
//	replicas:
//	  - address: 10.0.0.7:8000
//	    model: meta-llama/Llama-3.1-8B-Instruct
//	    events_endpoint: tcp://10.0.0.7:5557
//
// (unknown keys are errors) and returns the validated replicas sorted by ID.
// An empty document or an empty list is a valid empty set.
func ParseReplicas(data []byte) ([]Replica, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f replicasFile
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: want a single YAML document", ErrInvalid)
	}
	return BuildReplicas("replicas", f.Replicas)
}

// Defaults fill the fields DNS and Kubernetes sources cannot read from the
// replica itself. Kubernetes pod annotations and named ports override them.
type Defaults struct {
	// Model is the served model name (required unless every Kubernetes pod
	// carries AnnotationModel).
	Model string `yaml:"model"`
	// Engine is EngineVLLM (default) or EngineSGLang.
	Engine string `yaml:"engine"`
	// BlockSize in tokens; 0 = the consumer's per-model default.
	BlockSize int `yaml:"block_size"`
	// EventsPort is the engine's KV-event PUB port on the replica's IP;
	// 0 = no events.
	EventsPort int `yaml:"events_port"`
	// ReplayPort is the engine's replay ROUTER port; 0 = none.
	ReplayPort int `yaml:"replay_port"`
	// Topic is the engine's event topic.
	Topic string `yaml:"topic"`
	// DPRanks is the data-parallel size; 0 means 1.
	DPRanks int `yaml:"dp_ranks"`
	// MetricsPort is the port of /metrics when it differs from the serving
	// port; 0 = the serving port.
	MetricsPort int `yaml:"metrics_port"`
}

// overrides are per-replica values that beat Defaults (Kubernetes).
type overrides struct {
	model, engine, topic                       *string
	blockSize, eventsPort, replayPort, dpRanks *int
	metricsPort                                *int
	loraAdapters, groupKinds                   []string
}

// newReplica builds (and validates, with path = id) a replica serving on
// ip:port from defaults and per-replica overrides.
func newReplica(id, ip string, port int, d Defaults, o overrides, ready bool) (Replica, error) {
	pick := func(def string, o *string) string {
		if o != nil {
			return *o
		}
		return def
	}
	pickInt := func(def int, o *int) int {
		if o != nil {
			return *o
		}
		return def
	}
	addr := hostPort(ip, port)
	if id == "" {
		id = addr
	}
	r := Replica{
		ID:        id,
		Address:   addr,
		Model:     pick(d.Model, o.model),
		Engine:    pick(d.Engine, o.engine),
		BlockSize: pickInt(d.BlockSize, o.blockSize),
		Topic:     pick(d.Topic, o.topic),
		DPRanks:   pickInt(d.DPRanks, o.dpRanks),
		Ready:     ready,
		// Adapters are per pod: Defaults have none.
		LoRAAdapters: o.loraAdapters,
		GroupKinds:   o.groupKinds,
	}
	if p := pickInt(d.EventsPort, o.eventsPort); p != 0 {
		r.EventsEndpoint = "tcp://" + hostPort(ip, p)
	}
	if p := pickInt(d.ReplayPort, o.replayPort); p != 0 {
		r.ReplayEndpoint = "tcp://" + hostPort(ip, p)
	}
	if p := pickInt(d.MetricsPort, o.metricsPort); p != 0 {
		r.MetricsURL = "http://" + hostPort(ip, p) + "/metrics"
	}
	r = withDefaults(r)
	if err := validate(id, r); err != nil {
		return Replica{}, err
	}
	r.LoRAAdapters = sortedAdapters(r.LoRAAdapters)
	return r, nil
}

// validateDefaults checks Defaults the way a replica would be checked, so a
// bad value fails at construction rather than on every endpoint.
func validateDefaults(path string, d Defaults) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{path + "." + field, fmt.Sprintf(format, args...)})
	}
	if d.Engine != "" && d.Engine != EngineVLLM && d.Engine != EngineSGLang {
		bad("engine", "%q is not %q or %q", d.Engine, EngineVLLM, EngineSGLang)
	}
	if d.BlockSize < 0 || d.BlockSize > MaxBlockSize {
		bad("block_size", "%d is outside [0, %d]", d.BlockSize, MaxBlockSize)
	}
	if d.DPRanks < 0 || d.DPRanks > MaxDPRanks {
		bad("dp_ranks", "%d is outside [0, %d]", d.DPRanks, MaxDPRanks)
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"events_port", d.EventsPort}, {"replay_port", d.ReplayPort}, {"metrics_port", d.MetricsPort}} {
		if p.v < 0 || p.v > 65535 {
			bad(p.name, "%d is outside [0, 65535]", p.v)
		}
	}
	if d.ReplayPort != 0 && d.EventsPort == 0 {
		bad("replay_port", "is set but events_port is not")
	}
	return errors.Join(errs...)
}
