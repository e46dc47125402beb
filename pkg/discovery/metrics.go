package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one source's collectors, labelled with a constant
// source="<name>" so several sources share one registry.
type metrics struct {
	snapshots prometheus.Counter
	errors    prometheus.Counter
	replicas  *prometheus.GaugeVec
}

// newMetrics creates the collectors and registers them on reg (nil: the
// collectors work but are not exported).
func newMetrics(reg prometheus.Registerer, source string) (*metrics, error) {
	labels := prometheus.Labels{"source": source}
	m := &metrics{
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "kvroute_discovery_snapshots_total",
			Help:        "Replica-set snapshots published by a discovery source.",
			ConstLabels: labels,
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "kvroute_discovery_refresh_errors_total",
			Help:        "Failed refreshes of a discovery source (bad file reload, DNS failure); the last good set is kept.",
			ConstLabels: labels,
		}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "kvroute_discovery_replicas",
			Help:        "Replicas in the last snapshot by state (ready, not_ready), and endpoints left out as invalid.",
			ConstLabels: labels,
		}, []string{"state"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.snapshots, m.errors, m.replicas} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("discovery: source %q: register metrics: %w", source, err)
		}
	}
	return m, nil
}

// publisher sends snapshots for one source, skipping repeats, and keeps its
// metrics and state-change logs. It is owned by the Run goroutine.
type publisher struct {
	source  string
	log     *slog.Logger
	m       *metrics
	last    []Replica
	sent    bool
	invalid []string // IDs/addresses left out as invalid at the last build
}

// publish sends replicas (sorted by ID, owned by the callee from now on)
// unless they equal the last snapshot. It returns false when ctx ended
// before the receiver took it.
func (p *publisher) publish(ctx context.Context, updates chan<- Snapshot, replicas []Replica) bool {
	if p.sent && slices.EqualFunc(p.last, replicas, Replica.Equal) {
		return true
	}
	if replicas == nil {
		replicas = []Replica{}
	}
	select {
	case updates <- Snapshot{Source: p.source, Replicas: replicas}:
	case <-ctx.Done():
		return false
	}
	ready := countReady(replicas)
	c := Diff(p.last, replicas)
	p.log.Info("discovery: replica set changed", "source", p.source,
		"replicas", len(replicas), "ready", ready,
		"added", len(c.Added), "removed", len(c.Removed), "changed", len(c.Changed))
	p.m.snapshots.Inc()
	p.m.replicas.WithLabelValues("ready").Set(float64(ready))
	p.m.replicas.WithLabelValues("not_ready").Set(float64(len(replicas) - ready))
	p.last, p.sent = replicas, true
	return true
}

// setInvalid records the endpoints a build left out, logging when the set
// changes (not on every rebuild).
func (p *publisher) setInvalid(invalid []string, errs []error) {
	slices.Sort(invalid)
	p.m.replicas.WithLabelValues("invalid").Set(float64(len(invalid)))
	if slices.Equal(invalid, p.invalid) {
		return
	}
	p.invalid = invalid
	if len(invalid) == 0 {
		p.log.Info("discovery: no invalid endpoints left", "source", p.source)
		return
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = strings.ReplaceAll(e.Error(), "\n", "; ")
	}
	p.log.Warn("discovery: endpoints left out as invalid", "source", p.source,
		"count", len(invalid), "errors", msgs)
}

func countReady(rs []Replica) int {
	n := 0
	for _, r := range rs {
		if r.Ready {
			n++
		}
	}
	return n
}

func loggerOr(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
