// Package overhead measures what kvroute adds to the request path: it
// starts Envoy routing by kvroute and a second, plain round-robin Envoy
// in front of the same fast simulated engines (package testbed), drives
// the same load through each in turn, and reports side by side the
// latency (time to first token, end to end, inter-token), the throughput
// and kvroute's CPU time per request.
//
// Loads (Workload): small chats sent open loop at a fixed rate (requests
// start on schedule whether or not earlier ones finished), and large chat
// bodies (229 KB, 533 KB) sent closed loop at a fixed concurrency. Every
// request is a streamed chat completion with a body unique to it (so no
// tokenizer cache serves it), 64 output tokens and a final usage chunk.
// Targets alternate within one run (kvroute, round robin, kvroute, ...),
// Runs times each; Report keeps every run and the medians.
//
// kvroute's CPU time is read from /proc for its process over each
// kvroute phase and divided by the requests completed; routed counts the
// decisions kvroute made, so a request that Envoy sent round robin
// because kvroute failed open is visible. Engines are simulated with
// prefill effectively free and one output token per millisecond, so both
// targets see the same upstream and the difference is the router's.
//
// With Options.Floor a third target runs beside them: an Envoy with
// kvroute's own configuration whose ext_proc server is extproc.FloorProcessor, a
// process of its own (kvbench extproc-floor) that answers the same
// messages with round-robin picks and decides nothing. Its CPU per
// request is the ext_proc protocol's floor on this machine: what any
// processor pays for the two streams per request before its own work.
//
// Run owns every process and goroutine it starts and returns after
// stopping and joining all of them.
package overhead
