package policy

import (
	"math"
	"math/rand/v2"
)

// Reasons a policy gives for its pick (Result.Reason).
const (
	ReasonCost         = "cost"           // blended: lowest cost
	ReasonColdIndex    = "cold_index"     // no eligible candidate matches any block: least loaded
	ReasonLeastLoad    = "least_load"     // leastload, or a policy's load-only branch
	ReasonImbalanced   = "imbalanced"     // hardswitch / prefixaffinity: load imbalance tripped
	ReasonMatch        = "match"          // hardswitch / prefixaffinity: best prefix match
	ReasonLowMatch     = "low_match"      // match rate under the threshold
	ReasonNoPrefixData = "no_prefix_data" // prefixaffinity: low match and no footprint data
	ReasonSession      = "session"        // session: the key's ring owner (or its successor)
	ReasonNoSessionKey = "no_session_key" // session: no key, least loaded
	ReasonRoundRobin   = "round_robin"
	ReasonRandom       = "random"
	ReasonAffinity     = "affinity" // pureaffinity: longest match
	ReasonNoneEligible = "none_eligible"
	ReasonLoadBound    = "load_bound" // kvroute: the load bound took a candidate's cache credit and changed the pick
	// ReasonPrefixShare: kvroute passed over a cheaper candidate that took
	// too large a share of the recent placements drawn by the request's
	// prefix (herding).
	ReasonPrefixShare = "prefix_share"
	// ReasonHeld: kvroute held a request of a burst that fills the fleet
	// on a replica computing its prompt, passing over a cheaper one that
	// would compute it again (see KVRoute).
	ReasonHeld = "held"
)

// LoadBlocks is the load figure ties are broken on: the replica's active
// prefill plus active decode blocks. Between equal LoadBlocks the replica
// with fewer requests (running plus waiting) is less loaded; after that the
// choice is random.
func LoadBlocks(c Candidate) float64 {
	return c.Load.ActivePrefillBlocks + c.Load.ActiveDecodeBlocks
}

// lessLoaded reports whether a is strictly less loaded than b: fewer load
// blocks, then fewer requests.
func lessLoaded(a, b Candidate) bool {
	la, lb := LoadBlocks(a), LoadBlocks(b)
	if !floatEq(la, lb) {
		return la < lb
	}
	return a.Load.Requests() < b.Load.Requests()
}

// sameLoad reports whether neither of a and b is less loaded than the other.
func sameLoad(a, b Candidate) bool {
	return floatEq(LoadBlocks(a), LoadBlocks(b)) && a.Load.Requests() == b.Load.Requests()
}

// floatEq compares scores with a tolerance relative to their magnitude, so
// that mathematically equal costs summed in different orders tie.
func floatEq(a, b float64) bool {
	if a == b {
		return true
	}
	scale := math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
	return math.Abs(a-b) <= 1e-9*scale
}

// eligible reports whether a candidate may be picked.
func eligible(c Candidate) bool { return c.Load.Healthy }

// trust returns the candidate's trust clamped to [0, 1] (NaN counts as 0).
func trust(c Candidate) float64 {
	if !(c.Trust > 0) {
		return 0
	}
	return math.Min(c.Trust, 1)
}

// effectiveMatched is the candidate's matched prefix length scaled by its
// trust: a resyncing replica (Trust 0) matches nothing.
func effectiveMatched(c Candidate) float64 {
	return float64(c.MatchedBlocks()) * trust(c)
}

// cold reports whether no eligible candidate has any creditable match: the
// index is cold or empty for this request.
func cold(cands []Candidate) bool {
	for _, c := range cands {
		if eligible(c) && effectiveMatched(c) > 0 {
			return false
		}
	}
	return true
}

// intn draws from env.Rand, or from the runtime's global source when the
// caller injected none.
func (e Env) intn(n int) int {
	if n <= 1 {
		return 0
	}
	if e.Rand != nil {
		return e.Rand.IntN(n)
	}
	return rand.IntN(n)
}

// chooser collects the best candidates under some order and picks one of
// the ties uniformly at random, without allocating: reservoir sampling over
// the ties, one draw per tie.
type chooser struct {
	pick int
	ties int
}

func newChooser() chooser { return chooser{pick: -1} }

// better resets the choice to i (strictly better than anything so far).
func (ch *chooser) better(i int) { ch.pick, ch.ties = i, 1 }

// tie offers i as equal to the current best.
func (ch *chooser) tie(i int, env Env) {
	ch.ties++
	if env.intn(ch.ties) == 0 {
		ch.pick = i
	}
}

