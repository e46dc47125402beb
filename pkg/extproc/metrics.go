package extproc

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	decisions  *prometheus.CounterVec
	decideDur  prometheus.Histogram
	tokenize   *prometheus.HistogramVec
	rejections *prometheus.CounterVec
	streamErrs *prometheus.CounterVec
	active     prometheus.Gauge
	slotWaits  prometheus.Counter
	flights    prometheus.Gauge
	unobserved prometheus.Counter
	observed   *prometheus.CounterVec
	detached   prometheus.Counter
	vouched    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_decisions_total",
			Help: "Routing decisions, by chosen replica, policy, policy reason and degradation (\"\" when cache affinity was used).",
		}, []string{"replica", "policy", "reason", "degraded"}),
		decideDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_decision_duration_seconds",
			Help:    "Wall time of one routing decision, tokenization included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		tokenize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_tokenize_duration_seconds",
			Help:    "Time spent obtaining the prompt's tokens, by token source.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"source"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_extproc_immediate_responses_total",
			Help: "Requests answered by the router itself instead of routed, by HTTP status and reason.",
		}, []string{"code", "reason"}),
		streamErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_extproc_stream_errors_total",
			Help: "ext_proc stream failures, by kind (recv, send, panic, protocol, ended: ended by EndStreams at a shutdown's drain deadline).",
		}, []string{"kind"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_extproc_streams_active",
			Help: "ext_proc streams currently open.",
		}),
		slotWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_extproc_decide_slot_timeouts_total",
			Help: "Large-body decisions that waited a quarter of the decision timeout for a routing.decide_concurrency slot and went ahead without one.",
		}),
		flights: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_extproc_requests_in_flight",
			Help: "Routed requests whose response has not ended (or, unobserved, whose observer wait has not passed).",
		}),
		unobserved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_extproc_unobserved_total",
			Help: "Routed requests whose response no stream of this process observed (no observer filter, or its stream went to another router replica); their load charge ended with the router stream or routing.observer_wait after the decision.",
		}),
		observed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_extproc_observer_streams_total",
			Help: "Observer (observability-mode) ext_proc streams, by outcome: claimed (a decision of this process), unknown (an id this process does not hold: another replica's, already claimed, expired or forged), no_id (no decision header).",
		}, []string{"outcome"}),
		detached: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_extproc_observed_to_first_token_total",
			Help: "Streamed responses observed only to their first token (not sampled for usage: routing.usage_sample_every); their end came from the router stream.",
		}),
		vouched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_decisions_vouched_total",
			Help: "Decisions whose pick was credited blocks its event view did not show: the view was known to miss stores, and the router had sent it the prompt's longest earlier prompt (route.ViewGaps).",
		}, []string{"replica"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.decideDur, m.tokenize, m.rejections, m.streamErrs, m.active, m.slotWaits, m.flights, m.unobserved, m.observed, m.detached, m.vouched} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) rejected(code int, reason string) {
	m.rejections.WithLabelValues(strconv.Itoa(code), reason).Inc()
}
