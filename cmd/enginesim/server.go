package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/engine/simtok"
)

type loraModule struct {
	name, path string
	id         int
}

type server struct {
	model         string
	maxModelLen   int
	promptDetails bool
	scaleOut      bool // --enable-scale-out: the render endpoints (render.go)
	loras         []loraModule
	d             *driver
	pub           *publisher // nil with events disabled
	reg           *prometheus.Registry
	created       int64
	log           *slog.Logger
	realTok       *realTokenizer  // --tokenizer-dir: /tokenize with a real tokenizer
	blockSize     int             // tokens per KV block
	store         *responseStore  // the Responses API response store (store.go); nil when disabled
	bg            *backgroundRuns // background Responses requests' runs (background.go)
}

// tokenText renders a generated token: simtok's text, or with a real
// tokenizer a space and a letter, a word real BPE tokenizers encode as one
// token, so that a client resending the answer sends as many tokens as
// were generated (simtok's one-byte tokens would re-tokenize to about a
// quarter as many, and a resent history would grow slower than the
// engine's KV cache did).
func (s *server) tokenText(tok uint32) string {
	if s.realTok != nil {
		return wordText[tok%26]
	}
	return simtok.TokenString(tok)
}

// wordText is " a" ... " z".
var wordText = func() [26]string {
	var w [26]string
	for i := range w {
		w[i] = " " + string(rune('a'+i))
	}
	return w
}()

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, apiCompletions) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, apiChat) })
	mux.HandleFunc("POST /v1/responses", s.responses)
	mux.HandleFunc("GET /v1/responses/{response_id}", s.retrieveResponse)
	mux.HandleFunc("POST /v1/responses/{response_id}/cancel", s.cancelResponse)
	mux.HandleFunc("POST /v1/messages", s.messages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.countTokens)
	mux.HandleFunc("POST /tokenize", s.tokenize)
	mux.HandleFunc("POST /detokenize", s.detokenize)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /reset_prefix_cache", s.resetPrefixCache)
	mux.HandleFunc("GET /kv_event_sources", s.eventSources)
	if s.scaleOut {
		mux.HandleFunc("POST /v1/completions/render", rendering(func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, apiCompletions) }))
		mux.HandleFunc("POST /v1/chat/completions/render", rendering(func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, apiChat) }))
		mux.HandleFunc("POST /v1/responses/render", rendering(s.responses))
		mux.HandleFunc("POST /v1/messages/render", rendering(s.messages))
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	return mux
}

// resolveModel maps a request's model to the base model or an adapter.
func (s *server) resolveModel(m *string) (name string, lora *loraModule, err error) {
	if m == nil || *m == "" || *m == s.model {
		return s.model, nil, nil
	}
	for i := range s.loras {
		if s.loras[i].name == *m {
			return *m, &s.loras[i], nil
		}
	}
	return "", nil, &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
		msg: "The model `" + *m + "` does not exist."}
}

func randomID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type chatMsg struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int      `json:"index"`
	Message      *chatMsg `json:"message,omitempty"`
	Delta        *chatMsg `json:"delta,omitempty"`
	Logprobs     any      `json:"logprobs"`
	FinishReason *string  `json:"finish_reason"`
	StopReason   any      `json:"stop_reason"`
}

type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// api is the OpenAI API a generation request came in on.
type api uint8

const (
	apiCompletions api = iota
	apiChat
	apiResponses // converted into a chat request (responses.go)
	apiMessages  // Anthropic Messages, converted into a chat request (messages.go)
)

// writeError writes err in the API's error format.
func (a api) writeError(w http.ResponseWriter, err error) {
	if a == apiMessages {
		writeAnthropicError(w, err)
		return
	}
	writeError(w, err)
}

// chat reports whether the request's prompt is a chat: rendered with the
// chat template, max tokens defaulting to the rest of the context.
func (a api) chat() bool { return a != apiCompletions }

func (s *server) generate(w http.ResponseWriter, r *http.Request, a api) {
	var req genRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	model, lora, err := s.resolveModel(req.Model)
	if err != nil {
		writeError(w, err)
		return
	}
	s.run(w, r, &req, a, model, lora)
}

