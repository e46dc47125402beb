// Package bench measures routing quality offline: workloads (Mooncake
// traces and seeded generators), a discrete-event simulation of a fleet of
// pkg/engine replicas routed by the real route, index and policy packages,
// the summaries kvbench prints, and a coordinate search over a policy's
// knobs.
//
// # Workloads
//
// A Workload is a list of sessions; a session is a sequence of turns sent
// one after another (the next turn arrives its think time after the
// previous one finished, with the previous prompt and the tokens the engine
// generated prepended, less a reasoning turn's first Turn.Hidden tokens,
// its thinking). ReadTrace turns a Mooncake-format trace into
// single-turn sessions, expanding its hash ids (512 tokens each in
// Mooncake's traces; other block sizes are found from the lines or given)
// with kvblock.ExpandTrace; a bad line is an ErrTrace error naming the line.
// Generate builds the synthetic workloads (Generators: chat, agentic, rl,
// herding, fanout, agents, grpo, mixed, groups, which are the bar's,
// BarGenerators, and reasoning) from a seed: the same options give the
// same workload.
//
// # Simulation
//
// Simulate runs a workload through FleetConfig.Replicas engines (of one
// configuration, or at per-replica speeds with FleetConfig.Speeds: a mixed
// fleet of GPU generations with the same KV memory; FleetConfig.SpeedChanges
// changes a replica's speed during the run, as a GPU that throttles) in
// simulated time: an event queue orders speed changes, step completions,
// index deliveries, arrivals and step starts (in that order at equal
// times), so
// a run is deterministic for a given workload, freshly built policy and
// config. Decisions go through route.Decide over a State fed by a
// load.Tracker (the router's in-flight view), engine figures scraped at
// most ScrapeInterval ago and load.Fidelity's cache credit. The engines'
// cache events are applied to an index.Index after EventDelay, and lost
// whole with probability EventLoss. Each finished request records its
// TTFT, E2E, cached, predicted and ceiling tokens (the ceiling being one
// infinite cache that saw every earlier prompt and output) and the session
// key the router derived. Requests carry what a live client sends: a
// max_tokens after the clients' habit (FleetConfig.MaxTokens: the exact
// output, a cap or none), a
// session's x-session-id header or OpenAI user field after its habit, and,
// on a conversation's later requests, its opening messages (hashes of the
// first prompt and its answer), from which route.SessionKey derives the
// same conv: key a live router would.
//
// # Many cases
//
// RunCases simulates a list of cases (workload, policy, fleet with its
// seed) on a bounded pool of goroutines and returns their summaries in case
// order: results do not depend on the number of workers. It starts the
// costliest cases (most prompt and output tokens) first, so that no worker
// runs a long case alone at the end. The cases of one
// workload on one engine configuration share its relevance precomputation
// (every prompt's block hashes), computed once and dropped after the last
// of them. AggregateSeeds
// turns one policy's per-seed summaries into medians and ranges (Spread);
// comparisons use the medians.
//
// # Memory
//
// The simulator's table of every block hash (the ceiling's availability
// and relevance's counts; hundreds of MB on a long trace) lives outside the
// Go heap on huge pages (package hugemem) and is unmapped when its run or
// its shared preparation ends.
//
// # Concurrency
//
// RunCases starts its workers and joins them before it returns; nothing
// else in this package starts a goroutine (package live, below it, does).
// Simulate, Compare and Tune run on the caller's goroutine and honour ctx
// between steps. A Workload may be shared by concurrent simulations (they
// only read it); other values are not shared between calls.
package bench
