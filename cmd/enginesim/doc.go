// Command enginesim is a vLLM-compatible engine simulator: it serves
// vLLM's OpenAI HTTP API and publishes KV-cache events over ZeroMQ in vLLM's
// wire format, from the cache and scheduler model of package engine run in
// (scaled) real time.
//
// HTTP: POST /v1/completions (prompt as a string, strings, token ids or
// lists of token ids) and /v1/chat/completions (messages rendered with
// package simtok's chat template), both also streaming as server-sent
// events ending with "data: [DONE]", with stream_options.include_usage and
// continuous_usage_stats; usage.prompt_tokens_details.cached_tokens with
// --enable-prompt-tokens-details (null when zero, as vLLM does); cache_salt;
// LoRA adapters (--lora-modules) selected by the model name. max_tokens
// defaults as in vLLM: 16 for completions, max-model-len minus the prompt
// for chat; the simulator never samples an end-of-sequence token, so every
// request generates exactly max_tokens (finish_reason "length"), and n must
// be 1. POST /v1/responses (the Responses API, as vLLM 0.33 serves it for a
// model without the harmony format): the body is converted by
// openai.ParseResponses into the chat request vLLM renders for it, tokenized
// as a chat completion with add_special_tokens true and generated as
// one (max_output_tokens, else the rest of the context). The answer is
// {"id": the body's request_id, else "resp_...", "object": "response",
// "created_at", "model", "status": "incomplete" with "incomplete_details":
// {"reason": "max_output_tokens"} (every request stops on length),
// "previous_response_id", "output": [one assistant "message" item
// "msg_..." with one "output_text" part], "usage": {"input_tokens",
// "input_tokens_details": {"cached_tokens"} (always present),
// "output_tokens", "output_tokens_details": {"reasoning_tokens": 0},
// "total_tokens"}}; streamed, events "event: T\ndata: {"type": T,
// "sequence_number": n from 0, ...}": response.created and
// response.in_progress at once, then from the first token
// response.output_item.added, response.content_part.added, one
// response.output_text.delta per token, response.output_text.done,
// response.content_part.done, response.output_item.done and
// response.completed with the whole response (response.incomplete for one
// cut at max_output_tokens, as vLLM 0.33 ends it); no [DONE] line. Input vLLM
// refuses, and a partial final message (continue_final_message, which chat
// refuses too), are 400. The response store (store.go) is off by default,
// as in vLLM: previous_response_id, GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel are then 404 "Response with id '...' not
// found." (type invalid_request_error, param response_id), and background
// true vLLM's 400. With VLLM_ENABLE_RESPONSES_API_STORE=1 (or "true") or
// --enable-responses-store, a response with store true (the default) is
// kept, with the chat it was rendered from, once it has finished (streamed
// too), at most --responses-store-max of them (the oldest dropped; vLLM
// drops none); a request with previous_response_id is rendered from its
// instructions, the stored chat without its system messages, the stored
// output as assistant messages and its own input (vLLM's
// construct_input_messages), so its prompt is the whole conversation and
// a prefix-cache hit on this replica only; GET returns the stored
// response (stream=true 400: no background event store), cancel is 400
// "Cannot cancel a synchronous response.", and background mode is not
// simulated (400). POST /v1/messages (the Anthropic
// Messages API, as vLLM 0.33 serves it): the body is converted by
// openai.ParseMessages into the chat request vLLM makes of it (system
// blocks without Claude Code's billing header, tool_use and tool_result
// blocks as tool calls and tool messages, tools), tokenized as a chat
// completion (no special tokens; with --tokenizer-dir the template sees
// the system-first conversation or the disabled-thinking effort when the
// template calls for them) and generated as one, max_tokens cut to the
// rest of the context. The answer is {"id": "chatcmpl-" and 16 hex digits
// (or the X-Request-Id header), "type": "message", "role": "assistant",
// "content": [one "text" block], "model", "stop_reason": "max_tokens",
// "usage": {"input_tokens", "output_tokens"}}, with
// --enable-prompt-tokens-details also "cache_creation_input_tokens" (the
// prompt's full blocks its prefill wrote) and "cache_read_input_tokens"
// (the prefix cache hit), input_tokens then the rest; streamed, events
// "event: T\ndata: {"type": T, ...}": message_start (with the first token;
// usage the prompt alone), content_block_start, one content_block_delta
// text_delta per token, content_block_stop, message_delta (stop_reason,
// the final usage), message_stop; no ping and no [DONE]. Its errors are
// vLLM's: a body its request model rejects (or a content type other than
// application/json) 400 in the OpenAI shape with type "Bad Request";
// anything later {"type": "error", "error": {"type", "message"}} with
// Anthropic's type for the status (unknown model 404 not_found_error,
// over-long prompt 400 invalid_request_error). POST
// /v1/messages/count_tokens answers {"input_tokens": n,
// "context_management": {"original_input_tokens": n}}. POST /tokenize
// and /detokenize use the same tokenizer as the engine, except that with
// --tokenizer-dir DIR POST /tokenize answers with a real HuggingFace
// tokenizer (DIR/tokenizer.json, and DIR/tokenizer_config.json's chat
// template for messages, rendered as vLLM does), so that a router's local
// tokenizer can be self-checked against it; the engine's text prompts and
// chats are tokenized with it too (a chat's messages as sent, its tools and
// chat_template_kwargs), generated tokens going out as one-token words.
// With --enable-scale-out, POST /v1/chat/completions/render,
// /v1/completions/render, /v1/responses/render and /v1/messages/render
// answer as vLLM 0.33's render endpoints do: the request validated,
// rendered and tokenized exactly as its generation endpoint would, and
// answered with a GenerateRequest ({"request_id", "token_ids",
// "sampling_params", "model", ...}; of the sampling parameters only
// max_tokens) without generating, a list of them for completions.
// Chat content parts "text", "input_text" and "output_text" are text. GET /v1/models,
// /health, /metrics (vLLM's metric names on an own registry) and
// /kv_event_sources (the bound endpoints); POST /reset_prefix_cache
// (AllBlocksCleared; 409 while requests hold blocks). Errors are vLLM's body
// {"error": {"message", "type", "param", "code"}}: malformed JSON and
// invalid requests 400, unknown model 404.
//
// Events: a PUB socket sends [topic, 8-byte big-endian sequence from 0,
// msgpack batch] per engine step that changed the cache (bind or connect by
// vLLM's rule, port 0 binds an ephemeral port); a ROUTER socket answers
// replay requests ["", start] with every buffered batch from start and an
// end marker, in vLLM >= 0.26 framing or, with --kv-events-replay-legacy,
// the older one. With --hybrid-sliding-window N the engine is a
// hybrid-attention model (package engine's hybrid mode): every store is
// published once per KV-cache group (group_idx 0 "full_attention", group_idx
// 1 "sliding_window" with kv_cache_spec_sliding_window N), evictions name
// their group, and prefix hits need the window as in vLLM 0.33.
// --kv-events-drop-rate withholds batches (their sequence
// numbers are consumed and they stay replayable) to exercise gap handling.
// --slow-after with --slow-to slows the engine from a simulated time on
// (prefill speed times the factor, step times divided by it), as a GPU that
// throttles, to exercise a router's view of replica speeds.
//
// Goroutines: run owns them all — the HTTP server (Serve), the driver loop
// that steps the engine (the engine itself is guarded by the driver's
// mutex, which handlers take to submit and abort), and the publisher's PUB
// and replay goroutines (each owns its socket). On shutdown (SIGINT/SIGTERM
// or a cancelled context) the HTTP server drains first (streams finish while
// the driver still runs), then the driver stops, then the publisher.
package main
