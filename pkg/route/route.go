package route

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// Token sources and degradation reasons a Decision reports.
const (
	SourcePassthrough = "passthrough"

	DegradedTokenizeError   = "tokenize_error"
	DegradedTokenizeTimeout = "tokenize_timeout"
	DegradedNoTokenizer     = "no_tokenizer"
	DegradedApproximate     = "approximate_tokens"
	// DegradedApproximateIndex: approximate tokens were matched against the
	// dispatch-learned index (Options.Approx) for replicas without events.
	DegradedApproximateIndex = "approximate_index"
	DegradedColdIndex        = "cold_index"
)

// DefaultFallbacks is how many next-best addresses a Decision carries.
const DefaultFallbacks = 2

// Options configure a Router.
type Options struct {
	Matcher   Matcher
	State     State
	Policy    policy.Policy
	Tokenizer Tokenizer // may be nil when every request carries Tokens
	// Seed seeds the router's random source (policy tie-breaks), so that a
	// single-goroutine sequence of decisions is reproducible.
	Seed uint64
	// Fallbacks is how many next-best addresses to return (default 2; a
	// negative value returns none).
	Fallbacks int
	// Now reads the clock for TokenizeTime and DecideTime, and the
	// approximate index's expiries; nil means time.Now.
	Now func() time.Time
	// Approx, when not nil, is the approximate mode's dispatch-learned
	// index, for replicas without an event stream (State's EventFeeds
	// says which): their candidates are matched against it instead of the
	// Matcher, with trust ApproxTrust, whether the tokens are exact or
	// not, and Decide records every pick of such a replica there. Event-fed
	// replicas never use it, and approximate tokens never reach the
	// Matcher. Routers may share one ApproxIndex.
	Approx *ApproxIndex
	// SessionMemory is how many sessions' home replicas (the replica that
	// served a session's last request) the Router remembers for the
	// policy (policy.Candidate.Home); 0 means DefaultSessionMemory, a
	// negative value remembers none.
	SessionMemory int
	// Pending, when not nil, remembers (for its TTL) the blocks of the
	// requests this router just sent to event-fed replicas: a prefix whose
	// prefill is queued or running there is not in the engine's events yet
	// (they come once blocks are computed), but a request sent after it
	// may find it computed when its own turn comes. Without it a burst of
	// requests sharing a new prefix (GRPO samples of one task, fan-out
	// siblings) sees a cold index for every member and is spread, each
	// member prefilling the prefix again. Only the part of a prefix beyond
	// every candidate's indexed match counts, reported apart from the
	// match as Candidate.Pending (see matchPending): the kvroute policy
	// weighs it, the others ignore it. Decide records, Explain only reads.
	// Build it with NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL}).
	Pending *ApproxIndex

	// ApproxTrust is the trust of a match in Approx, in (0, 1]; 0 means
	// DefaultApproxTrust.
	ApproxTrust float64
	// Rates learns each replica's prefill speed and decode step from the
	// requests it served (fed by the caller: Rates.Observe); Decide fills
	// a candidate's Load.PrefillRate and Load.DecodeStep from it when the
	// State left them 0. Nil means a Rates of the Router's own (Router.Rates).
	Rates *Rates
	// Tracker, when not nil, is the in-flight view the State's loads are
	// built from (load.View's Tracker): Decide charges its pick there
	// (load.Tracker.Start with Decision.PrefillBlocks as prefill and the
	// prompt blocks as decode footprint) before any other decision
	// reads the loads, and returns the hold in Decision.Hold for the
	// caller to finish. Without it the caller charges the pick itself,
	// after Decide returns, and concurrent decisions may miss each other.
	Tracker *load.Tracker
	// Releases is the decoding ledger the kvroute policy's memory wait
	// reads (policy.Candidate.Releases, see policy.KVRoute.MemoryWait),
	// for a policy that reads it (WeighsReleases): the requests this
	// router sent that are decoding, with their blocks and expected
	// output. Nil means Tracker's ledger (requests Decide charges there
	// carry their max_tokens as expected output when the policy reads
	// the ledger), or none without a Tracker.
	Releases ReleaseSource
	// SessionHorizon is how many of a session's inter-turn gaps after its
	// latest request it still counts as living on its home replica, its
	// predicted turns committing that replica (policy.Candidate.Sessions;
	// the session book, bounded like the homes by SessionMemory); 0 means
	// DefaultSessionHorizon.
	SessionHorizon float64
	// DeferRecords leaves a decision's index records (the dispatch-learned
	// index's, the pending index's) to the caller, who calls
	// Decision.Commit once it has answered: a long prompt's records are
	// thousands of inserts its answer need not wait for. The pending
	// record is staged before Decide returns, so later decisions see it
	// either way. Without it Decide writes them before returning.
	DeferRecords bool
}

