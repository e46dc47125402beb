package policy

import (
	"math"

	"github.com/kvroute/kvroute/pkg/index"
)

// KVRoute is kvroute's own policy and the router's default: an estimate,
// in prefill blocks, of how long the request would wait for its first
// token on each candidate, plus a small charge per request already there.
// Lowest wins:
//
//	credit   = (gpu + cpu*host_cache_hit_weight + disk*disk_cache_hit_weight)
//	           * overlap_credit * Candidate.Trust
//	own      = max(0, prompt_blocks - credit)     the request's own uncached prefill
//	backlog  = active_prefill_blocks              uncached prefill queued ahead of it
//	cost     = backlog_weight*backlog + own + decode_weight*active_decode_blocks
//	           + request_weight*(running + waiting requests)
//
// Defaults: overlap_credit 1.25, backlog_weight 0.5, decode_weight 0,
// request_weight 2. A matched block is worth a little more than the block
// of prefill it saves: keeping a conversation where its history is cached
// also saves its next turns the prefill. The router charges a request's uncached blocks to the
// replica's active prefill until its first token, so on average half of
// the charged backlog is already computed when the next request looks:
// backlog_weight 0.5 is that expectation. The per-request charge spreads
// sessions that start on a cold index (sibling rollouts, fan-out) and
// evens out the decode work they bring, without outweighing a cache hit of
// more than a couple of blocks.
//
// It differs from Dynamo's blended cost (see Blended) in two ways that
// matter under load. The overlap credit only discounts the request's own
// prefill: it never cancels backlog a cache-rich replica already carries,
// so a replica that holds a prefix but has a long prefill queue loses to
// an idle one as soon as the queue outweighs the saving (no decay knob
// needed; bursts that queue little prefill are the load bound's, below). And decode footprint, which costs a decode step
// little and first-token latency almost nothing, is charged at a small
// weight instead of block for block, so that a replica holding a long
// conversation's KV is not pushed away from that conversation's next turn.
// Candidate.Trust (the closed-loop fidelity of the replica's served hits)
// scales the credit, so a replica whose predicted hits do not materialise
// stops attracting traffic on them. Ties go to the less loaded candidate,
// then at random. KVRoute holds no state.
//
// Bounded load (load_bound c, default 1.25; 0 turns it off), after
// consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam):
// with T the running plus waiting requests summed over the eligible
// candidates and N of them, a candidate already carrying
//
//	bound = max(load_bound_min, ceil(c * (T+1) / N))
//
// requests or more earns no cache credit for this request. The cost terms
// above weigh queued prefill, not the number of requests a replica serves,
// so a light burst that shares a long prefix (a system prompt cached on one
// replica) would otherwise all land on that replica: each request there
// prefills a few blocks instead of the whole prompt, and a handful of
// requests in flight never outweighs that saving. The bound caps how far
// ahead of its fair share a cache-rich replica can get before it competes
// on load alone, whatever the saving. It removes the credit rather than
// skipping the candidate: an over-bound replica can still win on load (when
// the others' prefill queues are longer), and no special case is needed
// when every candidate is over the bound. Reason "load_bound" marks a pick
// the bound changed (an over-bound candidate would have won with its credit).
//
// The floor load_bound_min (default 4 requests) keeps the bound from firing
// on a nearly idle fleet, where ceil(c*(T+1)/N) is 1 or 2 and a replica
// running two requests would lose a conversation whose whole history it
// holds: on the Mooncake trace (8 replicas) a floor of 1 moved 8% of the
// requests, nearly all with over 90% of their prompt cached, and cost 27%
// of mean TTFT and 18% of the hit rate (docs/benchmarks.md, "Routing
// quality"). At four requests a replica is far from busy, and the
// end-to-end herding burst (16 concurrent requests on 4 replicas, one
// holding their shared system prompt) spreads the same with floors 3 to 5.
type KVRoute struct {
	overlapCredit, backlogWeight, decodeWeight, requestWeight float64
	loadBound, loadBoundMin                                   float64
	tierWeight                                                [index.NumTiers]float64
}

func (c KVRouteConfig) resolve() (*KVRoute, error) {
	k := &KVRoute{
		overlapCredit: orDefault(c.OverlapCredit, DefaultKVRouteOverlapCredit),
		backlogWeight: orDefault(c.BacklogWeight, DefaultKVRouteBacklogWeight),
		decodeWeight:  orDefault(c.DecodeWeight, DefaultKVRouteDecodeWeight),
		requestWeight: orDefault(c.RequestWeight, DefaultKVRouteRequestWeight),
		loadBound:     orDefault(c.LoadBound, DefaultKVRouteLoadBound),
		loadBoundMin:  orDefault(c.LoadBoundMin, DefaultKVRouteLoadBoundMin),
	}
	if err := allFiniteNonNeg(
		knob{"kvroute.overlap_credit", k.overlapCredit},
		knob{"kvroute.backlog_weight", k.backlogWeight},
		knob{"kvroute.decode_weight", k.decodeWeight},
		knob{"kvroute.request_weight", k.requestWeight},
	); err != nil {
		return nil, err
	}
	if b := k.loadBound; math.IsNaN(b) || math.IsInf(b, 0) || (b != 0 && b < 1) {
		return nil, fieldErr("kvroute.load_bound", b, "0 (off) or a finite number >= 1")
	}
	if m := k.loadBoundMin; !(m >= 1 && m <= 1<<20) || m != math.Trunc(m) {
		return nil, fieldErr("kvroute.load_bound_min", m, "a whole number in [1, 1048576]")
	}
	var err error
	if k.tierWeight, err = tierWeights("kvroute", c.HostCacheHitWeight, c.DiskCacheHitWeight); err != nil {
		return nil, err
	}
	return k, nil
}

