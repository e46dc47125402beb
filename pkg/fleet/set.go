package fleet

import (
	"net/url"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

// Loads is the load view the Set reads (load.View).
type Loads interface {
	Load(replica string) load.Load
}

// Creditor is the events manager's credit for a stream's index view
// (events.Manager).
type Creditor interface {
	Credit(id index.ReplicaID) float64
}

// Gaps is an optional interface of a Creditor: whether a stream's view is
// known to miss blocks its engine holds (events.Manager.ViewGaps).
type Gaps interface {
	ViewGaps(id index.ReplicaID) bool
}

var (
	_ Gaps             = (*events.Manager)(nil)
	_ route.ViewGaps   = (*Set)(nil)
	_ route.EventFeeds = (*Set)(nil)
)

// Fidelity is the served-vs-predicted cache credit per stream, its reset
// when a replica leaves, and the cumulative totals (load.Fidelity).
type Fidelity interface {
	Credit(replica string) float64
	Reset(replica string)
	Totals(replica string) load.CacheTotals
}

// SetConfig wires a Set.
type SetConfig struct {
	// Loads gives each replica's load and health. Required.
	Loads Loads
	// Events gives each stream's credit. Required.
	Events Creditor
	// Fidelity, if set, caps the credit by served-vs-predicted hits.
	Fidelity Fidelity
	// BlockSize is the default KV block size for replicas that do not set
	// theirs.
	BlockSize int
	// Models, if set, adds the LoRA adapters each replica lists in its
	// /v1/models to those its spec names; the Controller keeps its targets
	// equal to the replica set and republishes the set when they change.
	Models *Models
}

// member is one routable stream: a replica, or one data-parallel rank of it.
type member struct {
	replica discovery.Replica
	rank    int
}

// snapshot is one immutable replica set, swapped whole.
type snapshot struct {
	all      []discovery.Replica // every known replica, ready or not, sorted by ID
	routable []route.Replica     // ready replicas, one entry per DP rank
	byID     map[index.ReplicaID]member
}

// Set implements route.State over discovery snapshots, the load view, the
// event streams' credit and cache fidelity. Readers never block: the set is
// an atomic pointer swapped whole by the Controller.
//
// Membership: a replica that is not Ready is not in the routable set (its
// event stream and index entries are kept). An unhealthy replica stays in
// the set with Load.Healthy false, so decisions (and explain) show it as
// ineligible.
//
// Trust is min(events credit, fidelity credit). A replica without an
// events endpoint has no engine cache view at all: credit 0 for the
// event-fed index; the router matches it against its dispatch-learned index
// instead (EventFed), with that index's own credit.
type Set struct {
	snap atomic.Pointer[snapshot]
	cfg  SetConfig
	// lookahead is each stream's lookahead as its events report it
	// (events.ReplicaStatus.Lookahead); written, like the snapshot, only by
	// the Controller's goroutine.
	lookahead map[index.ReplicaID]int
}

var (
	_ route.State      = (*Set)(nil)
	_ route.EventFeeds = (*Set)(nil)
)

// NewSet returns an empty set.
func NewSet(cfg SetConfig) *Set {
	s := &Set{cfg: cfg}
	s.snap.Store(&snapshot{byID: map[index.ReplicaID]member{}})
	return s
}

// set publishes a new replica set (sorted by ID, as snapshots are).
func (s *Set) set(rs []discovery.Replica) {
	n := &snapshot{
		all:  rs,
		byID: make(map[index.ReplicaID]member, len(rs)),
	}
	for _, r := range rs {
		for rank := range max(r.DPRanks, 1) {
			id := events.DPReplicaID(index.ReplicaID(r.ID), rank)
			n.byID[id] = member{replica: r, rank: rank}
			if !r.Ready {
				continue
			}
			n.routable = append(n.routable, route.Replica{
				ID: id, Address: r.Address, Model: r.Model, BlockSize: s.blockSizeOf(r),
				Adapters: s.adaptersOf(r), Lookahead: s.lookahead[id],
			})
		}
	}
	s.snap.Store(n)
}

// adaptersOf is the union of the adapters r's spec lists and those its
// engine reports (sorted, distinct; nil when none).
func (s *Set) adaptersOf(r discovery.Replica) []string {
	var probed []string
	if s.cfg.Models != nil {
		probed = s.cfg.Models.Adapters(r.ID)
	}
	if len(probed) == 0 {
		return r.LoRAAdapters
	}
	if len(r.LoRAAdapters) == 0 {
		return probed
	}
	out := slices.Concat(r.LoRAAdapters, probed)
	slices.Sort(out)
	return slices.Compact(out)
}

func (s *Set) blockSizeOf(r discovery.Replica) int {
	if r.BlockSize > 0 {
		return r.BlockSize
	}
	return s.cfg.BlockSize
}

// Replicas implements route.State: the ready replicas, one entry per
// data-parallel rank.
func (s *Set) Replicas() []route.Replica { return s.snap.Load().routable }

// All returns every known replica, ready or not, sorted by ID.
func (s *Set) All() []discovery.Replica { return s.snap.Load().all }

// Load implements route.State. Ranks above 0 share their replica's health
// (the engine is probed once, on its HTTP address).
func (s *Set) Load(id index.ReplicaID) load.Load {
	l := s.cfg.Loads.Load(string(id))
	if base, rank := events.SplitDPReplicaID(id); rank > 0 {
		l.Healthy = s.cfg.Loads.Load(string(base)).Healthy
	}
	return l
}

// Trust implements route.State.
func (s *Set) Trust(id index.ReplicaID) float64 {
	m, ok := s.snap.Load().byID[id]
	if !ok || m.replica.EventsEndpoint == "" {
		return 0
	}
	c := s.cfg.Events.Credit(id)
	if s.cfg.Fidelity != nil {
		c = min(c, s.cfg.Fidelity.Credit(string(id)))
	}
	return c
}

// ViewGaps implements route.ViewGaps: the stream's view is known to miss
// blocks its engine holds (events.Manager.ViewGaps), when the events side
// reports it (Gaps).
func (s *Set) ViewGaps(id index.ReplicaID) bool {
	g, ok := s.cfg.Events.(Gaps)
	return ok && g.ViewGaps(id)
}

// EventFed implements route.EventFeeds: whether the stream's replica has an
// events endpoint. Replicas without one are matched against the router's
// dispatch-learned index instead (route.Options.Approx).
func (s *Set) EventFed(id index.ReplicaID) bool {
	m, ok := s.snap.Load().byID[id]
	return ok && m.replica.EventsEndpoint != ""
}

// BlockSize returns a stream's block size (0 when unknown).
func (s *Set) BlockSize(id index.ReplicaID) int {
	m, ok := s.snap.Load().byID[id]
	if !ok {
		return 0
	}
	return s.blockSizeOf(m.replica)
}

// Addresses returns the addresses (ip:port) of the ready replicas serving
// model, as their base model or a LoRA adapter, each once (data-parallel
// ranks share theirs); every ready replica's when model is "". It is where
// a stored response of the Responses API is looked for (respstore): a
// superset of the replicas route.Decide would pick among (it takes a
// model's base-model replicas before its adapter's, and the proxy's
// subset), so a holder found outside those has its pin dropped there
// (Decision.Pin ""), the request routed as any other.
func (s *Set) Addresses(model string) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range s.snap.Load().routable {
		if (model != "" && r.Model != model && !slices.Contains(r.Adapters, model)) || seen[r.Address] {
			continue
		}
		seen[r.Address] = true
		out = append(out, r.Address)
	}
	return out
}