// ReleaseSource lists a replica's decoding requests (load.Tracker is one).
type ReleaseSource interface {
	Releases(replica string, dst []load.Release) []load.Release
}

// DefaultPendingTTL is a good TTL for Options.Pending: long enough for a
// queued prefill to run and its events to arrive, short enough that a
// request that died does not credit blocks that never came for long.
const DefaultPendingTTL = 5 * time.Second

// PendingMinShare: pending credit counts only when it covers at least
// 1/PendingMinShare of the prompt's blocks (see Options.Pending).
const PendingMinShare = 4

// DefaultApproxTrust is Options.ApproxTrust's default: a dispatch-learned
// match is trusted in full (the TTL bounds how stale it may be).
const DefaultApproxTrust = 1.0

// Router makes routing decisions. It is safe for concurrent use; it starts
// no goroutine and owns none.
type Router struct {
	mu       sync.Mutex // Decide's section from the loads to the pick's charge
	opts     Options
	homes    *homes
	prompts  *promptBook // where recent prompts went (vouch, with a State reporting ViewGaps; continues)
	shares   *prefixShares
	book     *sessionBook
	work     workMeter         // the fleet's recent prefill work, as if bursts spread (Request.SpreadUtil)
	fluid    fluidQueues       // per replica, the prefill sent there less what it has had time to compute (Candidate.Queued)
	bursts   burstSizes        // the sizes of bursts without a session key (Request.Siblings)
	fleet    []index.ReplicaID // the replica set of the latest decision, in State's order (forgetDeparted)
	rand     *rand.Rand
	future   bool          // the policy prices a new session's future (pricesFuture): sessionRound applies
	releases ReleaseSource // the decoding ledger Candidate.Releases come from; nil unless the policy reads them (policy.ReadsReleases)
	scratch  sync.Pool     // *scratch
}

// scratch holds per-call buffers reused across decisions.
type scratch struct {
	keys    []kvblock.Key
	own     []kvblock.Key // the request's event-root keys at the primary block size (Pending)
	grid    []kvblock.Key // keys at the approximate mode's grid positions (approxMatcher)
	matches []index.ReplicaMatch
	cands   []policy.Candidate
	sizes   []shape // distinct block sizes and lookaheads
	idx     []int   // candidate -> index into the replica set
	bs      []int   // candidate -> block size
	la      []int   // candidate -> lookahead tokens its engine hashes with
	src     []source
	rates   []float64 // candidate -> prefill speed, tokens per second (prefillRates)
	starts  []float64 // candidate -> its key kind's sessions started there (sessionRound)
	sub     []policy.Candidate
	subIdx  []int
	rel     []load.Release // the candidates' Releases, back to back
}

// shape is how an engine hashes blocks: its block size and lookahead.
type shape struct{ bs, la int }

// source is where a candidate's match comes from.
type source uint8

const (
	srcNone   source = iota // not matched (approximate tokens, event-fed replica)
	srcEvents               // the Matcher (engine events)
	srcApprox               // the dispatch-learned ApproxIndex
)