// prepare tokenizes and validates a parsed request into the engine
// requests it runs: one a prompt, each with its max tokens, sampling seed,
// cache salt and adapter.
func (s *server) prepare(req *genRequest, a api, lora *loraModule) ([]engine.Request, error) {
	chat := a.chat()
	var prompts [][]uint32
	var err error
	if chat {
		var p []uint32
		p, err = chatTokens(req, s.realTok)
		prompts = [][]uint32{p}
	} else {
		prompts, err = completionPrompts(req, s.realTok)
	}
	if err == nil {
		if a == apiMessages {
			err = s.validateMessages(req, prompts[0])
		} else {
			err = s.validate(req, prompts, chat)
		}
	}
	if err != nil {
		return nil, err
	}
	reqs := make([]engine.Request, len(prompts))
	for i, p := range prompts {
		mt := s.maxTokens(req, chat, len(p))
		if a == apiMessages {
			mt = s.messagesMaxTokens(req, len(p))
		}
		reqs[i] = engine.Request{Prompt: p, MaxTokens: mt, Sample: sampling(req, i)}
		if req.CacheSalt != nil {
			reqs[i].CacheSalt = *req.CacheSalt
		}
		if lora != nil {
			reqs[i].LoRAName, reqs[i].LoRAID = lora.name, lora.id
		}
	}
	return reqs, nil
}

// run tokenizes and validates a parsed request, submits it to the engine
// and answers in its API's format, streamed or not; it aborts the request
// when the client goes away. On a render endpoint (rendering) it answers
// with the requests it would run instead.
// submitAll submits reqs to the engine with a sink that holds every item
// they can produce (each request's tokens and its end).
func (s *server) submitAll(reqs []engine.Request) (*sink, []engine.ReqID, error) {
	total := 0
	for _, er := range reqs {
		total += er.MaxTokens + 1
	}
	sk := &sink{ch: make(chan item, total)}
	ids, err := s.d.submit(reqs, sk)
	return sk, ids, err
}

// newGeneration is the generation of submitted reqs, read from sk, for a
// client on w (nil for a background response) until ctx ends.
func (s *server) newGeneration(ctx context.Context, w http.ResponseWriter, a api, model string, reqs []engine.Request, sk *sink) *generation {
	return &generation{
		s: s, w: w, ctx: ctx, api: a, model: model, reqs: reqs, sink: sk,
		created: time.Now().Unix(),
		fins:    make([]*engine.Finished, len(reqs)),
		texts:   make([][]byte, len(reqs)),
	}
}

func (s *server) run(w http.ResponseWriter, r *http.Request, req *genRequest, a api, model string, lora *loraModule) {
	reqs, err := s.prepare(req, a, lora)
	if err != nil {
		a.writeError(w, err)
		return
	}
	if isRendering(r.Context()) {
		writeRendered(w, a, model, req.responseID, reqs)
		return
	}
	if req.background {
		s.runBackground(w, r, req, reqs, model)
		return
	}
	sk, ids, err := s.submitAll(reqs)
	if err != nil {
		a.writeError(w, badRequest("", "%v", err))
		return
	}
	g := s.newGeneration(r.Context(), w, a, model, reqs, sk)
	switch a {
	case apiCompletions:
		g.id = randomID("cmpl-")
	case apiChat:
		g.id = randomID("chatcmpl-")
	case apiResponses:
		g.startResponse(req)
	case apiMessages:
		// vLLM's chat request id: the X-Request-Id header, else 16 random
		// hex digits.
		g.id = "chatcmpl-" + r.Header.Get("X-Request-Id")
		if len(r.Header.Values("X-Request-Id")) == 0 {
			g.id = randomID("chatcmpl-")[:len("chatcmpl-")+16]
		}
	}
	var done bool
	switch {
	case a == apiResponses && req.Stream:
		done = g.streamResponse()
	case a == apiMessages && req.Stream:
		done = g.streamMessages()
	case req.Stream:
		inc := req.StreamOptions != nil && (req.StreamOptions.IncludeUsage == nil || *req.StreamOptions.IncludeUsage)
		cont := req.StreamOptions != nil && req.StreamOptions.ContinuousUsageStats
		done = g.stream(inc, cont)
	default:
		done = g.collect()
	}
	if !done {
		s.d.abort(ids)
	}
}

// sampling is the engine's sampling seed for the request's i-th prompt
// (engine.Request.Sample): greedy (0) at temperature 0; repeatable from the
// request's seed; else drawn at random, as vLLM samples at its default
// temperature of 1 (when neither the request nor the model's generation
// config sets one), so that two requests sending one prompt get two
// answers.
func sampling(req *genRequest, i int) uint64 {
	switch {
	case req.Temperature != nil && *req.Temperature == 0:
		return 0
	case req.Seed != nil:
		return 1<<63 | (uint64(*req.Seed)+uint64(i))&(1<<63-1)
	}
	return 1<<63 | mrand.Uint64()
}

func (s *server) maxTokens(req *genRequest, chat bool, promptLen int) int {
	switch {
	case chat && req.MaxCompletionTokens != nil:
		return *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		return *req.MaxTokens
	case chat:
		return s.maxModelLen - promptLen
	}
	return 16 // vLLM's completions default
}