// leastLoaded picks the least-loaded eligible candidate (LoadBlocks, then
// requests), ties at random; -1 when none is eligible.
func leastLoaded(cands []Candidate, env Env) int {
	ch := newChooser()
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		switch {
		case ch.pick < 0 || lessLoaded(c, cands[ch.pick]):
			ch.better(i)
		case sameLoad(c, cands[ch.pick]):
			ch.tie(i, env)
		}
	}
	return ch.pick
}

// loadCosts returns LoadBlocks per eligible candidate, NaN for the others:
// the score of the load-only branches.
func loadCosts(cands []Candidate) []float64 {
	costs := make([]float64, len(cands))
	for i, c := range cands {
		if eligible(c) {
			costs[i] = LoadBlocks(c)
		} else {
			costs[i] = math.NaN()
		}
	}
	return costs
}

// requestCosts returns running+waiting requests per eligible candidate, NaN
// for the others: the score of SGLang's and Ray's queue-length branches.
func requestCosts(cands []Candidate) []float64 {
	costs := make([]float64, len(cands))
	for i, c := range cands {
		if eligible(c) {
			costs[i] = float64(c.Load.Requests())
		} else {
			costs[i] = math.NaN()
		}
	}
	return costs
}

// coldResult is the cold-index fallback shared by the cache-aware policies.
func coldResult(cands []Candidate, env Env) Result {
	p := leastLoaded(cands, env)
	if p < 0 {
		return none()
	}
	return Result{Pick: p, Reason: ReasonColdIndex, Costs: loadCosts(cands)}
}

func none() Result { return Result{Pick: -1, Reason: ReasonNoneEligible} }

// fewestRequests picks the eligible candidate with the fewest requests
// (running plus waiting: SGLang's and Ray's load), ties at random.
func fewestRequests(cands []Candidate, env Env) int {
	ch := newChooser()
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		switch {
		case ch.pick < 0 || c.Load.Requests() < cands[ch.pick].Load.Requests():
			ch.better(i)
		case c.Load.Requests() == cands[ch.pick].Load.Requests():
			ch.tie(i, env)
		}
	}
	return ch.pick
}

// powerOfTwo draws two distinct eligible candidates at random and returns
// the one with fewer requests (a coin flip between equals); -1 when none is
// eligible.
func powerOfTwo(cands []Candidate, env Env) int {
	n := 0
	for _, c := range cands {
		if eligible(c) {
			n++
		}
	}
	if n == 0 {
		return -1
	}
	a := env.intn(n)
	b := a
	if n > 1 {
		b = env.intn(n - 1)
		if b >= a {
			b++
		}
	}
	ia, ib := nthEligible(cands, a), nthEligible(cands, b)
	ra, rb := cands[ia].Load.Requests(), cands[ib].Load.Requests()
	switch {
	case ra < rb:
		return ia
	case rb < ra:
		return ib
	case env.intn(2) == 0:
		return ia
	}
	return ib
}

func nthEligible(cands []Candidate, n int) int {
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		if n == 0 {
			return i
		}
		n--
	}
	return -1
}

// anyEligible reports whether some candidate may be picked.
func anyEligible(cands []Candidate) bool {
	for _, c := range cands {
		if eligible(c) {
			return true
		}
	}
	return false
}

// lowestCost scores every eligible candidate with cost (NaN for the
// ineligible) and picks the lowest; equal costs go to the less loaded
// candidate, then at random. It returns -1 when none is eligible.
func lowestCost(cands []Candidate, env Env, cost func(Candidate) float64) (int, []float64) {
	return lowestCostAmong(cands, env, cost, nil)
}

// lowestCostAmong is lowestCost picking only among the eligible candidates
// allowed admits (all when allowed is nil); costs are computed for every
// eligible candidate.
func lowestCostAmong(cands []Candidate, env Env, cost func(Candidate) float64, allowed func(Candidate) bool) (int, []float64) {
	costs := make([]float64, len(cands))
	ch := newChooser()
	for i, c := range cands {
		if !eligible(c) {
			costs[i] = math.NaN()
			continue
		}
		costs[i] = cost(c)
		if allowed != nil && !allowed(c) {
			continue
		}
		if ch.pick < 0 {
			ch.better(i)
			continue
		}
		best := costs[ch.pick]
		switch {
		case !floatEq(costs[i], best) && costs[i] < best:
			ch.better(i)
		case !floatEq(costs[i], best):
		case lessLoaded(c, cands[ch.pick]):
			ch.better(i)
		case sameLoad(c, cands[ch.pick]):
			ch.tie(i, env)
		}
	}
	return ch.pick, costs
}
