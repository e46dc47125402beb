// Package route is the protocol-free routing decision:
//
//	Decide(ctx, Request) (Decision, error)
//
// tokens (given, or from the Tokenizer) -> block keys (kvblock, per distinct
// block size of the candidates) -> longest match per replica (Matcher) ->
// policy pick -> Decision. ext_proc, the admin explain API and kvbench all
// call it. The Decision carries the pick, the policy and reason, up to two
// fallback addresses (next best eligible by the policy's cost), and every
// candidate's match per tier, trust, load, cost and eligibility.
//
// Candidates are the replicas serving the request's model (all of them when
// it names none) that the request's subset admits; of those, a request
// with a Pin (the holder of a stored Responses API response it continues,
// retrieves or cancels: no other engine has it) keeps only the replicas at
// that address, healthy or not, and routes as any other when none is
// there (Decision.Pin says which happened). A model that is no
// replica's base model but some replicas' LoRA adapter (Replica.Adapters)
// is routed among those replicas only, keyed under the adapter's root
// (kvblock.Root) and tokenized with their base model; each candidate's keys
// fold in its engine's lookahead tokens (Replica.Lookahead). Exact tokens are matched
// against the index; approximate tokens never are (Degraded
// "approximate_tokens"), and a tokenizer error or timeout routes on load
// alone (Degraded "tokenize_error" / "tokenize_timeout"). A policy that fell
// back for a cold index reports Degraded "cold_index".
//
// Approximate mode (Options.Approx, an ApproxIndex): replicas without an
// event stream (State's optional EventFeeds) have no engine view, so the
// router remembers its own dispatches instead: block key -> replicas sent a
// request carrying it, expiring after a TTL, bounded in entries (LRU,
// evictions counted). Their candidates are matched against it (trust
// Options.ApproxTrust, Candidate.Approximate set), for approximate tokens
// (Degraded "approximate_index") and for exact ones alike; event-fed
// candidates are matched against the Matcher for exact tokens only and get
// trust 0 for approximate ones. Keys of the approximate index are rooted
// apart from kvblock.Root, and approximate ids apart from exact ones, so the
// modes never mix. Decide records the pick's keys there when the pick has no
// events; Explain records nothing.
//
// Sessions: every request's session key is the x-session-id header, else
// one derived from the body (SessionKey: the conversation the body names,
// else a hash of a chat's opening up to its first assistant message, else
// OpenAI's prompt_cache_key, else the OpenAI `user`), else, for a
// request with exact tokens that is not a chat request (one without a key
// is a first turn), the conversation whose prompt its own continues (promptBook.continues: the longest prompt the router sent
// that it begins with, sent to one replica and continued by no other
// prompt, probed only up to the longest match any replica's index holds;
// "conv:" and that prompt's key, inherited by every later turn;
// Decision.SessionFromPrompt). A /v1/completions client's conversations
// and an RL trajectory's steps sent as token ids carry nothing else. The Router
// remembers, per key, the replica that served the session's last request
// (bounded: two generations of Options.SessionMemory/2 keys) and marks that
// candidate policy.Candidate.Home, a hint the policy weighs (kvroute
// charges a move away from it and never applies its load bound there),
// never a pin. Decide records the pick as the new home; Explain does not.
//
// Views known to miss stores: a State may report, per replica, that its
// event-fed view misses blocks the engine holds (the optional ViewGaps:
// the events manager's mark after a store whose parent the index did not
// hold, from a batch lost without replay or stores resumed after the view
// was cleared). Such a view undercounts what the replica holds, and a
// load-aware policy would then move a session off the history it left
// there. The Router keeps a prompt book (promptbook.go): per prompt it
// sent, the router key of its last full block -> length, the last four
// replicas it went to (a GRPO group's task prompt goes to several), the
// conversation key its request carried and the one prompt that continued
// it (Sessions, above), bounded like the homes. With a State that reports
// gaps, a request that resends an earlier prompt finds the longest such
// one (a probe per block, only while some candidate's view has gaps), and
// at each of that prompt's
// replicas that reports gaps, shows less of it in its index and has none
// of it in flight (Pending), the missing blocks are credited on its GPU
// tier:
// policy.Candidate.Matched includes them, the Decision's Candidate.Vouched
// counts them apart from the index's Matched. A view being relearned
// (trust 0, its matches worth nothing) gets Options.ApproxTrust and
// nothing of its index, so the vouched prompt (or a prompt's pending
// credit) counts there, as the approximate mode credits dispatches where
// no events come. Vouched blocks are part of the prediction the closed loop
// checks, so a replica that no longer holds what it was sent loses trust.
// Explain reads the book; only Decide records.
//
// Prefixes: the Router also remembers, per prefix that draws a request
// (the longest indexed match any candidate has, keyed by its deepest
// block; bounded like the homes), how its recent placements spread over
// replicas, each weighed by its prompt's blocks and halved per
// PrefixShareHalfLife of age, and reports them as
// policy.Candidate.PrefixShare (a share of the blocks) and
// policy.Request.PrefixPlacements (a count of requests)
// (kvroute's prefix share bound), and the largest count each prefix
// reached, halved per PrefixBurstHalfLife, as policy.Request.PrefixBurst
// (kvroute's hold of a burst's first requests). Decide records its pick
// there; Explain does not.
//
// Living sessions: the Router's session book (sessionbook.go) keeps, per
// replica, the sessions living there (their latest request went there
// within Options.SessionHorizon of their inter-turn gaps) with each one's
// turn rate and uncached blocks per turn, reported as
// policy.Candidate.Sessions: the committed future work the instantaneous
// load misses while sessions think. It also learns, per start class (the
// prefix that drew a session's first request, shrunk toward its key
// kind), what new sessions go on to do (later turns, blocks per turn,
// gaps, with SessionStatsHalfLife decay), and gives a request with a
// session key and no home that prediction as policy.Request.Future.
// Requests of one key closer than MinSessionGap are parallel requests,
// not turns. Bounded like the homes; Decide records, Explain only reads.
//
// Sessions of unknown future: until one of a key kind's sessions has come
// back, nothing predicts what its new sessions bring (Request.Future is 0
// for their class and kind alike), and the cost sees only the shared
// prefix they would find where it is held: a fleet's first sessions (new
// agents sharing a 3-6k-token harness prompt) all go to its holder and
// pack there, their later turns queueing behind each other's. So for a
// policy that prices a session's future (kvroute's FutureWait, unless
// future_weight is 0), a request starting a session (header or user key,
// no home) while its kind has seen none of its sessions come back and
// fewer of them start than there are eligible candidates is kept off the
// replicas that took more of the kind's sessions than the fewest any
// took: the policy's pick stands when it took the fewest, else the policy
// picks again among the idle ones that did (nothing running, waiting or
// queued), and that pick is taken (reason "session_round"; every
// candidate's cost from the first pick is still reported) only if the
// policy's cost puts it no further off than the prefill of the prefix the
// first pick holds beyond it. So a session of the round costs at most one
// prefill of its shared prefix, on a replica nobody was using; after one
// session per replica the prefix is held everywhere and no longer tips the
// cost, and once a session of the kind comes back its prediction takes
// over. Under load no replica is idle and the round changes nothing. Conversation keys are
// never in a round (such a key comes from a history: its request is a
// later turn). The kind's starts per replica decay like its other counts.
//
// Growing sessions: once the kind's sessions come back, the prediction
// prices the queueing a new session's later turns meet and bring, not the
// cache its history will take on the replica it starts on. So a new
// session (header or user key) whose later turns are predicted to add
// more history (Future.Turns times Future.Blocks) than the prefix its
// pick holds beyond an idle replica with the fewest living sessions
// (Candidate.Sessions) goes there by the same rule as the round (reason
// "session_balance": the policy's pick among the idle ones, taken only
// within the prefill of that prefix). Agent sessions that start small and
// grow to a replica's cache no longer pack on their prompt's holder; a
// chat session, whose short turns add less than the system prompt it
// would leave, stays with the prompt.
//
// Crowded holders: each such session alone is cheaper on its prompt's
// holder, so a replica holding popular prompts draws every session of
// them. When the pick has SessionCrowdRatio times its fair share of the
// healthy candidates' living sessions (its share of their prefill speed)
// and SessionCrowdExcess more than the fewest, a new session (header or
// user key) the balance left with its prefix goes to a replica with the
// fewest living sessions, busy or idle, by the same rule (reason
// "session_replicate": the policy's pick among them, taken only within
// the prefill of the prefix the first pick holds beyond it). That one
// prefill copies the prefix; the cost then splits its later sessions
// between the holders.
//
// Speeds: each candidate's Load.PrefillRate and DecodeStep are the
// State's, else Options.Rates' learned ones (see Rates: a much slower
// replica restarts the estimate after a run of samples, or a short run
// spread over a minute), then held to what the candidate's oldest
// streamed request still waiting for a first token proves
// (Load.OldestPrefillWait; Request.Streams marks such requests for the
// tracker): a replica that slowed is seen before its
// slow first tokens come back, once the proof is below RateShiftRatio of
// the learned speed. Neither the restart nor the bound reads a replica
// whose KV memory binds (load.Load.MemoryBound: preempting, or its cache
// at least load.MemoryBoundUsage full): there a late first token may be
// a wait for blocks, which the policy's memory term prices.
//
// Outputs: a request's expected output (policy.Request.ExpectedOutputBlocks,
// and the tracker's decoding ledger) is its max_tokens, or, for a
// max_tokens value that OutputMinSamples finished requests carried, the
// mean output they generated (Rates.ExpectOutput, fed with each observed
// response's output and the decision's MaxTokens): most clients send a
// cap (32,000 from an agent harness) or none, not the output, and a cap
// taken as the output charges every request for KV blocks it never
// fills. A client that sends each request's exact output is priced as
// before: its values repeat only with that mean.
//
// Departed replicas: what the Router keeps per replica (the fluid queue
// of the prefill it sent there, the learned speeds of Options.Rates, the
// session load committed there) is dropped at the first decision that no
// longer finds the replica in State.Replicas. An unhealthy replica stays
// in that set and keeps its own; one that is not Ready (fleet.Set lists
// Ready replicas only) is dropped like a departed one, so a readiness flap
// costs it what was learned about it.
//
// Concurrency: a Router is safe for concurrent use. It starts and owns no
// goroutine. Decide holds the Router's lock from reading the candidates'
// loads to charging its pick (Options.Tracker, Decision.Hold) and
// recording it, so concurrent decisions see each other's picks. Per-call buffers come from a sync.Pool; policy randomness comes
// from one *rand.Rand over a mutex-guarded PCG seeded from Options.Seed, so a
// single goroutine's sequence of decisions is reproducible. Decide reads the
// clock (Options.Now, injectable) to report TokenizeTime and DecideTime; its
// start time is also the approximate index's now. The ApproxIndex is safe
// for concurrent use (one RWMutex) and takes its time from the caller.
package route
