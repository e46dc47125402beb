// Package tokenize turns a request's prompt or chat messages into the token
// ids the engine will compute, so that the router's block keys match the keys
// learned from the engine's KV events. A mismatch does not fail: it silently
// gives a zero hit rate. So every tokenizer here either reproduces the engine
// exactly (Tokens.Exact) or says it does not.
//
// Tokenizer (New) implements route.Tokenizer and dispatches per model to one
// of five kinds, chosen in Config, or to a sixth that picks between two of
// them:
//
//   - auto (kvroute's default): local when the model's tokenizer.json and
//     tokenizer_config.json are found (Config.SearchDirs, then the
//     HuggingFace hub cache; FindTokenizerFiles says where), remote
//     otherwise. Found files load in a background goroutine (joined by
//     Close); until they are loaded, or if they fail to, the model is
//     served remotely. Explain says which and why.
//   - passthrough: the prompt already is token ids (a JSON array of ints).
//     The router itself handles requests with pre-tokenized ids; those never
//     reach a Tokenizer.
//   - remote: the replica's own POST /tokenize (vLLM's shape: prompt, or
//     messages with add_generation_prompt, chat_template_kwargs and tools),
//     over a pooled keep-alive HTTP client, with a circuit breaker per
//     replica URL (consecutive failures open it; after a pause one probe
//     goes through), an LRU cache keyed by a hash of the request body
//     (model included), and failover to the next candidate URL that
//     Options.Replicas returned. A 4xx other than 401, 403, 408 and 429
//     refuses the input, not the server: no failover, and the breaker
//     does not count it. Identical inputs in flight at once make
//     one call: later callers wait for the first one's answer
//     (kvroute_tokenizer_coalesced_total), and that call is not cut short
//     when the first caller's own request ends. Each call's deadline is
//     learned (remote_deadline.go): DeadlineMultiplier × the 95th
//     percentile latency of the last calls with inputs of the same size
//     class, within [timeout_min, timeout_max] (250ms, 1s), the maximum
//     until a class has been timed; a timed-out call counts as taking its
//     deadline, so sustained slowness raises it. A fixed timeout can be
//     configured instead.
//   - render: vLLM's render endpoints (0.33 and later; POST
//     /v1/chat/completions/render and its siblings for completions,
//     Responses and Messages), given the request's own body
//     (route.TokenizeInput.Body, at the path of its API) and read for the
//     token_ids of the GenerateRequest they answer with (of the first, for
//     a completions batch): the engine's own rendering and tokenization,
//     exact for any request vLLM accepts. Asked of ModelConfig.RenderURLs
//     (render servers, `vllm launch render`) in order, else of the model's
//     replicas (served with --enable-scale-out), by the remote tokenizer's
//     client: the same breakers, cache (keyed by API and body),
//     coalescing and deadlines. An input without a body is ErrUnsupported.
//   - local: a HuggingFace tokenizer.json implemented in Go in Encoder:
//     byte-level BPE with the split patterns of Llama-3 (3, 3.1, 3.2),
//     Qwen2/Qwen3, GPT-2, gpt-oss (o200k) and DeepSeek-V3 (three chained
//     splits), and character-level BPE with byte fallback and a metaspace
//     normalizer (Gemma 3); merge ranks, ignore_merges, added and special
//     tokens, NFC, TemplateProcessing post-processor. The chat template of
//     tokenizer_config.json is rendered by ChatTemplate with a Go Jinja2
//     engine after vLLM's message preprocessing. Components it does not
//     implement are refused at load time with ErrUnsupported, never
//     approximated. Fixtures from HuggingFace cover all seven families
//     (gpt-oss's npm files ship no chat template: completions only).
//   - approximate: no tokenizer; one pseudo token per 4 bytes. Exact is
//     false, and the router never matches such ids against keys learned
//     from engine events.
//
// A request the local tokenizer knows it cannot reproduce (ErrUnsupported:
// a template printing a number or a list as only Python prints it, and
// the like) is asked of the engine instead when the model has an engine
// client (an auto model, a self-checked local one, an SGLang one): its
// /tokenize, or its render endpoints (SelfCheckConfig.Endpoint). Only
// without one does it fall back as below.
//
// On failure (timeout, breaker open, remote error, invalid UTF-8, input over
// the size limit, a template that raises, malformed messages) a model whose
// fallback is "approximate" gets approximate tokens instead, counted in
// kvroute_tokenizer_fallbacks_total{model,kind,reason} and named in the
// tokens' Source as "approximate:<kind>_<reason>" (e.g.
// "approximate:remote_timeout"), which the router's Decision and explain
// show as the token source, and in Tokenizer.Explain's per-model counts
// (GET /debug/tokenizer); with fallback "none" the error is returned
// (wrapping one of the package's errors, for errors.Is). An unknown model
// is route.ErrUnknownModel. A request whose context ended gets its
// context's error, never a fallback: local tokenization stops between
// segments and chunks when the context ends.
//
// Multi-turn reuse: a conversation resends its whole history every turn.
// The local tokenizer keeps the ids of long text chunks in a bounded LRU
// cache keyed by the chunk's 128-bit hash, so only new text is encoded
// (kvroute_tokenizer_chunk_cache_hits_total, _misses_total and
// kvroute_tokenizer_chunk_cache_bytes, per model).
// Reuse is exact by construction, whatever the chat template: text between
// two added tokens (every template separates messages with them) is encoded
// independently of its neighbours, and a long span is further cut only
// after a newline followed by an ASCII letter, where the Llama-3/Qwen2 split
// patterns always end a piece (see Encoder.chunkEnd). Templates that render
// messages without special tokens between them, and GPT-2-pattern and
// Gemma 3 (character-level: merges cross newlines)
// tokenizers, still tokenize exactly but reuse less (only repeated whole
// spans). Tests compare cached and full encodings turn by turn.
//
// Conversation memo (conv.go): on top of the chunk cache, a chat request
// whose rendered prompt is at least 4 KB is remembered (its prompt text,
// ids and "safe cuts", bounded LRU, prefix_cache_bytes again), keyed by a
// hash of its tools, template arguments and messages' raw JSON. A later
// request whose messages start with those messages byte for byte (the
// next turn, a retry) finds it, takes the longest common prefix of the
// two rendered prompts and reuses the ids up to the last safe cut in it:
// the end of an added token without rstrip that no other added token
// contains. The encoder's decisions before such a cut depend only on the
// bytes before it and it starts afresh after it, so reuse is exact for any
// template, including ones that render earlier turns differently once a
// new turn arrives (the common prefix then ends earlier). Only the text
// after the cut is encoded (through the chunk cache); the body is still
// parsed and the template still rendered in full
// (kvroute_tokenizer_conversation_hits_total, _misses_total,
// _reused_tokens_total and kvroute_tokenizer_conversation_bytes, per
// model). The memo and the caller share the returned ids (route.Tokens:
// read or append, never write them in place). Tests compare every turn
// with a cacheless tokenizer, for every family.
//
// Byte-exactness with the reference (transformers + tokenizers), and how it
// is kept:
//
//   - tojson is Python's json.dumps as HuggingFace's template environment
//     calls it (ensure_ascii=False by default, indent, separators,
//     sort_keys, key order as sent, float repr: 2.0 stays 2.0, 1e16 is
//     1e+16; U+2028/U+2029 raw); trim is str.strip (U+001C..U+001F
//     included). Both replace the Jinja engine's own filters (jinjafix.go).
//   - What an output tag prints is Python's str() (pyprint.go): None is
//     "None", a computed float its repr, a list or a dict its repr with
//     Python's quoting and escapes (str.isprintable by Go's Unicode 15.0
//     tables, CPython 3.12's version). The engine prints None as nothing
//     and containers its own way, with no hook for either, so every output
//     tag whose value is not a string by construction is compiled through
//     a kvroute_print filter (printTags), a '~' chain in a tag or a set
//     statement through it operand by operand (Jinja2's '~' is str() of
//     each), and the string and join filters are replaced with ones
//     printing the same str(); upper, lower, capitalize and title are
//     Python's and Jinja2's (pycase.go: full case mapping, a final sigma,
//     title's word breaks), and first, last and list iterate a string or
//     a dict as Python does. TestJinjaDifferential holds the engine to
//     Jinja2 on 897 one-expression templates; what it still renders
//     otherwise is listed in testdata/jinja_diff_known.txt.
//   - Two changes of how a template runs, neither of what it prints: an
//     output tag concatenating onto a string literal ({{ '<|im_start|>' +
//     role + '\n' + content }}) is compiled as one tag per operand
//     (jinjaconcat.go: the engine's '+' on a string prints its right
//     operand as a tag would, so only the copies go), and the output
//     buffer is sized from the request before the engine's node walk runs
//     (jinjafix.go, checked against the engine's own render at start).
//     Tests render every family's template both ways.
//   - JSON numbers become what json.loads makes of them. An integer beyond
//     int64, or a float the engine would print unlike Python's repr, is
//     carried as its Python text behind an internal mark that tojson and
//     trim print; a template printing it any other way (an output tag,
//     string, join, '~', upper) gets ErrUnsupported (the request falls
//     back) instead of a silently different prompt. The engine's tests
//     take a marked number for a string ('is string' true, 'is number'
//     false), so a branch taken before such a print may differ from
//     Python's: printing the digits there would hide it.
//     Likewise a template calling .strip()/.lstrip()/.rstrip() without
//     arguments (the engine's white-space set is narrower than Python's)
//     refuses requests whose strings hold the characters that differ.
//   - NFC is UAX #15 without the stream-safe U+034F insertion after 30
//     combining marks (nfc.go).
//   - The pre-tokenizer's \p{L}, \p{N}... use a Unicode 16.0 General_Category
//     table (ucd_table.go, generated by hack/tokenizer-fixtures/gen_unicode.py
//     from PyPI unicodedata2 16.0.0), the version of the reference's regex
//     engine; Go's unicode package is 15.0.
//
// The JSON the package reads itself goes through pkg/jsonscan's scanner,
// the request parser's, which checks the grammar as encoding/json does,
// nesting bound included: the template values of a request's messages, tools and
// arguments (jsondecode.go), the engines' /tokenize and render answers
// (remote_decode.go) and a converted request's messages split for the
// conversation memo (conv.go).
//
// Fixtures (testdata, generated by hack/tokenizer-fixtures/gen.py from
// HuggingFace) hold a general corpus, a separate corpus of the classes that
// once broke exactness (long combining runs, Unicode 16 code points,
// U+2028/2029, C0 controls around trimmed content) and chats with tool
// schemas and arguments full of whole floats, exponents and huge integers.
// Multimodal content parts are refused (ErrUnsupported).
//
// vLLM's reshaping before the template (0.33; chat.go, tools.go,
// developer.go, contentformat.go), reproduced because the client's JSON is
// not what the template sees: text parts are "text", "input_text" and
// "output_text" (their "text"), "refusal" and "thinking" (their own key), a
// null text or refusal part skipped; a template that loops over a
// message's content (vLLM's content-format detection, done here on the
// template's statements) gets every content as a list of {"type": "text"}
// parts, any other template one string of the texts joined with "\n"; a
// system message's text that begins with Claude Code's
// x-anthropic-billing-header line loses that line; when the template never
// names the developer role, developer messages become system messages and
// every system message is merged into one at the front; and the tools are
// rendered as vLLM's ChatCompletionToolsParam.model_dump() gives them (key
// order type, function{name, description, parameters, strict,
// defer_loading}, description and parameters null when absent, other keys
// dropped); documents reach the template's documents variable; the
// request's reasoning effort (ChatInput.ReasoningEffort: a chat's
// reasoning_effort, a Responses request's reasoning.effort, a Messages
// request's output_config.effort) is merged over its template arguments
// as vLLM's build_chat_params merges it (effortArgs: reasoning_effort
// unless "auto", enable_thinking unless the request sets it), by Render
// and, into the chat_template_kwargs it sends, by the remote tokenizer;
// continue_final_message cuts the render at the final message's
// end (transformers' tag and cut, the 5.16–5.23 versions vLLM 0.33
// allows). SGLang hands templates each tool's function object alone; this
// package renders vLLM's shape. What an engine was started with that
// changes its rendering (--chat-template, --chat-template-content-format,
// --default-chat-template-kwargs) is configured per model (EngineChat,
// engine.go): default template arguments sit under the request's, whose
// None and "auto" values are dropped over them, as vLLM's merge drops
// them. A None the template prints (a tool's missing description, as
// vLLM's pydantic dump hands it) prints "None", as in Python (pyprint.go).
//
// Anthropic Messages requests (anthropic.go) arrive converted to chat by
// the request parser; two of vLLM's choices for them depend on the
// template, and are made here once per template as vLLM makes them: when
// the template fails on [system, user, system, user] in a bare Jinja
// environment, the conversation with its inline
// system messages merged into the first (ChatInput.SystemFirst) is
// rendered; a request with thinking disabled gets reasoning_effort "none",
// or "low" when the template fails on "none" or renders it as it renders
// an effort (EngineChat.DisabledThinkingEffort
// fixes it, as --anthropic-disabled-thinking-effort does). jinja2's bare
// environment fails where this package's engine goes on: an undefined
// name called (strftime_now is left undefined for the probe), an addition
// with an undefined operand (the special tokens, a string content's text
// part: rewritten for the probe to fail where the render reaches them), an
// attribute of an undefined value, the generation tag. Against vLLM's own
// probes on 79 public templates both agree on 78 (the 79th does not
// compile here, so it is never rendered locally) and on every fixture
// family. The remote tokenizer refuses disabled thinking (its effort is
// the engine's choice) and sends the unmerged conversation (an engine
// whose template rejects it fails the call, and the request falls back).
//
// SGLang (ModelConfig.Engine "sglang") renders chats otherwise than vLLM,
// and the local renderer renders vLLM's way: an SGLang model's chats are
// tokenized by its replicas' /tokenize (SGLang's own chat pipeline), asked
// without add_generation_prompt and with tool_choice and reasoning_effort
// as fields, so that SGLang renders them as its chat route does; its text
// prompts stay local.
//
// Self-check (selfcheck.go): with Options.Replicas set, a sample of local
// tokenizations (Config.SelfCheck.SampleRate, default 1%) is compared off
// the request path with the engine's own POST /tokenize (chat requests
// through the engine's chat rendering; not chats with documents or an
// empty tools list, which vLLM's /tokenize renders unlike its chat route,
// nor Messages requests whose rendering depends on a template probe), or
// with SelfCheckConfig.Endpoint render with the engine's render endpoint
// given the request's body (every request with a body), by a bounded pool
// of workers fed through a bounded queue (a full queue drops the sample;
// the request never waits). The first mismatch demotes that model's local
// tokenizer: its requests go to the same engine endpoint from then on, the
// mismatch is counted (kvroute_tokenizer_self_checks_total{model,result};
// a sample the endpoint cannot reproduce is counted as
// result="unreproducible", not sent;
// kvroute_tokenizer_local_exact{model} drops to 0), logged once with the
// first differing token position, and shown by Tokenizer.SelfCheckStates and
// Tokenizer.Explain. Engine errors are counted, never demote.
//
// Concurrency: everything is safe for concurrent use. The only goroutines
// are the self-check workers, started by New and stopped and joined by
// Tokenizer.Close, the auto kind's file loads (one per model with found
// files, joined by Close), and those of a long text's local encoding:
// a text of 64 KB or more is cut into the pieces that encode
// independently (text between added tokens, and its chunks as above),
// and contiguous runs of them are encoded on up to GOMAXPROCS goroutines
// that the call starts and joins before it returns (parallel.go; the same
// ids, cuts and chunk-cache entries as one goroutine, less latency, the
// same CPU time). The remote tokenizer's HTTP client owns its idle
// connections, also released by Close. Caches are bounded (remote LRU
// entries, chunk cache bytes, word cache entries).
package tokenize
