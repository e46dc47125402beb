package bench

import (
	"math"
	"slices"
	"time"
)

// Summary is a run's headline figures. Times are in seconds.
type Summary struct {
	Policy   string `json:"policy"`
	Workload string `json:"workload"`
	Requests int    `json:"requests"`

	TTFTMean float64 `json:"ttft_mean_s"`
	TTFTP50  float64 `json:"ttft_p50_s"`
	TTFTP90  float64 `json:"ttft_p90_s"`
	TTFTP99  float64 `json:"ttft_p99_s"`
	E2EP50   float64 `json:"e2e_p50_s"`
	E2EP99   float64 `json:"e2e_p99_s"`
	// Throughput is output tokens per second of makespan.
	Throughput float64 `json:"throughput_tok_s"`
	// HitRate is the token-weighted prefix-cache hit rate the engines
	// reported (cached over prompt tokens); Ceiling is the same for one
	// infinite cache holding every block any replica had computed by the
	// time each request was first scheduled (RequestResult.CeilingTokens):
	// a perfect router's hit rate on the run's timing.
	HitRate float64 `json:"hit_rate"`
	Ceiling float64 `json:"ceiling"`
	// HitOverCeiling is HitRate / Ceiling; 1 when the ceiling is 0 (there
	// was nothing to hit, so nothing was missed).
	HitOverCeiling float64 `json:"hit_over_ceiling"`
	// PredictedHitRate is what the router's index predicted on the picks.
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	// LoadCV is the coefficient of variation of the replicas' work time
	// (ReplicaResult.Work; population standard deviation over mean).
	LoadCV      float64 `json:"load_cv"`
	Makespan    float64 `json:"makespan_s"`
	Preemptions int64   `json:"preemptions"`
	Truncated   int     `json:"truncated"`
	// QueueFactor is the mean TTFT over the mean of each request's ideal
	// TTFT (RequestResult.IdealTTFT: the same cached tokens on an idle
	// replica): 1 on an idle fleet whatever the prompt lengths, growing with
	// queueing and batching. It replaces "round robin's p99/p50" as the
	// measure of load, which long-tailed prompts inflate at idle.
	QueueFactor float64 `json:"queue_factor"`
	// OfferedUtil is the workload's offered prefill load over the fleet's
	// prefill capacity (Workload.OfferedUtil); set by RunCases, 0 when the
	// summary came from Summarize alone.
	OfferedUtil float64 `json:"offered_util"`
	// RunUtil is the run's realized figure on its bulk: the prompt tokens
	// of the requests arriving between the 10th and 90th percentile of
	// arrival times, over that window, over the fleet's prefill capacity
	// (ramp-up and drain left out).
	RunUtil float64 `json:"run_util"`
}

// Summarize computes r's summary.
func Summarize(r *Run) Summary {
	s := Summary{Policy: r.Policy, Workload: r.Workload, Requests: len(r.Requests), Makespan: r.Makespan.Seconds()}
	if len(r.Requests) == 0 {
		return s
	}
	ttft := make([]float64, len(r.Requests))
	e2e := make([]float64, len(r.Requests))
	var prompt, cached, predicted, ceiling, out int64
	var ideal, ttftSum time.Duration
	for i, q := range r.Requests {
		ideal += q.IdealTTFT
		ttftSum += q.TTFT
		ttft[i] = q.TTFT.Seconds()
		e2e[i] = q.E2E.Seconds()
		prompt += int64(q.PromptTokens)
		cached += int64(q.CachedTokens)
		predicted += int64(q.PredictedTokens)
		ceiling += int64(q.CeilingTokens)
		out += int64(q.OutputTokens)
		if q.Truncated {
			s.Truncated++
		}
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	s.TTFTMean = mean(ttft)
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = Quantile(ttft, 0.5), Quantile(ttft, 0.9), Quantile(ttft, 0.99)
	s.E2EP50, s.E2EP99 = Quantile(e2e, 0.5), Quantile(e2e, 0.99)
	if r.Makespan > 0 {
		s.Throughput = float64(out) / r.Makespan.Seconds()
	}
	if ideal > 0 {
		s.QueueFactor = float64(ttftSum) / float64(ideal)
	}
	s.RunUtil = runUtil(r)
	s.HitRate = float64(cached) / float64(prompt)
	s.Ceiling = float64(ceiling) / float64(prompt)
	s.PredictedHitRate = float64(predicted) / float64(prompt)
	s.HitOverCeiling = 1
	if s.Ceiling > 0 {
		s.HitOverCeiling = s.HitRate / s.Ceiling
	}
	busy := make([]float64, len(r.Replicas))
	for i, rep := range r.Replicas {
		busy[i] = rep.Work.Seconds()
		s.Preemptions += rep.Preemptions
	}
	s.LoadCV = CV(busy)
	return s
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// CV is the coefficient of variation of xs (population standard deviation
// over the mean); 0 for an empty or all-zero sample.
func CV(xs []float64) float64 {
	m := mean(xs)
	if m == 0 {
		return 0
	}
	v := 0.0
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	return math.Sqrt(v/float64(len(xs))) / m
}

// Quantile returns the q-quantile of sorted xs by linear interpolation
// between closest ranks; 0 for an empty slice.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// TTFTs returns the run's TTFTs in seconds, sorted.
func TTFTs(r *Run) []float64 {
	out := make([]float64, len(r.Requests))
	for i, q := range r.Requests {
		out[i] = q.TTFT.Seconds()
	}
	slices.Sort(out)
	return out
}

// Seconds converts a duration to float seconds (for tables).
func Seconds(d time.Duration) float64 { return d.Seconds() }

// runUtil is Summary.RunUtil: the bulk figure of OfferedUtil over the
// run's actual arrivals.
func runUtil(r *Run) float64 {
	if r.Capacity <= 0 || len(r.Requests) < 2 {
		return 0
	}
	at := make([]time.Duration, len(r.Requests))
	lens := make([]int, len(r.Requests))
	for i, q := range r.Requests {
		at[i], lens[i] = q.Arrival, q.PromptTokens
	}
	return bulkUtil(at, lens, r.Capacity)
}
