package policy

import "math"

// Fleet is what KVRoute's cost reads of the other candidates: the own
// prefill at the session's home and the fleet's pressure.
type Fleet struct {
	// HomeOwn is the request's own uncached prefill, in blocks, at its
	// session's eligible home replica, or for a sibling in a burst at a
	// holder of its whole prompt (Sibling), or for a continuation at the
	// one replica holding its history (Continuation); +Inf without any (no
	// move charge).
	HomeOwn float64
	// Pressure is busy/(1-busy) capped at move_pressure_max, busy being
	// the share of eligible candidates with prefill queued or requests
	// waiting.
	Pressure float64
	// PrefillRate and DecodeStep (seconds) stand in for a candidate's own
	// learned figures while it has none: the mean of the eligible
	// candidates' learned ones, else the policy's prefill_rate and
	// decode_step.
	PrefillRate, DecodeStep float64
	// BlockTokens is the request's block size in tokens (Request.BlockSize,
	// else the prompt's tokens per block, else 16).
	BlockTokens float64
	// Future is set when the request's later turns are charged (a new
	// session with Request.Future.Turns > 0 and future_weight > 0);
	// FutureMin is then the least of the eligible candidates' raw future
	// charges (FutureWait), which every candidate's charge is taken
	// against.
	Future    bool
	FutureMin float64
	// Spread is set for a request of a burst in the spread regime (see
	// KVRoute): no move charge, no in-flight credit, and only holders of
	// its prompt or candidates starting it within CarrierDone seconds (the
	// first holder's fluid queue) are allowed. Fluid charges every
	// candidate's wait on its fluid queue (Candidate.Queued): a spread
	// request, or one whose prompt no candidate holds, in the regime.
	Spread, Fluid bool
	CarrierDone   float64
	// CommonBlocks are the prompt blocks every eligible candidate holds
	// (the least of their MatchedBlocks): a prefix held fleet-wide, such
	// as a system prompt every replica has cached, keeps the request on
	// none of them.
	CommonBlocks float64
	// MinFill is the least reported KV cache fill (Load.KVUsage) of the
	// eligible candidates (0 without reports): the room the fleet has.
	MinFill float64
	// Sibling is set when HomeOwn is not a home's but a holder's: the
	// request has no home and a candidate holds its whole prompt, part of
	// it in flight (a sibling of a request just sent there), and it is
	// keyless or its burst fills the fleet; HomeOwn is then the least own
	// prefill of such a holder with all it holds credited, and a holder
	// pays no move charge.
	Sibling bool
}

// FleetOf computes the fleet figures for the request over cands, where
// credited reports whether a candidate keeps its cache credit (the load
// bound); nil credits every candidate.
func (k *KVRoute) FleetOf(req Request, cands []Candidate, credited func(Candidate) bool) Fleet {
	f := Fleet{HomeOwn: math.Inf(1), PrefillRate: k.prefillRate, DecodeStep: k.decodeStep, BlockTokens: blockTokens(req)}
	busy, n := 0, 0
	stepSum, stepN := 0.0, 0
	if r, ok := learnedPrefillRate(cands); ok {
		f.PrefillRate = r
	}
	f.CommonBlocks = math.Inf(1)
	f.MinFill = math.Inf(1)
	for _, c := range cands {
		if !eligible(c) {
			continue
		}
		n++
		f.CommonBlocks = math.Min(f.CommonBlocks, float64(c.MatchedBlocks()))
		f.MinFill = math.Min(f.MinFill, math.Max(0, c.Load.KVUsage))
		if d := c.Load.DecodeStep.Seconds(); d > 0 {
			stepSum += d
			stepN++
		}
		if c.Home {
			hit := 0.0
			if credited == nil || credited(c) {
				hit = k.HitBlocks(req, c)
			}
			f.HomeOwn = own(req, hit)
		}
		if c.Load.ActivePrefillBlocks > 0 || c.Load.WaitingRequests > 0 {
			busy++
		}
	}
	if stepN > 0 {
		f.DecodeStep = stepSum / float64(stepN)
	}
	if n == 0 {
		f.CommonBlocks, f.MinFill = 0, 0
		return f
	}
	keyless := req.SessionKey == ""
	if math.IsInf(f.HomeOwn, 1) && (keyless || inBurst(req, n)) {
		// A sibling: a holder's own prefill stands for the home's, for a
		// keyless request always, for a new session's once its burst
		// fills the fleet (the queues are summed only when a holder
		// exists).
		held := math.Inf(1)
		for _, c := range cands {
			if eligible(c) && HoldsPrompt(req, c) && (credited == nil || credited(c)) {
				held = math.Min(held, own(req, float64(c.MatchedBlocks()+c.Pending)))
			}
		}
		if !math.IsInf(held, 1) && (keyless || k.fleetFilling(req, cands, n)) {
			f.Sibling, f.HomeOwn = true, held
		}
	}
	if math.IsInf(f.HomeOwn, 1) {
		if o, ok := k.Continuation(req, cands, credited); ok {
			f.HomeOwn = o
		}
	}
	if req.Future.Turns > 0 && k.futureWeight > 0 {
		f.Future, f.FutureMin = true, math.Inf(1)
		for _, c := range cands {
			if eligible(c) {
				f.FutureMin = math.Min(f.FutureMin, k.FutureWait(req, c, f))
			}
		}
	}
	b := float64(busy) / float64(n)
	if b >= 1 {
		f.Pressure = k.movePressureMax
	} else {
		f.Pressure = math.Min(k.movePressureMax, b/(1-b))
	}
	k.spreadRegime(req, cands, &f)
	return f
}

