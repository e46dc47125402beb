package route

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/pkg/policy"
)

// ReasonSessionRound marks a decision whose pick the round of sessions of
// unknown future changed (see Router.sessionRound).
const ReasonSessionRound = "session_round"

// ReasonSessionBalance marks a decision whose pick the balance of growing
// sessions changed (see Router.sessionRound).
const ReasonSessionBalance = "session_balance"

// ReasonSessionReplicate marks a decision that started a session away
// from its crowded prefix holder, copying the prefix to a second replica
// (see Router.sessionRound).
const ReasonSessionReplicate = "session_replicate"

// A prefix's holder is crowded (see Router.sessionRound) when its living
// sessions (policy.Candidate.Sessions) come to SessionCrowdRatio times its
// fair share of the healthy candidates' living sessions or more (its
// share of their prefill speed: 1/N on identical replicas), and to at
// least SessionCrowdExcess more than the fewest any has.
const (
	SessionCrowdRatio  = 1.5
	SessionCrowdExcess = 2
)

// futurePricer is a policy that can place a new session by what its later
// turns will cost where it lives (policy.KVRoute, unless its future_weight
// is 0).
type futurePricer interface {
	PricesFuture() bool
}

// pricesFuture reports whether p prices a new session's later turns.
func pricesFuture(p policy.Policy) bool {
	fp, ok := p.(futurePricer)
	return ok && fp.PricesFuture()
}

// sessionRound places a request that starts a session (a session key, no
// home) on a replica that has fewer sessions than the policy's pick, for a
// policy that prices a new session's future, in three cases:
//
//   - a session of unknown future (sessionBook.round: none of its key
//     kind's sessions came back yet), kept off the replicas that took more
//     of its kind's sessions than the fewest any took (reason
//     session_round);
//   - a growing session (header or user key, its later turns predicted to
//     add more history, Future.Turns times Future.Blocks, than the prefix
//     the pick holds beyond the alternative), kept off the replicas with
//     more living sessions (Candidate.Sessions) than the fewest any has
//     (reason session_balance);
//   - any other session of those keys whose pick is crowded (living
//     sessions SessionCrowdRatio times its fair share or more, and
//     SessionCrowdExcess more than the fewest), kept off the replicas
//     with more living sessions than the fewest, busy or not (reason
//     session_replicate).
//
// res is the policy's pick among all candidates, kept when it has the
// fewest, else the policy is asked again among those of them that are idle
// (nothing running, waiting or queued; any of them for session_replicate),
// and its pick there taken if the policy's cost puts it no further off
// than the prefill of the prefix the first pick holds beyond it (costs
// reported are the first pick's, every candidate's).
//
// Nothing predicts what a session of unknown future brings, and the
// policy's cost then sees only the shared prefix it would find on the
// replicas holding it: every new session of a fleet's first minutes
// (agents sharing a harness prompt) goes to its holder, and they pack
// there, their later turns queueing behind each other's, their histories
// filling one replica's cache. Spread one per replica instead, a session
// costs at most one prefill of its shared prefix on a replica that was not
// using it, and the round ends after one session per replica: the prefix
// is then held everywhere and no longer tips the cost, or the kind's
// sessions came back and their prediction takes over.
//
// That prediction prices the queueing a session's turns meet and bring
// (policy.KVRoute's future charge), not the cache its history will take:
// a session lives where it starts, and what it saves there once (the
// shared prefix) is smaller than what its history will add to that
// replica's cache. Agent sessions that start at 3-7k tokens and grow to
// 70-125k packed four to a replica on the prefix's holder while the
// fleet's other replicas had none; with half the KV cache (8 replicas of
// 3,072 blocks of 64 tokens) their histories no longer fit there, and
// their late turns waited for memory or moved, re-prefilling 70-80k
// tokens elsewhere (agents at 0.8: p99 time to first token 1.93 s against
// session affinity's 0.78; balanced 0.50 s). A chat session, whose few
// short turns add less than the system prompt it would leave, stays with
// the prompt's holder: spread, the prompt's prefill would be its first
// turn's wait for nothing it gets back (chat at 6 replicas, 0.5: p99
// 0.068 -> 0.074 s without the growth test; docs/benchmarks.md, "Growing
// sessions, and the memory term's weight again"). Conversation keys are
// neither: such a key comes from a history, so its request is a later
// turn whatever the router saw of its first (let into the balance,
// agentic at 16 replicas, 0.5, lost 37 % of its p99).
//
// A session that stays with its prompt decides alone, and each new one
// finds the prompt's holder the cheaper start: its own turns queue there a
// few milliseconds longer, less than a cold prefill of the prompt
// elsewhere. But every new session drawn by that prompt decides the same,
// so a holder of two popular prompts takes all their sessions: chat's four
// system prompts at 4 replicas, 0.95, one seed, put 1,143 of 2,130 requests
// on one replica (mean time to first token there 0.042 s against 0.032 s
// elsewhere; on ten seeds the busiest replica took up to 48 % of a run).
// Once the holder is crowded, a session starting there goes where the
// fewest sessions live, busy or idle, within one prefill of the prefix
// (reason session_replicate): that prefill copies the prompt, and the cost
// then splits the prompt's later sessions between its two holders (33 % at
// most on those seeds; chat's p99 at 4, 8 and 16 replicas, three sets of
// five seeds, 0.5-0.95: median 2.5 % lower, lower in 21 of 27 medians;
// docs/benchmarks.md, "A crowded prefix holder").
func (r *Router) sessionRound(sc *scratch, now time.Time, key string, res policy.Result, preq policy.Request, primary int) policy.Result {
	if !r.future {
		return res
	}
	sc.starts = slices.Grow(sc.starts[:0], len(sc.cands))[:len(sc.cands)]
	reason, growth := ReasonSessionRound, math.Inf(1)
	switch {
	case preq.Future.Turns == 0:
		if !r.book.round(now, key, sc.cands, sc.starts) {
			return res
		}
	case key != "" && keyKind(key) != kindConv:
		reason, growth = ReasonSessionBalance, preq.Future.Turns*preq.Future.Blocks
		for k, c := range sc.cands {
			sc.starts[k] = float64(c.Sessions.Sessions)
		}
	default:
		return res
	}
	least := math.Inf(1)
	for k, c := range sc.cands {
		if c.Load.Healthy {
			least = math.Min(least, sc.starts[k])
		}
	}
	out, moved := r.startAway(sc, res, preq, primary, reason, growth, least)
	if moved || reason != ReasonSessionBalance || !crowded(sc, res.Pick, least) {
		return out
	}
	out, _ = r.startAway(sc, res, preq, primary, ReasonSessionReplicate, growth, least)
	return out
}

