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
//	           * overlap_credit * Candidate.Credit
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
// an idle one as soon as the queue outweighs the saving (no herding, no
// decay knob needed). And decode footprint, which costs a decode step
// little and first-token latency almost nothing, is charged at a small
// weight instead of block for block, so that a replica holding a long
// conversation's KV is not pushed away from that conversation's next turn.
// Candidate.Credit (the closed-loop fidelity of the replica's served hits)
// scales the credit, so a replica whose predicted hits do not materialise
// stops attracting traffic on them. Ties go to the less loaded candidate,
// then at random. KVRoute holds no state.
type KVRoute struct {
	credit, backlogWeight, decodeWeight, requestWeight float64
	tierWeight                                         [index.NumTiers]float64
}

func (c KVRouteConfig) resolve() (*KVRoute, error) {
	k := &KVRoute{
		credit:        orDefault(c.OverlapCredit, DefaultKVRouteOverlapCredit),
		backlogWeight: orDefault(c.BacklogWeight, DefaultKVRouteBacklogWeight),
		decodeWeight:  orDefault(c.DecodeWeight, DefaultKVRouteDecodeWeight),
		requestWeight: orDefault(c.RequestWeight, DefaultKVRouteRequestWeight),
	}
	k.tierWeight[index.TierGPU] = 1
	k.tierWeight[index.TierCPU] = orDefault(c.HostCacheHitWeight, DefaultHostCacheHitWeight)
	k.tierWeight[index.TierDisk] = orDefault(c.DiskCacheHitWeight, DefaultDiskCacheHitWeight)
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"kvroute.overlap_credit", k.credit},
		{"kvroute.backlog_weight", k.backlogWeight},
		{"kvroute.decode_weight", k.decodeWeight},
		{"kvroute.request_weight", k.requestWeight},
	} {
		if err := finiteNonNeg(f.name, f.v); err != nil {
			return nil, err
		}
	}
	if err := unit("kvroute.host_cache_hit_weight", k.tierWeight[index.TierCPU]); err != nil {
		return nil, err
	}
	if err := unit("kvroute.disk_cache_hit_weight", k.tierWeight[index.TierDisk]); err != nil {
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
	t := 0.0
	for tier, m := range c.Matched {
		t += float64(m) * k.tierWeight[tier]
	}
	return k.credit * t * credit(c)
}

// Cost is the candidate's cost for this request.
func (k *KVRoute) Cost(req Request, c Candidate) float64 {
	own := math.Max(0, float64(req.PromptBlocks)-k.CreditBlocks(c))
	return k.backlogWeight*c.Load.ActivePrefillBlocks + own +
		k.decodeWeight*c.Load.ActiveDecodeBlocks +
		k.requestWeight*float64(c.Load.Requests())
}

// Pick implements Policy.
func (k *KVRoute) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	costs := make([]float64, len(cands))
	ch := newChooser()
	for i, c := range cands {
		if !eligible(c) {
			costs[i] = math.NaN()
			continue
		}
		costs[i] = k.Cost(req, c)
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
	reason := ReasonCost
	if cold(cands) {
		reason = ReasonColdIndex
	}
	return Result{Pick: ch.pick, Reason: reason, Costs: costs}
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
}

// kvroute's defaults.
const (
	DefaultKVRouteOverlapCredit = 1.25
	DefaultKVRouteBacklogWeight = 0.5
	DefaultKVRouteDecodeWeight  = 0.0
	DefaultKVRouteRequestWeight = 2.0
)