// TokenizerURLs returns the base URLs of ready, healthy replicas serving
// model, for the remote tokenizer; when none is healthy, every ready one.
func (s *Set) TokenizerURLs(model string) []string {
	snap := s.snap.Load()
	var healthy, all []string
	for _, r := range snap.all {
		if !r.Ready || r.Model != model {
			continue
		}
		u := "http://" + r.Address
		all = append(all, u)
		if s.cfg.Loads.Load(r.ID).Healthy {
			healthy = append(healthy, u)
		}
	}
	if len(healthy) == 0 {
		return all
	}
	return healthy
}

// scrapeTarget derives the scraper's base URL for a replica: its metrics
// URL without the /metrics path when it has that form, else its address.
func scrapeTarget(r discovery.Replica) load.Target {
	base := "http://" + r.Address
	if u, err := url.Parse(r.MetricsURL); err == nil && u.Host != "" && strings.TrimSuffix(u.Path, "/") == "/metrics" {
		base = u.Scheme + "://" + u.Host
	}
	return load.Target{ID: r.ID, URL: base}
}

// eventSources expands replicas with an events endpoint into one source per
// data-parallel rank.
func eventSources(rs []discovery.Replica, blockSize func(discovery.Replica) int) ([]events.Source, []error) {
	var out []events.Source
	var errs []error
	for _, r := range rs {
		if r.EventsEndpoint == "" {
			continue
		}
		srcs, err := events.DPSources(events.Source{
			ID:             index.ReplicaID(r.ID),
			Model:          r.Model,
			Endpoint:       r.EventsEndpoint,
			ReplayEndpoint: r.ReplayEndpoint,
			Topic:          r.Topic,
			Engine:         r.Engine,
			BlockSize:      blockSize(r),
			GroupKinds:     strings.Join(r.GroupKinds, ","),
		}, max(r.DPRanks, 1))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, srcs...)
	}
	return out, errs
}
