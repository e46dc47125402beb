// Package live drives a running OpenAI-compatible stack (Envoy + kvroute +
// engines, or anything serving /v1/completions) with a workload from
// package bench and measures, from the client, time to first token,
// inter-token latency and end-to-end latency of streamed completions.
//
// Sessions start open loop (at their workload start times, scaled, or as
// a seeded Poisson process at Options.Rate); the turns of one session are
// closed loop, each sent its think time after the previous one finished,
// with the previous prompt and the text actually generated prepended, as
// a chat client resends its history. Prompts are text: every token of the
// workload becomes one lower-case letter, so a one-token-per-byte
// tokenizer (enginesim's) sees prompts of the workload's lengths, and
// equal prefixes stay equal; with Options.Words a space and a letter, one
// token of a real BPE tokenizer.
//
// With Options.API APIMessages every session is sent instead as Claude
// Code sends it to vLLM's Anthropic endpoint, POST /v1/messages, streamed:
// the same turns as a system prompt, alternating user and assistant
// messages (an agent's later turns as tool results) and Claude Code's
// metadata.user_id (messagesSession); time to first token is the first
// content_block_delta, and the prompt and cached tokens come from the
// final message_delta's usage.
//
// Run owns one goroutine per started session; all stop when ctx is done or
// the workload is finished, and Run returns only after every one has
// returned. Options.MaxInFlight bounds concurrent requests; a session
// start that finds the bound reached waits (counted in Report.Delayed).
//
// Bench (kvbench live -stack) starts a stack on loopback in a process
// group of its own (package testbed: enginesims, kvroute behind Envoy, a
// plain round-robin Envoy, with BenchOptions.Parallel in front of a second
// set of enginesims so both arms run at the same time, kvbench's default)
// and runs repetitions of
// kvroute against round robin through it, each from empty caches on idle
// engines, reading the engines' and kvroute's metrics around every run.
// Every process it started is stopped before it returns.
package live
