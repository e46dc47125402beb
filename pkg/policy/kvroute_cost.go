package policy

import (
	"cmp"
	"math"
	"slices"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

// HitBlocks is the candidate's trusted cache hit for the request, in
// blocks: its matched blocks weighted by tier plus its in-flight credit
// (InFlightCredit), never more than MaxHitBlocks, times its trust.
func (k *KVRoute) HitBlocks(req Request, c Candidate) float64 { return k.hitBlocks(req, c, true) }

// hitBlocks is HitBlocks, without the in-flight credit unless pending.
func (k *KVRoute) hitBlocks(req Request, c Candidate, pending bool) float64 {
	matched := 0.0
	if pending {
		matched = InFlightCredit(req, c)
	}
	for tier, m := range c.Matched {
		matched += float64(m) * k.tierWeight[tier]
	}
	if req.PromptBlocks > 0 {
		matched = math.Min(matched, MaxHitBlocks(req))
	}
	return matched * trust(c)
}

// MaxHitBlocks is the most of the request's prompt blocks an engine serves
// from its cache: its full blocks but the one holding the prompt's last
// token, which the engine computes to sample the first output (all of
// PromptBlocks unless the prompt ends on a block boundary; PromptBlocks
// when PromptTokens is unknown).
func MaxHitBlocks(req Request) float64 {
	if req.PromptTokens <= 0 || req.BlockSize <= 0 {
		return float64(req.PromptBlocks)
	}
	return math.Min(float64(req.PromptBlocks), float64((req.PromptTokens-1)/req.BlockSize))
}

// InFlightCredit is the part of the candidate's in-flight prefix
// (Candidate.Pending) a request placed there finds computed: all of it,
// up to MaxHitBlocks with the candidate's matched blocks. Engines share a
// prefix while it is computed: vLLM v1 caches the blocks a step will
// compute when it schedules the step, so a request admitted into that
// step or a later one finds them, and SGLang admits such a request a step
// later, when they are computed. (vLLM's V0 engine cached a block only
// once computed, so a request admitted into the prefix's own step
// computed it again.) Route nets it out of its fluid queue estimate.
func InFlightCredit(req Request, c Candidate) float64 {
	p := float64(c.Pending)
	if !(p > 0) {
		return 0
	}
	return math.Min(p, math.Max(0, MaxHitBlocks(req)-float64(c.MatchedBlocks())))
}

// StepBlocks is the engine's per-step token budget (step_tokens) in the
// request's blocks.
func (k *KVRoute) StepBlocks(req Request) float64 { return k.stepTokens / blockTokens(req) }

// Pace is how a candidate turns work into time: seconds per prompt block
// of prefill and per decode step.
type Pace struct{ BlockSecs, StepSecs float64 }

// Pace is the candidate's pace: its learned prefill speed and decode
// step (Load.PrefillRate, Load.DecodeStep), each falling back to f's, then
// to the policy's prefill_rate and decode_step.
func (k *KVRoute) Pace(c Candidate, f Fleet) Pace {
	rate, step, bt := k.rate(c, f), c.Load.DecodeStep.Seconds(), f.BlockTokens
	if !(step > 0) {
		step = f.DecodeStep
	}
	if !(step > 0) {
		step = k.decodeStep
	}
	if !(bt > 0) {
		bt = 16
	}
	return Pace{BlockSecs: bt / rate, StepSecs: step}
}

// rate is the candidate's prefill speed as Pace prices it: its learned
// speed, else f's, else prefill_rate.
func (k *KVRoute) rate(c Candidate, f Fleet) float64 {
	fleet := f.PrefillRate
	if !validRate(fleet) {
		fleet = k.prefillRate
	}
	return prefillRateOr(c, fleet)
}

// PrefillRates implements Pacer: each candidate's prefill speed as Pace
// prices it (its learned speed, else the mean of the eligible candidates'
// learned ones, else prefill_rate).
func (k *KVRoute) PrefillRates(dst []float64, cands []Candidate) []float64 {
	return PrefillRates(dst, cands, k.prefillRate)
}

// Prediction is one candidate's predicted cost, term by term, in seconds.
type Prediction struct {
	Wait, Own, Move, Memory, Decode, Step, Requests, Future float64
}

// Total is the cost the pick compares.
func (p Prediction) Total() float64 {
	return p.Wait + p.Own + p.Move + p.Memory + p.Decode + p.Step + p.Requests + p.Future
}

// futureIdleMin keeps the queueing formula of FutureWait finite on a
// replica whose committed sessions alone would keep it busy all the time:
// its idle share counts as at least this.
const futureIdleMin = 0.05

// PricesFuture reports whether kvroute charges a new session for its
// predicted later turns (future_weight > 0; see FutureWait).
func (k *KVRoute) PricesFuture() bool { return k.futureWeight > 0 }

// FutureWait is the waiting, in seconds, the request's session would add
// over its later turns (Request.Future) if it lived on c, to its own turns
// and to those of the sessions living there (Candidate.Sessions), by the
// Pollaczek-Khinchine mean wait of a queue fed by those sessions' turns
// (b the candidate's seconds per block, B their turn rate, U = b·Blocks
// their utilization, A = b²·BlocksSq their rate times mean square service,
// s1 and s2 the mean and mean square of the new session's turn's service):
//
//	per turn = (A + B*s2) / (2*(1-U)) + B*A*s1 / (2*(1-U)^2)
//	FutureWait = future_weight * Future.Turns * per turn
//
// the first part its own turn's wait behind theirs plus theirs behind it,
// the second how its share of the replica lengthens everyone's queue. 1-U
// counts as at least futureIdleMin.
func (k *KVRoute) FutureWait(req Request, c Candidate, f Fleet) float64 {
	fu := req.Future
	if !(fu.Turns > 0) || k.futureWeight == 0 {
		return 0
	}
	b := k.Pace(c, f).BlockSecs
	sl := c.Sessions
	rate, u, a := sl.Rate, b*sl.Blocks, b*b*sl.BlocksSq
	s1, s2 := b*fu.Blocks, b*b*fu.BlocksSq
	idle := math.Max(1-u, futureIdleMin)
	per := (a+rate*s2)/(2*idle) + rate*a*s1/(2*idle*idle)
	return k.futureWeight * fu.Turns * per
}

// own is the request's uncached prefill on c given its hit.
func own(req Request, hit float64) float64 {
	return math.Max(0, float64(req.PromptBlocks)-hit)
}

// blockTokens is the request's block size in tokens.
func blockTokens(req Request) float64 {
	switch {
	case req.BlockSize > 0:
		return float64(req.BlockSize)
	case req.PromptBlocks > 0 && req.PromptTokens >= req.PromptBlocks:
		return float64(req.PromptTokens / req.PromptBlocks)
	}
	return 16
}

// MovePressure is the pressure a move onto c is charged at: the fleet's
// (Fleet.Pressure) or, with move_fill > 0 and where it is higher, how much
// fuller c's KV cache is than the fleet's emptiest, in units of the room c
// has left, times move_fill: move_fill*(u-min)/(1-u), u its reported usage
// (Load.KVUsage) and min Fleet.MinFill, capped at move_pressure_max. A
// history re-prefilled into a nearly full cache while another replica has
// room displaces what the replica's own sessions keep there and is
// displaced in turn: the move buys one turn, not a new home, and the
// session's next turns move again. Where every cache is as full there is
// no room to move to and the fleet's pressure alone prices the move. With
// the fast half of a mixed fleet full and the slow half idle, the fleet's
// pressure alone priced moves between the full fast replicas at a tenth of
// their re-prefill; move_fill 1 halves rl's p99 there, but costs some
// p99s with half the KV cache or lost events, so it is off by default
// (docs/benchmarks.md, "A move into a full cache").
func (k *KVRoute) MovePressure(c Candidate, f Fleet) float64 {
	if k.moveFill == 0 {
		return f.Pressure
	}
	u := c.Load.KVUsage
	if !(u > f.MinFill) {
		return f.Pressure
	}
	fill := math.Inf(1) // a full cache: no room left at all
	if u < 1 {
		fill = k.moveFill * (u - f.MinFill) / (1 - u)
	}
	return math.Max(f.Pressure, math.Min(k.movePressureMax, fill))
}

// Predict is the candidate's cost for the request, term by term, in
// seconds, with its cache credit (hit blocks) as given.
func (k *KVRoute) Predict(req Request, c Candidate, hit float64, f Fleet) Prediction {
	pc := k.Pace(c, f)
	o := own(req, hit)
	wait := k.backlogWeight * c.Load.ActivePrefillBlocks
	switch {
	case f.Fluid:
		wait = k.FluidWait(c)
	case hit > 0 && InFlightCredit(req, c) > 0:
		// Part of the hit is a prefix in flight: it is computed only once
		// its own prefill is, which was just sent and is charged in full.
		a, pend := c.Load.ActivePrefillBlocks, float64(c.Pending)
		wait = k.backlogWeight*math.Max(0, a-pend) + math.Min(a, pend)
	case c.Home || hit == 0 || float64(c.MatchedBlocks()) <= f.CommonBlocks:
		// A fresh queue is waited for in full (see KVRoute), also at a
		// candidate holding no more of the prompt than every candidate
		// does: going elsewhere leaves nothing behind.
		wait = math.Max(wait, math.Min(c.Load.ActivePrefillBlocks, k.FluidWait(c)))
	}
	extra := math.Max(0, o-f.HomeOwn)
	if f.Sibling && HoldsPrompt(req, c) {
		extra = 0
	}
	p := Prediction{
		Wait:     pc.BlockSecs * wait,
		Own:      pc.BlockSecs * o,
		Move:     pc.BlockSecs * k.moveWeight * k.MovePressure(c, f) * extra,
		Decode:   pc.BlockSecs * k.decodeWeight * c.Load.ActiveDecodeBlocks,
		Step:     pc.StepSecs,
		Requests: pc.StepSecs * (k.requestWeight*float64(c.Load.WaitingRequests) + k.runningWeight*float64(c.Load.ActiveRequests)),
	}
	if f.Future {
		p.Future = math.Max(0, k.FutureWait(req, c, f)-f.FutureMin)
	}
	if total := c.Load.KVBlocks; total > 0 && k.memoryWeight > 0 {
		reported := c.Load.KVUsage * total
		footprint := c.Load.ActiveDecodeBlocks
		need := float64(req.PromptBlocks) + req.ExpectedOutputBlocks
		if bound := reported + c.Load.ActivePrefillBlocks; reported > 0 && footprint > bound {
			// The footprint beyond the engine's report and the prefill
			// still to be allocated is blocks the engine holds once for
			// several requests or no longer holds (see KVRoute): not in
			// use, and the request's prefix cached on c may be those very
			// blocks, not charged twice.
			need -= math.Min(footprint-bound, math.Min(float64(c.Matched[index.TierGPU]), float64(req.PromptBlocks)))
			footprint = bound
		}
		used := math.Max(reported, footprint)
		p.Memory = pc.BlockSecs * k.memoryWeight * math.Max(0, used+need-(1-k.memoryReserve)*total)
		if k.memoryWait > 0 && len(c.Releases) > 0 && k.FluidWait(c) < k.StepBlocks(req) {
			// Short of memory and not prefill-bound: the request waits
			// for decodes to end (see KVRoute). Admission waits for
			// memory and prefill for the queue ahead, and the two overlap:
			// the memory wait counts beyond the queue's.
			alloc := math.Max(0, float64(req.PromptBlocks-c.Matched[index.TierGPU]))
			waiting := 0.0
			if n := c.Load.Requests(); n > 0 && c.Load.WaitingRequests > 0 {
				// Requests the engine holds waiting beyond the prefill
				// charged there (preempted ones, another router's), each
				// the size of a request in flight there.
				waiting = math.Max(0, float64(c.Load.WaitingRequests)*c.Load.ActiveDecodeBlocks/float64(n)-c.Load.ActivePrefillBlocks)
			}
			itl := c.Load.TokenInterval.Seconds()
			if !(itl > 0) {
				itl = pc.StepSecs
			}
			p.Memory = math.Max(p.Memory, k.memoryWait*(k.MemoryWait(c.Releases, used+alloc+waiting-total, itl)-p.Wait))
		}
	}
	return p
}

// MemoryWait is how long, in seconds, a replica whose KV cache is short of
// deficit blocks keeps a request waiting for them: the time until the
// decoding requests in rel (Candidate.Releases), one token a decode step
// (step seconds) each until their expected output, have freed that many
// blocks, the soonest first. It is 0 when nothing is short, and the last
// release when even all of rel does not cover the deficit (requests the
// ledger does not hold, another router's or without an expected output,
// free the rest: the wait is at least that). It sorts rel in place.
func (k *KVRoute) MemoryWait(rel []load.Release, deficit, step float64) float64 {
	if !(deficit > 0) || len(rel) == 0 {
		return 0
	}
	at := func(r load.Release) float64 {
		return math.Max(0, float64(r.Output)*step-r.Decoding.Seconds())
	}
	slices.SortFunc(rel, func(a, b load.Release) int { return cmp.Compare(at(a), at(b)) })
	freed := 0.0
	for _, r := range rel {
		if freed += r.Blocks; freed >= deficit {
			return at(r)
		}
	}
	return at(rel[len(rel)-1])
}

// FluidWait is the prefill, in blocks, a request placed on c waits behind
// on the router's fluid estimate: Candidate.Queued plus backlog_weight
// times the charged prefill that estimate does not account for
// (ActivePrefillBlocks beyond Candidate.QueuedCharge).
func (k *KVRoute) FluidWait(c Candidate) float64 {
	return c.Queued + k.backlogWeight*math.Max(0, c.Load.ActivePrefillBlocks-c.QueuedCharge)
}

// HoldsPrompt reports whether c holds the request's whole prompt, all but
// its last block, part of it in flight there (Candidate.Pending): the
// request is a sibling of one just sent there (a fan-out's or a GRPO
// group's sample), and computes little more than its last block there.
func HoldsPrompt(req Request, c Candidate) bool {
	return c.Pending > 0 && c.Pending+c.MatchedBlocks() >= req.PromptBlocks-1
}