// crowded reports whether candidate p has SessionCrowdRatio times its fair
// share of the healthy candidates' living sessions (sc.starts) or more,
// and SessionCrowdExcess more than the fewest (least).
func crowded(sc *scratch, p int, least float64) bool {
	if !sc.cands[p].Load.Healthy || sc.starts[p] < least+SessionCrowdExcess {
		return false
	}
	sessions, speed := 0.0, 0.0
	for k, c := range sc.cands {
		if c.Load.Healthy {
			sessions += sc.starts[k]
			speed += sc.rates[k]
		}
	}
	return speed > 0 && sc.starts[p] >= SessionCrowdRatio*sessions*sc.rates[p]/speed
}

// startAway is sessionRound's move for reason: res's pick kept when it
// has the fewest sc.starts (least), else the policy's pick among those
// with the fewest (idle ones only, but for session_replicate) taken when
// the prefix res's pick holds beyond it is no more than growth
// (session_replicate: more than growth, the sessions the balance leaves
// with their prefix) and its cost is within that prefix's prefill. moved
// reports whether it changed the pick.
func (r *Router) startAway(sc *scratch, res policy.Result, preq policy.Request, primary int, reason string, growth, least float64) (policy.Result, bool) {
	busy := reason == ReasonSessionReplicate
	// Only an idle replica (nothing running, waiting or queued): the
	// session invests capacity nobody is using, never queues behind
	// others. A crowded holder's session goes to the fewest sessions
	// busy or not: the queue it meets there is in its cost.
	in := func(k int) bool {
		l := sc.cands[k].Load
		return l.Healthy && sc.starts[k] < least+0.5 && (busy || l.Requests() == 0 && l.ActivePrefillBlocks == 0)
	}
	if sc.starts[res.Pick] < least+0.5 {
		return res, false
	}
	sc.sub, sc.subIdx = sc.sub[:0], sc.subIdx[:0]
	for k := range sc.cands {
		if in(k) {
			sc.sub = append(sc.sub, sc.cands[k])
			sc.subIdx = append(sc.subIdx, k)
		}
	}
	if len(sc.sub) == 0 {
		return res, false
	}
	sub := r.opts.Policy.Pick(preq, sc.sub, policy.Env{Rand: r.rand})
	if sub.Pick < 0 || sub.Pick >= len(sc.sub) {
		return res, false
	}
	k := sc.subIdx[sub.Pick]
	held := float64(sc.cands[res.Pick].MatchedBlocks() - sc.cands[k].MatchedBlocks())
	if (held > growth) != busy {
		return res, false
	}
	// Only the shared prefix's prefill: a pick the policy's cost puts
	// further off than the prefix the first pick holds beyond it, at k's
	// prefill speed, would wait behind a queue, not invest idle capacity.
	if res.Costs != nil && sc.rates[k] > 0 {
		saved := held * float64(primary) / sc.rates[k]
		if extra := res.Costs[k] - res.Costs[res.Pick]; !(extra <= saved*(1+1e-9)) {
			return res, false
		}
	}
	res.Pick, res.Reason, res.Spread = k, reason, sub.Spread
	return res, true
}
