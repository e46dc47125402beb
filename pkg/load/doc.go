// Package load holds the per-replica load view: in-flight prefill and decode
// blocks and requests from the request lifecycle, scraped engine metrics, and
// health. Readers get immutable snapshots; writers never block them.
//
// Parts, each usable alone, all keyed by the replica's ID string:
//
//   - Tracker: the router's own in-flight view. Start(replica,
//     prefillBlocks, decodeBlocks) raises a replica's counters and returns a
//     Handle; Handle.FirstToken moves the request from prefill to decode;
//     Handle.Done releases it. Both are idempotent and safe on every path
//     (cancel, error, panic recovery), so counters never leak. Per-replica
//     atomics: readers never wait. MeanRequest gives the mean request size
//     (exponentially weighted), which View uses to size other routers'
//     requests. A request started with an expected output
//     (StartExpecting: the router's estimate from its max_tokens, and its
//     blocks) is in its
//     replica's decoding ledger from its first token until Done; Releases
//     copies it out (each request's blocks, expected output and time since
//     its first token, on the tracker's clock, SetClock), for kvroute's
//     memory wait. The ledger is a map behind a per-replica mutex, taken
//     only by expecting requests' FirstToken and Done and by Releases. A
//     request whose response streams (Output.Streams) waits in a
//     per-replica list, under the same mutex, until its first token: the
//     oldest one's wait and the prefill blocks that were ahead of it plus
//     its own (InFlight.OldestWait, OldestBlocks; copied to atomics, so
//     Get still never waits) bound how fast the replica is prefilling
//     before any slow first token comes back.
//   - Scraper: polls each target's /metrics (Prometheus text format, parsed
//     with expfmt; vLLM vllm:num_requests_running, vllm:num_requests_waiting,
//     vllm:kv_cache_usage_perc falling back to vllm:gpu_cache_usage_perc;
//     SGLang sglang:num_running_reqs, sglang:num_queue_reqs,
//     sglang:token_usage; the preemption counters
//     vllm:num_preemptions_total and sglang:num_retracted_requests_total,
//     of which it keeps the probe that first read them higher,
//     Scraped.PreemptedAt) and /health every 200ms by default. A replica is
//     unhealthy until its first good probe, after two failed probes in a
//     row, and is readmitted by the next good one. NewScraper has no side
//     effects; Run(ctx) owns one goroutine per target, starts and stops them
//     as SetTargets changes the set, and joins them all before returning.
//     Given the Tracker, it samples the router's own in-flight count around
//     each scrape, so that View can tell other routers' requests in the
//     engine's figures from its own.
//   - Fidelity: compares predicted and served prefix-cache hits per replica
//     and derives the cache credit the router gives the replica's index view
//     (an EWMA of served/predicted, clamped to [Floor, 1]; see Fidelity).
//     Totals returns a replica's cumulative predicted and served cached
//     tokens: the figures its counters export, typed for the admin API.
//   - View: combines the three into Load; its comment gives the formula,
//     including the estimate of other routers' load (exact for this
//     router's own requests, one scrape old and sized by this router's mean
//     request for the others'). Load.MemoryBound says the replica's KV
//     memory binds (preempting within PreemptionHold, or a cache at least
//     MemoryBoundUsage full): its requests may wait for blocks, so the
//     router does not read their late first tokens as a slower replica.
//
// Metrics are registered on the prometheus.Registerer each constructor is
// given (nil: none). Only the Scraper logs, and only on health changes.
package load
