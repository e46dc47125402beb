package policy

import (
	"math"
)

// HardSwitch is SGLang's cache_aware rule. The load of a replica is its
// running plus waiting requests (SGLang's load). The fleet is imbalanced iff
//
//	(max_load - min_load) > balance_abs_threshold  AND  max_load > balance_rel_threshold * min_load
//
// over eligible candidates; then the least loaded wins ("imbalanced").
// Otherwise the best match wins ("match") if its match rate (matched blocks
// times the candidate's trust, over prompt blocks) is at least
// cache_threshold, else the least loaded ("low_match"). Every tie is broken
// at random. Costs are the request counts in the load branches and the
// negated match rate in the match branch. HardSwitch holds no state.
type HardSwitch struct {
	cacheThreshold, absThreshold, relThreshold float64
}

func (c HardSwitchConfig) resolve() (*HardSwitch, error) {
	h := &HardSwitch{
		cacheThreshold: orDefault(c.CacheThreshold, DefaultCacheThreshold),
		absThreshold:   orDefault(c.BalanceAbsThreshold, DefaultBalanceAbsThreshold),
		relThreshold:   orDefault(c.BalanceRelThreshold, DefaultBalanceRelThreshold),
	}
	if err := unit("hardswitch.cache_threshold", h.cacheThreshold); err != nil {
		return nil, err
	}
	if err := finiteNonNeg("hardswitch.balance_abs_threshold", h.absThreshold); err != nil {
		return nil, err
	}
	if err := finiteNonNeg("hardswitch.balance_rel_threshold", h.relThreshold); err != nil {
		return nil, err
	}
	return h, nil
}

// NewHardSwitch returns the hardswitch policy with cfg's knobs (defaults
// applied).
func NewHardSwitch(cfg HardSwitchConfig) (*HardSwitch, error) { return cfg.resolve() }

// Name implements Policy.
func (h *HardSwitch) Name() string { return NameHardSwitch }

// Imbalanced reports SGLang's two-condition imbalance test over the
// eligible candidates' request counts.
func (h *HardSwitch) Imbalanced(cands []Candidate) bool {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cands {
		if eligible(c) {
			l := float64(c.Load.Requests())
			lo, hi = math.Min(lo, l), math.Max(hi, l)
		}
	}
	return hi-lo > h.absThreshold && hi > h.relThreshold*lo
}

// Pick implements Policy.
func (h *HardSwitch) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if cold(cands) {
		return coldResult(cands, env)
	}
	if h.Imbalanced(cands) {
		return Result{Pick: fewestRequests(cands, env), Reason: ReasonImbalanced, Costs: requestCosts(cands)}
	}
	best, rate := bestMatch(req, cands, env)
	if rate >= h.cacheThreshold {
		return Result{Pick: best, Reason: ReasonMatch, Costs: negRates(req, cands)}
	}
	return Result{Pick: fewestRequests(cands, env), Reason: ReasonLowMatch, Costs: requestCosts(cands)}
}

// matchRate is the candidate's trusted matched blocks over the prompt's.
func matchRate(req Request, c Candidate) float64 {
	return effectiveMatched(c) / float64(max(req.PromptBlocks, 1))
}

// bestMatch returns the eligible candidate with the highest match rate (ties
// at random) and that rate.
func bestMatch(req Request, cands []Candidate, env Env) (int, float64) {
	ch := newChooser()
	bestRate := 0.0
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		r := matchRate(req, c)
		switch {
		case ch.pick < 0 || (r > bestRate && !floatEq(r, bestRate)):
			ch.better(i)
			bestRate = r
		case floatEq(r, bestRate):
			ch.tie(i, env)
		}
	}
	return ch.pick, bestRate
}

// negRates is the match branch's score: the negated match rate.
func negRates(req Request, cands []Candidate) []float64 {
	costs := make([]float64, len(cands))
	for i, c := range cands {
		if eligible(c) {
			costs[i] = -matchRate(req, c)
		} else {
			costs[i] = math.NaN()
		}
	}
	return costs
}
