package main

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/engine"
)

// newMetrics registers vLLM's metric names on reg, read from the engine at
// scrape time. Labels follow vLLM: model_name and engine on the serving
// metrics; cache_config_info carries the cache configuration as labels.
func newMetrics(reg prometheus.Registerer, model string, cfg engine.Config, d *driver, pub *publisher) error {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	gauge := func(name, help string, f func(engine.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(d.stats()) })
	}
	counter := func(name, help string, f func(engine.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(d.stats()) })
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"engine":                "0",
			"block_size":            strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks":        strconv.Itoa(cfg.NumGPUBlocks),
			"num_cpu_blocks":        strconv.Itoa(cfg.NumCPUBlocks),
			"enable_prefix_caching": "True",
		},
	})
	info.Set(1)
	cs := []prometheus.Collector{
		info,
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
			func(s engine.Stats) float64 { return float64(s.Running) }),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
			func(s engine.Stats) float64 { return float64(s.Waiting) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
			func(s engine.Stats) float64 { return s.KVUsage }),
		counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
			func(s engine.Stats) float64 { return float64(s.PrefixQueries) }),
		counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
			func(s engine.Stats) float64 { return float64(s.PrefixHits) }),
		counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
			func(s engine.Stats) float64 { return float64(s.PromptTokens) }),
		counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
			func(s engine.Stats) float64 { return float64(s.GenerationTokens) }),
		counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
			func(s engine.Stats) float64 { return float64(s.Preemptions) }),
	}
	if pub != nil {
		batches := func(outcome string, f func() int64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "enginesim_kv_event_batches_total", Help: "KV event batches by outcome.",
				ConstLabels: prometheus.Labels{"outcome": outcome},
			}, func() float64 { return float64(f()) })
		}
		cs = append(cs,
			batches("sent", pub.sent.Load),
			batches("dropped_injected", pub.injected.Load),
			batches("dropped_queue_full", pub.queueFull.Load),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "enginesim_kv_event_replays_total", Help: "Replay requests served.",
			}, func() float64 { return float64(pub.replays.Load()) }),
		)
	}
	// Latencies are in simulated seconds: what the engine would report.
	buckets := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640}
	hist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	ttft := hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
	e2e := hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.")
	queued := hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.")
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	cs = append(cs, ttft, e2e, queued, success)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	d.onFinish = func(f engine.Finished) {
		ttft.Observe((f.FirstToken - f.Arrival).Seconds())
		e2e.Observe((f.Finish - f.Arrival).Seconds())
		queued.Observe((f.Scheduled - f.Arrival).Seconds())
		success.WithLabelValues(f.Reason).Inc()
	}
	return nil
}
