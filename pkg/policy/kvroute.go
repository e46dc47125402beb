package policy

import (
	"math"

	"github.com/kvroute/kvroute/pkg/index"
)

// KVRoute is kvroute's own policy and the router's default. It predicts,
// for each candidate, what placing the request there costs, in seconds,
// and picks the lowest. Work is counted in prompt blocks and turned into
// time with the candidate's pace: b seconds per block (the block size over
// the replica's prefill speed) and s seconds per decode step, both learned
// online per replica from the requests it served (Load.PrefillRate and
// Load.DecodeStep, see route.Rates); a replica with nothing learned yet
// takes the mean of the candidates that have, else the policy's
// prefill_rate and decode_step.
//
//	hit     = min(max_hit, gpu + cpu*host_cache_hit_weight + disk*disk_cache_hit_weight + inflight) * Candidate.Trust
//	inflight = min(pending, max_hit - matched blocks)   the prefix in flight there (InFlightCredit)
//	max_hit = the prompt's full blocks but the one holding its last token   (MaxHitBlocks)
//	own     = max(0, prompt_blocks - hit)              the request's own uncached prefill
//	wait    = backlog_weight*active_prefill_blocks     prefill queued ahead of it; with inflight > 0:
//	          backlog_weight*max(0, active_prefill_blocks - pending) + min(active_prefill_blocks, pending);
//	          at the session's home or a candidate holding no more of the prompt than
//	          every candidate does, at least
//	          min(active_prefill_blocks, FluidWait)      (a fresh queue, see below)
//	extra   = own - own at the session's home          history this placement re-prefills (0 at home, or without one;
//	          a sibling in a burst: own - own at a holder of its whole prompt, 0 at a holder)
//	move    = move_weight * pressure * extra          what that extra work makes everyone else wait;
//	          pressure = fleet_pressure, or with move_fill > 0 (off by default)
//	          max(fleet_pressure, move_fill*(u - least u)/(1 - u)), u a KV cache's
//	          reported fill, capped at move_pressure_max (MovePressure)
//	memory  = memory_weight * overflow                 KV blocks the placement would make the engine preempt;
//	          with memory_wait w > 0, where the KV cache is short and no step of prefill is
//	          queued, at least w*(MemoryWait - b*wait)     (seconds) decodes running there take to free the blocks
//	future  = FutureWait(candidate) - least FutureWait of the eligible candidates
//	          (a new session's later turns; seconds; 0 without Request.Future)
//	cost    = b*(wait + own + move + memory + decode_weight*active_decode_blocks)
//	          + s*(1 + request_weight*waiting + running_weight*running requests) + future
//
// b*(wait + own) + s is the request's own time to first token on the
// candidate: its prefill behind what is queued, and the step that samples
// the first token. The router charges a request's uncached blocks to the
// replica's active prefill until its first token, so on average half of
// the charged backlog is already computed when the next request looks
// (backlog_weight 0.5). A fresh backlog is not: a 90k-token document sent
// a moment ago is charged like one nearly computed, and the engine runs
// its chunks, step after step, ahead of a request sent behind it. The
// router's fluid estimate of the queue (FluidWait: Candidate.Queued, what
// it sent there drained at the learned speed since) tells them apart, so
// where it holds more than backlog_weight of the charge the wait is the
// estimate, never more than the charge: at the session's home, whose
// leaving the move charge prices, and at a candidate holding none of the
// prompt, or none beyond what every eligible candidate holds
// (Fleet.CommonBlocks: a system prompt cached fleet-wide). At another
// holder of the prompt it stays backlog_weight of the charge: a request
// without a home is charged nothing for the cache it leaves, and the
// trace's later requests, keyed afresh, left the replicas holding their
// history behind fresh queues (hit/ceiling 0.95 -> 0.83 at 4 replicas,
// 0.5, with the estimate there too). A prefix every candidate holds is
// left behind nowhere, and there the discount only hid fresh queues: on
// the herding bait (every request a 2k-token system prompt all replicas
// hold and a 1-6k-token body) a request went to the replica whose charge
// was mostly a document sent a moment before, 0.13 s of predicted wait
// against 0.24 s waited, behind a replica whose queue was all but
// drained; its p99 lost to round robin's by 5.3 % at 4 replicas, 0.5, and
// by 1.6 % with the fresh queue waited for there (medians of seeds 1-5;
// one such decision printed, docs/benchmarks.md, "A prefix every replica
// holds"). On mixed at 0.95 (4 and
// 8 replicas, seeds 1-10) picks onto a queue whose estimate still held
// 60% or more of its charge waited 3.3-3.5 s on average, predicted 1.3-1.6
// s short by backlog_weight and 0.35-0.45 s short by the estimate; the
// agent turns kept home 0.2-0.5 s after a document was sent there waited
// 5.2-6.2 s where an idle replica would have re-prefilled their history
// in 3-4 s, and they were the requests of kvroute's p99 tail that
// blended's did not have. A request the engine holds waiting is charged a
// decode step (request_weight 1): it takes a step's room before this one.
// A running request is charged what it adds to the steps this one waits
// through (running_weight 0.02 steps): a decoding sequence lengthens a
// step by its per-sequence cost (about 1% of the step in the engine
// model, 80 µs against 8 ms), and a request waits through about two steps
// (the one in progress and its own). Its prefill, if any is left, is in
// the backlog already. Charging it a whole step (request_weight, before)
// priced 15 running requests at 15 steps, 0.14 s, against the 1-2 ms they
// cost: on chat at 4 replicas kvroute moved 169 requests in 5 seeds off
// the replica holding their history or system prompt to save that
// phantom, paying 74 ms of time to first token where the holder would
// have given 36 ms; they filled a quarter of its p99 tail sets.
//
// In-flight prefixes: pending (Candidate.Pending) counts the request's
// blocks beyond the index's match that the router just sent to the
// candidate (route's Options.Pending, on by default: routing.pending_ttl):
// a fan-out sibling or a GRPO sample of a new task finds its prompt being
// prefilled there. Engines share such a prefix while computing it: vLLM
// v1 caches the blocks a step will compute when it schedules the step, so
// a request admitted into that step or a later one finds them, and SGLang
// admits such a request a step later, when they are computed. So the
// whole pending prefix is credited, up to the prompt's last token, which
// the engine always computes (max_hit); the prefix's own prefill, just
// sent, is waited for in full (no backlog discount), and route queues the
// request's own prefill only (its fluid queue) and, for a sibling holding
// its whole prompt there, charges only that (its load tracker), so a
// fan-out's holder does not read as many prompts queued as it has
// siblings. An engine that shares a block only once it
// is computed (vLLM's V0 engine, and kvroute's engine model before it was
// made faithful) would have a sibling admitted into the prefix's own step
// compute the prefix again; against vLLM v1's model the old step-aware
// credit, which priced that, and the spread regime below passed 32, 34
// and 31 of the bar's 36 cases at 4, 8 and 16 replicas, against 34, 36
// and 34 now (docs/benchmarks.md: "An engine model that shares a prefix
// in flight"). No other policy reads pending.
//
// The move charge is what moving a session away from its history costs
// the others. The session's home (Candidate.Home: the replica that served
// its previous request) holds its history; re-prefilling it on another
// replica is work every request queued behind it there waits for, and at
// load the fleet has no spare capacity to absorb it: more work means
// longer queues everywhere, which move more sessions away from their
// history, which adds more work (the cache-thrash cliff). fleet_pressure
// is busy/(1-busy), busy being the share of eligible candidates with
// prefill queued or requests waiting, capped at move_pressure_max: 0 on an
// idle fleet (a move costs only the request's own prefill), 1 with half
// the fleet busy, move_pressure_max when nearly all of it is. So at light
// load a session moves away from its history as soon as its holder's
// queue outweighs the history's prefill, and at saturation only when the
// holder's queue outweighs it several times over: trajectories stay home.
// The cap is 12 (busy 12/13 of the fleet). At 4 it held a move's price
// at five times the history's prefill however overloaded the fleet was,
// and on Mooncake's conversation trace at 4 replicas and 1.1 utilization
// kvroute's turns left their history for queues that the moves themselves
// kept full: mean time to first token 17.8 s against hardswitch's 9.4 s,
// 11.0 s at 12 (p99 39.2 -> 24.4 s); the bar and its off-grid variants
// pass as many cases either way (docs/benchmarks.md, "The move charge's
// cap"). With move_fill > 0 (off by default; for fleets of mixed
// speeds), a candidate whose KV cache is fuller than the fleet's emptiest
// charges a move at that excess over its own room, (u - least u)/(1 - u),
// where that exceeds the fleet's pressure (MovePressure): a history
// re-prefilled into a nearly full cache while another replica has room
// displaces the replica's own sessions and is soon displaced itself, so
// the session would only move again. On a fleet whose fast half is full
// and slow half idle, the fleet's pressure alone let turns hop between the
// full fast replicas.
// A request without a home (a new session, or no session key) pays no move
// charge, a burst's sibling and a continuation aside (below): prefilling a
// shared prefix (a system prompt, a task prompt) on one more replica is a
// one-off investment the replica's later requests reuse, not a loss, so
// new sessions and groups go where the prediction is lowest: to the holder
// of their shared prefix while its queue is short, elsewhere once it is
// not.
//
// A continuation pays the move charge as a session leaving its home does.
// A request without a home whose prompt one replica alone holds nearly
// whole (continuationShare of its blocks indexed there, and no other
// replica holding sharedShare of them, in flight included) is a
// conversation's next turn under a key the router has not seen: a client
// that keys each request afresh (the trace's later turns), a session whose
// home lapsed. What it would leave behind is its own history, which no
// later request of anyone else reuses, so re-prefilling it elsewhere is
// work the fleet does twice, as for a session's move; that holder's own
// prefill stands for the home's. A prefix two or more replicas hold half
// of (a system prompt many sessions start from) is the shared investment
// above, and a holder of the whole prompt with part of it in flight is a
// burst's sibling (below). Without the charge the trace's homeless turns
// left the replicas holding their history for shorter queues elsewhere:
// each move right for the request, the recomputation lengthening every
// queue (hit/ceiling 0.94 at 4 replicas, 0.5, 0.74 at 8 replicas with
// half the KV cache, 0.95; 0.99 with it, and the mean time to first token
// 13-18 % lower at 4 and 8 replicas at 1.1, and at 0.95 with half the
// cache; docs/benchmarks.md, "A conversation under a new key"). Charged
// wherever a replica held 90 % (shared prompts too), the mixed workload's
// new chat sessions herded onto the first replica holding their system
// prompt (mean +4 to +20 % at 8 replicas, half the cache).
//
// A sibling in a burst pays the move charge too. A request without a home
// whose whole prompt a candidate holds, part of it in flight (a holder, as
// for the hold below: a GRPO sample or a fan-out sibling sent just after
// the one now prefilling it), while the prefix that draws it has had 2N or
// more recent placements (Request.PrefixPlacements, the burst the prefix
// share bound watches for) and the fleet's queued prefill (its fluid
// estimate, FluidWait) comes to half an engine step a replica or more, is
// charged on every other candidate for the prefill a holder would have
// saved: the least own prefill of a holder, everything it holds credited,
// stands for the home's, and a holder pays no move charge. A copy of a
// prompt prefilled on another replica is work the fleet does twice, and in
// a burst of more requests than replicas the burst itself fills every
// replica's next steps, so the copy delays the burst's later requests
// there; on the holder the sibling costs the fleet nothing once the prompt
// is computed. Placed by the prediction alone, a GRPO step (4 groups of
// 8-16 samples at once, on 4 replicas) spread every group over every
// replica, and each replica's first step computed the first group's prompt
// three or four times over, pushing the later groups into its second step;
// with the charge a group stays on one or two replicas. The fleet's fill
// is part of the condition because a copy costs nothing while the fleet's
// next steps have room the burst will not use: 16 replicas start a whole
// GRPO step at once, and without it the holders' queues put groups' later
// samples a step behind (grpo p99 at 16 replicas +12 to +19 %); a whole
// step a replica instead of half gave back most of the gain at 4. A
// smaller burst (rl: 8 samples of a 2,048-token task prompt on 4 replicas,
// none of it indexed yet) fits the fleet's next steps spread and keeps the
// normal prediction, as does a request of a spread burst (the spread
// regime decides there). Those conditions are measured for new sessions
// (a request with a session key and no home yet: an rl or GRPO sample,
// whose later turns follow it). A keyless request whose whole prompt a
// candidate holds is a sibling whatever the burst (n samples of one
// prompt, one-shot) and pays the charge always: on an engine that shares
// a prompt in flight it waits on the holder for the one prefill it would
// compute elsewhere, and spread at light load, before the fleet filled,
// fan-out's keyless siblings computed their prompt on up to eight
// replicas (16 replicas, 0.5: hit/ceiling 0.888, held 0.981; medians of
// seeds 1-5).
//
// The future charge is what a new session's later turns will pay, and
// make others pay, where it is placed. The queue a turn meets is not only
// what is in flight now: agent sessions spend most of their life thinking
// or waiting on tools, and the sessions living on a replica
// (Candidate.Sessions, kept by route's session book: their latest request
// went there within a few of their inter-turn gaps) will send their next
// turns there. A request with a session key and no home carries its
// session's prediction (Request.Future: later turns and their uncached
// blocks, learned by route from the sessions that started on the same
// prefix and of the same key kind); FutureWait prices it on each candidate
// by the Pollaczek-Khinchine mean wait of a queue fed by the living
// sessions' turns, its own turns waiting behind theirs, theirs behind its,
// and its share lengthening everyone's queue, times its expected later
// turns; the cost adds it against the least committed candidate
// (future_weight scales it, 0 turns it off). So the one-off prefill a
// shared prompt saves on its holder is weighed against the waiting the
// session would meet and bring there over its life: a new session joins
// the holder while few sessions live there and goes to a less committed
// replica once the wait outweighs the prompt. A request without a session
// key, or whose start class never came back (a one-shot request: herding,
// fan-out, a document), has no predicted turns and pays nothing; a
// request with a home never does (homes are placed by the move charge).
//
// The spread regime, off by default (spread_util 0), is for bursts on
// engines that share a prefix only once it is computed: a fan-out's
// siblings (n samples of one prompt, sent at once) reach the router one
// after another, and the first one's prompt is in flight on its replica
// when the others look (Candidate.Pending covers the whole prompt there:
// that replica is a holder). On such an engine holding the burst on a
// holder saves the fleet a prefill of the prompt per sibling, but costs
// each sibling about one prompt's prefill of waiting: the engine admits
// the next sibling into the step still computing the prompt, where it
// computes it again, and the rest wait for both. (vLLM v1 and SGLang
// share the prompt with the sibling instead: held, it waits for the one
// prefill it would have computed elsewhere, and the fleet saves it; with
// the regime on against that engine model kvroute lost fan-out at 0.5
// and 0.8 at every fleet size.) Spreading the burst costs each sibling the
// queueing its extra prefill adds to the fleet. In a queue served at
// utilization U the mean wait is U/(2(1-U)) service times
// (Pollaczek-Khinchine, deterministic service), below one prompt's
// prefill while U < 2/3. So a burst spreads while Request.SpreadUtil (set
// by the router: the fleet's recent prefill utilization with every
// sibling counting its whole prompt, as if bursts spread) is below
// spread_util (2/3 for such engines), and is held above it. It spreads
// only if the fleet has a replica holding none of its prompt for this
// request and for each later sibling expected (Request.Siblings, learned
// by the router from earlier bursts): on a fleet smaller than the burst
// the extra siblings would double up and compute the prompt again beside
// another. A request of a spread burst (one with a holder that is a
// parallel request of its session, or has no session key; n samples under
// one session key each are other sessions' first turns and keep the normal
// prediction) pays no move charge, gets no in-flight credit (on such an
// engine it would join its holder's step and compute the prompt itself),
// and is charged its wait on the router's fluid estimate of each replica's
// prefill queue (Candidate.Queued: what this router sent there, drained at
// its learned speed since, plus backlog_weight times any charged prefill
// that estimate does not account for, Candidate.QueuedCharge) rather than
// backlog_weight times the charged prefill, which says little of how far a
// burst just sent has got: a sibling goes where it starts first. It may go
// only to a holder or to a replica that starts it before the first holder
// has computed the prompt, since a sibling starting later would have found
// the prompt computed there. The router marks the burst spread when its
// second request is (Result.Spread), and its later requests follow. Below
// spread_util the first request of an expected burst (one whose prompt no
// candidate holds, indexed or in flight, with at least one sibling
// expected) is charged its wait on the fluid estimate too, so that it
// starts as early as its siblings will. Above spread_util none of this
// applies: holding bursts saves the fleet the prefills that would
// otherwise saturate it.
//
// A burst that fills the fleet is held (Reason "held" when that changed the
// pick): a request whose whole prompt a candidate holds, part of it in
// flight (a holder: Candidate.Pending > 0, and Pending plus the matched
// blocks cover all but the prompt's last block), is placed only on a
// holder when every eligible candidate that does not hold it has a step
// (step_tokens) or more of prefill queued ahead of it on the router's
// fluid estimate (FluidWait), so that spreading cannot start it in the
// engine's next step anywhere, and only on a holder whose fluid wait is no
// longer than the least that wait plus the request's own prefill comes to
// on a candidate without the prompt: the request starts there no later
// than it would have finished elsewhere, and the fleet computes the
// prompt once less. A GRPO step (32-64 samples at once, groups of 8-16
// sharing a task prompt) on 4 replicas is such a burst: placed one request
// at a time by the prediction alone, each group spreads evenly and every
// replica computes every group's prompt two or three times in its first
// steps; held, grpo's p99 time to first token at 4 replicas is 1.37-1.41 s
// at 0.5-0.95, against 1.43-1.49 s with the step-aware credit alone and
// 1.46-1.52 s before it (10 seeds; 8 replicas within 1.5%).
// A request without a home in a burst (its prefix drew 2N or more recent
// placements, Request.PrefixPlacements, as for the prefix share bound) is
// held there whatever room the fleet's next step has: the burst's later
// requests take that room, so a copy of the prompt made there is one
// more prefill of it in the burst's steps, and one more replica holding
// its KV blocks and the group's later turns. Held only once the fleet had
// filled, a GRPO step's groups spread over two to three replicas each (8
// replicas, engines twice as fast, grpo at 0.95: 2.4-3.1 replicas a group
// of 8-16 samples, seeds 1-3), onto replicas whose KV memory was full, and
// their samples waited there for memory; weighted put each group on one
// replica. Held, kvroute's mean time to first token there is 0.841 s
// against 0.883 s (weighted's 0.588 s), lower on each of seeds 1-5 at 4,
// 8 and 16 replicas; on the bar grpo's mean at 4 and 8 replicas falls
// 1-11 % and no other workload moves (docs/benchmarks.md, "A burst held
// whatever room the fleet has").
// So is a request without a home whose prefix drew such a burst before
// (Request.PrefixBurst, the largest count its placements reached, halved
// per ten minutes): a burst's first requests are placed before its own
// count reaches 2N, and a GRPO step's first group, one sample of it after
// another, spread over the fleet's room as the step's later groups could
// not. Remembered, the next step's first group is held from its first
// sample: with engines twice as fast, grpo 0.95's mean at 8 and 16
// replicas falls from 0.841 to 0.766 s and from 0.935 to 0.760 s
// (weighted's 0.588 and 0.633 s), its p99 at 4 replicas rises from 4.72
// to 5.34 s, and on the bar only grpo moves, its mean within 3 %
// (docs/benchmarks.md, "A burst's first samples, on a prefix that drew a
// burst before").
// The hold does not apply to a request of a spread burst (below
// spread_util the spread regime decides), nor when no holder is within
// that bound. A burst that fits into the fleet's next step on a prefix
// that has drawn no burst of 2N (rl's eight samples of each step's new
// 2,048-token task prompt, on 4 replicas) spreads as before.
//
// The memory term reads KV headroom: with the candidate's KV blocks known
// (Load.KVBlocks), the blocks in use are the larger of the engine's
// reported usage and the router's own in-flight footprint, the footprint
// taken at most up to the report plus the prefill still to be allocated
// (Load.ActivePrefillBlocks) once the engine reports any usage; the request
// needs its prompt blocks plus its expected output blocks; whatever would
// exceed (1 - memory_reserve) of the cache is overflow, which the engine
// resolves by preempting a running request and recomputing it later.
// Without Load.KVBlocks the term is 0. The footprint counts a prefix
// shared by requests in flight once per request, and a request the engine
// finished until the router sees its end; where it exceeds the engine's
// report plus the prefill still to be allocated, that excess is this
// over-count, not memory in use, and the request's prefix cached on the
// candidate is not needed again up to it. Without that subtraction, a
// replica holding a session's previous turn (ended at the engine, not yet
// at the router) read full and the next turn moved off its home,
// re-prefilling 88k tokens (the live agents check through Envoy). Without
// the cap, a conversation trace at 0.95 utilization on 4 replicas read
// every replica over full (router footprints of 6,400-6,900 blocks of
// 6,144 against reported usage of 0.74-0.99), and the term, not the
// queues, sent long cold prompts to the replica with the smallest
// over-count and the longest queue: the trace's p99 time to first token
// 8.13 s, capped 7.42 s (medians of ten seeds, the same on each: the trace
// replays the same requests; docs/benchmarks.md, "The memory term's
// footprint").
//
// The memory wait (memory_wait w, default 0: off) prices what a request
// meets where the KV cache is short of what it must allocate: the engine
// does not admit it until running requests end and free their blocks (it
// preempts only to grow requests already running), and what it waits for
// is then decodes, not prefill. With half the cache, RL trajectories of
// 10-14k tokens, fully cached on their replica with nothing queued, waited
// 5-7 s there behind 14-23 decodes of 1,024 tokens (4 replicas, 0.95, seed
// 1's slowest requests printed), where the overflow charge priced 0.8-1.4
// s. With w > 0, where the router's ledger of its decoding requests there
// is known (Candidate.Releases: their blocks, expected output and time
// since their first token) and less than a step's budget of prefill is
// queued on the fluid estimate (FluidWait below StepBlocks: a
// prefill-bound engine's decodes crawl one token a prefill step, and its
// queue is the wait), the memory term is at least w times what MemoryWait
// exceeds the queue's wait by (the request waits for both at once).
// MemoryWait is the time until the decodes, at the replica's learned token
// interval (Load.TokenInterval, prefill chunks included), free the blocks
// it is short (its uncached blocks, plus those of requests the engine
// holds waiting beyond the prefill charged there, preempted ones, each the
// size of the replica's mean request in flight, over the blocks in use as
// above). It is off by default because it trades mean for tail: on that RL
// case (seeds 1-5) the p99 fell from 5.79 to 4.12 s, below blended's 4.37,
// while the mean rose from 0.243 to 0.295 s, above weighted's 0.266, and
// at 1.1 both rose (mean +34 %, p99 +26 %; hits 0.96 -> 0.90 of the
// ceiling); an oracle reading the engine's own free blocks, queue and
// remaining outputs made the same trade (p99 3.98 s, mean 0.274 s). Moving
// a turn off a full replica serves it sooner, but its history fills
// another replica's cache, which the prediction does not charge. Without
// the prefill gate the trace at 4 replicas and 1.1 lost half its hits
// (mean +43 %, seeds 1-5 replaying the same requests): its decodes crawled
// behind 50-135k-token prompts, their learned interval read 0.27 s a
// token, and requests left their history for replicas whose decodes looked
// to end sooner (docs/benchmarks.md, "Waiting for memory").
//
// Herding protection comes from the prediction where a burst's cost is
// visible: its queued prefill is in the router's in-flight view (wait),
// and its requests, once the engine holds them waiting, in the
// per-request charge. Two bounds are the safety
// net for a burst on a prefix so long that the holder stays the faster
// choice for many requests, and neither ever applies at a session's home
// (a session leaves its history only when the prediction says the holder
// is slower). Nor does the prefix share bound pass over a holder of a
// request's whole prompt, part of it in flight (HoldsPrompt): the request
// computes little more than its last block there, and the bound, which
// weighs each placement by its whole prompt, would have another replica
// compute all of it again. Keeping copies of one prompt together is what
// the hold and the sibling's move charge ask for, not herding. The load bound
// below fires at three times the fleet's mean load. The prefix share bound
// (prefix_share_bound c, default 1.25; 0
// turns it off) passes over a candidate that took c times its fair share
// or more of the router's recent placements of requests drawn by the same
// prefix, each weighed by its prompt's blocks (Candidate.PrefixShare: the
// longest indexed match any candidate has for the request, placements
// counted with a one-second half-life; weighed, a replica that took a few
// long prompts is not the least loaded with the burst, as it was counted
// by requests; docs/benchmarks.md, "An unseen trace"), so
// only a burst of 2N or more within about a second,
// Request.PrefixPlacements, arms it), while any eligible candidate is not
// over it. A fair share is the candidate's share of the eligible
// candidates' prefill speed as Pace prices it: 1/N on identical replicas.
// Counted as 1/N on a fleet whose replicas differ, it pushed a burst onto
// the slow half; counted by speed, herding's p99 time to first token at 8
// replicas, four twice as fast, is 7-25 % lower (docs/benchmarks.md, "A
// fair share on a mixed fleet"). Its cost is still
// computed and reported, and reason "prefix_share" marks a pick it
// changed. Such a burst is what the prediction herds on when the prefix's
// prefill is long against a decode step: with 16 clients sharing a
// 3.4k-token system prompt on 4 replicas (e2e
// TestSharedSystemPromptDoesNotHerd), every request is rightly predicted
// faster on the holder, whose hits leave no prefill queue, while the
// others prefill the prompt for their first requests; the holder took up
// to 28 of 64 requests. Spreading costs each other replica one prefill of
// the prompt, after which it holds it too.
// Candidate.Trust (the closed-loop fidelity of the replica's served hits)
// scales the hit. Ties go to the less loaded candidate, then at random.
// KVRoute holds no state.
//
// Bounded load (load_bound c, default 3; 0 turns it off), after
// consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam):
// with T the running plus waiting requests summed over the eligible
// candidates and N of them, a candidate other than the session's home
// already carrying
//
//	bound = max(load_bound_min, ceil(c * (T+1) / N))
//
// requests or more earns no cache credit for this request (its hit counts
// 0, so extra and move are computed as for a cold replica). It removes
// the credit rather than skipping the candidate: an over-bound replica can
// still win on load, and no special case is needed when every candidate
// is over the bound. Reason "load_bound" marks a pick the bound changed.
// The floor load_bound_min (default 6 requests) keeps the bound from
// firing on a lightly loaded fleet, where a replica holding a shared
// prefix serves a few requests faster than a cold one.
type KVRoute struct {
	backlogWeight, decodeWeight, requestWeight float64
	runningWeight                              float64
	moveWeight, movePressureMax, moveFill      float64
	memoryWeight, memoryReserve, memoryWait    float64
	loadBound, loadBoundMin                    float64
	prefixShareBound                           float64
	futureWeight                               float64
	spreadUtil                                 float64
	prefillRate, decodeStep                    float64
	stepTokens                                 float64
	tierWeight                                 [index.NumTiers]float64
}

