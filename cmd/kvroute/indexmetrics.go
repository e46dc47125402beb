package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/route"
)

// indexCollector exports the index's Stats as gauges at scrape time (the
// index itself keeps no metrics).
type indexCollector struct {
	idx                                            *index.Index
	keys, holders, engine, replicas, bytes, budget *prometheus.Desc
	evicted                                        *prometheus.Desc
}

func newIndexCollector(idx *index.Index) *indexCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &indexCollector{
		idx:      idx,
		keys:     d("kvroute_index_keys", "Distinct block keys in the prefix index."),
		holders:  d("kvroute_index_holders", "(block key, replica) entries in the prefix index."),
		engine:   d("kvroute_index_engine_hashes", "Engine block hash -> key mappings over all replicas."),
		replicas: d("kvroute_index_replicas", "Replicas holding at least one indexed block."),
		bytes:    d("kvroute_index_bytes", "Estimated memory held by the prefix index."),
		budget:   d("kvroute_index_budget_bytes", "Configured memory budget of the prefix index (0 = none)."),
		evicted:  d("kvroute_index_evicted_total", "Router-side key evictions under the memory budget."),
	}
}

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.keys, c.holders, c.engine, c.replicas, c.bytes, c.budget, c.evicted} {
		ch <- d
	}
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.idx.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	g(c.keys, float64(st.Keys))
	g(c.holders, float64(st.Holders))
	g(c.engine, float64(st.Engine))
	g(c.replicas, float64(st.Replicas))
	g(c.bytes, float64(st.Bytes))
	g(c.budget, float64(st.Budget))
	ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(st.Evicted))
}

// approxCollector exports the dispatch-learned index's stats at scrape time.
type approxCollector struct {
	x                               *route.ApproxIndex
	keys, entries, evicted, expired *prometheus.Desc
}

func newApproxCollector(x *route.ApproxIndex) *approxCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &approxCollector{
		x:       x,
		keys:    d("kvroute_approx_index_keys", "Distinct block keys in the dispatch-learned index (replicas without events)."),
		entries: d("kvroute_approx_index_entries", "(block key, replica) entries in the dispatch-learned index."),
		evicted: d("kvroute_approx_index_evicted_total", "Dispatch-learned entries evicted for routing.approximate.max_entries."),
		expired: d("kvroute_approx_index_expired_total", "Dispatch-learned entries dropped after routing.approximate.ttl."),
	}
}

func (c *approxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.keys, c.entries, c.evicted, c.expired} {
		ch <- d
	}
}

func (c *approxCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.x.Stats()
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(st.Evicted))
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(st.Expired))
}
