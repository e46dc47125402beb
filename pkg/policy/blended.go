package policy

import (
	"math"

	"github.com/kvroute/kvroute/pkg/index"
)

// Blended is NVIDIA Dynamo's router cost, in KV blocks, lowest wins:
//
//	credit_blocks           = (gpu*device_credit + cpu*host_cache_hit_weight
//	                           + disk*disk_cache_hit_weight) * overlap_score_credit * Candidate.Trust
//	device_credit           = 1 / (1 + overlap_score_credit_decay * excess)
//	excess                  = (active_prefill - min active_prefill over eligible) / max(prompt_blocks, 1)
//	adjusted_prefill_blocks = max(0, active_prefill_blocks + prompt_blocks - credit_blocks)
//	potential_decode_blocks = active_decode_blocks + incoming_active_blocks
//	cost = prefill_load_scale*adjusted_prefill_blocks + potential_decode_blocks
//	       + decode_active_request_weight*active_requests
//
// gpu, cpu and disk are the candidate's matched blocks by tier;
// incoming_active_blocks is Request.ExpectedOutputBlocks, the same for every
// candidate (it shifts every cost alike and never changes the pick). Ties go
// to the less loaded candidate (LoadBlocks, then requests), then at random.
// Blended holds no state.
type Blended struct {
	credit, decay, scale, reqWeight float64
	tierWeight                      [index.NumTiers]float64
}

func (c BlendedConfig) resolve() (*Blended, error) {
	b := &Blended{
		credit:    orDefault(c.OverlapScoreCredit, DefaultOverlapScoreCredit),
		decay:     c.OverlapScoreCreditDecay,
		scale:     orDefault(c.PrefillLoadScale, DefaultPrefillLoadScale),
		reqWeight: c.DecodeActiveRequestWeight,
	}
	if err := allFiniteNonNeg(
		knob{"blended.overlap_score_credit", b.credit},
		knob{"blended.overlap_score_credit_decay", b.decay},
		knob{"blended.prefill_load_scale", b.scale},
		knob{"blended.decode_active_request_weight", b.reqWeight},
	); err != nil {
		return nil, err
	}
	var err error
	if b.tierWeight, err = tierWeights("blended", c.HostCacheHitWeight, c.DiskCacheHitWeight); err != nil {
		return nil, err
	}
	return b, nil
}

// NewBlended returns the blended policy with cfg's knobs (defaults applied).
func NewBlended(cfg BlendedConfig) (*Blended, error) { return cfg.resolve() }

// Name implements Policy.
func (b *Blended) Name() string { return NameBlended }

// CreditBlocks is the overlap credit, in blocks, the candidate earns for
// this request given the least active prefill among eligible candidates.
func (b *Blended) CreditBlocks(req Request, c Candidate, minPrefill float64) float64 {
	device := float64(c.Matched[index.TierGPU])
	if b.decay > 0 {
		excess := math.Max(0, c.Load.ActivePrefillBlocks-minPrefill) / float64(max(req.PromptBlocks, 1))
		device /= 1 + b.decay*excess
	}
	off := float64(c.Matched[index.TierCPU])*b.tierWeight[index.TierCPU] +
		float64(c.Matched[index.TierDisk])*b.tierWeight[index.TierDisk]
	return b.credit * (device + off) * trust(c)
}

// Cost is the candidate's Dynamo cost for this request.
func (b *Blended) Cost(req Request, c Candidate, minPrefill float64) float64 {
	raw := c.Load.ActivePrefillBlocks + float64(req.PromptBlocks)
	adjusted := math.Max(0, raw-b.CreditBlocks(req, c, minPrefill))
	decode := c.Load.ActiveDecodeBlocks + req.ExpectedOutputBlocks
	return b.scale*adjusted + decode + b.reqWeight*float64(c.Load.ActiveRequests)
}

// Pick implements Policy.
func (b *Blended) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if cold(cands) {
		return coldResult(cands, env)
	}
	minPrefill := math.Inf(1)
	for _, c := range cands {
		if eligible(c) {
			minPrefill = math.Min(minPrefill, c.Load.ActivePrefillBlocks)
		}
	}
	pick, costs := lowestCost(cands, env, func(c Candidate) float64 { return b.Cost(req, c, minPrefill) })
	return Result{Pick: pick, Reason: ReasonCost, Costs: costs}
}
