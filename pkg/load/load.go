package load

import "time"

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
	// Healthy is false when the replica failed its health checks or is not
	// ready; unhealthy replicas are never picked.
	Healthy bool
}

// Requests returns running plus waiting requests: the queue-length load
// figure that SGLang's and Ray's rules compare.
func (l Load) Requests() int { return l.ActiveRequests + l.WaitingRequests }