// A continuation's prompt shares (see KVRoute): its holder has at least
// continuationShare of the prompt's blocks indexed, and no other candidate
// has sharedShare of them, indexed or in flight.
const (
	continuationShare = 0.9
	sharedShare       = 0.5
)

// Continuation reports whether a request without a home is a
// conversation's continuation among cands (see KVRoute), and its own
// prefill, in blocks, at the one candidate holding its history,
// everything it holds there credited. credited, when not nil, says which
// candidates keep their cache credit (the load bound): one that does not
// is no holder. A candidate holding the whole prompt with part of it in
// flight (HoldsPrompt) is a burst's sibling's holder, not a
// continuation's.
func (k *KVRoute) Continuation(req Request, cands []Candidate, credited func(Candidate) bool) (float64, bool) {
	if req.PromptBlocks < 2 {
		return 0, false
	}
	p := float64(req.PromptBlocks)
	holder := -1
	for i, c := range cands {
		if !eligible(c) {
			continue
		}
		if c.Home {
			return 0, false // a session with a home moves from there
		}
		if float64(c.MatchedBlocks()+c.Pending) < sharedShare*p {
			continue
		}
		if holder >= 0 {
			return 0, false // a prefix two replicas hold half of is shared
		}
		holder = i
	}
	if holder < 0 {
		return 0, false
	}
	c := cands[holder]
	if (credited != nil && !credited(c)) || HoldsPrompt(req, c) || float64(c.MatchedBlocks()) < continuationShare*p {
		return 0, false
	}
	return own(req, k.hitBlocks(req, c, false)), true
}

// spreadRegime sets f's spread regime figures for the request (see
// KVRoute): Fluid below spread_util for a request whose prompt no
// candidate holds, and the spread of a burst's request.
func (k *KVRoute) spreadRegime(req Request, cands []Candidate, f *Fleet) {
	if k.spreadUtil == 0 {
		return
	}
	below := req.SpreadUtil > 0 && req.SpreadUtil < k.spreadUtil
	p := float64(req.PromptBlocks)
	cold, holder, free := true, false, 0
	for _, c := range cands {
		if c.Pending > 0 || c.MatchedBlocks() > 0 {
			cold = false
		}
		if !eligible(c) {
			continue
		}
		if p >= 2 && float64(c.Pending) >= p-1 {
			holder = true
		}
		if c.Pending == 0 {
			free++
		}
	}
	if below && cold && req.Siblings >= 1 {
		f.Fluid = true
	}
	keyed := req.Parallel && !math.IsInf(f.HomeOwn, 1)
	if !holder || (!keyed && req.SessionKey != "") || float64(free) < 1+req.Siblings-1e-9 {
		return
	}
	switch {
	case keyed && req.BurstSpread:
	case keyed && req.BurstPlaced != 1:
		return
	case !below:
		return
	}
	f.Spread, f.Fluid = true, true
	f.HomeOwn, f.Sibling = math.Inf(1), false
	f.CarrierDone = math.Inf(1)
	for _, c := range cands {
		if eligible(c) && c.Pending > 0 {
			f.CarrierDone = math.Min(f.CarrierDone, k.Pace(c, *f).BlockSecs*k.FluidWait(c))
		}
	}
}

// LoadBound is the request count at or above which a candidate other than
// the session's home earns no cache credit: max(load_bound_min,
// ceil(c*(T+1)/N)) with T the eligible candidates' running plus waiting
// requests and N their number. It is +Inf when the bound is off or no
// candidate is eligible.
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

