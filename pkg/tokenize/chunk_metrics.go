package tokenize

import "github.com/prometheus/client_golang/prometheus"

// chunkCollector exports each local tokenizer's caches, per model: the
// chunk cache and the conversation memo (the multi-turn reuse caches) and
// the chat template's tools cache: hits, misses and bytes held.
type chunkCollector struct {
	t                   *Tokenizer
	hits, misses, bytes *prometheus.Desc
	// The conversation memo (conv.go).
	convHits, convMisses, convReused, convBytes *prometheus.Desc
	// The tools cache (tools.go).
	toolsHits, toolsMisses, toolsBytes *prometheus.Desc
}

func newChunkCollector(t *Tokenizer) *chunkCollector {
	return &chunkCollector{
		t: t,
		hits: prometheus.NewDesc("kvroute_tokenizer_chunk_cache_hits_total",
			"Text chunks the local tokenizer took from its chunk cache instead of encoding them (multi-turn reuse), by model.", []string{"model"}, nil),
		misses: prometheus.NewDesc("kvroute_tokenizer_chunk_cache_misses_total",
			"Text chunks the local tokenizer encoded and stored in its chunk cache, by model.", []string{"model"}, nil),
		bytes: prometheus.NewDesc("kvroute_tokenizer_chunk_cache_bytes",
			"Bytes the local tokenizer's chunk cache holds (bounded by prefix_cache_bytes), by model.", []string{"model"}, nil),
		convHits: prometheus.NewDesc("kvroute_tokenizer_conversation_hits_total",
			"Large chat requests whose previous turn the local tokenizer's conversation memo held, by model.", []string{"model"}, nil),
		convMisses: prometheus.NewDesc("kvroute_tokenizer_conversation_misses_total",
			"Large chat requests with no previous turn in the conversation memo, by model.", []string{"model"}, nil),
		convReused: prometheus.NewDesc("kvroute_tokenizer_conversation_reused_tokens_total",
			"Token ids taken from a previous turn instead of being encoded, by model.", []string{"model"}, nil),
		convBytes: prometheus.NewDesc("kvroute_tokenizer_conversation_bytes",
			"Bytes the conversation memo holds (bounded by prefix_cache_bytes), by model.", []string{"model"}, nil),
		toolsHits: prometheus.NewDesc("kvroute_tokenizer_tools_cache_hits_total",
			"Chat requests whose tools list (2 KiB of JSON or more) the chat template's tools cache held decoded, by model.", []string{"model"}, nil),
		toolsMisses: prometheus.NewDesc("kvroute_tokenizer_tools_cache_misses_total",
			"Chat requests whose tools list (2 KiB of JSON or more) was decoded and stored in the tools cache, by model.", []string{"model"}, nil),
		toolsBytes: prometheus.NewDesc("kvroute_tokenizer_tools_cache_bytes",
			"Raw tools JSON bytes the tools cache holds decoded (bounded at 1 MiB a model), by model.", []string{"model"}, nil),
	}
}

func (c *chunkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hits
	ch <- c.misses
	ch <- c.bytes
	ch <- c.convHits
	ch <- c.convMisses
	ch <- c.convReused
	ch <- c.convBytes
	ch <- c.toolsHits
	ch <- c.toolsMisses
	ch <- c.toolsBytes
}

func (c *chunkCollector) Collect(ch chan<- prometheus.Metric) {
	for name, l := range c.t.locals() {
		if l.cache != nil {
			hits, misses, bytes := l.cache.stats()
			ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(hits), name)
			ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, float64(misses), name)
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(bytes), name)
		}
		if l.conv != nil {
			hits, misses, reused, bytes := l.conv.stats()
			ch <- prometheus.MustNewConstMetric(c.convHits, prometheus.CounterValue, float64(hits), name)
			ch <- prometheus.MustNewConstMetric(c.convMisses, prometheus.CounterValue, float64(misses), name)
			ch <- prometheus.MustNewConstMetric(c.convReused, prometheus.CounterValue, float64(reused), name)
			ch <- prometheus.MustNewConstMetric(c.convBytes, prometheus.GaugeValue, float64(bytes), name)
		}
		if l.tmpl != nil {
			hits, misses, bytes := l.tmpl.toolsCache.stats()
			ch <- prometheus.MustNewConstMetric(c.toolsHits, prometheus.CounterValue, float64(hits), name)
			ch <- prometheus.MustNewConstMetric(c.toolsMisses, prometheus.CounterValue, float64(misses), name)
			ch <- prometheus.MustNewConstMetric(c.toolsBytes, prometheus.GaugeValue, float64(bytes), name)
		}
	}
}

// locals returns every model's local tokenizer in service (configured, or
// found by the auto kind and loaded), by model.
func (t *Tokenizer) locals() map[string]*Local {
	out := map[string]*Local{}
	add := func(name string, m *modelTokenizer) {
		if m.local != nil {
			out[name] = m.local
		} else if l := m.found.Load(); l != nil {
			out[name] = l
		}
	}
	for name, m := range t.models {
		add(name, m)
	}
	if t.defaults != nil {
		t.defaults.mu.Lock()
		for name, m := range t.defaults.m {
			add(name, m)
		}
		t.defaults.mu.Unlock()
	}
	return out
}
