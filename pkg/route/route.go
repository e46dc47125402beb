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
	d := Decision{Policy: r.opts.Policy.Name()}

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
	d.Session = SessionKey(req)
	home, hasHome := r.homes.get(d.Session)
	// A conversation's first turn has no assistant message yet: a client
	// that sends the OpenAI user field has it keyed by its user, and its
	// later turns by their opening. The session book carries the session
	// its first turn started over to the opening's key (sessionBook.rekey).
	upgraded := ""
	if !hasHome && req.User != "" && strings.HasPrefix(d.Session, "conv:") {
		upgraded = "user:" + req.User
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
	// The prompt's keys at the primary block size, hashed once, before
	// the lock below (on a long prompt hashing is most of the work): the
	// engine events' match at that block size reads them, Options.Pending
	// matches and records them, the prompt book probes and records them.
	exact := hasIDs && toks.Exact
	usePending := exact && r.opts.Pending != nil
	useBook := exact && r.prompts != nil
	sc.own = sc.own[:0]
	if exact {
		sc.own = kvblock.Keys(sc.own, kvblock.Root(req.Model, req.LoRA), toks.IDs, primary, kopts)
		r.match(sc, kvblock.Root(req.Model, req.LoRA), kopts, toks.IDs, srcEvents, r.opts.Matcher, raw, primary)
	}
	if useApprox {
		root := approxRoot(req.Model, req.LoRA, toks.Exact)
		r.match(sc, root, kopts, toks.IDs, srcApprox, approxMatcher{r.opts.Approx, start, &sc.grid}, raw, primary)
	}
	// The prefix that draws the request: its longest indexed match on any
	// candidate (see prefixShares).
	held := longestMatch(sc)
	drawKey, drawn := r.drawingPrefix(sc, kvblock.Root(req.Model, req.LoRA), kopts, toks.IDs, primary, hasIDs, held)
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
		return d, fmt.Errorf("%w: none of %d replicas for model %q is healthy", ErrNoReplica, len(cands), req.Model)
	}
	if usePending {
		r.matchPending(sc, kvblock.Root(req.Model, req.LoRA), kopts, toks.IDs, start, raw, primary)
	}
	if _, gaps := r.opts.State.(ViewGaps); useBook && gaps {
		r.vouch(sc, raw)
	}
	r.fillReleases(sc, d.PromptBlocks)
	placements := 0.0
	if drawn {
		placements = r.shares.get(drawKey, start, func(id index.ReplicaID, share float64) {
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

	preq := policy.Request{
		PromptBlocks:         d.PromptBlocks,
		PromptTokens:         d.PromptTokens,
		SessionKey:           d.Session,
		ExpectedOutputBlocks: expectedOutputBlocks(req.MaxTokens, primary),
		BlockSize:            primary,
		PrefixPlacements:     placements,
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
			sc.keys = kvblock.Keys(sc.keys[:0], kvblock.Root(req.Model, req.LoRA), toks.IDs, sc.bs[res.Pick], kopts)
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
				out.Tokens, out.Blocks = req.MaxTokens, expectedOutputBlocks(req.MaxTokens, primary)
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

// longestMatch is the most blocks (at the primary block size) any
// candidate's index holds of the request.
func longestMatch(sc *scratch) int {
	longest := 0
	for _, c := range sc.cands {
		longest = max(longest, c.MatchedBlocks())
	}
	return longest
}

// drawingPrefix returns the key (at the primary block size) of the
// deepest block of the longest match any candidate has for the request
// (longest, longestMatch); ok is false without a match. It reads the key
// from sc.own when Decide hashed the prompt there, else hashes the
// matched prefix.
func (r *Router) drawingPrefix(sc *scratch, root kvblock.Key, opts kvblock.Options, tokens []uint32, primary int, hasIDs bool, longest int) (kvblock.Key, bool) {
	if !hasIDs {
		return 0, false
	}
	longest = min(longest, len(tokens)/primary)
	if longest == 0 {
		return 0, false
	}
	if len(sc.own) >= longest {
		return sc.own[longest-1], true
	}
	sc.keys = kvblock.Keys(sc.keys[:0], root, tokens[:longest*primary], primary, opts)
	return sc.keys[longest-1], true
}

// candidates returns the indexes into reps of the replicas serving the
// request's model (all when it names none) and admitted by its subset. A
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
	return out, nil
}

// match computes the request's keys (from root) per distinct block size
// and lookahead of the candidates whose source is src, matches them with m
// and fills those candidates' matched blocks: raw (in the replica's own
// blocks) for the decision, converted to the primary block size for the
// policy. A lookahead (engine events, Replica.Lookahead) keys the blocks as
// kvblock.Options.WithLookahead does, as that engine hashes them. For
// engine events, Decide has hashed the prompt at the primary block size
// into sc.own (from root, with opts): the candidates of that block size
// without a lookahead are matched with those keys.
func (r *Router) match(sc *scratch, root kvblock.Key, opts kvblock.Options, tokens []uint32, src source, m Matcher, raw []Candidate, primary int) {
	sc.sizes = sc.sizes[:0]
	for k, bs := range sc.bs {
		sh := shape{bs, 0}
		if src == srcEvents {
			sh.la = sc.la[k]
		}
		if sc.src[k] == src && !slices.Contains(sc.sizes, sh) {
			sc.sizes = append(sc.sizes, sh)
		}
	}
	for _, sh := range sc.sizes {
		bs := sh.bs
		keys := sc.own
		if src != srcEvents || bs != primary || sh.la > 0 {
			o, n := opts.WithLookahead(tokens, bs, sh.la)
			sc.keys = kvblock.Keys(sc.keys[:0], root, tokens[:n], bs, o)
			keys = sc.keys
		}
		if len(keys) == 0 {
			continue
		}
		sc.matches = m.Match(keys, sc.matches[:0])
		for _, mt := range sc.matches {
			for k := range sc.cands {
				if sc.src[k] != src || sc.bs[k] != bs || (src == srcEvents && sc.la[k] != sh.la) || sc.cands[k].Replica != mt.Replica {
					continue
				}
				raw[k].Matched = mt.ByTier
				if bs == primary {
					sc.cands[k].Matched = mt.ByTier
				} else {
					for t := range mt.ByTier {
						sc.cands[k].Matched[t] = mt.ByTier[t] * bs / primary
					}
				}
			}
		}
	}
}

// vouch credits the replicas the router sent the longest earlier prompt
// this one resends (Router.prompts: the last bookSenders of them), where a
// replica's view is known to miss stores (ViewGaps) and its index shows
// less of that prompt, with the blocks the index does not show there
// (Candidate.Vouched). Every sender is credited, not the last: siblings
// that sent one task prompt to several replicas each hold it there, and
// crediting only the last sender would draw all their next turns to it. A
// view being relearned (Trust 0: its matches count for nothing) is
// credited the whole prompt at the approximate mode's trust
// (Options.ApproxTrust), as the router's own dispatches are credited where
// no events come.
func (r *Router) vouch(sc *scratch, raw []Candidate) {
	gaps := r.opts.State.(ViewGaps)
	n := len(sc.own) // the prompt's full blocks, hashed by Decide
	// Only a prompt longer than some gapped candidate's credited match can
	// add credit: the book is probed down to the least such match.
	least := n
	for k := range sc.cands {
		if c := &sc.cands[k]; sc.src[k] == srcEvents && gaps.ViewGaps(c.Replica) {
			if c.Trust == 0 {
				least = 0
				break
			}
			least = min(least, c.MatchedBlocks())
		}
	}
	if least >= n {
		return
	}
	sent, ok := r.prompts.longest(sc.own, least)
	if !ok {
		return
	}
	for k := range sc.cands {
		c := &sc.cands[k]
		if !sent.sentTo(c.Replica) || sc.src[k] != srcEvents || !gaps.ViewGaps(c.Replica) {
			continue
		}
		if c.Trust == 0 {
			// The router's own records stand in for the view: its
			// matches count for nothing, what it sent there does.
			c.Matched, c.Trust = [index.NumTiers]int{}, r.opts.ApproxTrust
		}
		// A prompt still in flight there (Pending) is the pending credit's
		// to weigh: its blocks are being computed, not held.
		if have := c.MatchedBlocks(); c.Pending == 0 && have < sent.blocks {
			c.Matched[index.TierGPU] += sent.blocks - have
			raw[k].Vouched = sent.blocks - have
		}
	}
}

// matchPending sets each event-fed candidate's Pending to the blocks
// Options.Pending remembers were just sent there beyond both its own
// indexed match and the longest prefix any candidate's events show (the
// match itself stays what the index holds: the policy decides what a
// prefix still being prefilled is worth, see policy.Candidate.Pending). Blocks some replica is known
// to hold earn no pending credit elsewhere: a burst sharing a system
// prompt the fleet already holds is spread by the prediction as before,
// not pulled onto whichever replica took its first members; pending
// credit is for the part of a prefix nobody holds yet (a new task's
// samples, fan-out siblings), and only when that part is at least
// 1/PendingMinShare of the prompt: a guess about blocks not yet computed
// does not tip a choice the indexed blocks and the load should make (a
// burst whose members share one more block than the indexed system
// prompt). Pending's keys are this router's own (no lookahead: they are
// only ever compared with themselves).
func (r *Router) matchPending(sc *scratch, root kvblock.Key, opts kvblock.Options, tokens []uint32, now time.Time, raw []Candidate, primary int) {
	sc.sizes = sc.sizes[:0]
	for k, bs := range sc.bs {
		if sc.src[k] == srcEvents && !slices.Contains(sc.sizes, shape{bs, 0}) {
			sc.sizes = append(sc.sizes, shape{bs, 0})
		}
	}
	// The longest prefix any candidate's events show, in tokens: pending
	// credit is for prefixes beyond it only.
	indexed := 0
	for k := range sc.cands {
		if sc.src[k] != srcEvents {
			continue
		}
		have := 0
		for _, n := range raw[k].Matched {
			have += n
		}
		indexed = max(indexed, have*sc.bs[k])
	}
	for _, sh := range sc.sizes {
		keys := sc.own // hashed by decide at the primary block size
		if sh.bs != primary {
			sc.keys = kvblock.Keys(sc.keys[:0], root, tokens, sh.bs, opts)
			keys = sc.keys
		}
		if len(keys) <= indexed/sh.bs { // nothing beyond the indexed prefix
			continue
		}
		sc.matches = r.opts.Pending.Match(keys, now, sc.matches[:0])
		for _, mt := range sc.matches {
			for k := range sc.cands {
				if sc.src[k] != srcEvents || sc.bs[k] != sh.bs || sc.cands[k].Replica != mt.Replica {
					continue
				}
				have := 0
				for _, n := range raw[k].Matched {
					have += n
				}
				if extra := mt.Blocks - max(have, indexed/sh.bs); extra > 0 && extra*PendingMinShare >= len(keys) {
					raw[k].Pending = extra
					sc.cands[k].Pending = extra * sh.bs / primary
				}
			}
		}
	}
}

// approxMatcher matches against an ApproxIndex at a fixed time.
type approxMatcher struct {
	x    *ApproxIndex
	now  time.Time
	grid *[]kvblock.Key // reused buffer for the grid keys
}

// Match matches the keys at the approximate mode's grid positions
// (approxGrid) and converts each replica's count of grid keys back to
// blocks: a replica holding grid keys 0..j-1 is credited the blocks up to
// and including the (j-1)th grid position.
func (a approxMatcher) Match(keys []kvblock.Key, dst []index.ReplicaMatch) []index.ReplicaMatch {
	start := len(dst)
	*a.grid = approxGrid((*a.grid)[:0], keys)
	dst = a.x.Match(*a.grid, a.now, dst)
	for i := start; i < len(dst); i++ {
		b := approxGridBlocks(dst[i].Blocks, len(keys))
		dst[i].Blocks, dst[i].ByTier = b, [index.NumTiers]int{index.TierGPU: b}
	}
	return dst
}

// The approximate mode records and matches a prompt's keys at grid
// positions only: every block of the first approxGridDense, then every
// approxGridStep1-th up to approxGridFar, then every approxGridStep2-th,
// and the last block. A long prompt's record is then a few hundred map
// inserts rather than one per block (a 229 KB chat has about 3.5k blocks
// of 16 tokens), and a match deeper than approxGridDense blocks is
// credited to the last grid position it reaches: at most 15 blocks short
// below approxGridFar blocks and 63 beyond, when the prefix ends between
// grid positions of the longer prompt.
const (
	approxGridDense = 64
	approxGridStep1 = 16
	approxGridFar   = 1024
	approxGridStep2 = 64
)

// onApproxGrid reports whether block p of an n-block prompt is on the grid.
func onApproxGrid(p, n int) bool {
	switch {
	case p < approxGridDense || p == n-1:
		return true
	case p < approxGridFar:
		return p%approxGridStep1 == approxGridStep1-1
	}
	return p%approxGridStep2 == approxGridStep2-1
}

// approxGrid appends to dst the keys at grid positions.
func approxGrid(dst, keys []kvblock.Key) []kvblock.Key {
	for p, k := range keys {
		if onApproxGrid(p, len(keys)) {
			dst = append(dst, k)
		}
	}
	return dst
}

// approxGridBlocks is the blocks covered by the first j grid keys of an
// n-block prompt: the (j-1)th grid position plus one.
func approxGridBlocks(j, n int) int {
	for p := range n {
		if onApproxGrid(p, n) {
			if j--; j == 0 {
				return p + 1
			}
		}
	}
	return 0
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

// expectedOutputBlocks converts max_tokens to blocks (0 when unknown).
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
