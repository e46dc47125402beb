package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Engine names a replica may carry.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// Limits enforced by validation.
const (
	// MaxDPRanks bounds Replica.DPRanks.
	MaxDPRanks = 1024
	// MaxBlockSize bounds Replica.BlockSize (tokens).
	MaxBlockSize = 1 << 16
)

// ErrInvalid classifies every validation failure (a *FieldError matches it
// with errors.Is).
var ErrInvalid = errors.New("discovery: invalid replica")

// FieldError is one invalid field, named by its path, e.g.
// "replicas[2].address" or "ns/pod-0.dp_ranks".
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Is reports whether target is ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// Replica is one routable engine replica as a source sees it. Values are
// copied freely; a Replica never holds a pointer or slice.
type Replica struct {
	// ID is stable for the replica's lifetime: "namespace/pod" for
	// Kubernetes endpoints backed by a pod, the address otherwise (DNS, and
	// static entries without an explicit id). A pod recreated under the same
	// name (StatefulSet) keeps its ID with a new Address: consumers should
	// treat an Address change as a new engine (fresh index, resubscribe).
	ID string
	// Address is the ip:port Envoy connects to (the OpenAI HTTP port). It is
	// always an IP literal: Envoy's ORIGINAL_DST cluster does not resolve names.
	Address string
	// Model is the served model name requests are matched against.
	Model string
	// Engine is EngineVLLM or EngineSGLang.
	Engine string
	// BlockSize is the engine's KV block size in tokens; 0 means the
	// consumer's per-model default.
	BlockSize int
	// EventsEndpoint is the ZMQ endpoint of the engine's KV-event PUB socket
	// (the subscriber connects), e.g. "tcp://10.0.0.7:5557"; empty = no events.
	EventsEndpoint string
	// ReplayEndpoint is the engine's ROUTER replay socket; empty = none.
	ReplayEndpoint string
	// Topic is the ZMQ topic the engine publishes on (a prefix filter for the
	// subscriber); empty matches everything.
	Topic string
	// DPRanks is the number of data-parallel ranks (>= 1). Rank r publishes
	// on the event and replay ports plus r (see OffsetEndpoint); all ranks
	// serve HTTP on Address.
	DPRanks int
	// MetricsURL is the engine's Prometheus endpoint (default
	// http://<Address>/metrics).
	MetricsURL string
	// HealthURL is the engine's health endpoint (default
	// http://<Address>/health).
	HealthURL string
	// LoRAAdapters are the LoRA adapters the replica is known to serve on
	// top of Model (vLLM --lora-modules), sorted and without duplicates.
	// The router also learns them from the engine's /v1/models.
	LoRAAdapters []string
	// GroupKinds labels the engine's KV-cache groups by index with their
	// kv_cache_spec_kind (events.Source.GroupKinds), for engines whose
	// events do not carry it (vLLM 0.33 GPU events of a hybrid model),
	// e.g. [full_attention, sliding_window]. Empty: every group unlabelled.
	GroupKinds []string
	// Ready is false for replicas the source knows but which must not get
	// new requests (not ready, terminating, drained). Consumers keep their
	// event subscriptions and index entries for them.
	Ready bool
}

// Snapshot is the complete replica set of one source at one moment.
// Replicas are sorted by ID with unique IDs and addresses. A snapshot is never
// mutated after it is sent; receivers must treat it as read-only too, which
// makes it safe to share between goroutines without copying.
type Snapshot struct {
	// Source is the name of the source that produced the snapshot.
	Source string
	// Replicas is the full set (not a delta); empty means "none".
	Replicas []Replica
}

// Source discovers a replica set and publishes it.
//
// Run publishes a Snapshot on updates whenever the set changes (after its
// initial state is known, it always publishes at least one snapshot, possibly
// empty) and returns when ctx is cancelled. It returns nil on cancellation and
// a non-nil error only when it cannot run at all (bad configuration, a static
// file that does not load at start). Sends block until the receiver takes the
// snapshot or ctx ends, so a slow receiver slows the source down instead of
// queueing; sources coalesce changes while blocked and never send a snapshot
// equal to the previous one.
//
// The caller owns updates: Run never closes it (several sources may share
// one channel; Snapshot.Source tells them apart). Run must not be called
// concurrently on the same Source; it may be called again after it returned.
type Source interface {
	Run(ctx context.Context, updates chan<- Snapshot) error
}

// Changes is the difference between two replica sets (see Diff).
type Changes struct {
	// Added are in next but not in prev (by ID).
	Added []Replica
	// Removed are in prev but not in next.
	Removed []Replica
	// Changed are in both with some field different; the value is next's.
	Changed []Replica
}

