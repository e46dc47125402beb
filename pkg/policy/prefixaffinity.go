package policy

import (
	"math"
)

// PrefixAffinity is Ray Serve's PrefixCacheAffinityRouter over the block
// index instead of a character tree. Queue length is running plus waiting
// requests. After the cold-index check (no eligible candidate matches any
// block: least loaded, "cold_index"), its four branches are:
//
//  1. max-min queue length > imbalanced_threshold: power of two choices
//     ("imbalanced"; the default threshold +Inf never trips).
//  2. best match rate >= match_rate_threshold: the highest match, ties at
//     random ("match").
//  3. lower match rate, and some candidate reports its cached footprint:
//     the smallest footprint, ties at random ("low_match"). The footprint
//     is Candidate.Footprint when any eligible candidate reports one, else
//     Load.KVUsage (Ray counts the characters each replica holds in its
//     tree; the engine's KV usage is our closest measure of the same).
//  4. lower match rate and no footprint data at all: power of two choices
//     ("no_prefix_data").
//
// Ray's fourth branch also covers an entirely empty tree; here that case is
// the cold index and goes to the exact least loaded instead of power of two
// choices, as for every cache-aware policy. PrefixAffinity holds no state.
type PrefixAffinity struct {
	imbalanced, matchRate float64
}

func (c PrefixAffinityConfig) resolve() (*PrefixAffinity, error) {
	p := &PrefixAffinity{
		imbalanced: orDefault(c.ImbalancedThreshold, math.Inf(1)),
		matchRate:  orDefault(c.MatchRateThreshold, DefaultMatchRateThreshold),
	}
	if math.IsNaN(p.imbalanced) || p.imbalanced < 0 {
		return nil, fieldErr("prefixaffinity.imbalanced_threshold", p.imbalanced, ">= 0 (or .inf)")
	}
	if err := unit("prefixaffinity.match_rate_threshold", p.matchRate); err != nil {
		return nil, err
	}
	return p, nil
}

// NewPrefixAffinity returns the prefixaffinity policy with cfg's knobs
// (defaults applied).
func NewPrefixAffinity(cfg PrefixAffinityConfig) (*PrefixAffinity, error) { return cfg.resolve() }

// Name implements Policy.
func (p *PrefixAffinity) Name() string { return NamePrefixAffinity }

// Pick implements Policy.
func (p *PrefixAffinity) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if cold(cands) {
		return coldResult(cands, env)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cands {
		if eligible(c) {
			l := float64(c.Load.Requests())
			lo, hi = math.Min(lo, l), math.Max(hi, l)
		}
	}
	if hi-lo > p.imbalanced {
		return Result{Pick: powerOfTwo(cands, env), Reason: ReasonImbalanced, Costs: requestCosts(cands)}
	}
	best, rate := bestMatch(req, cands, env)
	if rate >= p.matchRate {
		return Result{Pick: best, Reason: ReasonMatch, Costs: negRates(req, cands)}
	}
	fp := footprints(cands)
	if fp == nil {
		return Result{Pick: powerOfTwo(cands, env), Reason: ReasonNoPrefixData, Costs: requestCosts(cands)}
	}
	ch := newChooser()
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		switch {
		case ch.pick < 0 || (fp[i] < fp[ch.pick] && !floatEq(fp[i], fp[ch.pick])):
			ch.better(i)
		case floatEq(fp[i], fp[ch.pick]):
			ch.tie(i, env)
		}
	}
	return Result{Pick: ch.pick, Reason: ReasonLowMatch, Costs: fp}
}

// footprints returns each eligible candidate's cached footprint (NaN for
// the others), or nil when no eligible candidate reports one.
func footprints(cands []Candidate) []float64 {
	useFootprint, useKV := false, false
	for _, c := range cands {
		if !eligible(c) {
			continue
		}
		useFootprint = useFootprint || c.Footprint > 0
		useKV = useKV || c.Load.KVUsage > 0
	}
	if !useFootprint && !useKV {
		return nil
	}
	fp := make([]float64, len(cands))
	for i, c := range cands {
		switch {
		case !eligible(c):
			fp[i] = math.NaN()
		case useFootprint:
			fp[i] = math.Max(0, c.Footprint)
		default:
			fp[i] = math.Max(0, c.Load.KVUsage)
		}
	}
	return fp
}
