package policy

import (
	"math"
	"math/rand/v2"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

// Candidate is one replica a request may go to.
type Candidate struct {
	Replica index.ReplicaID
	// Matched counts the request's leading blocks the replica holds, by the
	// best tier holding each (index.ReplicaMatch.ByTier).
	Matched [index.NumTiers]int
	// Trust is how far the router's view of the replica's cache is to be
	// believed, in [0, 1]: 0 while the replica is resyncing (its index view
	// is known to be incomplete), below 1 when its served cache hits fall
	// short of predicted ones. It scales every cache credit the candidate
	// earns.
	Trust float64
	Load  load.Load
	// Home marks the replica that served the previous request of the
	// request's session (route's session memory); false when the request
	// has no session key or the session is new. Only kvroute reads it: its
	// load bound never takes a session's credit at home.
	Home bool
	// Pending counts blocks beyond Matched that are in flight to the
	// replica: the router just sent a request with that longer prefix
	// there (route's Options.Pending) and its prefill has not finished, so
	// they are not held yet and may be computed only after whatever is
	// queued ahead of them. Only kvroute reads it (see KVRoute); 0 when
	// the router keeps no such memory.
	Pending int
	// Footprint is the replica's cached footprint (for instance the blocks
	// it holds in the router's index); 0 when unknown. Only prefixaffinity
	// reads it: its low-match branch prefers the smallest footprint and
	// falls back to Load.KVUsage when no candidate reports a Footprint.
	Footprint float64
	// PrefixShare is the replica's share of the router's recent
	// placements of requests drawn by the same prefix as this one (the
	// longest indexed match any candidate has for it; route's prefix
	// memory), each weighed by its prompt's blocks, in [0, 1]; 0 without
	// one. Only kvroute reads it, with
	// Request.PrefixPlacements (see KVRoute's prefix share bound).
	PrefixShare float64
	// Sessions is the replica's committed session load: the sessions
	// living there (route's session book: their latest request went there
	// within a few of their inter-turn gaps) and the turns they are
	// predicted to bring. Zero without such memory. Only kvroute reads it,
	// with Request.Future.
	Sessions SessionLoad
	// Queued is route's fluid estimate of the replica's prefill queue, in
	// blocks: the uncached blocks the router sent there, drained at the
	// replica's prefill speed since. Unlike Load.ActivePrefillBlocks (a
	// request's charge, held until its first token) it does not count
	// prefill already done. Only kvroute reads it: in its spread regime
	// (see KVRoute), which Request.SpreadUtil from the same router arms,
	// and as the wait of a fresh queue (one it holds more of than the
	// backlog weight's share of the charge) at a session's home and at a
	// candidate holding no more of the prompt than every candidate does.
	// At the pick, capped by Load.ActivePrefillBlocks, it is also what the
	// router tells its rate learner was queued ahead of the request
	// (route.Decision.QueuedTokens).
	Queued float64
	// QueuedCharge is the part of Load.ActivePrefillBlocks that Queued
	// accounts for: the uncached blocks of the requests the router sent
	// there that its fluid estimate has not finished. The rest of the
	// charged prefill (another router's requests, or requests the estimate
	// drained too soon) is prefill Queued does not know of.
	QueuedCharge float64
	// Releases are the requests the router sent to the replica that are
	// decoding (load.Tracker's ledger): the KV blocks each frees when it
	// ends, and how far it has got. Route fills it only where the
	// replica's free KV blocks may not hold the request (see
	// KVRoute.MemoryWait); nil otherwise. Only kvroute reads it.
	Releases []load.Release
}

// SessionLoad is a replica's committed future work: the predicted turns of
// the sessions living there, which its instantaneous load misses while
// they think or wait on tools.
type SessionLoad struct {
	// Rate is their turns per second (each session's turn rate, 1 over its
	// mean inter-turn gap, times the chance it comes back).
	Rate float64
	// Blocks is their uncached prefill blocks per second (each session's
	// rate times its mean uncached blocks per turn).
	Blocks float64
	// BlocksSq is each session's rate times the mean square of its
	// uncached blocks per turn, summed: with a pace b seconds per block,
	// b²·BlocksSq is the sum of rate × E[service²] queueing formulas read.
	BlocksSq float64
	// Sessions is how many sessions live there.
	Sessions int
}

// Future is what the request's session is predicted to bring over its
// later turns, when the request has a session key but no home (a new
// session): route's session book learns it from the sessions that
// started on the same prefix (and of the same key kind) before.
type Future struct {
	// Turns is the expected number of later turns (0: none expected, a
	// one-shot request).
	Turns float64
	// Blocks and BlocksSq are the mean and mean square of a later turn's
	// uncached prefill blocks.
	Blocks, BlocksSq float64
}

// MatchedBlocks is the replica's matched prefix length over all tiers.
func (c Candidate) MatchedBlocks() int {
	n := 0
	for _, m := range c.Matched {
		n += m
	}
	return n
}

// Request is what a policy knows of the request being placed.
type Request struct {
	// PromptBlocks is the number of full blocks of the prompt.
	PromptBlocks int
	// PromptTokens is the prompt length in tokens.
	PromptTokens int
	// SessionKey is the session affinity key (x-session-id), if any.
	SessionKey string
	// ExpectedOutputBlocks estimates the blocks the request will decode
	// (its max_tokens, or the mean output of recent requests that carried
	// the same max_tokens: route's Rates.ExpectOutput); 0 when unknown.
	ExpectedOutputBlocks float64
	// BlockSize is the block size of PromptBlocks, in tokens; 0 when
	// unknown (kvroute then takes PromptTokens/PromptBlocks).
	BlockSize int
	// PrefixPlacements counts the router's recent placements of requests
	// drawn by the same prefix, each halved per second of age (route's
	// PrefixShareHalfLife); 0 when none or unknown. See
	// Candidate.PrefixShare.
	PrefixPlacements float64
	// PrefixBurst is the largest PrefixPlacements the prefix reached,
	// halved per ten minutes of age (route's PrefixBurstHalfLife): the
	// largest burst it drew lately, remembered once that burst is over;
	// 0 when none or unknown. Only kvroute reads it (see KVRoute's hold).
	PrefixBurst float64
	// Future is what the request's session is predicted to bring over its
	// later turns when it has no home yet (see Future); zero otherwise.
	Future Future
	// Parallel marks a request sent within route's MinSessionGap of its
	// session's latest turn (a fan-out sibling, one of n samples): its
	// session's home is the replica the previous request of its burst
	// went to.
	Parallel bool
	// Siblings is how many more requests of the request's burst (requests
	// of one session, or without a session key of one prompt, sent within
	// route's MinSessionGap) are expected after it: for a parallel
	// request, from the bursts of its session's start class (its key
	// kind's until the class has one), less those already placed; for a
	// session's first request, its class's mean burst size less one;
	// without a session key, from the router's earlier bursts of such
	// requests, less the holders of its prompt in flight and itself. 0
	// otherwise.
	Siblings float64
	// BurstPlaced is, for a parallel request, how many requests of its
	// burst were placed before it; BurstSpread reports that kvroute spread
	// the burst's second request (Result.Spread), which its later requests
	// follow.
	BurstPlaced int
	BurstSpread bool
	// SpreadUtil is the fleet's recent prefill utilization as if every
	// request were computed where its prompt is best indexed (in-flight
	// prefixes not counted, so each sibling of a burst counts its whole
	// prompt): route's work meter, the uncached blocks its decisions sent
	// over the last ten seconds or so, over the eligible candidates'
	// prefill capacity. 0 without one.
	SpreadUtil float64
}

// Env is what a policy may use besides its inputs: injected randomness, so
// that decisions are reproducible under a seed.
type Env struct {
	// Rand breaks ties and drives the random choices. It must be safe for
	// the caller's concurrency. Nil means the runtime's global source
	// (concurrency-safe, not reproducible).
	Rand *rand.Rand
}

// Result is a policy's decision.
type Result struct {
	// Pick is the index of the chosen candidate, or -1 when none is eligible.
	Pick int
	// Reason is a short machine-readable reason ("cost", "least_load",
	// "imbalanced", "cold_index", "session", ...).
	Reason string
	// Costs holds, per candidate, the policy's score (lower is better for
	// cost-based policies; NaN for ineligible candidates). May be nil for
	// policies without a per-candidate score.
	Costs []float64
	// Spread reports that kvroute spread a burst's request (see KVRoute's
	// spread regime); for the burst's second request, the router has its
	// later requests follow.
	Spread bool
}

// Pacer is implemented by a policy that prices prefill in time (kvroute):
// route drains its fluid queues (Candidate.Queued) and sums the fleet's
// prefill capacity (Request.SpreadUtil) at the speeds the policy assumes,
// so a replica with nothing learned yet has one fallback, the policy's.
type Pacer interface {
	// PrefillRates returns dst (reused when long enough) with
	// dst[i] cands[i]'s prefill speed, uncached tokens per second.
	PrefillRates(dst []float64, cands []Candidate) []float64
}

// ReadsReleases reports whether p reads Candidate.Releases (kvroute with
// memory_wait on): a router keeps the decoding ledger and fills them only
// for a policy that does.
func ReadsReleases(p Policy) bool {
	r, ok := p.(interface{ WeighsReleases() bool })
	return ok && r.WeighsReleases()
}

// PrefillRates returns dst (reused when long enough) with dst[i] cands[i]'s
// prefill speed, uncached tokens per second: its learned
// Load.PrefillRate, else the mean of the eligible candidates' learned
// ones, else fallback. It is KVRoute's pace (see KVRoute.Pace), and route's
// for a policy that is not a Pacer, with kvroute's default prefill_rate.
func PrefillRates(dst []float64, cands []Candidate, fallback float64) []float64 {
	if cap(dst) < len(cands) {
		dst = make([]float64, len(cands))
	}
	dst = dst[:len(cands)]
	mean, ok := learnedPrefillRate(cands)
	if !ok {
		mean = fallback
	}
	for i, c := range cands {
		dst[i] = prefillRateOr(c, mean)
	}
	return dst
}

// prefillRateOr is c's learned prefill speed, or mean while it has none.
func prefillRateOr(c Candidate, mean float64) float64 {
	if r := c.Load.PrefillRate; validRate(r) {
		return r
	}
	return mean
}

// validRate reports whether r is a usable speed: positive and finite.
func validRate(r float64) bool { return r > 0 && !math.IsInf(r, 0) }

// learnedPrefillRate is the mean of the eligible candidates' learned
// prefill speeds; ok is false when none has one.
func learnedPrefillRate(cands []Candidate) (float64, bool) {
	sum, n := 0.0, 0
	for _, c := range cands {
		if r := c.Load.PrefillRate; eligible(c) && validRate(r) {
			sum += r
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// Policy picks a replica for a request. Implementations are pure apart from
// explicit state documented on the type (a round-robin counter, a hash ring):
// time and randomness come in through Env.
type Policy interface {
	Name() string
	Pick(req Request, cands []Candidate, env Env) Result
}
