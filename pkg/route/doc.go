// Package route is the protocol-free routing decision:
//
//	Decide(ctx, Request) (Decision, error)
//
// tokens (given, or from the Tokenizer) -> block keys (kvblock) -> longest
// match per replica (Matcher) -> policy score -> pick. ext_proc, the admin
// explain API and kvbench all call it. The Decision carries the pick, the
// policy and reason, and every candidate's match per tier, load and cost.
package route
