// Package engine is a model of a vLLM engine's KV cache and scheduler, pure
// and driven from outside: the same model runs in real time behind the
// enginesim HTTP server and in simulated time inside a discrete-event
// benchmark.
//
// # Driving it
//
// New(cfg, seed) builds an engine. Submit(now, req) queues a tokenized
// request; Step(now) runs one scheduler step and returns a StepResult: the
// step's simulated start and end, the tokens sampled (at End), the requests
// finished (with arrival, first-scheduled, first-token and finish times and
// cached tokens), the requests preempted, and the KV-cache events of the
// step. NextEventTime reports when the next step may start (the end of the
// previous one) or that the engine is idle. A discrete-event driver calls
// Step at NextEventTime and interleaves arrivals; a real-time driver sleeps
// until the wall-clock image of each step's End before delivering its
// results. Times are time.Duration offsets on the driver's own clock.
//
// # Cache
//
// The GPU cache holds NumGPUBlocks blocks of BlockSize tokens. Only full
// blocks are cached, under chained 64-bit hashes: xxh3 over the parent's
// hash (8 bytes big-endian), the block's tokens (uint32 little-endian) and
// its extra keys — the LoRA adapter name on every block of an adapter's
// request, then the cache salt on block 0 — rooted at a none-hash derived
// from the seed (the driver passes a random seed unless one is configured,
// as vLLM roots its chains at a random NONE_HASH unless PYTHONHASHSEED is
// set). Blocks held by running requests are pinned by reference counts.
// When a request finishes, its blocks are appended to the free list last
// block first; allocation takes the free list's head, so the least recently
// freed block is evicted first (BlockRemoved, medium GPU). With a CPU tier
// (NumCPUBlocks > 0) an evicted block is offloaded to it (BlockStored,
// medium CPU), the CPU tier evicts its least recently used block when full
// (BlockRemoved, medium CPU), and a prefix lookup that misses the GPU but
// hits the CPU reloads the block (BlockStored, medium GPU) at
// ReloadTokensPerSec. A block computed while another copy of the same hash
// is cached stays private and is never published. ResetPrefixCache forgets
// everything on both tiers (AllBlocksCleared) and, like vLLM, refuses while
// any block is in use.
//
// # Hybrid attention
//
// With Config.SlidingWindow > 0 the engine models a hybrid-attention model
// as vLLM 0.33's hybrid KV-cache coordinator does: a full-attention group
// (0) and a sliding-window group (1) of the same block size share the
// block pool; a request's sliding-window blocks that leave the window are
// released during its prefill (and so are evicted first); both groups
// cache and publish every full block (group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window on BlockStored, group_idx on
// BlockRemoved); and a prefix hit is the full-attention hit cut to where
// the sliding-window group still holds a window's worth of consecutive
// blocks. hybrid.go has the exact rules. Stats.CachedGPUBlocks counts both
// groups' blocks; CachedPrefix and BlockHashes are the full-attention
// group's. No CPU tier in this mode.
//
// # Scheduler
//
// Continuous batching in steps, after vLLM's v1 scheduler. Each step first
// serves running requests in admission order: a decoding request computes
// its one new token, a request in chunked prefill continues with as many
// tokens as the budget (MaxNumBatchedTokens) leaves. When blocks run out
// the most recently admitted running request is preempted: its blocks are
// released (they stay cached) and it returns to the head of the waiting
// queue, to be recomputed later. If nothing was preempted, waiting requests
// are then admitted in order while the batch is below MaxNumSeqs, budget
// remains and their blocks fit: at admission the prompt is looked up in the
// cache — full blocks only, never the prompt's last token — and the hits are
// not recomputed; the rest is prefilled, chunked by the budget.
//
// A step lasts StepTime + StepTimePerSeq × batch size + prefill tokens /
// PrefillTokensPerSec + reloaded tokens / ReloadTokensPerSec. A request
// samples a token at the end of each step in which its computed tokens
// catch up with its known tokens: its first token ends its prefill (TTFT
// emerges from queueing, prefill chunks and batch size), later tokens come
// one per step (inter-token latency grows with the batch). Newly full
// blocks — of the prompt and of the output — are cached as the step that
// computes them is scheduled, as vLLM v1's scheduler caches them when it
// allocates their slots, and published with that step's events: a request
// admitted later in the same step, or while a long prompt's chunks are
// still being computed, finds the blocks scheduled so far and computes
// none of them again (SGLang holds such a request back a step and then
// finds them; vLLM's V0 engine cached a block only once computed). A
// request finishes after MaxTokens tokens; generated text comes from
// package simtok's generator, seeded by the engine seed, the prompt and
// the request's sampling seed (Request.Sample: 0 is greedy, the same
// answer for the same prompt; any other value samples an answer of its
// own, as at a temperature above 0).
//
// Stats reports what a vLLM engine exports on /metrics — running and
// waiting requests, KV usage and free blocks, prefix-cache queries and
// hits, prompt, computed-prefill and generation tokens, preemptions, and
// the sums of TTFT, queue, prefill and decode times — plus the running
// averages an observer of its steps can derive (prefill tokens per second
// of prefill steps, decode step time). Finished carries each request's
// arrival, first-scheduled, first-token and finish times and its cached
// tokens, as a response's timing and usage do.
//
// Everything is deterministic: the same config, seed and sequence of calls
// give the same results, hashes and events.
//
// Memory: the table from block hash to its place on both tiers and the CPU
// tier's LRU links are mapped outside the Go heap on huge pages (package
// hugemem), because they are probed at random; an Engine that becomes
// unreachable gives them back to the OS.
//
// # Concurrency
//
// An Engine is not safe for concurrent use: the driver serialises calls.
// The package starts no goroutine, reads no clock, does no I/O and does not
// log.
package engine
