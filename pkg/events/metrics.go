package events

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Manager's Prometheus collectors, all prefixed
// kvroute_events_ and labelled by replica (workers for the queue gauge).
type metrics struct {
	batches       *prometheus.CounterVec
	events        *prometheus.CounterVec
	decodeErrors  *prometheus.CounterVec
	gaps          *prometheus.CounterVec
	replays       *prometheus.CounterVec
	resyncs       *prometheus.CounterVec
	unknownParent *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	overflows     *prometheus.CounterVec
	sizeMismatch  *prometheus.CounterVec
	unknownKind   *prometheus.CounterVec
	groupHeld     *prometheus.CounterVec
	engineBlock   *prometheus.GaugeVec
	queueDepth    *prometheus.GaugeVec
	lag           *prometheus.GaugeVec
	resyncing     *prometheus.GaugeVec
	silent        *prometheus.GaugeVec
	degraded      *prometheus.GaugeVec
	replayed      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "kvroute", "events"
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels))
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels))
	}
	m := &metrics{
		batches:       counter("batches_total", "Event batches applied.", "replica"),
		events:        counter("events_total", "Events applied, by type (BlockStored, BlockRemoved, AllBlocksCleared, unknown).", "replica", "type"),
		decodeErrors:  counter("decode_errors_total", "Messages or events that could not be decoded, by reason (frames, replay_frames, truncated, too_long, not_batch, bad_value, invalid_event, dp_rank_mismatch, panic). A dp_rank_mismatch batch is still applied.", "replica", "reason"),
		gaps:          counter("gaps_total", "Sequence gaps detected on the live stream (one per gap, not per missing batch).", "replica"),
		replays:       counter("replays_total", "Replay requests, by result (ok, truncated, failed).", "replica", "result"),
		resyncs:       counter("resyncs_total", "Times the replica's view was cleared and relearned, by reason.", "replica", "reason"),
		unknownParent: counter("unknown_parent_blocks_total", "Blocks of BlockStored events whose parent hash was unknown, not indexed.", "replica"),
		skipped:       counter("skipped_total", "Events or keys not applied, by reason (bad_shape, unknown_medium, other_group: stores and removals of partial-attention KV-cache groups, unknown_key, no_slot).", "replica", "reason"),
		overflows:     counter("queue_overflows_total", "Live batches that found the worker queue full (each triggers a resync).", "replica"),
		sizeMismatch:  counter("block_size_mismatch_total", "BlockStored events whose block size differs from the replica's configured block size (indexed as given, except group-tagged events, which are skipped).", "replica"),
		unknownKind:   counter("unknown_spec_kind_total", "Events of a KV-cache group whose kv_cache_spec_kind this router does not know; presumed full attention and applied.", "replica"),
		groupHeld:     counter("group_held_total", "Block removals of one KV-cache group not applied to the index because another group still holds the block.", "replica"),
		degraded:      gauge("degraded", "1 when the replica's warm-up ended without a complete view (engine unreachable, replay truncated or failed, no replay endpoint): cache credit 0 until it catches up; Manager.Readiness says why.", "replica"),
		replayed:      counter("replayed_batches_total", "Batches applied from replay replies (warm-up and gap catch-ups).", "replica"),
		engineBlock:   gauge("engine_block_size", "Block size (SGLang: page size) of the replica's last BlockStored event, in tokens.", "replica"),
		queueDepth:    gauge("queue_depth", "Items waiting in a worker queue.", "worker"),
		lag:           gauge("lag_seconds", "Now minus the timestamp of the last applied batch.", "replica"),
		resyncing:     gauge("resyncing", "1 while the replica's view is incomplete and its cache credit withheld.", "replica"),
		silent:        gauge("silent", "1 when requests were routed to the replica but it published no event for the silence window.", "replica"),
	}
	return m
}

// register registers c with reg (if any). When an equal collector is
// already registered (a second Manager on the same registry), the existing
// one is shared.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if e, ok := are.ExistingCollector.(T); ok {
				return e
			}
		}
	}
	return c
}

// replicaMetrics are one replica's pre-bound collectors, so that the hot
// path does no label lookups.
type replicaMetrics struct {
	batches                        prometheus.Counter
	stored, removed, cleared, unkn prometheus.Counter
	unknownParent                  prometheus.Counter
	badShape, unknownMedium, group prometheus.Counter
	sizeMismatch                   prometheus.Counter
	unknownKind, groupHeld         prometheus.Counter
	engineBlock                    prometheus.Gauge
	overflows                      prometheus.Counter
	gaps                           prometheus.Counter
	lag                            prometheus.Gauge
	resyncing, silent, degraded    prometheus.Gauge
	replayed                       prometheus.Counter
}

func (m *metrics) forReplica(id string) *replicaMetrics {
	return &replicaMetrics{
		batches:       m.batches.WithLabelValues(id),
		stored:        m.events.WithLabelValues(id, EventBlockStored.String()),
		removed:       m.events.WithLabelValues(id, EventBlockRemoved.String()),
		cleared:       m.events.WithLabelValues(id, EventAllBlocksCleared.String()),
		unkn:          m.events.WithLabelValues(id, "unknown"),
		unknownParent: m.unknownParent.WithLabelValues(id),
		badShape:      m.skipped.WithLabelValues(id, "bad_shape"),
		unknownMedium: m.skipped.WithLabelValues(id, "unknown_medium"),
		group:         m.skipped.WithLabelValues(id, "other_group"),
		sizeMismatch:  m.sizeMismatch.WithLabelValues(id),
		unknownKind:   m.unknownKind.WithLabelValues(id),
		groupHeld:     m.groupHeld.WithLabelValues(id),
		engineBlock:   m.engineBlock.WithLabelValues(id),
		overflows:     m.overflows.WithLabelValues(id),
		gaps:          m.gaps.WithLabelValues(id),
		lag:           m.lag.WithLabelValues(id),
		resyncing:     m.resyncing.WithLabelValues(id),
		silent:        m.silent.WithLabelValues(id),
		degraded:      m.degraded.WithLabelValues(id),
		replayed:      m.replayed.WithLabelValues(id),
	}
}

// forget drops a removed replica's series.
func (m *metrics) forget(id string) {
	l := prometheus.Labels{"replica": id}
	for _, v := range []*prometheus.CounterVec{m.batches, m.events, m.decodeErrors, m.gaps, m.replays, m.resyncs,
		m.unknownParent, m.skipped, m.overflows, m.sizeMismatch, m.unknownKind, m.groupHeld, m.replayed} {
		v.DeletePartialMatch(l)
	}
	for _, v := range []*prometheus.GaugeVec{m.lag, m.resyncing, m.silent, m.engineBlock, m.degraded} {
		v.DeletePartialMatch(l)
	}
}

func workerLabel(i int) string { return strconv.Itoa(i) }
