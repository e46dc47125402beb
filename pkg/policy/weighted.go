package policy

import (
	"math"
)

// Weighted is llm-d's scheduling profile as its router chart ships it:
// three scorers, each normalised to [0, 1] per candidate, summed with
// weights, and a max-score picker (ties at random):
//
//	prefix = creditable matched blocks / prompt blocks          (prefix-cache-scorer, ratio form)
//	queue  = (max_waiting - waiting) / (max_waiting - min_waiting), 1 when all equal
//	                                                            (queue-scorer: min-max of the waiting queue)
//	kv     = 1 - KV usage                                       (kv-cache-utilization-scorer)
//	score  = prefix_weight*prefix + queue_weight*queue + kv_weight*kv
//
// with default weights prefix 3, queue 2, KV utilisation 2. Costs are the
// negated scores (lower is better, as for every policy). A cold index
// (nothing matched anywhere) goes to the least loaded, as for every
// cache-aware policy. Weighted holds no state.
type Weighted struct {
	prefix, queue, kv float64
}

func (c WeightedConfig) resolve() (*Weighted, error) {
	w := &Weighted{
		prefix: orDefault(c.PrefixWeight, DefaultWeightedPrefix),
		queue:  orDefault(c.QueueWeight, DefaultWeightedQueue),
		kv:     orDefault(c.KVUtilizationWeight, DefaultWeightedKVUtilization),
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"weighted.prefix_weight", w.prefix},
		{"weighted.queue_weight", w.queue},
		{"weighted.kv_utilization_weight", w.kv},
	} {
		if err := finiteNonNeg(f.name, f.v); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// NewWeighted returns the weighted policy with cfg's weights (defaults
// applied).
func NewWeighted(cfg WeightedConfig) (*Weighted, error) { return cfg.resolve() }

// Name implements Policy.
func (w *Weighted) Name() string { return NameWeighted }

// Scores returns each candidate's weighted score (NaN when ineligible).
func (w *Weighted) Scores(req Request, cands []Candidate) []float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cands {
		if eligible(c) {
			q := float64(c.Load.WaitingRequests)
			lo, hi = math.Min(lo, q), math.Max(hi, q)
		}
	}
	scores := make([]float64, len(cands))
	for i, c := range cands {
		if !eligible(c) {
			scores[i] = math.NaN()
			continue
		}
		queue := 1.0
		if hi > lo {
			queue = (hi - float64(c.Load.WaitingRequests)) / (hi - lo)
		}
		kv := 1 - math.Min(1, math.Max(0, c.Load.KVUsage))
		prefix := math.Min(1, matchRate(req, c))
		scores[i] = w.prefix*prefix + w.queue*queue + w.kv*kv
	}
	return scores
}

// Pick implements Policy.
func (w *Weighted) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if cold(cands) {
		return coldResult(cands, env)
	}
	scores := w.Scores(req, cands)
	ch := newChooser()
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		switch {
		case ch.pick < 0 || (scores[i] > scores[ch.pick] && !floatEq(scores[i], scores[ch.pick])):
			ch.better(i)
		case floatEq(scores[i], scores[ch.pick]):
			ch.tie(i, env)
		}
	}
	costs := make([]float64, len(cands))
	for i, s := range scores {
		costs[i] = -s
	}
	return Result{Pick: ch.pick, Reason: ReasonScore, Costs: costs}
}

// ReasonScore is weighted's reason: the highest weighted score.
const ReasonScore = "score"

// WeightedConfig are the scorer weights of llm-d's default profile.
type WeightedConfig struct {
	// PrefixWeight weighs the prefix-cache scorer (default 3).
	PrefixWeight *float64 `yaml:"prefix_weight"`
	// QueueWeight weighs the queue scorer (default 2).
	QueueWeight *float64 `yaml:"queue_weight"`
	// KVUtilizationWeight weighs the KV-cache-utilisation scorer (default 2).
	KVUtilizationWeight *float64 `yaml:"kv_utilization_weight"`
}

// llm-d's default scorer weights.
const (
	DefaultWeightedPrefix        = 3.0
	DefaultWeightedQueue         = 2.0
	DefaultWeightedKVUtilization = 2.0
)
