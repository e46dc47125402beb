// Package openai parses the parts of OpenAI-compatible HTTP traffic the router
// needs, and nothing more.
//
// Request side: Parse reads a /v1/completions or /v1/chat/completions body
// into a Request: the model string (which may name a LoRA adapter; resolving
// adapter versus base model is the router configuration's job), the prompt
// in every form the completions API accepts (string, [string], [int],
// [[int]]), chat messages, tools, chat_template_kwargs,
// add_generation_prompt (default true), continue_final_message,
// add_special_tokens (default true for completions, false for chat),
// max_tokens / max_completion_tokens, stream, stream_options.include_usage
// and cache_salt. Messages, tools and template kwargs stay raw JSON: they
// are passed on to a tokenizer exactly as the engine would receive them.
// Every malformed body yields an error wrapping ErrInvalidRequest, whose text
// names the offending field; callers map it to HTTP 400.
//
// Response side: ParseUsage reads the usage object of a non-streamed JSON
// response. StreamParser consumes a server-sent-events stream in arbitrary
// chunks (bytes as they arrive, events split anywhere), remembers the last
// usage object seen (the final chunk when stream_options.include_usage is
// set; every chunk under continuous usage stats) and reports the first event
// carrying generated content.
//
// The package holds no state beyond the values it returns, starts no
// goroutine and never panics on input. A StreamParser is not safe for
// concurrent use; one belongs to one response.
package openai
