package load

import "time"

// PreemptionHold is how long after its engine's preemption counter was
// last seen to rise a replica counts as preempting (Load.Preempting).
// Where KV memory binds, the engine preempts every few seconds: on the
// simulator's memory-bound runs (kvroute and round robin, 4 replicas,
// seeds 1-3), 98 % of the gaps between a replica's scraped rises were
// under 10 s with engines twice as fast (grpo and rl at 0.95), and 88 %
// with half the KV cache (rl and grpo at 0.95 and 1.1).
const PreemptionHold = 10 * time.Second

// Load is one replica's load as the router sees it: its own in-flight view
// (requests it routed there and has not seen finish) combined with the
// engine's scraped metrics, which also cover load sent by other routers.
type Load struct {
	// ActivePrefillBlocks are prompt blocks routed to the replica that still
	// need prefill (uncached blocks of requests without a first token yet).
	ActivePrefillBlocks float64
	// ActiveDecodeBlocks are KV blocks of requests that are decoding.
	ActiveDecodeBlocks float64
	// ActiveRequests are requests in flight (running on the engine).
	ActiveRequests int
	// WaitingRequests are requests queued by the engine (scraped).
	WaitingRequests int
	// KVUsage is the engine's KV cache usage in [0, 1] (scraped).
	KVUsage float64
	// KVBlocks is the engine's number of GPU KV blocks (vLLM's
	// cache_config_info num_gpu_blocks); 0 when unknown. With KVUsage it
	// gives the free blocks a placement may use before the engine has to
	// preempt.
	KVBlocks float64
	// PrefillRate is the replica's prefill speed for uncached prompt
	// tokens, tokens per second, as learned from the requests it served
	// (route.Rates); 0 when not known yet.
	PrefillRate float64
	// DecodeStep is the replica's decode step time (the inter-token time
	// its running requests see), as learned from the requests it served
	// (route.Rates); 0 when not known yet.
	DecodeStep time.Duration
	// TokenInterval is the mean time between a running request's output
	// tokens on the replica, steps lengthened by other requests' prefill
	// chunks included (route.Rates); 0 when not known yet.
	TokenInterval time.Duration
	// OldestPrefillWait is how long the router's oldest streamed request
	// on the replica still without a first token has waited, and
	// OldestPrefillBlocks the prefill blocks ahead of it at its start
	// plus its own (Tracker: InFlight.OldestWait, OldestBlocks); 0 when
	// none waits. The replica has prefilled fewer blocks than that in
	// that time: a bound on its speed before any slow sample returns.
	OldestPrefillWait   time.Duration
	OldestPrefillBlocks float64
	// Preempting reports that the engine's preemption counter (scraped:
	// vLLM's num_preemptions_total, SGLang's
	// num_retracted_requests_total) rose within PreemptionHold: its KV
	// memory binds, its requests wait for blocks and are computed again,
	// and a late first token there is memory, not a slower replica.
	Preempting bool
	// Healthy is false when the replica failed its health checks or is not
	// ready; unhealthy replicas are never picked.
	Healthy bool
}

// MemoryBoundUsage is the KV cache usage from which a replica's waiting
// requests may be waiting for memory rather than for prefill (Load.
// MemoryBound): vLLM admits a prompt only when its blocks are free. On
// the simulator's memory-bound runs (rl at 0.95-1.1 with half the KV
// cache, 4 replicas, seeds 1-5, kvroute's and round robin's runs), the
// router read a streamed request waiting over 2 s at under half the
// replica's learned speed 17,408 times (candidates of its decisions):
// 15,703 on a replica preempting, and of the other 1,705 all but 8 on one
// at least 0.9 full. With a replica slowed to a twentieth of its speed
// (the bar's trace, agents, herding and mixed at 0.5 and 0.8, 4 replicas,
// seeds 1-2), 23 of 9,923 such readings were on a replica preempting, and
// 30 of the rest on one at least 0.9 full.
const MemoryBoundUsage = 0.9

// MemoryBound reports that the replica's KV memory binds: its engine is
// preempting (Preempting) or its cache is at least MemoryBoundUsage full.
// Its requests may wait for blocks, so a late first token there is no
// sign that it computes slower.
func (l Load) MemoryBound() bool { return l.Preempting || l.KVUsage >= MemoryBoundUsage }

// Requests returns running plus waiting requests: the queue-length load
// figure that SGLang's and Ray's rules compare.
func (l Load) Requests() int { return l.ActiveRequests + l.WaitingRequests }