// Empty reports whether there is no change.
func (c Changes) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// Diff compares two replica sets sorted by ID (as snapshots are) and returns
// what was added, removed and changed, each sorted by ID.
func Diff(prev, next []Replica) Changes {
	var c Changes
	i, j := 0, 0
	for i < len(prev) || j < len(next) {
		switch {
		case j == len(next) || (i < len(prev) && prev[i].ID < next[j].ID):
			c.Removed = append(c.Removed, prev[i])
			i++
		case i == len(prev) || next[j].ID < prev[i].ID:
			c.Added = append(c.Added, next[j])
			j++
		default:
			if !prev[i].Equal(next[j]) {
				c.Changed = append(c.Changed, next[j])
			}
			i++
			j++
		}
	}
	return c
}

// OffsetEndpoint returns the ZMQ endpoint data-parallel rank uses, the way
// vLLM derives it: rank 0 is endpoint unchanged; a tcp endpoint's port is
// increased by rank; any other transport cannot carry rank > 0.
func OffsetEndpoint(endpoint string, rank int) (string, error) {
	if rank < 0 {
		return "", fmt.Errorf("discovery: negative rank %d", rank)
	}
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("discovery: endpoint %q: rank %d needs a tcp endpoint", endpoint, rank)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("discovery: endpoint %q: %w", endpoint, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p+rank > 65535 {
		return "", fmt.Errorf("discovery: endpoint %q: port %q cannot be offset by %d", endpoint, port, rank)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
}

// Normalize applies defaults to replicas and validates them, returning a new
// slice sorted by ID (the input is not modified). path prefixes field names in
// errors ("replicas" gives "replicas[2].address: ..."); errors are
// *FieldError values joined with errors.Join and match ErrInvalid.
//
// Defaults: ID = Address, Engine = EngineVLLM, DPRanks = 1,
// MetricsURL = http://<Address>/metrics, HealthURL = http://<Address>/health.
// Ready is left as given.
func Normalize(path string, replicas []Replica) ([]Replica, error) {
	out := make([]Replica, len(replicas))
	var errs []error
	ids := make(map[string]int, len(replicas))
	addrs := make(map[string]int, len(replicas))
	for i, r := range replicas {
		p := fmt.Sprintf("%s[%d]", path, i)
		r = withDefaults(r)
		if err := validate(p, r); err != nil {
			errs = append(errs, err)
		}
		if j, dup := ids[r.ID]; dup && r.ID != "" {
			errs = append(errs, &FieldError{p + ".id", fmt.Sprintf("duplicate %q (also %s[%d])", r.ID, path, j)})
		} else {
			ids[r.ID] = i
		}
		if j, dup := addrs[r.Address]; dup && r.Address != "" {
			errs = append(errs, &FieldError{p + ".address", fmt.Sprintf("duplicate %q (also %s[%d])", r.Address, path, j)})
		} else {
			addrs[r.Address] = i
		}
		r.LoRAAdapters = sortedAdapters(r.LoRAAdapters)
		out[i] = r
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sortByID(out)
	return out, nil
}

// Equal reports whether r and o are the same in every field.
func (r Replica) Equal(o Replica) bool {
	return r.ID == o.ID && r.Address == o.Address && r.Model == o.Model && r.Engine == o.Engine &&
		r.BlockSize == o.BlockSize && r.EventsEndpoint == o.EventsEndpoint && r.ReplayEndpoint == o.ReplayEndpoint &&
		r.Topic == o.Topic && r.DPRanks == o.DPRanks && r.MetricsURL == o.MetricsURL && r.HealthURL == o.HealthURL &&
		r.Ready == o.Ready && slices.Equal(r.LoRAAdapters, o.LoRAAdapters) && slices.Equal(r.GroupKinds, o.GroupKinds)
}

// sortedAdapters sorts adapter names and drops duplicates (after
// validation, so that error paths index the list as written).
func sortedAdapters(as []string) []string {
	if len(as) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(as)))
}

func sortByID(rs []Replica) {
	slices.SortFunc(rs, func(a, b Replica) int { return cmp.Compare(a.ID, b.ID) })
}

func withDefaults(r Replica) Replica {
	if r.ID == "" {
		r.ID = r.Address
	}
	if r.Engine == "" {
		r.Engine = EngineVLLM
	}
	if r.DPRanks == 0 {
		r.DPRanks = 1
	}
	if r.MetricsURL == "" && r.Address != "" {
		r.MetricsURL = "http://" + r.Address + "/metrics"
	}
	if r.HealthURL == "" && r.Address != "" {
		r.HealthURL = "http://" + r.Address + "/health"
	}
	return r
}

// validate checks one replica with defaults applied; p is its path. It
// returns the first problem of each field, joined.
func validate(p string, r Replica) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{p + "." + field, fmt.Sprintf(format, args...)})
	}
	if r.ID == "" {
		bad("id", "must not be empty")
	}
	if r.Address == "" {
		bad("address", "is required")
	} else if err := checkIPPort(r.Address); err != nil {
		bad("address", "%q %v", r.Address, err)
	}
	if r.Model == "" {
		bad("model", "is required")
	}
	for i, a := range r.LoRAAdapters {
		if strings.TrimSpace(a) == "" || strings.ContainsAny(a, " ,\t\n") {
			bad(fmt.Sprintf("lora_adapters[%d]", i), "%q is not an adapter name", a)
		} else if a == r.Model {
			bad(fmt.Sprintf("lora_adapters[%d]", i), "%q is the base model's name", a)
		}
	}
	for i, k := range r.GroupKinds {
		if k == "" || strings.ContainsAny(k, " ,\t\n") {
			bad(fmt.Sprintf("group_kinds[%d]", i), "%q is not a kv_cache_spec_kind", k)
		}
	}
	if r.Engine != EngineVLLM && r.Engine != EngineSGLang {
		bad("engine", "%q is not %q or %q", r.Engine, EngineVLLM, EngineSGLang)
	}
	if r.BlockSize < 0 || r.BlockSize > MaxBlockSize {
		bad("block_size", "%d is outside [0, %d]", r.BlockSize, MaxBlockSize)
	}
	if r.DPRanks < 1 || r.DPRanks > MaxDPRanks {
		bad("dp_ranks", "%d is outside [1, %d]", r.DPRanks, MaxDPRanks)
	}
	ranks := max(1, min(r.DPRanks, MaxDPRanks))
	ev, evErr := checkZMQ(r.EventsEndpoint, ranks)
	if evErr != nil {
		bad("events_endpoint", "%q %v", r.EventsEndpoint, evErr)
	}
	rp, rpErr := checkZMQ(r.ReplayEndpoint, ranks)
	if rpErr != nil {
		bad("replay_endpoint", "%q %v", r.ReplayEndpoint, rpErr)
	}
	if r.ReplayEndpoint != "" && r.EventsEndpoint == "" {
		bad("replay_endpoint", "is set but events_endpoint is not")
	}
	if evErr == nil && rpErr == nil && ev.tcp && rp.tcp && ev.host == rp.host {
		if lo, hi := min(ev.port, rp.port), max(ev.port, rp.port); hi-lo < ranks {
			bad("replay_endpoint", "port %d overlaps the event ports %d..%d of %d ranks",
				rp.port, ev.port, ev.port+ranks-1, ranks)
		}
	}
	if err := checkHTTPURL(r.MetricsURL); err != nil {
		bad("metrics_url", "%q %v", r.MetricsURL, err)
	}
	if err := checkHTTPURL(r.HealthURL); err != nil {
		bad("health_url", "%q %v", r.HealthURL, err)
	}
	return errors.Join(errs...)
}

func checkIPPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("is not ip:port")
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return errors.New("is not ip:port (the host must be an IP address: Envoy's original-destination routing does not resolve names)")
	}
	if _, err := parsePort(port); err != nil {
		return err
	}
	return nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("has an invalid port %q (want 1..65535)", s)
	}
	return p, nil
}

type zmqEndpoint struct {
	tcp  bool
	host string
	port int
}

// checkZMQ validates an endpoint a subscriber connects to: tcp://host:port
// (host an IP or a name) or ipc://path. ranks > 1 needs tcp, and every rank's
// port must fit.
func checkZMQ(s string, ranks int) (zmqEndpoint, error) {
	if s == "" {
		return zmqEndpoint{}, nil
	}
	if rest, ok := strings.CutPrefix(s, "tcp://"); ok {
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" || host == "*" {
			return zmqEndpoint{}, errors.New("is not tcp://host:port with a connectable host")
		}
		p, err := parsePort(port)
		if err != nil {
			return zmqEndpoint{}, err
		}
		if p+ranks-1 > 65535 {
			return zmqEndpoint{}, fmt.Errorf("port %d plus %d ranks exceeds 65535", p, ranks)
		}
		return zmqEndpoint{tcp: true, host: host, port: p}, nil
	}
	if rest, ok := strings.CutPrefix(s, "ipc://"); ok {
		if rest == "" {
			return zmqEndpoint{}, errors.New("has an empty ipc path")
		}
		if ranks > 1 {
			return zmqEndpoint{}, errors.New("is not tcp, which data-parallel ranks > 1 need (rank r uses port + r)")
		}
		return zmqEndpoint{}, nil
	}
	return zmqEndpoint{}, errors.New("is not a tcp:// or ipc:// endpoint")
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("is not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("is not an http(s) URL")
	}
	if u.Host == "" {
		return errors.New("has no host")
	}
	return nil
}

// hostPort joins an IP and port into an address (brackets for IPv6).
func hostPort(ip string, port int) string {
	return net.JoinHostPort(ip, strconv.Itoa(port))
}