// New returns a Router. State is required (New panics without it: a wiring
// bug). A nil Policy means kvroute's default policy (policy.NameKVRoute); a nil Matcher
// matches nothing (every decision sees a cold index).
func New(opts Options) *Router {
	if opts.State == nil {
		panic("route.New: Options.State is nil")
	}
	if opts.Policy == nil {
		p, err := policy.New(policy.NameKVRoute, policy.Config{})
		if err != nil {
			panic(err) // the defaults are valid; covered by tests
		}
		opts.Policy = p
	}
	if opts.Matcher == nil {
		opts.Matcher = noMatches{}
	}
	if opts.Fallbacks == 0 {
		opts.Fallbacks = DefaultFallbacks
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if !(opts.ApproxTrust > 0 && opts.ApproxTrust <= 1) {
		opts.ApproxTrust = DefaultApproxTrust
	}
	if opts.SessionMemory == 0 {
		opts.SessionMemory = DefaultSessionMemory
	}
	if opts.Rates == nil {
		opts.Rates = NewRates()
	}
	r := &Router{
		opts:   opts,
		homes:  newHomes(opts.SessionMemory),
		shares: newPrefixShares(DefaultPrefixMemory),
		book:   newSessionBook(opts.SessionMemory, opts.SessionHorizon),
		rand:   rand.New(&lockedSource{src: rand.NewPCG(opts.Seed, opts.Seed^0x5851f42d4c957f2d)}),
		future: pricesFuture(opts.Policy),
	}
	r.prompts = newPromptBook(opts.SessionMemory)
	if policy.ReadsReleases(opts.Policy) {
		r.releases = opts.Releases
		if r.releases == nil && opts.Tracker != nil {
			r.releases = opts.Tracker
		}
	}
	r.scratch.New = func() any { return new(scratch) }
	return r
}

type noMatches struct{}

func (noMatches) Match(_ []kvblock.Key, dst []index.ReplicaMatch) []index.ReplicaMatch { return dst }

// lockedSource makes a PCG safe for concurrent use; a *rand.Rand over it is
// then safe too (rand.Rand keeps no state of its own). Tie-breaks draw
// rarely, so the lock is cold.
type lockedSource struct {
	mu  sync.Mutex
	src *rand.PCG
}

func (s *lockedSource) Uint64() uint64 {
	s.mu.Lock()
	v := s.src.Uint64()
	s.mu.Unlock()
	return v
}

// Policy returns the router's policy.
func (r *Router) Policy() policy.Policy { return r.opts.Policy }

// Rates returns the router's rate learner (Options.Rates): whoever sees
// responses feeds it with Observe.
func (r *Router) Rates() *Rates { return r.opts.Rates }

// Decide picks a replica for req, remembers it as the home of the
// request's session (SessionKey), and, when the pick is a replica without
// events and Options.Approx is set, records the request's keys for it there.
// Errors: ErrNoReplica when the set is
// empty, the subset admits none of the model's replicas, or none of them is
// healthy; ErrUnknownModel when replicas exist but none serves req.Model;
// the context's error when ctx is cancelled while tokenizing. A tokenizer
// failure or timeout is not an error: the decision is made on load alone
// and Decision.Degraded says why.
func (r *Router) Decide(ctx context.Context, req Request) (Decision, error) {
	return r.decide(ctx, req, true)
}

// Explain is Decide without side effects on the router: it records nothing
// in Options.Approx nor in the session memory. (The policy is still asked to pick: give an explaining
// Router its own instance of a stateful policy.)
func (r *Router) Explain(ctx context.Context, req Request) (Decision, error) {
	return r.decide(ctx, req, false)
}

func (r *Router) decide(ctx context.Context, req Request, learn bool) (Decision, error) {
	start := r.opts.Now()
	d := Decision{Policy: r.opts.Policy.Name(), MaxTokens: req.MaxTokens}

	sc := r.scratch.Get().(*scratch)
	defer r.scratch.Put(sc)

	reps := r.opts.State.Replicas()
	cands, err := candidates(reps, &req, sc.idx[:0])
	sc.idx = cands
	if err != nil {
		return d, err
	}
	tokModel := req.Model
	if req.LoRA != "" {
		tokModel = reps[cands[0]].Model // an adapter uses its base model's tokenizer
	}

	// Tokens.
	var toks Tokens
	switch {
	case req.Tokens != nil:
		toks = Tokens{IDs: req.Tokens, Source: SourcePassthrough, Exact: true}
	case r.opts.Tokenizer == nil:
		d.Degraded = DegradedNoTokenizer
	default:
		t0 := r.opts.Now()
		toks, err = r.opts.Tokenizer.Tokenize(ctx, tokModel, req.Input)
		d.TokenizeTime = r.opts.Now().Sub(t0)
		switch {
		case err == nil:
		case errors.Is(err, context.Canceled) && ctx.Err() != nil:
			return d, fmt.Errorf("route: tokenize: %w", err)
		case errors.Is(err, context.DeadlineExceeded):
			d.Degraded, toks = DegradedTokenizeTimeout, Tokens{}
		default:
			d.Degraded, toks = DegradedTokenizeError, Tokens{}
		}
	}
	d.TokenSource = toks.Source
	d.PromptTokens = len(toks.IDs)
	hasIDs := d.Degraded == "" && len(toks.IDs) > 0

	// The policy's block size: the first candidate's. Matches of replicas
	// with another block size are converted to it (in tokens, rounded down).
	primary := reps[cands[0]].BlockSize
	if primary <= 0 {
		primary = kvblock.DefaultBlockSize
	}
	d.PromptBlocks = kvblock.NumBlocks(len(toks.IDs), primary)

	// Each candidate's source of matches: approximate tokens are never
	// matched against engine events (an event-fed replica gets trust 0),
	// replicas without events use the dispatch-learned index when there
	// is one.
	d.Session, d.Pin = SessionKey(req), req.Pin
	home, hasHome := r.homes.get(d.Session)
	// A conversation's first turn has no assistant message yet: a client
	// that sends OpenAI's prompt_cache_key or user field has it keyed by
	// that, and its later turns by their opening. The session book carries
	// the session its first turn started over to the opening's key
	// (sessionBook.rekey).
	upgraded := ""
	if !hasHome && strings.HasPrefix(d.Session, "conv:") {
		upgraded = firstTurnKey(req)
	}
	feeds, _ := r.opts.State.(EventFeeds)
	useApprox := false
	sc.cands, sc.src, sc.bs, sc.la = sc.cands[:0], sc.src[:0], sc.bs[:0], sc.la[:0]
	for _, i := range cands {
		rep := reps[i]
		c := policy.Candidate{Replica: rep.ID} // Home is set once the session is known (below)
		src := srcEvents
		switch {
		case hasIDs && r.opts.Approx != nil && feeds != nil && !feeds.EventFed(rep.ID):
			src, c.Trust, useApprox = srcApprox, r.opts.ApproxTrust, true
		case hasIDs && !toks.Exact:
			src = srcNone
		default:
			c.Trust = r.opts.State.Trust(rep.ID)
		}
		bs := rep.BlockSize
		if bs <= 0 {
			bs = kvblock.DefaultBlockSize
		}
		sc.cands = append(sc.cands, c)
		sc.src = append(sc.src, src)
		sc.bs = append(sc.bs, bs)
		sc.la = append(sc.la, rep.Lookahead)
	}
	if hasIDs && !toks.Exact {
		d.Degraded = DegradedApproximate
		if useApprox {
			d.Degraded = DegradedApproximateIndex
		}
	}
	raw := make([]Candidate, len(cands)) // the decision's own copy
	kopts := kvblock.Options{CacheSalt: req.CacheSalt}
	evRoot := kvblock.Root(req.Model, req.LoRA) // the engines' keys' root: model and adapter
	// The prompt's keys at the primary block size, hashed once, before
	// the lock below (on a long prompt hashing is most of the work): the
	// engine events' match at that block size reads them, Options.Pending
	// matches and records them, the prompt book probes and records them.
	exact := hasIDs && toks.Exact
	usePending := exact && r.opts.Pending != nil
	useBook := exact && r.prompts != nil
	sc.own = sc.own[:0]
	if exact {
		sc.own = kvblock.Keys(sc.own, evRoot, toks.IDs, primary, kopts)
		r.match(sc, evRoot, kopts, toks.IDs, sc.own, srcEvents, r.opts.Matcher, raw, primary)
	}
	if useApprox {
		root := approxRoot(req.Model, req.LoRA, toks.Exact)
		r.match(sc, root, kopts, toks.IDs, nil, srcApprox, approxMatcher{r.opts.Approx, start, &sc.grid}, raw, primary)
	}
	// The prefix that draws the request: its longest indexed match on any
	// candidate (see prefixShares).
	held := longestMatch(sc)
	drawKey, drawn := r.drawingPrefix(sc, evRoot, kopts, toks.IDs, primary, hasIDs, held)
	// A request without a key whose prompt continues one the router sent
	// to one replica is that conversation's next turn (promptBook.continues):
	// a /v1/completions client resending its history, a trajectory's next
	// step. Its home is where the turn it continues went. Only prompts some
	// replica's index still holds are probed for: the turn it continues was
	// prefilled, and a history every replica evicted has no home to keep.
	// A chat request without a key has no assistant message (SessionKey):
	// a first turn, which continues nothing; probed, one whose system
	// prompt's last full block ended an earlier first turn's prompt took
	// that turn's replica as its home.
	if d.Session == "" && useBook && !req.Input.Chat {
		if key, at, ok := r.prompts.continues(sc.own, held, learn); ok {
			d.Session, d.SessionFromPrompt = key, true
			if home, hasHome = r.homes.get(key); !hasHome {
				home, hasHome = at, true
			}
		}
	}
	for k := range sc.cands {
		sc.cands[k].Home = hasHome && sc.cands[k].Replica == home
	}
	// Records are written after the lock is released (deferred before the
	// unlock, this runs after it): a long prompt's record is thousands of
	// inserts. The dispatch-learned index is matched before the lock, so
	// no concurrent decision waits for its record; the pending record is
	// staged under the lock, where every later decision's pending match
	// sees it, and committed here.
	var recs records // the pick's index records (see Options.DeferRecords)
	if learn && !r.opts.DeferRecords {
		defer recs.commit()
	}

	// From the loads to the pick's charge, a Decide holds the router's
	// lock: a concurrent decision sees this one's request in the pick's
	// load (Options.Tracker) and in Pending, never a load read before this
	// pick was charged (a burst of concurrent requests would otherwise all
	// see the same loads and go to the same replica). The section does no
	// I/O: loads, the pending match, the policy, the charge and the
	// session and share records and the pending record staged.
	if learn {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.forgetDeparted(reps)
	}
	healthy := false
	for k, i := range cands {
		c := &sc.cands[k]
		c.Load = r.opts.State.Load(reps[i].ID)
		if c.Load.PrefillRate == 0 || c.Load.DecodeStep == 0 || c.Load.TokenInterval == 0 {
			if rt, ok := r.opts.Rates.Get(c.Replica); ok {
				if c.Load.PrefillRate == 0 {
					c.Load.PrefillRate = rt.PrefillTokensPerSec
				}
				if c.Load.DecodeStep == 0 {
					c.Load.DecodeStep = rt.DecodeStep
				}
				if c.Load.TokenInterval == 0 {
					c.Load.TokenInterval = rt.TokenInterval
				}
			}
		}
		c.Load.PrefillRate = provenRate(c.Load, primary)
		healthy = healthy || c.Load.Healthy
	}
	if !healthy {
		if req.Pin != "" {
			return d, fmt.Errorf("%w: %s stores the response the request names", ErrPinUnhealthy, req.Pin)
		}
		return d, fmt.Errorf("%w: none of %d replicas for model %q is healthy", ErrNoReplica, len(cands), req.Model)
	}
	if usePending {
		r.matchPending(sc, evRoot, kopts, toks.IDs, start, raw, primary)
	}
	if _, gaps := r.opts.State.(ViewGaps); useBook && gaps {
		r.vouch(sc, raw)
	}
	r.fillReleases(sc, d.PromptBlocks)
	placements, burst := 0.0, 0.0
	if drawn {
		placements, burst = r.shares.get(drawKey, start, func(id index.ReplicaID, share float64) {
			for k := range sc.cands {
				if sc.cands[k].Replica == id {
					sc.cands[k].PrefixShare = share
				}
			}
		})
	}

	continued := upgraded != "" && learn && r.book.rekey(upgraded, d.Session)
	future := r.book.view(start, d.Session, hasHome, drawKey, drawn, sc.cands)
	var (
		parallel, spread bool
		siblings         float64
		placed           int
	)
	if hasHome {
		parallel, siblings, placed, spread = r.book.siblings(start, d.Session)
	} else {
		siblings = r.book.firstBurst(start, d.Session, drawKey, drawn)
	}
	// The fleet's prefill capacity, in blocks per second, each replica's
	// fluid queue, and the requests' recent work against that capacity.
	capacity := 0.0
	sc.rates = r.prefillRates(sc.rates, sc.cands)
	for k := range sc.cands {
		c := &sc.cands[k]
		rate := sc.rates[k] / float64(primary)
		c.Queued, c.QueuedCharge = r.fluid.get(c.Replica, start, rate)
		if c.Load.Healthy {
			capacity += rate
		}
	}
	util := 0.0
	if capacity > 0 {
		util = r.work.rate(start) / capacity
	}
	// A request without a session key whose whole prompt is in flight is a
	// sibling of the burst that sent it there first.
	holders := 0
	for k := range sc.cands {
		if d.PromptBlocks >= 2 && sc.cands[k].Pending >= d.PromptBlocks-1 {
			holders++
		}
	}
	if d.Session == "" {
		siblings = math.Max(0, r.bursts.size(start)-float64(holders+1))
		if learn {
			r.bursts.note(start, holders > 0)
		}
	}

	d.ExpectedOutputTokens = r.opts.Rates.ExpectOutput(req.MaxTokens)
	preq := policy.Request{
		PromptBlocks:         d.PromptBlocks,
		PromptTokens:         d.PromptTokens,
		SessionKey:           d.Session,
		ExpectedOutputBlocks: expectedOutputBlocks(d.ExpectedOutputTokens, primary),
		BlockSize:            primary,
		PrefixPlacements:     placements,
		PrefixBurst:          burst,
		Future:               future,
		Parallel:             parallel,
		Siblings:             siblings,
		BurstPlaced:          placed,
		BurstSpread:          spread,
		SpreadUtil:           util,
	}
	res := r.opts.Policy.Pick(preq, sc.cands, policy.Env{Rand: r.rand})
	if res.Pick < 0 || res.Pick >= len(cands) {
		return d, fmt.Errorf("%w: policy %s picked none (%s)", ErrNoReplica, d.Policy, res.Reason)
	}
	if !hasHome && drawn {
		res = r.sessionRound(sc, start, d.Session, res, preq, primary)
	}
	// The pick's uncached blocks, and of them the prefill it computes
	// itself: less the part of its prefix in flight there that it finds
	// computed (policy.InFlightCredit: the engine computes the prefix
	// once, for the request that carried it). That is what it adds to the
	// fluid queue; counted again it over-stated the queue ahead of the
	// next request, and the speed the rate learner took from it.
	pick := sc.cands[res.Pick]
	uncached := max(0, d.PromptBlocks-pick.MatchedBlocks())
	own := max(0, uncached-int(policy.InFlightCredit(preq, pick)))

	for k, i := range cands {
		c := sc.cands[k]
		raw[k].Replica = c.Replica
		raw[k].Address = reps[i].Address
		raw[k].Trust = c.Trust
		raw[k].Load = c.Load
		raw[k].Eligible = c.Load.Healthy
		raw[k].Home = c.Home
		raw[k].Approximate = useApprox && sc.src[k] == srcApprox
		raw[k].Cost = math.NaN()
		if res.Costs != nil {
			raw[k].Cost = res.Costs[k]
		}
	}
	if learn {
		best := 0
		for k := range sc.cands {
			best = max(best, sc.cands[k].MatchedBlocks())
		}
		r.work.add(start, float64(max(0, d.PromptBlocks-best)))
		pc := sc.cands[res.Pick]
		// What the fluid queue holds ahead of the request, never more than
		// the backlog still charged there (a request leaves it at its first
		// token, so a replica answering faster than its learned speed caps
		// it): the rate learner's RateSample.Queued. Without it every
		// request sent behind a queue gives a prefill-speed sample of its
		// own tokens over its whole time to first token, and a burst (a
		// GRPO step's 32-64 samples at once) teaches the router a replica
		// prefills at 3,000-7,000 tokens/s where it does 16,000. The
		// charged backlog alone over-states it (it counts a request in
		// full until its first token; fed to the learner it doubled the
		// learned speeds).
		d.QueuedTokens = int(math.Min(pc.Queued, pc.Load.ActivePrefillBlocks) * float64(primary))
		rate := sc.rates[res.Pick] / float64(primary)
		r.fluid.add(pc.Replica, start, rate, float64(own), rate*fluidHorizon.Seconds())
	}
	d.Candidates = raw
	d.Replica = raw[res.Pick].Replica
	// The pick's charge. A sibling of a request just sent to its pick with
	// its whole prompt (a fan-out's, a GRPO group's) is charged its own
	// prefill, its last block: charged its whole prompt, a holder of eight
	// siblings read as eight prompts queued, and the burst spread over the
	// fleet, computing the prompt once a replica (fan-out at 4 replicas,
	// 0.5, medians of seeds 1-10: hit/ceiling 0.768, p99 0.426 s; charged
	// its own prefill 0.969, 0.413 s). A request sharing only part of its
	// prompt with one in flight is charged all its uncached blocks:
	// credited there too, the trace at 4 replicas lost (0.8: p99 4.659 ->
	// 4.876 s, hit/ceiling 0.965 -> 0.938; 1.1: mean 7.450 -> 8.749 s; the
	// same on each of seeds 1-10, the trace replaying the same requests),
	// for reasons not traced yet.
	d.PrefillBlocks = uncached
	if policy.HoldsPrompt(preq, pick) {
		d.PrefillBlocks = own
	}
	d.Address = raw[res.Pick].Address
	d.Reason = res.Reason
	if res.Reason == policy.ReasonColdIndex && d.Degraded == "" {
		d.Degraded = DegradedColdIndex
	}
	d.Fallbacks = fallbacks(raw, res.Pick, r.opts.Fallbacks)
	if learn && useApprox && sc.src[res.Pick] == srcApprox {
		root := approxRoot(req.Model, req.LoRA, toks.Exact)
		sc.keys = kvblock.Keys(sc.keys[:0], root, toks.IDs, sc.bs[res.Pick], kopts)
		recs.approx, recs.at = r.opts.Approx, start
		recs.approxKeys, recs.approxReplica = approxGrid(nil, sc.keys), d.Replica
	}
	if learn && usePending && sc.src[res.Pick] == srcEvents {
		keys := sc.own
		if sc.bs[res.Pick] != primary {
			sc.keys = kvblock.Keys(sc.keys[:0], evRoot, toks.IDs, sc.bs[res.Pick], kopts)
			keys = sc.keys
		}
		recs.pending, recs.staged = r.opts.Pending, r.opts.Pending.Stage(keys, d.Replica, start)
	}
	if learn {
		r.homes.set(d.Session, d.Replica)
		if useBook && d.PromptBlocks > 0 {
			r.prompts.set(sc.own[d.PromptBlocks-1], d.Replica, d.PromptBlocks, d.Session)
		}
		if drawn {
			r.shares.record(drawKey, d.Replica, d.PromptBlocks, start)
		}
		r.book.record(start, d.Session, hasHome || continued, drawKey, drawn, d.Replica, float64(d.PromptBlocks-d.MatchedBlocks()))
		if res.Spread && placed == 1 {
			r.book.spreadBurst(d.Session)
		}
		if r.opts.Tracker != nil {
			out := load.Output{Streams: req.Streams}
			if r.releases != nil { // the ledger is kept only for a policy that reads it
				out.Tokens, out.Blocks = d.ExpectedOutputTokens, expectedOutputBlocks(d.ExpectedOutputTokens, primary)
			}
			d.Hold = r.opts.Tracker.StartExpecting(string(d.Replica), d.PrefillBlocks, d.PromptBlocks, out)
		}
	}
	if r.opts.DeferRecords && (recs.approxKeys != nil || recs.staged != nil) {
		rc := recs // only a deferring caller's decision carries its records to the heap
		d.records = &rc
	}
	d.DecideTime = r.opts.Now().Sub(start)
	return d, nil
}

// candidates returns the indexes into reps of the replicas serving the
// request's model (all when it names none) and admitted by its subset,
// only those at its Pin when any is (req.Pin is cleared when none is). A
// model no replica serves as its base model but some list among their
// Adapters is a LoRA request: req.LoRA is set to it and the candidates are
// the replicas serving that adapter (whose keys kvblock.Root roots at the
// adapter, as pkg/events does for blocks stored with its lora_name).
func candidates(reps []Replica, req *Request, out []int) ([]int, error) {
	if len(reps) == 0 {
		return out, fmt.Errorf("%w: the replica set is empty", ErrNoReplica)
	}
	adapter := req.LoRA == "" && req.Model != "" &&
		!slices.ContainsFunc(reps, func(r Replica) bool { return r.Model == req.Model }) &&
		slices.ContainsFunc(reps, func(r Replica) bool { return slices.Contains(r.Adapters, req.Model) })
	if adapter {
		req.LoRA = req.Model
	}
	served := false
	for i, rep := range reps {
		switch {
		case adapter:
			if !slices.Contains(rep.Adapters, req.LoRA) {
				continue
			}
		case req.Model != "" && rep.Model != req.Model:
			continue
		}
		served = true
		if req.Subset != nil && !slices.Contains(req.Subset, rep.Address) {
			continue
		}
		out = append(out, i)
	}
	if !served {
		return out, fmt.Errorf("%w: %q", ErrUnknownModel, req.Model)
	}
	if len(out) == 0 {
		return out, fmt.Errorf("%w: the subset admits none of model %q's replicas", ErrNoReplica, req.Model)
	}
	if req.Pin != "" {
		held := out[:0:0]
		for _, i := range out {
			if reps[i].Address == req.Pin {
				held = append(held, i)
			}
		}
		if len(held) == 0 {
			req.Pin = "" // its replica left: nowhere holds what it names
			return out, nil
		}
		out = append(out[:0], held...)
	}
	return out, nil
}

// fillReleases gives each candidate whose free KV blocks may not hold a
// request of promptBlocks (the engine's reported usage, the prefill
// charged there and the prompt come to more than its blocks) the
// releases ledger's decoding requests there (Candidate.Releases); the
// others, every candidate without a known KV size, and all of them when
// the policy reads no releases (Router.releases nil), get none.
func (r *Router) fillReleases(sc *scratch, promptBlocks int) {
	src := r.releases
	if src == nil {
		return // candidates are built without releases
	}
	sc.rel = sc.rel[:0]
	for k := range sc.cands {
		c := &sc.cands[k]
		c.Releases = nil
		l := c.Load
		if !(l.KVBlocks > 0) || l.KVUsage*l.KVBlocks+l.ActivePrefillBlocks+float64(promptBlocks) <= l.KVBlocks {
			continue
		}
		from := len(sc.rel)
		sc.rel = src.Releases(string(c.Replica), sc.rel)
		c.Releases = sc.rel[from:len(sc.rel):len(sc.rel)]
	}
}

// expectedOutputBlocks converts an expected output in tokens to blocks (0
// when unknown).
func expectedOutputBlocks(maxTokens, blockSize int) float64 {
	if maxTokens <= 0 || blockSize <= 0 {
		return 0
	}
	return float64(maxTokens) / float64(blockSize)
}

// fallbacks returns up to n addresses of eligible candidates other than the
// pick, best cost first (NaN costs last, then least loaded); without costs,
// least loaded first.
func fallbacks(cands []Candidate, pick, n int) []string {
	if n <= 0 {
		return nil
	}
	idx := make([]int, 0, len(cands))
	for i, c := range cands {
		if i != pick && c.Eligible && c.Address != cands[pick].Address {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		ca, cb := cands[a].Cost, cands[b].Cost
		switch na, nb := math.IsNaN(ca), math.IsNaN(cb); {
		case na && !nb:
			return 1
		case nb && !na:
			return -1
		case !na && ca != cb:
			if ca < cb {
				return -1
			}
			return 1
		}
		la := cands[a].Load.ActivePrefillBlocks + cands[a].Load.ActiveDecodeBlocks
		lb := cands[b].Load.ActivePrefillBlocks + cands[b].Load.ActiveDecodeBlocks
		switch {
		case la < lb:
			return -1
		case la > lb:
			return 1
		}
		return cands[a].Load.Requests() - cands[b].Load.Requests()
	})
	if len(idx) > n {
		idx = idx[:n]
	}
	if len(idx) == 0 {
		return nil
	}
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = cands[i].Address
	}
	return out
}

