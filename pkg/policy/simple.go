package policy

import (
	"math"
	"sync/atomic"
)

// LeastLoad picks the least-loaded eligible candidate: fewest LoadBlocks
// (active prefill plus decode blocks), then fewest requests, then at random.
// It ignores the cache, so the cold index changes nothing but the reason.
// LeastLoad holds no state.
type LeastLoad struct{}

// Name implements Policy.
func (LeastLoad) Name() string { return NameLeastLoad }

// Pick implements Policy.
func (LeastLoad) Pick(_ Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if cold(cands) {
		return coldResult(cands, env)
	}
	return Result{Pick: leastLoaded(cands, env), Reason: ReasonLeastLoad, Costs: loadCosts(cands)}
}

// RoundRobin cycles over the eligible candidates. Its state is one atomic
// counter, advanced once per pick, so it is safe for concurrent use; the
// cycle is over positions among the eligible candidates of each call. It
// is load- and cache-blind by definition. Costs are each eligible
// candidate's distance from the pick along the cycle.
type RoundRobin struct {
	next atomic.Uint64
}

// Name implements Policy.
func (*RoundRobin) Name() string { return NameRoundRobin }

// Pick implements Policy.
func (r *RoundRobin) Pick(_ Request, cands []Candidate, _ Env) Result {
	n := 0
	for _, c := range cands {
		if eligible(c) {
			n++
		}
	}
	if n == 0 {
		return none()
	}
	start := int((r.next.Add(1) - 1) % uint64(n))
	costs := make([]float64, len(cands))
	pos := 0
	for i, c := range cands {
		if !eligible(c) {
			costs[i] = math.NaN()
			continue
		}
		costs[i] = float64((pos - start + n) % n)
		pos++
	}
	return Result{Pick: nthEligible(cands, start), Reason: ReasonRoundRobin, Costs: costs}
}

// Random picks an eligible candidate uniformly at random from Env.Rand. It
// is load- and cache-blind by definition and has no score (nil Costs).
type Random struct{}

// Name implements Policy.
func (Random) Name() string { return NameRandom }

// Pick implements Policy.
func (Random) Pick(_ Request, cands []Candidate, env Env) Result {
	n := 0
	for _, c := range cands {
		if eligible(c) {
			n++
		}
	}
	if n == 0 {
		return none()
	}
	return Result{Pick: nthEligible(cands, env.intn(n)), Reason: ReasonRandom}
}

// PureAffinity picks the longest creditable match and ignores load
// entirely; ties go to the LOWEST index, exactly like the seed document's
// lexsort, so that it herds exactly as the seed shows. It is for
// experiments only (it is the herding baseline): never deploy it. With a
// cold index it degrades to least loaded like every cache-aware policy.
// Costs are the negated matched blocks. PureAffinity holds no state.
type PureAffinity struct{}

// Name implements Policy.
func (PureAffinity) Name() string { return NamePureAffinity }

// Pick implements Policy.
func (PureAffinity) Pick(_ Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if cold(cands) {
		return coldResult(cands, env)
	}
	costs := make([]float64, len(cands))
	pick := -1
	for i, c := range cands {
		if !eligible(c) {
			costs[i] = math.NaN()
			continue
		}
		costs[i] = -effectiveMatched(c)
		if pick < 0 || costs[i] < costs[pick] {
			pick = i
		}
	}
	return Result{Pick: pick, Reason: ReasonAffinity, Costs: costs}
}