// validate checks a whole request before anything is queued, with vLLM's
// messages.
func (s *server) validate(req *genRequest, prompts [][]uint32, chat bool) error {
	if req.N != nil && *req.N != 1 {
		return badRequest("n", "n=%d is not supported by the simulator (only n=1)", *req.N)
	}
	if req.StreamOptions != nil && !req.Stream {
		return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	if req.CacheSalt != nil && *req.CacheSalt == "" {
		return badRequest("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
	}
	for _, p := range prompts {
		if len(p) == 0 {
			return badRequest("prompt", "The prompt cannot be empty.")
		}
		if len(p) > s.maxModelLen {
			return badRequest("", "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", s.maxModelLen, len(p))
		}
		mt := s.maxTokens(req, chat, len(p))
		if mt < 1 {
			return badRequest("max_tokens", "max_tokens must be at least 1, got %d.", mt)
		}
		if len(p)+mt > s.maxModelLen {
			return badRequest("max_tokens", "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).", mt, s.maxModelLen, len(p), mt, s.maxModelLen, len(p))
		}
	}
	return nil
}

// generation is one HTTP request's run: its prompts' tokens and finishes.
// It ends early when ctx does: the client went away or, for a background
// response (w nil), the run was cancelled.
type generation struct {
	s       *server
	w       http.ResponseWriter
	ctx     context.Context
	api     api
	id      string
	msgID   string // a Responses answer's message item
	model   string
	created int64
	reqs    []engine.Request
	sink    *sink
	fins    []*engine.Finished
	texts   [][]byte
	emitted int

	// A Responses answer's previous_response_id ("" for none), and keep
	// (nil when it is not stored) stores its final response (startResponse).
	previousID string
	keep       func(*responseObject)
}

func (g *generation) usage() *usage {
	u := &usage{}
	cached := 0
	for i, f := range g.fins {
		u.PromptTokens += len(g.reqs[i].Prompt)
		if f != nil {
			u.CompletionTokens += f.OutputTokens
			cached += f.CachedTokens
		}
	}
	if g.fins[0] == nil { // continuous stats mid-stream
		u.CompletionTokens = g.emitted
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	// Like vLLM 0.33, the details appear whenever enabled, a miss as 0.
	if g.s.promptDetails {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

// next waits for the next item; false when the client went away.
func (g *generation) next() (item, bool) {
	select {
	case it := <-g.sink.ch:
		return it, true
	case <-g.ctx.Done():
		return item{}, false
	}
}

// gather waits until every prompt has finished, keeping their texts;
// false when the client went away first.
func (g *generation) gather() bool {
	left := len(g.reqs)
	for left > 0 {
		it, ok := g.next()
		if !ok {
			return false
		}
		switch {
		case it.tok != nil:
			g.texts[it.idx] = append(g.texts[it.idx], g.s.tokenText(it.tok.Token)...)
		case it.fin != nil:
			g.fins[it.idx] = it.fin
			left--
		}
	}
	return true
}

func (g *generation) collect() bool {
	if !g.gather() {
		return false
	}
	switch g.api {
	case apiResponses:
		writeJSON(g.w, http.StatusOK, g.finalResponse())
		return true
	case apiMessages:
		writeCompactJSON(g.w, http.StatusOK, g.messageObject())
		return true
	}
	length := "length"
	resp := response{ID: g.id, Created: g.created, Model: g.model, Usage: g.usage()}
	if g.api == apiChat {
		resp.Object = "chat.completion"
		resp.Choices = []chatChoice{{Message: &chatMsg{Role: "assistant", Content: string(g.texts[0])}, FinishReason: &length}}
	} else {
		resp.Object = "text_completion"
		ch := make([]completionChoice, len(g.reqs))
		for i := range ch {
			ch[i] = completionChoice{Index: i, Text: string(g.texts[i]), FinishReason: &length}
		}
		resp.Choices = ch
	}
	writeJSON(g.w, http.StatusOK, resp)
	return true
}

func (g *generation) stream(includeUsage, continuous bool) bool {
	h := g.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	g.w.WriteHeader(http.StatusOK)
	fl, _ := g.w.(http.Flusher)
	object := "text_completion"
	if g.api == apiChat {
		object = "chat.completion.chunk"
	}
	write := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := g.w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return false
		}
		return true
	}
	flush := func() {
		if fl != nil {
			fl.Flush()
		}
	}
	chunk := func(choices any) response {
		c := response{ID: g.id, Object: object, Created: g.created, Model: g.model, Choices: choices}
		if continuous {
			c.Usage = g.usage()
		}
		return c
	}
	if g.api == apiChat {
		for i := range g.reqs {
			if !write(chunk([]chatChoice{{Index: i, Delta: &chatMsg{Role: "assistant"}}})) {
				return false
			}
		}
		flush()
	}
	left := len(g.reqs)
	for left > 0 {
		it, ok := g.next()
		if !ok {
			return false
		}
		if it.fin != nil {
			g.fins[it.idx] = it.fin
			left--
		} else {
			g.emitted++
			var fr *string
			if it.tok.Index+1 == g.reqs[it.idx].MaxTokens {
				length := "length"
				fr = &length
			}
			text := g.s.tokenText(it.tok.Token)
			var c response
			if g.api == apiChat {
				c = chunk([]chatChoice{{Index: it.idx, Delta: &chatMsg{Content: text}, FinishReason: fr}})
			} else {
				c = chunk([]completionChoice{{Index: it.idx, Text: text, FinishReason: fr}})
			}
			if !write(c) {
				return false
			}
		}
		if len(g.sink.ch) == 0 {
			flush()
		}
	}
	if includeUsage {
		if !write(response{ID: g.id, Object: object, Created: g.created, Model: g.model, Choices: []any{}, Usage: g.usage()}) {
			return true
		}
	}
	_, _ = g.w.Write([]byte("data: [DONE]\n\n"))
	flush()
	return true
}

func (s *server) tokenize(w http.ResponseWriter, r *http.Request) {
	if s.realTok != nil {
		s.realTok.tokenize(s, w, r)
		return
	}
	var req genRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if _, _, err := s.resolveModel(req.Model); err != nil {
		writeError(w, err)
		return
	}
	var toks []uint32
	var err error
	switch {
	case req.Messages != nil:
		if req.ContinueFinalMessage && req.AddGenerationPrompt != nil && *req.AddGenerationPrompt {
			writeError(w, badRequest("", "Cannot set both `continue_final_message` and `add_generation_prompt` to True."))
			return
		}
		toks, err = chatTokens(&req, nil)
	default:
		var s string
		if e := json.Unmarshal(req.Prompt, &s); e != nil {
			err = badRequest("prompt", "prompt must be a string")
		} else {
			toks = simtok.Encode(s, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	var strs []string
	if req.ReturnTokenStrs {
		strs = make([]string, len(toks))
		for i, t := range toks {
			strs[i] = simtok.TokenString(t)
		}
	}
	if toks == nil {
		toks = []uint32{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"count": len(toks), "max_model_len": s.maxModelLen, "tokens": toks, "token_strs": strs,
	})
}

func (s *server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req genRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if _, _, err := s.resolveModel(req.Model); err != nil {
		writeError(w, err)
		return
	}
	toks, err := tokenIDs(req.Tokens)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": simtok.Decode(toks)})
}

func (s *server) models(w http.ResponseWriter, _ *http.Request) {
	card := func(id, root string, parent any) map[string]any {
		return map[string]any{
			"id": id, "object": "model", "created": s.created, "owned_by": "vllm",
			"root": root, "parent": parent, "max_model_len": s.maxModelLen,
		}
	}
	data := []any{card(s.model, s.model, nil)}
	for _, l := range s.loras {
		data = append(data, card(l.name, l.path, s.model))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *server) resetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	if !s.d.resetPrefixCache() {
		writeError(w, &apiError{status: http.StatusConflict, typ: "ConflictError",
			msg: "Failed to reset prefix cache: some blocks are still in use by running requests."})
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *server) eventSources(w http.ResponseWriter, _ *http.Request) {
	sources := []any{}
	if s.pub != nil {
		var replay any
		if s.pub.replayEndpoint != "" {
			replay = s.pub.replayEndpoint
		}
		sources = append(sources, map[string]any{
			"data_parallel_rank": 0, "endpoint": s.pub.endpoint,
			"replay_endpoint": replay, "topic": s.pub.cfg.topic,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"sources": sources})
}

// guardedPrefixes are the paths vLLM's --api-key guards.
var guardedPrefixes = []string{"/v1", "/v2", "/inference", "/cohere"}

// guarded refuses, as vLLM's --api-key middleware does, a request to a
// guarded path without "Authorization: Bearer key" (the scheme in any
// case): 401 {"error": "Unauthorized"}. An empty key guards nothing.
func guarded(h http.Handler, key string) http.Handler {
	if key == "" {
		return h
	}
	want := sha256.Sum256([]byte(key))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodOptions && slices.ContainsFunc(guardedPrefixes, func(p string) bool { return strings.HasPrefix(r.URL.Path, p) }) {
			scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			got := sha256.Sum256([]byte(token))
			if !strings.EqualFold(scheme, "bearer") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
