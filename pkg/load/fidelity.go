package load

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// FidelityConfig tunes the cache-credit signal. Zero fields take defaults.
type FidelityConfig struct {
	// Alpha is the EWMA weight of a new observation, in (0, 1]. Default
	// DefaultFidelityAlpha (0.1).
	Alpha float64
	// Floor is the lowest credit a replica can fall to, in [0, 1]. Default
	// DefaultFidelityFloor (0.25): a replica whose hits never materialise still keeps some cache
	// credit, so a recovering replica can earn it back.
	Floor float64
	// MinSamples is how many observations (with predicted hits) a replica
	// needs before its credit may fall below 1. Default
	// DefaultFidelityMinSamples (8).
	MinSamples int
}

func (c FidelityConfig) withDefaults() (FidelityConfig, error) {
	c.Alpha, c.Floor, c.MinSamples = c.defaulted()
	if errs := c.validate("alpha", "floor", "min_samples"); len(errs) > 0 {
		return c, fmt.Errorf("load: fidelity: %w", errors.Join(errs...))
	}
	return c, nil
}

// Fidelity compares, per replica, the prefix-cache hits the router predicted
// with those the engine reported serving, and turns persistent shortfalls
// into a reduced cache credit.
//
// For every finished request whose usage carried
// prompt_tokens_details.cached_tokens and whose predicted hit was positive:
//
//	sample = clamp(served / predicted, 0, 1)
//	ratio  = ratio + Alpha * (sample - ratio)      (ratio starts at 1)
//	credit = clamp(ratio, Floor, 1)                once MinSamples are seen, else 1
//
// Serving more than predicted is not rewarded beyond 1 (other routers or
// index lag explain it). Requests predicted to hit nothing say nothing about
// the index and leave the ratio alone. Credit is read lock-free; Observe
// serialises per replica.
type Fidelity struct {
	cfg      FidelityConfig
	replicas sync.Map // string -> *fidelityState, forgotten by Reset
	totals   sync.Map // string -> *cacheCounts, never forgotten (counters)
}

// CacheTotals are one replica's cumulative fidelity figures since the
// router started: the prompt tokens predicted to be, and reported, served
// from its prefix cache, over Observations finished requests. They are what
// the kvroute_cached_tokens_{predicted,served}_total and
// kvroute_fidelity_observations_total counters export.
type CacheTotals struct {
	Predicted, Served int64
	Observations      int64
}

type cacheCounts struct {
	predicted, served, observations atomic.Int64
}

type fidelityState struct {
	mu      sync.Mutex
	ratio   float64
	samples int
	credit  atomic.Uint64 // float64 bits
}

