// Package tokenize turns a request's prompt or chat messages into the token
// ids the engine will compute, so that the router's block keys match the keys
// learned from the engine's KV events. A mismatch does not fail: it silently
// gives a zero hit rate. So every tokenizer here either reproduces the engine
// exactly (Tokens.Exact) or says it does not.
//
// Tokenizer (New) implements route.Tokenizer and dispatches per model to one
// of four kinds, chosen in Config:
//
//   - passthrough: the prompt already is token ids (a JSON array of ints).
//     The router itself handles requests with pre-tokenized ids; those never
//     reach a Tokenizer.
//   - remote: the replica's own POST /tokenize (vLLM's shape: prompt, or
//     messages with add_generation_prompt, chat_template_kwargs and tools),
//     over a pooled keep-alive HTTP client, with a short timeout (50ms),
//     a circuit breaker per replica URL (consecutive failures open it; after
//     a pause one probe goes through), an LRU cache keyed by a hash of the
//     request body (model included), and failover to the next candidate
//     URL that Options.Replicas returned.
//   - local: a HuggingFace tokenizer.json (byte-level BPE: Llama-3,
//     Qwen2/Qwen3 and GPT-2 split patterns, merge ranks, ignore_merges,
//     added and special tokens, NFC normalizer, TemplateProcessing
//     post-processor) implemented in Go in Encoder, and the chat template
//     of tokenizer_config.json rendered by ChatTemplate with a Go Jinja2
//     engine after vLLM's message preprocessing. Components it does not
//     implement are refused at load time with ErrUnsupported, never
//     approximated.
//   - approximate: no tokenizer; one pseudo token per 4 bytes. Exact is
//     false, and the router never matches such ids against keys learned
//     from engine events.
//
// On failure (timeout, breaker open, remote error, invalid UTF-8, input over
// the size limit, a template that raises, malformed messages) a model whose
// fallback is "approximate" gets approximate tokens instead, counted in
// kvroute_tokenizer_fallbacks_total{model,kind,reason}; with fallback "none"
// the error is returned (wrapping one of the package's errors, for
// errors.Is). An unknown model is route.ErrUnknownModel.
//
// Multi-turn reuse: a conversation resends its whole history every turn.
// The local tokenizer keeps the ids of long text chunks in a bounded LRU
// cache keyed by the chunk's 128-bit hash, so only new text is encoded.
// Reuse is exact by construction, whatever the chat template: text between
// two added tokens (every template separates messages with them) is encoded
// independently of its neighbours, and a long span is further cut only
// after a newline followed by an ASCII letter, where the Llama-3/Qwen2 split
// patterns always end a piece (see Encoder.chunkEnd). Templates that render
// messages without special tokens between them, and GPT-2-pattern
// tokenizers, still tokenize exactly but reuse less (only repeated whole
// spans). Tests compare cached and full encodings turn by turn.
//
// Known limits of the local chat path: the Jinja engine (ardanlabs/jinja
// v1.8.0) prints tojson(indent=N) through Go's encoder, which sorts object
// keys and escapes <, > and &, unlike Python; templates that use it (Meta's
// full Llama-3.1 tool-calling template) render tool schemas differently, so
// serve such models with the remote tokenizer. Multimodal content parts are
// refused (ErrUnsupported). The fixtures cover the templates shipped with the
// Qwen3 and Llama-3.1 tokenizer files used in tests.
//
// Concurrency: everything is safe for concurrent use. The package starts no
// goroutines; the remote tokenizer's HTTP client owns its idle connections,
// released by Tokenizer.Close. Caches are bounded (remote LRU entries, chunk
// cache bytes, word cache entries).
package tokenize
