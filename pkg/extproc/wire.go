package extproc

// The wire contract with the proxy, in one place (Gateway API Inference
// Extension, Endpoint Picker protocol).
const (
	// DefaultDestinationHeader carries the picked endpoint "ip:port" on the
	// upstream request.
	DefaultDestinationHeader = "x-gateway-destination-endpoint"
	// DefaultFallbackHeader carries the ordered fallback endpoints
	// "ip:port,ip:port" when fallbacks are not folded into the destination
	// value (Config.FallbacksInDestination).
	DefaultFallbackHeader = "x-gateway-destination-endpoint-fallback"
	// DestinationPrefix: every client-sent header starting with it is
	// removed, so a client never chooses its own upstream.
	DestinationPrefix = "x-gateway-destination-endpoint"

	// MetadataNamespace / MetadataDestinationKey: the dynamic metadata the
	// pick is also published under (same value as the header).
	MetadataNamespace      = "envoy.lb"
	MetadataDestinationKey = "x-gateway-destination-endpoint"
	// SubsetNamespace / SubsetKey: the proxy's subset hint in the request's
	// metadata_context: a list of "ip:port" the pick must come from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey (namespace envoy.lb) reports, on the response path, the
	// endpoint that actually served the request.
	ServedKey = "x-gateway-destination-endpoint-served"

	// DecisionHeader carries the decision id on the routed request: the
	// router always sets it (replacing any client value), and the observer
	// stream (Envoy's second, observability-mode ext_proc filter) reads it
	// from the request headers it is sent, to find the decision whose
	// response it observes. The shipped Envoy configs also strip it from
	// client requests before routing and from the request sent upstream.
	DecisionHeader = "x-kvroute-decision"

	// ReasonHeader explains an immediate (error) response.
	ReasonHeader = "x-kvroute-reason"
	// DefaultSessionHeader carries the session affinity key.
	DefaultSessionHeader = "x-session-id"

	// MaxStreamedChunk bounds each re-sent body chunk in
	// FULL_DUPLEX_STREAMED mode (some proxies cap streamed chunks at 64 KiB).
	MaxStreamedChunk = 62000
)

// Reasons reported in ReasonHeader and the rejection metric.
const (
	ReasonNoReplica    = "no_healthy_replica"
	ReasonSubsetEmpty  = "subset_empty"
	ReasonUnknownModel = "unknown_model"
	ReasonBadRequest   = "invalid_request"
	ReasonTooLarge     = "body_too_large"
	ReasonTimeout      = "decide_timeout"
	ReasonInternal     = "internal_error"
)
