// Package route is the protocol-free routing decision:
//
//	Decide(ctx, Request) (Decision, error)
//
// tokens (given, or from the Tokenizer) -> block keys (kvblock, per distinct
// block size of the candidates) -> longest match per replica (Matcher) ->
// policy pick -> Decision. ext_proc, the admin explain API and kvbench all
// call it. The Decision carries the pick, the policy and reason, up to two
// fallback addresses (next best eligible by the policy's cost), and every
// candidate's match per tier, credit, load, cost and eligibility.
//
// Candidates are the replicas serving the request's model (all of them when
// it names none) that the request's subset admits. Exact tokens are matched
// against the index; approximate tokens never are (Degraded
// "approximate_tokens"), and a tokenizer error or timeout routes on load
// alone (Degraded "tokenize_error" / "tokenize_timeout"). A policy that fell
// back for a cold index reports Degraded "cold_index".
//
// Concurrency: a Router is safe for concurrent use. It starts and owns no
// goroutine. Per-call buffers come from a sync.Pool; policy randomness comes
// from one *rand.Rand over a mutex-guarded PCG seeded from Options.Seed, so a
// single goroutine's sequence of decisions is reproducible. Decide reads the
// clock (Options.Now, injectable) only to report TokenizeTime and DecideTime.
package route
