// Package policy decides which replica serves a request, given every
// candidate's matched prefix (by tier), trust and load.
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
//   - kvroute: the router's default; the request's own uncached prefill
//     plus the replica's prefill backlog and a per-request charge, with a
//     bounded-load rule: a replica over its share of the in-flight
//     requests earns no cache credit (Reason "load_bound" when that
//     changed the pick). See KVRoute and the kvroute benchmarks in
//     docs/benchmarks.md.
//
// Rules every policy follows:
//   - Only eligible candidates (Load.Healthy) are picked; with none,
//     Result.Pick is -1.
//   - Candidate.Trust in [0, 1] scales the cache credit a candidate earns;
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