// Held returns the candidates a request of a burst is held on (see
// KVRoute): the holders of its prompt, among the eligible candidates
// allowed admits (nil: all), whose fluid wait is at most the least fluid
// wait plus own prefill of a candidate without the prompt, when every
// such candidate has a step (StepBlocks) or more of fluid wait (the burst
// fills the fleet) or the request has no home and is in a burst, or its
// prefix drew one before (homelessInBurst). It returns nil when the hold
// does not apply: a spread burst's request (f.Spread), no holder, a
// candidate without the prompt with less than a step queued for a request
// with a home or outside a burst, or no holder within that bound.
func (k *KVRoute) Held(req Request, cands []Candidate, f Fleet, allowed func(Candidate) bool) func(Candidate) bool {
	if f.Spread || req.PromptBlocks < 2 {
		return nil
	}
	ok := func(c Candidate) bool { return eligible(c) && (allowed == nil || allowed(c)) }
	step := k.StepBlocks(req)
	done, holder, room := math.Inf(1), false, false
	for _, c := range cands {
		if !ok(c) {
			continue
		}
		if HoldsPrompt(req, c) {
			holder = true
			continue
		}
		w := k.FluidWait(c)
		room = room || w < step
		done = math.Min(done, w+float64(req.PromptBlocks-c.MatchedBlocks()))
	}
	// A request without a home in a burst is held whatever room the
	// fleet's next step has: the burst's later requests take that room.
	if !holder || (room && !homelessInBurst(req, cands)) {
		return nil
	}
	in := func(c Candidate) bool { return ok(c) && HoldsPrompt(req, c) && k.FluidWait(c) <= done }
	for _, c := range cands {
		if in(c) {
			return in
		}
	}
	return nil
}

// Herding returns whether a candidate is herding the request's prefix:
// it is not the session's home, the prefix that draws the request
// (Candidate.PrefixShare) has had at least 2N recent placements, N the
// eligible candidates, and the candidate took prefix_share_bound times its
// share of the eligible candidates' prefill speed (1/N on identical
// replicas) or more of their prompt blocks, each speed as Pace prices it (a candidate
// that has learned none counts at f.PrefillRate, else at prefill_rate).
// It is false for every candidate when the bound is off.
func (k *KVRoute) Herding(req Request, cands []Candidate, f Fleet) func(Candidate) bool {
	n, total := 0, 0.0
	for _, c := range cands {
		if eligible(c) {
			n++
			total += k.rate(c, f)
		}
	}
	if k.prefixShareBound == 0 || n < 2 || !inBurst(req, n) {
		return func(Candidate) bool { return false }
	}
	// A candidate's fair share of the burst is its share of the fleet's
	// prefill speed: 1/N on identical replicas, twice that on one twice as
	// fast as the rest.
	return func(c Candidate) bool {
		return !c.Home && c.PrefixShare >= k.prefixShareBound*k.rate(c, f)/total
	}
}

// fleetFilling reports whether the n eligible candidates' queued prefill
// on the router's fluid estimate (FluidWait) comes to half an engine step
// (StepBlocks) a replica or more: a burst has filled the fleet's next
// steps half way.
func (k *KVRoute) fleetFilling(req Request, cands []Candidate, n int) bool {
	q := 0.0
	for _, c := range cands {
		if eligible(c) {
			q += k.FluidWait(c)
		}
	}
	return q >= float64(n)*k.StepBlocks(req)/2
}

// inBurst reports whether the request is part of a burst on a fleet of n
// eligible candidates: the prefix that draws it had 2n or more recent
// placements (Request.PrefixPlacements).
func inBurst(req Request, n int) bool { return req.PrefixPlacements >= burstPlacements(n) }

// burstPlacements is how many recent placements of one prefix make a
// burst on a fleet of n eligible candidates: 2n.
func burstPlacements(n int) float64 { return float64(2 * n) }

// passedOver reports whether an eligible herding candidate was cheaper
// than the pick.
func passedOver(cands []Candidate, costs []float64, pick int, herding func(Candidate) bool) bool {
	for i, c := range cands {
		if eligible(c) && herding(c) && costs[i] < costs[pick] && !floatEq(costs[i], costs[pick]) {
			return true
		}
	}
	return false
}

// boundChanged reports whether the pick would have been another,
// over-bound candidate had the bound not taken its credit: the bound, not
// the prediction alone, decided.
func (k *KVRoute) boundChanged(req Request, cands []Candidate, pick int, pickCost float64, credited func(Candidate) bool) bool {
	var f *Fleet
	for i, c := range cands {
		if i == pick || !eligible(c) || credited(c) || k.HitBlocks(req, c) == 0 {
			continue
		}
		if f == nil {
			ff := k.FleetOf(req, cands, nil)
			f = &ff
		}
		if v := k.Predict(req, c, k.HitBlocks(req, c), *f).Total(); v < pickCost && !floatEq(v, pickCost) {
			return true
		}
	}
	return false
}

// homelessInBurst reports whether the request has no home among the
// eligible candidates and is part of a burst on them (inBurst), or its
// prefix drew such a burst before (Request.PrefixBurst 2N or more): a
// burst's first requests are placed before its count reaches 2N, and the
// prefix's last burst tells what is coming.
func homelessInBurst(req Request, cands []Candidate) bool {
	n := 0
	for _, c := range cands {
		if !eligible(c) {
			continue
		}
		if c.Home {
			return false
		}
		n++
	}
	return inBurst(req, n) || req.PrefixBurst >= burstPlacements(n)
}
