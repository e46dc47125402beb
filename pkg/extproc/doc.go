// Package extproc is the router's Envoy external-processing (ext_proc v3)
// service, speaking the Gateway API Inference Extension's Endpoint Picker
// protocol. It owns the per-stream state machine; the decision itself is
// the Decider's (route.Decide), and load bookkeeping is package load's.
//
// # Wiring
//
//	srv, err := extproc.New(extproc.Config{
//		Decider:    router,         // route.Decide's shape
//		Tracker:    tracker,        // *load.Tracker, optional
//		Fidelity:   fidelity,       // *load.Fidelity, optional
//		BlockSize:  blockSizeOf,    // optional, for predicted cached tokens
//		TracerProvider: tp, Registerer: reg, Logger: log,
//	})
//	health := extproc.NewHealth()   // live, not ready
//	g := grpc.NewServer(append(srv.ServerOptions(), keepaliveEtc...)...)
//	srv.Register(g)
//	health.Register(g)
//	health.SetReady(true)           // once replicas and index are usable
//	...
//	health.Shutdown(); g.GracefulStop()
//
// Config follows the configuration convention: its settings carry YAML
// tags, their defaults are the Default* constants, WithDefaults fills them
// and Validate reports every problem with its field path. One setting,
// Config.MaxBodyBytes (default 16 MiB), bounds request bodies everywhere:
// the router answers 413 body_too_large above it in every body mode, and
// ServerOptions derives the gRPC receive limit from it (in BUFFERED mode
// the whole body arrives in one message; gRPC's own default of 4 MiB made
// the proxy fail open on larger bodies and route them blind). The proxy
// must buffer exactly MaxBodyBytes (Envoy's request_body_buffer_limit); a
// test checks the shipped envoy/*.yaml and the chart's bootstrap.
// ServerOptions also fixes large HTTP/2 flow-control windows, so that
// large bodies sharing the proxy's one connection do not wait on window
// updates.
// For the subset hint to arrive, the proxy must forward the metadata
// namespace envoy.lb.subset_hint (ext_proc
// metadata_options.forwarding_namespaces.untyped); forwarding envoy.lb too
// reports the served endpoint (a span attribute) but makes Envoy echo the
// pick on every later message, each streamed chunk included, so the
// shipped configs do not.
//
// New has no side effects beyond registering metrics; the gRPC server owns
// the stream goroutines (one per ext_proc stream, i.e. per HTTP request),
// and Process returns when its stream ends. Streams share nothing but the
// Decider, the Tracker and the metrics: no lock, goroutine or buffer of
// the package is common to two streams. A buffered body is used in place
// (no copy of the gRPC message's bytes).
//
// # One stream
//
//	request headers -> (body accumulation) -> decide -> pick | immediate response
//	response headers -> response body chunks -> end of stream
//
// Request body modes: FULL_DUPLEX_STREAMED holds the request-headers
// answer until the body's end of stream, decides, then answers the headers
// with the pick and re-sends the body as streamed body mutations of at most
// 62,000 bytes. BUFFERED (and BUFFERED_PARTIAL) answers the headers at once
// (stripping client destination headers) and carries the pick in the body
// answer. With no body (headers end the stream, or a NONE/STREAMED body
// mode) the pick is made at the headers by load alone. The modes are read
// from the proxy's protocol_config on the stream's first message, else
// taken from Config.
//
// The pick: header x-gateway-destination-endpoint (Config.DestinationHeader)
// = "ip:port", dynamic metadata envoy.lb / x-gateway-destination-endpoint
// with the ordered list "pick,fallback,..." (the protocol's list form, which
// Envoy's override_host load balancer walks on retries), clear_route_cache
// set, and the ordered fallbacks in x-gateway-destination-endpoint-fallback
// (or folded into the header's value too with Config.FallbacksInDestination;
// off by default because an ORIGINAL_DST cluster needs one address). Every
// client-sent x-gateway-destination-endpoint* header is removed, even when
// the router then sets the same one. The caller's W3C trace context is
// continued: a server span kvroute.request per stream, a child
// kvroute.decide span with the decision's attributes and a bounded
// candidate_costs event; traceparent is injected upstream.
//
// The subset hint (metadata_context envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset, a list or comma-separated string
// of ip:port) is passed as route.Request.Subset; present but empty is a
// 503 without a decision.
//
// Stored responses (Config.Responses, a respstore.Store): a /v1/responses
// body with previous_response_id, and GET /v1/responses/{id} or POST
// /v1/responses/{id}/cancel, name a response one engine stores in its own
// memory; the request is pinned to that holder (route.Request.Pin) when
// the store knows or finds it. A /v1/responses body the engine will store
// (store not false) records its pick as the holder: at once under the
// body's request_id, else under the id the response's first bytes name
// (openai.ResponseID; the observer reads up to 64 KB for it). A pinned
// request answered 404 unlearns its holder; one whose holder is not
// healthy is pinned to another replica that answers for the response
// (ResponseStore.Elsewhere), else refused 503.
//
// Errors are immediate responses with an OpenAI-style JSON error body (on
// /v1/messages the Anthropic API's {"type":"error","error":{type,
// message}}, which its clients read) and header x-kvroute-reason: 400
// invalid_request (unparseable body on /v1/completions,
// /v1/chat/completions, /v1/responses or /v1/messages), 413 body_too_large, 404
// unknown_model, 503 no_healthy_replica / subset_empty / decide_timeout,
// 500 internal_error. Unknown paths, non-JSON bodies and body-less requests
// are routed by load alone (a "model" field is still read leniently from
// JSON bodies). Tokenization failures degrade inside the Decider. A panic
// while handling a message is recovered, counted
// (kvroute_extproc_stream_errors_total{kind="panic"}), answered with 500
// when still possible, and ends only that stream.
//
// Response side, off the data path. The shipped Envoy configs run two
// ext_proc filters: the router filter (request headers and a buffered
// body; no response processing) and, after it, an observer filter in
// observability mode (Envoy sends the request headers, response headers,
// every response body chunk and the trailers without waiting, and ignores
// answers; none are sent). On the pick the router sets DecisionHeader, a
// per-process unique and unguessable id, replacing any client value, and
// registers a flight (flight.go: the decision, the load charge, the request
// span, the pick time) under it. Its stream then idles: Envoy closes a
// stream with a buffered body when it is done with the request, which
// marks the request's end when no observer stream of this process claims
// the flight. The observer stream claims the flight with the id from its request
// headers (once: a repeated, foreign or forged id is ended at once,
// unanswered, and moves nothing) and does the accounting; it closes its
// stream when the response ends, after which the proxy sends it nothing.
// A proxy with one filter that sends the response on the router stream
// works too: that stream claims its own flight and answers each message
// (chunks echoed unchanged in FULL_DUPLEX_STREAMED mode with one reused
// answer per stream, continued otherwise). A flight no stream claims
// (no observer filter; in active-active, an observer stream Envoy sent to
// another kvroute replica) releases its charge when its router stream
// ends (buffered body: the request's end; a body-less request's stream may
// end at once, and its charge then waits) and ends Config.ObserverWait
// after the decision (kvroute_extproc_unobserved_total), until which a
// late observer can still report usage.
//
// With Config.UsageSampleEvery N > 1 (the default, 64), the observer
// follows one streamed response in N to its end, and besides one of a
// replica's whenever none of that replica's was in the last
// Config.UsageSampleInterval (250 ms: every response of a replica that
// gets fewer than four a second); for the others whose router stream's
// close marks the request's end (a buffered body) it stops at the first
// token and closes its stream, so Envoy sends none of the remaining chunks
// (kvroute_extproc_observed_to_first_token_total), and the router stream's
// close ends the flight: the load view still sees first token and end, and
// Rates still gets every first-token time (the prefill speed, with the
// uncached tokens kvroute predicted, when the prompt's tokens were exact);
// Fidelity, Rates' decode step and the span's usage attributes only the
// responses followed to their end.
//
// The accounting: a chunk is parsed only as far as the first output and
// the usage object need. On the pick the replica's in-flight counters rise
// (Tracker.Start with the prefill the pick computes itself,
// route.Decision.PrefillBlocks, and the prompt blocks as decode
// footprint); the first output (first SSE event with
// content, or the first chunk of a non-streamed body) moves prefill to
// decode; the end of the response, or any end of the observing stream
// (client disconnect, error, panic, the proxy's deferred close), releases
// them. Usage from the JSON body or the last SSE usage chunk is compared
// with the prediction (the picked replica's matched blocks x block size,
// capped below the prompt length since engines recompute the last token)
// and fed to Fidelity. A streamed (SSE) response also feeds Config.Rates:
// pick-to-first-token and pick-to-end times with the usage's prompt,
// cached and output tokens, from which the router learns each replica's
// prefill speed and decode step.
//
// Abuse limits (a client of the port that is not a proxy; mutual TLS in
// front of the port is the first defence): a stream counts as load only
// once it produced a routing decision, and only until the request's
// deadline (Config.MaxRequestLifetime): held open longer it is released and
// its usage ignored. Usage feeds Fidelity only on a stream kvroute routed,
// once (the first complete response), and only for a 2xx response. A
// connection carries at most Config.MaxStreamsPerConnection streams at once
// (further ones wait for a slot) and is closed after
// Config.MaxConnectionIdle without streams (ServerOptions).
//
// Shutdown: after GracefulStop has waited as long as the owner allows,
// Server.EndStreams ends every stream still open with UNAVAILABLE
// (ErrEndStreams) at its next message, after answering that message, and
// counts it (kvroute_extproc_stream_errors_total{kind="ended"}). A proxy
// that fails open (Envoy's failure_mode_allow) serves the rest of the
// request without the router; observer streams end the same way and the
// proxy, which never waits for them, loses nothing. Streams with no
// message pending are ended by the owner's final grpc.Server.Stop.
//
// Metrics (registered on Config.Registerer): kvroute_decisions_total,
// kvroute_decision_duration_seconds, kvroute_tokenize_duration_seconds,
// kvroute_extproc_immediate_responses_total,
// kvroute_extproc_stream_errors_total, kvroute_extproc_streams_active,
// kvroute_extproc_requests_in_flight (flights),
// kvroute_extproc_observer_streams_total{outcome},
// kvroute_extproc_unobserved_total,
// kvroute_extproc_observed_to_first_token_total.
//
// Health: NewHealth serves the gRPC health protocol with the three service
// names liveness, readiness and envoy.service.ext_proc.v3.ExternalProcessor.
//
// FloorProcessor (and ServeFloor) is for measuring, never routing: it
// answers the same messages as Server with round-robin picks and decides
// nothing, so that what the protocol itself costs can be read beside
// kvroute (kvbench overhead -floor).
package extproc