// forgetDeparted drops the per-replica state of replicas that left the
// fleet since the previous decision (gone from State.Replicas, not merely
// unhealthy; a replica that is not Ready is gone from it too): their fluid queues, learned speeds (Options.Rates) and the
// session load committed to them. Without it a fleet that replaces its
// replicas (a rollout, autoscaling) keeps every departed one's entries
// for the router's life. The home of a session and the prefix shares
// kept there are bounded and age out on their own. Callers hold r.mu.
func (r *Router) forgetDeparted(reps []Replica) {
	same := len(reps) == len(r.fleet)
	for i := 0; same && i < len(reps); i++ {
		same = reps[i].ID == r.fleet[i]
	}
	if same {
		return
	}
	now := make(map[index.ReplicaID]struct{}, len(reps))
	for _, rep := range reps {
		now[rep.ID] = struct{}{}
	}
	for _, id := range r.fleet {
		if _, ok := now[id]; !ok {
			r.fluid.forget(id)
			r.opts.Rates.Forget(id)
			r.book.forget(id)
		}
	}
	r.fleet = r.fleet[:0]
	for _, rep := range reps {
		r.fleet = append(r.fleet, rep.ID)
	}
}

// prefillRates returns dst with each candidate's prefill speed, tokens per
// second, as the policy prices it (policy.Pacer), else as kvroute's
// defaults would.
func (r *Router) prefillRates(dst []float64, cands []policy.Candidate) []float64 {
	if p, ok := r.opts.Policy.(policy.Pacer); ok {
		return p.PrefillRates(dst, cands)
	}
	return policy.PrefillRates(dst, cands, policy.DefaultKVRoutePrefillRate)
}