// NewKVRoute returns the kvroute policy with cfg's knobs (defaults
// applied).
func NewKVRoute(cfg KVRouteConfig) (*KVRoute, error) { return cfg.resolve() }

// Name implements Policy.
func (k *KVRoute) Name() string { return NameKVRoute }

// CreditBlocks is the overlap credit, in blocks, the candidate earns.
func (k *KVRoute) CreditBlocks(c Candidate) float64 {
	matched := 0.0
	for tier, m := range c.Matched {
		matched += float64(m) * k.tierWeight[tier]
	}
	return k.overlapCredit * matched * trust(c)
}

// Cost is the candidate's cost for this request, with its cache credit
// (the load bound is not applied: see Pick).
func (k *KVRoute) Cost(req Request, c Candidate) float64 {
	return k.cost(req, c, k.CreditBlocks(c))
}

func (k *KVRoute) cost(req Request, c Candidate, creditBlocks float64) float64 {
	own := math.Max(0, float64(req.PromptBlocks)-creditBlocks)
	return k.backlogWeight*c.Load.ActivePrefillBlocks + own +
		k.decodeWeight*c.Load.ActiveDecodeBlocks +
		k.requestWeight*float64(c.Load.Requests())
}

// LoadBound is the request count at or above which a candidate earns no
// cache credit: max(load_bound_min, ceil(c*(T+1)/N)) with T the eligible
// candidates' running plus waiting requests and N their number. It is +Inf
// when the bound is off or no candidate is eligible.
func (k *KVRoute) LoadBound(cands []Candidate) float64 {
	if k.loadBound == 0 {
		return math.Inf(1)
	}
	total, n := 0, 0
	for _, c := range cands {
		if eligible(c) {
			total += c.Load.Requests()
			n++
		}
	}
	if n == 0 {
		return math.Inf(1)
	}
	return math.Max(k.loadBoundMin, math.Ceil(k.loadBound*float64(total+1)/float64(n)))
}

// Pick implements Policy.
func (k *KVRoute) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	bound := k.LoadBound(cands)
	over := func(c Candidate) bool { return float64(c.Load.Requests()) >= bound }
	pick, costs := lowestCost(cands, env, func(c Candidate) float64 {
		cr := 0.0
		if !over(c) {
			cr = k.CreditBlocks(c)
		}
		return k.cost(req, c, cr)
	})
	reason := ReasonCost
	switch {
	case cold(cands):
		reason = ReasonColdIndex
	case k.boundChanged(req, cands, pick, costs[pick], over):
		reason = ReasonLoadBound
	}
	return Result{Pick: pick, Reason: reason, Costs: costs}
}

// boundChanged reports whether some over-bound candidate other than the
// pick would have cost less than the pick with its cache credit: the bound,
// not the cost alone, decided.
func (k *KVRoute) boundChanged(req Request, cands []Candidate, pick int, pickCost float64, over func(Candidate) bool) bool {
	for i, c := range cands {
		if i == pick || !eligible(c) || !over(c) {
			continue
		}
		cr := k.CreditBlocks(c)
		if cr == 0 {
			continue
		}
		if v := k.cost(req, c, cr); v < pickCost && !floatEq(v, pickCost) {
			return true
		}
	}
	return false
}

// KVRouteConfig are the kvroute policy's knobs (see KVRoute).
type KVRouteConfig struct {
	// OverlapCredit scales the cache credit (default 1.25; 0 turns cache
	// awareness off).
	OverlapCredit *float64 `yaml:"overlap_credit"`
	// BacklogWeight weighs the active prefill blocks queued ahead.
	BacklogWeight *float64 `yaml:"backlog_weight"`
	// DecodeWeight charges blocks per active decode block.
	DecodeWeight *float64 `yaml:"decode_weight"`
	// RequestWeight charges blocks per running or waiting request.
	RequestWeight *float64 `yaml:"request_weight"`
	// HostCacheHitWeight credits a CPU-tier block (default 0.75).
	HostCacheHitWeight *float64 `yaml:"host_cache_hit_weight"`
	// DiskCacheHitWeight credits a disk-tier block (default 0.25).
	DiskCacheHitWeight *float64 `yaml:"disk_cache_hit_weight"`
	// LoadBound c: a candidate with max(load_bound_min, ceil(c*(T+1)/N))
	// or more running plus waiting requests (T summed over the N eligible
	// candidates) earns no cache credit (default 1.25; 0 turns the bound
	// off; otherwise it must be >= 1).
	LoadBound *float64 `yaml:"load_bound"`
	// LoadBoundMin is the bound's floor in requests (default 4; a whole
	// number >= 1).
	LoadBoundMin *float64 `yaml:"load_bound_min"`
}

// kvroute's defaults.
const (
	DefaultKVRouteOverlapCredit = 1.25
	DefaultKVRouteBacklogWeight = 0.5
	DefaultKVRouteDecodeWeight  = 0.0
	DefaultKVRouteRequestWeight = 2.0
	DefaultKVRouteLoadBound     = 1.25
	DefaultKVRouteLoadBoundMin  = 4.0
)
