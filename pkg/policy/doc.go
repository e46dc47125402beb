// Package policy decides which replica serves a request, given every
// candidate's matched prefix (by tier), trust, load and whether it is the
// session's home.
//
// Policies are small types behind one interface, built by New(name, Config):
//
//   - blended: NVIDIA Dynamo's cost (overlap credit subtracted from prefill
//     load, plus decode load), with Dynamo's knob names and defaults.
//   - hardswitch: SGLang's cache_aware rule (imbalance test, then match rate
//     against cache_threshold).
//   - prefixaffinity: Ray Serve's PrefixCacheAffinityRouter (four branches).
//   - session: consistent hashing on the session key, optional bounded load.
//   - leastload, roundrobin, random.
//   - pureaffinity: longest match only, ties to the lowest index. For
//     experiments only: it herds (see the seed reproduction in kvbench).
//   - weighted: llm-d's scorers (prefix 3, queue 2, KV utilisation 2, each
//     normalised to [0, 1]) and a max-score picker.
//   - kvroute: the router's default. It predicts each candidate's cost in
//     seconds, prompt blocks turned into time with the replica's learned
//     prefill speed and decode step (Load.PrefillRate, Load.DecodeStep):
//     half the prefill queued there, the request's own uncached prefill,
//     a move charge when the request would leave its session's home (the
//     history it re-prefills, times the fleet's pressure busy/(1-busy):
//     free on an idle fleet, several times the work on a saturated one),
//     a KV-memory overflow charge (blocks past the replica's free KV,
//     which the engine would preempt), the step that samples the first
//     token, a decode step per waiting request and a sequence's share of
//     one per running request. A prompt the router just sent to a replica
//     (Candidate.Pending) is credited as far as the engine will have
//     computed it when it admits the request, given its per-step token
//     budget (step_tokens, vLLM's --max-num-batched-tokens), and a burst
//     that fills the fleet, or a request without a home in a burst or on
//     a prefix that drew one within minutes, is held where its prompt is
//     in flight (Reason "held"); a bounded-load
//     safety net at three times the mean load takes a replica's cache
//     credit, never at the session's home (Reason "load_bound" when that
//     changed the pick). See KVRoute and the kvroute benchmarks in
//     docs/benchmarks.md. It is a Pacer: route drains its estimate of
//     each replica's prefill queue at the speeds kvroute prices (a
//     replica with none learned takes the fleet's mean, else
//     prefill_rate), and so does it for any other policy with kvroute's
//     defaults (PrefillRates).
//
// Rules every policy follows:
//   - Only eligible candidates (Load.Healthy) are picked; with none,
//     Result.Pick is -1.
//   - Candidate.Trust in [0, 1] scales the cache credit a candidate earns
//     (the trusted share of its matched blocks);
//     0 (a resyncing replica) removes it entirely.
//   - With a cold or empty index (no eligible candidate has a creditable
//     match) the cache-aware policies and leastload pick the least loaded
//     with Reason "cold_index". roundrobin and random are load-blind by
//     definition and session keeps its key affinity.
//   - "Least loaded" means fewest LoadBlocks (active prefill plus decode
//     blocks), then fewest requests (running plus waiting). SGLang's and
//     Ray's own branches compare requests only, as they do.
//   - Ties never go to the lowest index (pureaffinity excepted, on purpose):
//     they are broken uniformly at random with Env.Rand.
//
// The package is pure: no goroutines, no clock, no logging; randomness
// comes in through Env. The only state is explicit and documented on its
// type: RoundRobin's atomic counter and Session's ring cache (mutex
// guarded). Every Policy is safe for concurrent use provided Env.Rand is
// (a *rand.Rand over a locked source, or one per goroutine).
package policy