// NewFidelity builds a fidelity tracker and registers, unless reg is nil:
// kvroute_cached_tokens_predicted_total{replica},
// kvroute_cached_tokens_served_total{replica},
// kvroute_fidelity_observations_total{replica} and the gauge
// kvroute_replica_cache_credit{replica}.
func NewFidelity(cfg FidelityConfig, reg prometheus.Registerer) (*Fidelity, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	f := &Fidelity{cfg: cfg}
	if reg != nil {
		if err := reg.Register(newFidelityCollector(f)); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (f *Fidelity) state(replica string) *fidelityState {
	if s, ok := f.replicas.Load(replica); ok {
		return s.(*fidelityState)
	}
	s := &fidelityState{ratio: 1}
	s.credit.Store(math.Float64bits(1))
	v, _ := f.replicas.LoadOrStore(replica, s)
	return v.(*fidelityState)
}

// Observe records one finished request: predicted and served are prompt
// tokens expected from, and reported by, the replica's prefix cache.
// Negative values are taken as 0.
func (f *Fidelity) Observe(replica string, predicted, served int) {
	predicted, served = max(predicted, 0), max(served, 0)
	t := f.counts(replica)
	t.predicted.Add(int64(predicted))
	t.served.Add(int64(served))
	t.observations.Add(1)
	if predicted == 0 {
		return
	}
	s := f.state(replica)
	sample := min(float64(served)/float64(predicted), 1)
	s.mu.Lock()
	s.ratio += f.cfg.Alpha * (sample - s.ratio)
	s.samples++
	credit := 1.0
	if s.samples >= f.cfg.MinSamples {
		credit = min(max(s.ratio, f.cfg.Floor), 1)
	}
	s.credit.Store(math.Float64bits(credit))
	s.mu.Unlock()
}

// Credit returns replica's cache credit in [Floor, 1]; 1 for a replica
// without observations.
func (f *Fidelity) Credit(replica string) float64 {
	if f == nil {
		return 1
	}
	s, ok := f.replicas.Load(replica)
	if !ok {
		return 1
	}
	return math.Float64frombits(s.(*fidelityState).credit.Load())
}

func (f *Fidelity) counts(replica string) *cacheCounts {
	if t, ok := f.totals.Load(replica); ok {
		return t.(*cacheCounts)
	}
	t, _ := f.totals.LoadOrStore(replica, &cacheCounts{})
	return t.(*cacheCounts)
}

// Totals returns replica's cumulative figures (zero for a replica never
// observed, or a nil Fidelity). Reset does not clear them: they are
// counters.
func (f *Fidelity) Totals(replica string) CacheTotals {
	if f == nil {
		return CacheTotals{}
	}
	t, ok := f.totals.Load(replica)
	if !ok {
		return CacheTotals{}
	}
	c := t.(*cacheCounts)
	return CacheTotals{Predicted: c.predicted.Load(), Served: c.served.Load(), Observations: c.observations.Load()}
}

// Reset forgets replica's history (after its cache was cleared, or when it
// leaves the replica set): its credit returns to 1.
func (f *Fidelity) Reset(replica string) {
	f.replicas.Delete(replica)
}

// fidelityCollector exports the totals as counters and the credit as a
// gauge, read from the same state Totals and Credit read.
type fidelityCollector struct {
	f                                  *Fidelity
	predicted, served, observed, trust *prometheus.Desc
}

func newFidelityCollector(f *Fidelity) *fidelityCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"replica"}, nil)
	}
	return &fidelityCollector{
		f: f,
		predicted: d("kvroute_cached_tokens_predicted_total",
			"Prompt tokens the router predicted the replica would serve from its prefix cache (requests whose usage reported cached tokens)."),
		served: d("kvroute_cached_tokens_served_total",
			"Prompt tokens the replica reported serving from its prefix cache (usage.prompt_tokens_details.cached_tokens)."),
		observed: d("kvroute_fidelity_observations_total", "Finished requests compared for cache fidelity."),
		trust: d("kvroute_replica_cache_credit",
			"Cache credit in [0, 1] the router gives the replica's predicted hits (1 = full trust)."),
	}
}

func (c *fidelityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.predicted
	ch <- c.served
	ch <- c.observed
	ch <- c.trust
}

func (c *fidelityCollector) Collect(ch chan<- prometheus.Metric) {
	totals := map[string]CacheTotals{}
	c.f.totals.Range(func(k, _ any) bool {
		totals[k.(string)] = c.f.Totals(k.(string))
		return true
	})
	for _, r := range sortedKeys(totals) {
		t := totals[r]
		ch <- prometheus.MustNewConstMetric(c.predicted, prometheus.CounterValue, float64(t.Predicted), r)
		ch <- prometheus.MustNewConstMetric(c.served, prometheus.CounterValue, float64(t.Served), r)
		ch <- prometheus.MustNewConstMetric(c.observed, prometheus.CounterValue, float64(t.Observations), r)
	}
	credits := map[string]float64{}
	c.f.replicas.Range(func(k, v any) bool {
		credits[k.(string)] = math.Float64frombits(v.(*fidelityState).credit.Load())
		return true
	})
	for _, r := range sortedKeys(credits) {
		ch <- prometheus.MustNewConstMetric(c.trust, prometheus.GaugeValue, credits[r], r)
	}
}
