package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

// Streams is what the Controller drives and reads of the event subscribers
// (events.Manager).
type Streams interface {
	Creditor
	// SetSources replaces the subscribed streams.
	SetSources(srcs []events.Source) error
	// Warm reports whether every subscribed stream has caught up or settled.
	Warm() bool
	// Readiness is Warm with the detail: which streams are degraded, why.
	Readiness() events.Readiness
	// Status is one stream's state (zero when not subscribed).
	Status(id index.ReplicaID) events.ReplicaStatus
}

// Clearer drops every block a stream holds (index.Index).
type Clearer interface {
	Cleared(id index.ReplicaID)
}

// Prober is the health and metrics scraper (load.Scraper).
type Prober interface {
	SetTargets(targets []load.Target)
	Get(replica string) (load.Scraped, bool)
}

// Readiness receives the router's readiness (extproc.Health).
type Readiness interface {
	SetReady(ready bool)
}

// DefaultTick is how often the Controller rechecks health-gated
// subscriptions and readiness between snapshots.
const DefaultTick = 100 * time.Millisecond

// ControllerConfig wires a Controller. Set, Streams, Index and Probes are
// required.
type ControllerConfig struct {
	Set     *Set
	Streams Streams
	Index   Clearer
	Probes  Prober
	// Readiness, if set, is told when the router turns ready.
	Readiness Readiness
	// WarmTimeout: ready at the latest this long after Run starts, warm or
	// not.
	WarmTimeout time.Duration
	// Tick between rechecks; 0 means DefaultTick.
	Tick time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// Controller applies discovery snapshots to the Set, the scraper, the event
// subscriptions and the index, and decides readiness. See the package doc.
type Controller struct {
	cfg ControllerConfig
	log *slog.Logger

	applied atomic.Bool // a first snapshot was applied
	ready   atomic.Bool
	mu      sync.Mutex // serialises turning ready with Shutdown
	stopped bool       // guarded by mu

	// Owned by the Run goroutine.
	prev      []discovery.Replica
	srcs      []events.Source
	modelsVer uint64 // the Set.cfg.Models version the routable set reflects
}

// NewController checks cfg and returns a Controller. It starts nothing.
func NewController(cfg ControllerConfig) (*Controller, error) {
	var errs []error
	if cfg.Set == nil {
		errs = append(errs, errors.New("fleet: Set is required"))
	}
	if cfg.Streams == nil {
		errs = append(errs, errors.New("fleet: Streams is required"))
	}
	if cfg.Index == nil {
		errs = append(errs, errors.New("fleet: Index is required"))
	}
	if cfg.Probes == nil {
		errs = append(errs, errors.New("fleet: Probes is required"))
	}
	if cfg.WarmTimeout < 0 {
		errs = append(errs, errors.New("fleet: WarmTimeout must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, log: log}, nil
}

// Run applies snapshots from updates and rechecks subscriptions and
// readiness every Tick, until ctx ends. It is the Controller's only
// goroutine; call it once.
func (c *Controller) Run(ctx context.Context, updates <-chan discovery.Snapshot) error {
	start := c.cfg.Now()
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case snap := <-updates:
			c.apply(snap)
		case <-t.C:
			c.syncAdapters()
			c.syncLookahead()
		}
		c.syncSources()
		c.checkReady(start)
	}
}

// Ready reports whether the router is ready to route.
func (c *Controller) Ready() bool { return c.ready.Load() }

// Shutdown turns readiness off for good (the sink is told by its owner).
func (c *Controller) Shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.ready.Store(false)
}

// apply makes one discovery snapshot current: scrape targets, the
// routable set, and index entries of removed replicas. Event sources follow
// in syncSources.
func (c *Controller) apply(snap discovery.Snapshot) {
	rs := snap.Replicas
	changes := discovery.Diff(c.prev, rs)
	targets := make([]load.Target, 0, len(rs))
	for _, rep := range rs {
		targets = append(targets, scrapeTarget(rep))
	}
	c.cfg.Probes.SetTargets(targets)
	if m := c.cfg.Set.cfg.Models; m != nil {
		mts := make([]ModelsTarget, 0, len(rs))
		for _, rep := range rs {
			mts = append(mts, ModelsTarget{ID: rep.ID, URL: "http://" + rep.Address + "/v1/models"})
		}
		m.SetTargets(mts)
		c.modelsVer = m.Version()
	}
	c.cfg.Set.set(rs)
	for _, rep := range changes.Removed {
		for rank := range max(rep.DPRanks, 1) {
			id := events.DPReplicaID(index.ReplicaID(rep.ID), rank)
			c.cfg.Index.Cleared(id)
			if f := c.cfg.Set.cfg.Fidelity; f != nil {
				f.Reset(string(id)) // fidelity is per stream, like the index
			}
		}
	}
	c.prev = rs
	if !changes.Empty() || !c.applied.Load() {
		c.log.Info("replica set", slog.String("source", snap.Source), slog.Int("replicas", len(rs)),
			slog.Int("added", len(changes.Added)), slog.Int("removed", len(changes.Removed)),
			slog.Int("changed", len(changes.Changed)))
	}
	c.applied.Store(true)
}

// syncAdapters republishes the replica set when the adapters learned from
// the engines' model lists changed.
func (c *Controller) syncAdapters() {
	m := c.cfg.Set.cfg.Models
	if m == nil || !c.applied.Load() {
		return
	}
	if v := m.Version(); v != c.modelsVer {
		c.modelsVer = v
		c.cfg.Set.set(c.prev)
	}
}

// syncLookahead republishes the replica set when a subscribed stream's
// lookahead (the tokens after each block its engine hashes, reported by its
// events) changed, so requests for it are keyed the same way.
func (c *Controller) syncLookahead() {
	var la map[index.ReplicaID]int
	for _, src := range c.srcs {
		if n := c.cfg.Streams.Status(src.ID).Lookahead; n > 0 {
			if la == nil {
				la = map[index.ReplicaID]int{}
			}
			la[src.ID] = n
		}
	}
	if maps.Equal(la, c.cfg.Set.lookahead) {
		return
	}
	c.cfg.Set.lookahead = la
	c.cfg.Set.set(c.prev)
	c.log.Info("stream lookahead", slog.Any("lookahead", la))
}

// syncSources subscribes to the event streams of the replicas that are in
// the set and pass their health probes. A replica that fails them (a dead
// or restarting engine) loses its subscription, and with it its index
// entries: its cache is gone or unknowable. When it passes again it is
// resubscribed and relearned from its replay buffer (credit 0 until then).
func (c *Controller) syncSources() {
	var healthy []discovery.Replica
	for _, rep := range c.prev {
		if rep.EventsEndpoint != "" && c.cfg.Set.cfg.Loads.Load(rep.ID).Healthy {
			healthy = append(healthy, rep)
		}
	}
	srcs, errs := eventSources(healthy, c.cfg.Set.blockSizeOf)
	if slices.Equal(srcs, c.srcs) {
		return
	}
	for _, err := range errs {
		c.log.Warn("replica event source skipped", slog.Any("error", err))
	}
	if err := c.cfg.Streams.SetSources(srcs); err != nil {
		c.log.Error("setting event sources", slog.Any("error", err))
		return
	}
	// Streams that left the set lose their index entries (the events
	// manager clears them too; this also covers a source it never ran).
	now := make(map[index.ReplicaID]bool, len(srcs))
	for _, s := range srcs {
		now[s.ID] = true
	}
	for _, s := range c.srcs {
		if !now[s.ID] {
			c.cfg.Index.Cleared(s.ID)
		}
	}
	c.log.Info("event streams", slog.Int("subscribed", len(srcs)))
	c.srcs = srcs
}

// checkReady turns ready once the first replica set is applied, every
// replica has been probed once, and every subscribed event stream has
// warmed up; or once WarmTimeout has passed since start. It stays ready
// until Shutdown.
func (c *Controller) checkReady(start time.Time) {
	if c.ready.Load() || !c.applied.Load() {
		return
	}
	probed := true
	for _, rep := range c.prev {
		if s, ok := c.cfg.Probes.Get(rep.ID); !ok || s.ProbedAt.IsZero() {
			probed = false
			break
		}
	}
	warm := probed && c.cfg.Streams.Warm()
	after := c.cfg.Now().Sub(start)
	if !warm && after < c.cfg.WarmTimeout {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.ready.Store(true)
	if c.cfg.Readiness != nil {
		c.cfg.Readiness.SetReady(true)
	}
	attrs := []any{slog.Bool("events_warm", warm), slog.Duration("after", after)}
	if !warm {
		var cold []string
		for _, d := range c.cfg.Streams.Readiness().Degraded {
			cold = append(cold, string(d.ID)+" "+d.Reason)
		}
		attrs = append(attrs, slog.Any("degraded", cold))
	}
	c.log.Info("ready", attrs...)
}

// ReadyStatus is the detail behind Ready, as /readyz shows it.
type ReadyStatus struct {
	Ready bool
	// Applied: a first discovery snapshot was applied.
	Applied bool
	// Replicas known, and how many of them were probed at least once.
	Replicas, Probed int
	// Events is the event streams' side (events.Manager.Readiness).
	Events events.Readiness
}

// ReadyStatus reports readiness with its detail. Safe for concurrent use.
func (c *Controller) ReadyStatus() ReadyStatus {
	st := ReadyStatus{Ready: c.ready.Load(), Applied: c.applied.Load(), Events: c.cfg.Streams.Readiness()}
	for _, rep := range c.cfg.Set.All() {
		st.Replicas++
		if s, ok := c.cfg.Probes.Get(rep.ID); ok && !s.ProbedAt.IsZero() {
			st.Probed++
		}
	}
	return st
}

// String renders the status as /readyz's body: a first line "ready" or
// "not ready", then one line per part and one per degraded stream.
func (s ReadyStatus) String() string {
	var b strings.Builder
	if s.Ready {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready\n")
	}
	if !s.Applied {
		b.WriteString("replicas: no discovery snapshot yet\n")
	} else {
		fmt.Fprintf(&b, "replicas: %d (%d probed)\n", s.Replicas, s.Probed)
	}
	fmt.Fprintf(&b, "event streams: %d (%d caught up, warm: %t)\n", s.Events.Sources, s.Events.CaughtUp, s.Events.Warm)
	for _, d := range s.Events.Degraded {
		fmt.Fprintf(&b, "degraded: %s %s\n", d.ID, d.Reason)
	}
	return b.String()
}

// Member is one stream of the replica set as the admin API lists it.
type Member struct {
	// ID is the stream's ID: the replica's, or "<id>#dp<rank>".
	ID index.ReplicaID
	// Replica is the discovered replica the stream belongs to.
	Replica discovery.Replica
	// Load and Trust are what routing sees (Set.Load, Set.Trust).
	Load  load.Load
	Trust float64
	// Stream is the event stream's state (zero when not subscribed).
	Stream events.ReplicaStatus
	// Cache is the stream's cumulative predicted vs served cached tokens
	// (zero without a Fidelity).
	Cache load.CacheTotals
}

// Members lists every known replica, ready or not, one entry per
// data-parallel rank, sorted by replica ID.
func (c *Controller) Members() []Member {
	s := c.cfg.Set
	var out []Member
	for _, rep := range s.All() {
		for rank := range max(rep.DPRanks, 1) {
			id := events.DPReplicaID(index.ReplicaID(rep.ID), rank)
			m := Member{
				ID: id, Replica: rep, Load: s.Load(id), Trust: s.Trust(id),
				Stream: c.cfg.Streams.Status(id),
			}
			if f := s.cfg.Fidelity; f != nil {
				m.Cache = f.Totals(string(id))
			}
			out = append(out, m)
		}
	}
	return out
}