func (c KVRouteConfig) resolve() (*KVRoute, error) {
	k := &KVRoute{
		backlogWeight:    orDefault(c.BacklogWeight, DefaultKVRouteBacklogWeight),
		decodeWeight:     orDefault(c.DecodeWeight, DefaultKVRouteDecodeWeight),
		requestWeight:    orDefault(c.RequestWeight, DefaultKVRouteRequestWeight),
		runningWeight:    orDefault(c.RunningWeight, DefaultKVRouteRunningWeight),
		moveWeight:       orDefault(c.MoveWeight, DefaultKVRouteMoveWeight),
		movePressureMax:  orDefault(c.MovePressureMax, DefaultKVRouteMovePressureMax),
		moveFill:         orDefault(c.MoveFill, DefaultKVRouteMoveFill),
		memoryWeight:     orDefault(c.MemoryWeight, DefaultKVRouteMemoryWeight),
		memoryReserve:    orDefault(c.MemoryReserve, DefaultKVRouteMemoryReserve),
		memoryWait:       orDefault(c.MemoryWait, DefaultKVRouteMemoryWait),
		loadBound:        orDefault(c.LoadBound, DefaultKVRouteLoadBound),
		loadBoundMin:     orDefault(c.LoadBoundMin, DefaultKVRouteLoadBoundMin),
		prefixShareBound: orDefault(c.PrefixShareBound, DefaultKVRoutePrefixShareBound),
		futureWeight:     orDefault(c.FutureWeight, DefaultKVRouteFutureWeight),
		spreadUtil:       orDefault(c.SpreadUtil, DefaultKVRouteSpreadUtil),
		prefillRate:      orDefault(c.PrefillRate, DefaultKVRoutePrefillRate),
		decodeStep:       orDefault(c.DecodeStep, DefaultKVRouteDecodeStep),
		stepTokens:       orDefault(c.StepTokens, DefaultKVRouteStepTokens),
	}
	if err := allFiniteNonNeg(
		knob{"kvroute.backlog_weight", k.backlogWeight},
		knob{"kvroute.decode_weight", k.decodeWeight},
		knob{"kvroute.request_weight", k.requestWeight},
		knob{"kvroute.running_weight", k.runningWeight},
		knob{"kvroute.move_weight", k.moveWeight},
		knob{"kvroute.move_pressure_max", k.movePressureMax},
		knob{"kvroute.move_fill", k.moveFill},
		knob{"kvroute.memory_weight", k.memoryWeight},
		knob{"kvroute.memory_wait", k.memoryWait},
		knob{"kvroute.future_weight", k.futureWeight},
	); err != nil {
		return nil, err
	}
	if r := k.prefillRate; !validRate(r) {
		return nil, fieldErr("kvroute.prefill_rate", r, "a positive finite number")
	}
	if d := k.decodeStep; !(d > 0) || math.IsInf(d, 0) {
		return nil, fieldErr("kvroute.decode_step", d, "a positive finite number")
	}
	if t := k.stepTokens; !(t >= 1 && t <= 1<<24) || t != math.Trunc(t) {
		return nil, fieldErr("kvroute.step_tokens", t, "a whole number in [1, 16777216]")
	}
	if u := k.spreadUtil; !(u >= 0 && u < 1) {
		return nil, fieldErr("kvroute.spread_util", u, "in [0, 1)")
	}
	if r := k.memoryReserve; !(r >= 0 && r < 1) {
		return nil, fieldErr("kvroute.memory_reserve", r, "in [0, 1)")
	}
	if b := k.loadBound; math.IsNaN(b) || math.IsInf(b, 0) || (b != 0 && b < 1) {
		return nil, fieldErr("kvroute.load_bound", b, "0 (off) or a finite number >= 1")
	}
	if b := k.prefixShareBound; math.IsNaN(b) || math.IsInf(b, 0) || (b != 0 && b < 1) {
		return nil, fieldErr("kvroute.prefix_share_bound", b, "0 (off) or a finite number >= 1")
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

// WeighsReleases reports whether kvroute reads Candidate.Releases (its
// memory wait is on: memory_wait > 0 and memory_weight > 0; see
// ReadsReleases).
func (k *KVRoute) WeighsReleases() bool { return k.memoryWait > 0 && k.memoryWeight > 0 }

// WeighsPending reports that kvroute weighs Candidate.Pending, the
// prefixes the router just sent (its in-flight credit): a router or
// simulator keeps them only for a policy that does.
func (k *KVRoute) WeighsPending() bool { return true }

// Cost is the candidate's cost for this request among cands, with its
// cache credit (the load bound is not applied: see Pick).
func (k *KVRoute) Cost(req Request, c Candidate, cands []Candidate) float64 {
	return k.Predict(req, c, k.HitBlocks(req, c), k.FleetOf(req, cands, nil)).Total()
}

// Pick implements Policy.
func (k *KVRoute) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	bound := k.LoadBound(cands)
	credited := func(c Candidate) bool { return c.Home || float64(c.Load.Requests()) < bound }
	f := k.FleetOf(req, cands, credited)
	// Keeping a burst's copies of one prompt together is not herding.
	h := k.Herding(req, cands, f)
	herding := func(c Candidate) bool { return h(c) && !HoldsPrompt(req, c) }
	var allowed func(Candidate) bool
	for _, c := range cands {
		if eligible(c) && !herding(c) {
			allowed = func(c Candidate) bool { return !herding(c) }
			break
		}
	}
	if f.Spread {
		// Only a holder, or a candidate that starts the request before
		// the first holder has computed its prompt.
		early := func(c Candidate) bool {
			return c.Pending > 0 || k.Predict(req, c, 0, f).Wait <= f.CarrierDone
		}
		if h := allowed; h != nil {
			allowed = func(c Candidate) bool { return h(c) && early(c) }
		} else {
			allowed = early
		}
	}
	held := k.Held(req, cands, f, allowed)
	if held != nil {
		allowed = held
	}
	pick, costs := lowestCostAmong(cands, env, func(c Candidate) float64 {
		hit := 0.0
		if credited(c) {
			hit = k.hitBlocks(req, c, !f.Spread)
		}
		return k.Predict(req, c, hit, f).Total()
	}, allowed)
	reason := ReasonCost
	switch {
	case cold(cands):
		reason = ReasonColdIndex
	case allowed != nil && passedOver(cands, costs, pick, herding):
		reason = ReasonPrefixShare
	case held != nil && passedOver(cands, costs, pick, func(c Candidate) bool { return !held(c) }):
		reason = ReasonHeld
	case k.boundChanged(req, cands, pick, costs[pick], credited):
		reason = ReasonLoadBound
	}
	return Result{Pick: pick, Reason: reason, Costs: costs, Spread: f.Spread}
}

// KVRouteConfig are the kvroute policy's knobs (see KVRoute).
type KVRouteConfig struct {
	// BacklogWeight weighs the active prefill blocks queued ahead
	// (default 0.5).
	BacklogWeight *float64 `yaml:"backlog_weight"`
	// DecodeWeight charges blocks per active decode block (default 0).
	DecodeWeight *float64 `yaml:"decode_weight"`
	// RequestWeight charges decode steps per waiting request (default
	// 1).
	RequestWeight *float64 `yaml:"request_weight"`
	// RunningWeight charges decode steps per running request (default
	// 0.02: a sequence's share of the steps a new request waits through).
	RunningWeight *float64 `yaml:"running_weight"`
	// MoveWeight scales the move charge: extra prefill times the fleet's
	// pressure (default 1; 0 charges a move only the request's own
	// prefill).
	MoveWeight *float64 `yaml:"move_weight"`
	// MovePressureMax caps the fleet pressure busy/(1-busy) (default 12).
	MovePressureMax *float64 `yaml:"move_pressure_max"`
	// MoveFill scales a destination's KV cache fill beyond the fleet's
	// emptiest, (u - least u)/(1 - u), as the pressure a move onto it is
	// charged at where that exceeds the fleet's (default 0: off, the
	// fleet's pressure alone; 1 for fleets of mixed speeds; see
	// MovePressure).
	MoveFill *float64 `yaml:"move_fill"`
	// MemoryWeight charges blocks per KV block of predicted overflow
	// (default 1; 0 ignores memory headroom).
	MemoryWeight *float64 `yaml:"memory_weight"`
	// MemoryReserve is the share of a replica's KV blocks kept for the
	// growth of running decodes, in [0, 1) (default 0.05).
	MemoryReserve *float64 `yaml:"memory_reserve"`
	// MemoryWait scales the memory wait: the time a request waits, where
	// a replica's KV cache is short of it and no step of prefill is
	// queued, for the decodes running there to end (see
	// KVRoute.MemoryWait; default 0: off, the overflow charge alone).
	MemoryWait *float64 `yaml:"memory_wait"`
	// HostCacheHitWeight credits a CPU-tier block (default 0.75).
	HostCacheHitWeight *float64 `yaml:"host_cache_hit_weight"`
	// DiskCacheHitWeight credits a disk-tier block (default 0.25).
	DiskCacheHitWeight *float64 `yaml:"disk_cache_hit_weight"`
	// LoadBound c: a candidate other than the session's home with
	// max(load_bound_min, ceil(c*(T+1)/N)) or more running plus waiting
	// requests (T summed over the N eligible candidates) earns no cache
	// credit (default 3; 0 turns the bound off; otherwise it must be
	// >= 1).
	LoadBound *float64 `yaml:"load_bound"`
	// LoadBoundMin is the bound's floor in requests (default 6; a whole
	// number >= 1).
	LoadBoundMin *float64 `yaml:"load_bound_min"`
	// PrefixShareBound c: a candidate other than the session's home that
	// took c times its share of the fleet's prefill speed (c/N on
	// identical replicas) or more of the router's recent placements drawn
	// by the request's prefix (once that prefix drew 2N or more, N the eligible
	// candidates) is passed over while another candidate is not (default
	// 1.25; 0 turns it off; otherwise it must be >= 1).
	PrefixShareBound *float64 `yaml:"prefix_share_bound"`
	// FutureWeight scales the future charge of a new session (the waiting
	// its predicted later turns add where it is placed, see FutureWait;
	// default 1; 0 turns it off).
	FutureWeight *float64 `yaml:"future_weight"`
	// SpreadUtil is the fleet prefill utilization (Request.SpreadUtil)
	// below which kvroute spreads a burst's requests (its spread regime,
	// see KVRoute), in [0, 1) (default 0: off, right for engines that
	// share a prefix while computing it, as vLLM v1 and SGLang do; 2/3
	// for an engine that shares blocks only once computed).
	SpreadUtil *float64 `yaml:"spread_util"`
	// PrefillRate is the prefill speed, uncached tokens per second,
	// assumed for a replica while no candidate has a learned one
	// (Load.PrefillRate; default 16000).
	PrefillRate *float64 `yaml:"prefill_rate"`
	// DecodeStep is the decode step time, seconds, assumed while no
	// candidate has a learned one (Load.DecodeStep; default 0.008).
	DecodeStep *float64 `yaml:"decode_step"`
	// StepTokens is the engines' per-step token budget: the most tokens an
	// engine schedules in one step, prefill chunks included (vLLM's
	// --max-num-batched-tokens, SGLang's --chunked-prefill-size). Neither
	// engine reports it (vLLM's cache_config_info gauge carries the cache
	// configuration, /v1/models the context length), so set it to the
	// engines' value; default 8192, vLLM's for its API server on GPUs with
	// 70 GiB or more (2048 on smaller ones) and the simulator's (enginesim
	// -max-num-batched-tokens). kvroute's hold of bursts and its sibling
	// charge read it (see KVRoute). A whole number in [1, 16777216].
	StepTokens *float64 `yaml:"step_tokens"`
}

// kvroute's defaults.
const (
	DefaultKVRouteBacklogWeight    = 0.5
	DefaultKVRouteDecodeWeight     = 0.0
	DefaultKVRouteRequestWeight    = 1.0
	DefaultKVRouteRunningWeight    = 0.02
	DefaultKVRouteMoveWeight       = 1.0
	DefaultKVRouteMovePressureMax  = 12.0
	DefaultKVRouteMoveFill         = 0.0
	DefaultKVRouteMemoryWeight     = 1.0
	DefaultKVRouteMemoryReserve    = 0.05
	DefaultKVRouteMemoryWait       = 0.0
	DefaultKVRouteLoadBound        = 3.0
	DefaultKVRouteLoadBoundMin     = 6.0
	DefaultKVRoutePrefixShareBound = 1.25
	DefaultKVRouteFutureWeight     = 1.0
	DefaultKVRouteSpreadUtil       = 0.0
	DefaultKVRoutePrefillRate      = 16000.0
	DefaultKVRouteDecodeStep       = 0.008
	DefaultKVRouteStepTokens       = 8192.0
)
