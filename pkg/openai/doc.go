// Package openai parses the parts of OpenAI-compatible HTTP traffic the router
// needs, and nothing more.
//
// Request side: Parse reads a /v1/completions, /v1/chat/completions,
// /v1/responses or /v1/messages (the Anthropic Messages API, which vLLM
// also serves) body into a Request. A Responses body (ParseResponses) and
// a Messages body (ParseMessages) are converted into the chat request vLLM
// renders for them; the rest of this paragraph is about the other two. A Request holds the model string
// (which may name a LoRA adapter; resolving adapter versus base model is
// the router configuration's job), the prompt
// in every form the completions API accepts (string, [string], [int],
// [[int]]), chat messages, tools, chat_template_kwargs,
// add_generation_prompt (default true), continue_final_message,
// add_special_tokens (default true for completions, false for chat),
// max_tokens / max_completion_tokens, stream, stream_options.include_usage,
// cache_salt, and the identity fields a session key can come from (user,
// prompt_cache_key, session/conversation ids). Messages, tools and template
// kwargs are also kept raw (slices of the body, not copies): they are
// passed on to a tokenizer exactly as the engine would receive them.
// Every malformed body yields an error wrapping ErrInvalidRequest, whose text
// names the offending field; callers map it to HTTP 400.
//
// The body is read in one pass with pkg/jsonscan's scanner (which the
// tokenizer's JSON readers use too): everything is validated, only what
// routing reads is decoded (the messages' role, text and name; the prompt;
// the scalar fields) and the rest is skipped; it accepts exactly what
// encoding/json accepts and decodes strings as it does, so message text is
// byte for byte what the local tokenizer's chat template renders (tests
// and fuzz targets compare both). Keys match exactly, as in vLLM (not
// case-insensitively, as encoding/json's struct decoding would).
//
// Response side: ParseUsage reads the usage object of a non-streamed JSON
// response (prompt_tokens or the Responses API's input_tokens, and their
// details' cached_tokens; or the Anthropic API's input_tokens plus its
// cache_read_input_tokens and cache_creation_input_tokens, the first of
// which are the cached tokens). StreamParser consumes a server-sent-events stream in arbitrary
// chunks (bytes as they arrive, events split anywhere), remembers the last
// usage object seen (the final chunk when stream_options.include_usage is
// set; every chunk under continuous usage stats; a Responses stream's
// response.completed or response.incomplete, read from any event's
// response object; an Anthropic stream's message_delta) and reports the
// first event carrying generated content (for a Responses stream, the
// first event after response.created and response.in_progress; for an
// Anthropic one, the first after message_start and ping). Both read JSON with the request's scanner
// (chunk.go), decoding only usage and whether a choice carries output,
// with encoding/json's answers (tests and a fuzz target compare them; keys
// match as encoding/json matches these ASCII names, exactly or ignoring
// case).
//
// The package holds no state beyond the values it returns, starts no
// goroutine and never panics on input. A StreamParser is not safe for
// concurrent use; one belongs to one response.
package openai
