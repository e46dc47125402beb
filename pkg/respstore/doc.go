// Package respstore remembers which replica stores each response of the
// OpenAI Responses API, so that a request naming one reaches the only
// engine that has it.
//
// vLLM (with VLLM_ENABLE_RESPONSES_API_STORE=1) and SGLang (with
// --enable-response-store) keep every stored response, and the chat
// messages it was rendered from, in the serving process's memory. A
// request continuing one (a /v1/responses body with previous_response_id),
// retrieving one (GET /v1/responses/{id}) or cancelling one (POST
// /v1/responses/{id}/cancel) is answered 404 "Response with id '...' not
// found." by every other replica. For the router such a request is pinned:
// it may go to the holder only (route.Request.Pin).
//
// A Store learns holders two ways: Stored, told by the ext_proc server
// when it routes a request that will be stored under an id it knows (the
// body's request_id, which both engines name the response with) or when
// it reads a generated id ("resp_...") from the response's first bytes;
// and, for an id it was never told of (a router restarted, another router
// of an active-active pair routed the first turn, an observer stream that
// went elsewhere), Holder asks the replicas: GET /v1/responses/{id} on
// each of the model's replicas at once (at most Config.LookupFanout),
// bounded by Config.LookupTimeout; the first to answer 200 is the holder.
// Requests naming one id while its lookup runs join it rather than asking
// again; the lookup does not end with the request that started it (only
// LookupTimeout ends it), so a client that gave up leaves the others
// their answer.
// At most Config.LookupConcurrency lookups run at once: past that, and for
// an id every asked replica answered 404 for in the last MissTTL (a
// replica that did not answer in time may hold it: that is no miss), a
// request goes without
// one (routed as any other, where the engine answers 404), so that
// clients sending unknown ids cannot multiply their requests by the fleet
// size. Lost forgets a holder that answered 404 for an id (the engine
// restarted and lost its store). Elsewhere looks past a remembered holder
// that is not healthy, on the other replicas: a proxy that retried the
// storing request on a fallback made that one the holder.
//
// The memory is bounded: the last Config.Memory ids told or found
// (first in, first out), and the last missMemory ids found nowhere. Ids
// longer than MaxIDBytes are never remembered nor looked up.
//
// Store is safe for concurrent use. It starts no goroutine that outlives a
// call: a lookup's requests are joined before Holder returns.
//
// Metrics: kvroute_responses_holder_total{source} (book, lookup, unknown,
// unanswered, skipped, busy), kvroute_responses_forgotten_total (ids
// pushed out of Config.Memory), kvroute_responses_lost_total (holders
// unlearned on their 404),
// kvroute_responses_lookup_requests_total{outcome} (found, not_found,
// error, timeout), kvroute_responses_remembered (ids in memory).
package respstore
