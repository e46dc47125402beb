// Package admin serves kvroute's own admin API (proto/kvroute/v1): Explain a
// routing decision, list the decisions made most recently, list the replica
// set, report index statistics. The same calls are mirrored as HTTP JSON on
// the admin listener:
//
//	POST /debug/explain   the OpenAI request body, as a client would send it
//	                      (query: path=/v1/completions, session=<key>; the
//	                      x-session-id header is honoured too)
//	GET  /debug/decisions the newest routing decisions, oldest first, each
//	                      with its time and every candidate's match, load
//	                      and cost (query: limit=N); 409 when the router
//	                      keeps no history (routing.decision_history 0)
//	GET  /debug/replicas
//	GET  /debug/index
//	     /debug/pprof/...  the Go profiler (net/http/pprof)
//
// Error bodies quote at most 512 bytes of a message (which may carry a
// request value such as a model name), then the message's full length.
// The handler can explain any prompt and profile the process: the admin
// listener stays on loopback unless TLS protects it.
//
// Explain runs the same decision ext_proc runs, through the Explainer it is
// given, and must not touch any load counter: the caller wires an Explainer
// that only reads. Nothing is sent to a replica.
//
// The package declares what it reads as small interfaces (Explainer,
// ReplicaLister, IndexStater, DecisionLister) and a RequestParser function, all provided by
// the composition root. A Server holds no goroutine of its own: gRPC and HTTP
// servers that call it are owned by the caller. It is safe for concurrent use.
package admin
