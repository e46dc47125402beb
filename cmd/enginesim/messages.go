package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/pyfmt"
)

// Anthropic Messages API (vLLM's entrypoints/anthropic): the body is
// converted into the chat completion request vLLM makes of it
// (openai.ParseMessages), which runs exactly as a chat completion does
// (chat template, no special tokens added, sampling), and the answer is
// converted back into a "message" object or its event stream.
//
// vLLM answers a body its request model rejects (malformed JSON, a missing
// or mistyped field, a non-JSON content type) from FastAPI's validation
// handler, in its OpenAI error shape with type "Bad Request"; every error
// past that point (unknown model, over-long prompt, a conversion failure)
// in Anthropic's shape, {"type": "error", "error": {"type", "message"}},
// the type named after the status (translate_error_type).

// validationError is the body vLLM's validation handler writes: an OpenAI
// error of type "Bad Request".
type validationError struct {
	msg string
}

func (e *validationError) Error() string { return e.msg }

// writeValidationError writes vLLM's RequestValidationError answer.
func writeValidationError(w http.ResponseWriter, msg string) {
	type info struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    int    `json:"code"`
	}
	writeCompactJSON(w, http.StatusBadRequest, struct {
		Error info `json:"error"`
	}{info{Message: msg, Type: "Bad Request", Code: http.StatusBadRequest}})
}

// anthropicErrorType is vLLM's translate_error_type: Anthropic's error
// vocabulary for an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	if status >= http.StatusInternalServerError {
		return "api_error"
	}
	return "invalid_request_error"
}

// writeAnthropicError writes err as vLLM's Messages endpoints do: a
// validation error in the OpenAI shape, anything else as an Anthropic
// error with the status of the error vLLM raises.
func writeAnthropicError(w http.ResponseWriter, err error) {
	var ve *validationError
	if errors.As(err, &ve) {
		writeValidationError(w, ve.msg)
		return
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	writeCompactJSON(w, ae.status, struct {
		Type  string `json:"type"`
		Error detail `json:"error"`
	}{"error", detail{anthropicErrorType(ae.status), ae.msg}})
}

// marshalCompact is v as Python's serializers write it: no HTML escaping
// (<, > and & stay as they are) and no trailing newline.
func marshalCompact(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// writeCompactJSON writes v as Starlette's JSONResponse does.
func writeCompactJSON(w http.ResponseWriter, status int, v any) {
	b, err := marshalCompact(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// readMessagesBody reads a Messages endpoint's body, refusing a content
// type other than application/json as vLLM's validate_json_request does.
func readMessagesBody(r *http.Request) ([]byte, error) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); !strings.EqualFold(mt, "application/json") {
		return nil, &validationError{"1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"}
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 64<<20))
	if err != nil {
		return nil, &validationError{fmt.Sprintf("invalid body: %v", err)}
	}
	return body, nil
}

// unknownModel is vLLM 0.33's answer to a model it does not serve.
func (s *server) unknownModel(model string) error {
	return &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
		msg: fmt.Sprintf("The model `%s` does not exist. Valid aliases: %s.", model, s.model)}
}

// convertError is how vLLM answers a body ParseMessages could not
// convert: a failure of vLLM's own conversion (a tool change naming an
// undeclared tool, a malformed tool result or image) is an Anthropic
// invalid_request_error; anything else is a field vLLM's request model
// rejects, a validation error. An assistant's tool_result with list
// content, which vLLM renders as Python's repr of the list, is refused
// too: the simulator cannot render it as vLLM does.
func convertError(err error) error {
	msg := strings.TrimPrefix(err.Error(), openai.ErrMessagesUnsupported.Error()+": ")
	// vLLM names the tool with Python's repr.
	if m := undeclaredTool.FindStringSubmatch(msg); m != nil {
		if name, err := strconv.Unquote(m[2]); err == nil {
			return badRequest("", "%s references tool %s, which is not declared in tools", m[1], pyRepr(name))
		}
	}
	for _, conv := range []string{"which is not declared in tools", "tool_result", "image source"} {
		if strings.Contains(msg, conv) {
			return badRequest("", "%s", msg)
		}
	}
	return &validationError{"1 validation error:\n  " + msg}
}

var undeclaredTool = regexp.MustCompile(`(tool_addition|tool_removal) references tool ("(?:[^"\\]|\\.)*"), which is not declared in tools$`)

// pyRepr is Python's repr of a string (pkg/pyfmt), as vLLM's error
// messages quote a tool's name.
func pyRepr(s string) string {
	var b strings.Builder
	pyfmt.WriteStringRepr(&b, s)
	return b.String()
}

// messagesSampling are the sampling fields of a Messages body the
// conversion does not carry; their types are checked as vLLM's request
// model checks them.
type messagesSampling struct {
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	TopK        *int     `json:"top_k"`
	CacheSalt   *string  `json:"cache_salt"`
}

// parseMessagesRequest parses and converts a Messages body into the chat
// request vLLM runs for it.
func (s *server) parseMessagesRequest(body []byte) (*genRequest, string, *loraModule, error) {
	p, err := openai.ParseMessages(body)
	if err != nil {
		return nil, "", nil, &validationError{"1 validation error:\n  " + strings.TrimPrefix(err.Error(), openai.ErrInvalidRequest.Error()+": ")}
	}
	var sample messagesSampling
	if err := json.Unmarshal(body, &sample); err != nil {
		return nil, "", nil, &validationError{fmt.Sprintf("1 validation error:\n  %v", err)}
	}
	if sample.CacheSalt != nil && (*sample.CacheSalt == "" || len(*sample.CacheSalt) > 1024) {
		return nil, "", nil, &validationError{"1 validation error:\n  cache_salt must be 1 to 1024 characters"}
	}
	if p.Convert != nil {
		return nil, "", nil, convertError(p.Convert)
	}
	model, lora, err := s.resolveModel(&p.Model)
	if err != nil {
		return nil, "", nil, s.unknownModel(p.Model)
	}
	req := &genRequest{
		Model: &p.Model, Stream: p.Stream, Temperature: sample.Temperature,
		AddSpecialTokens: &p.AddSpecialTokens, AddGenerationPrompt: &p.AddGenerationPrompt,
		Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs, CacheSalt: sample.CacheSalt,
		systemFirst: p.SystemFirstMessages, thinkingDisabled: p.ThinkingDisabled,
	}
	if p.ReasoningEffort != "" {
		req.ReasoningEffort = &p.ReasoningEffort
	}
	if err := json.Unmarshal(p.Messages, &req.Messages); err != nil {
		return nil, "", nil, badRequest("", "messages convert to invalid chat messages: %v", err)
	}
	if p.MaxTokens > 0 {
		req.MaxCompletionTokens = &p.MaxTokens
	}
	return req, model, lora, nil
}

// messages serves POST /v1/messages.
func (s *server) messages(w http.ResponseWriter, r *http.Request) {
	body, err := readMessagesBody(r)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	req, model, lora, err := s.parseMessagesRequest(body)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	s.run(w, r, req, apiMessages, model, lora)
}

// countTokens serves POST /v1/messages/count_tokens: the prompt the same
// body would run, counted ({"input_tokens": n, "context_management":
// {"original_input_tokens": n}}). Its request model has no max_tokens,
// stream or sampling fields, so those are ignored.
func (s *server) countTokens(w http.ResponseWriter, r *http.Request) {
	body, err := readMessagesBody(r)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		writeAnthropicError(w, &validationError{"1 validation error:\n  the body is not a JSON object"})
		return
	}
	for _, k := range []string{"stream", "temperature", "top_p", "top_k", "cache_salt", "stop_sequences", "metadata"} {
		delete(top, k)
	}
	// The largest max_tokens: no thinking budget is refused for it.
	top["max_tokens"] = json.RawMessage("2147483647")
	body, err = json.Marshal(top)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	req, _, _, err := s.parseMessagesRequest(body)
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	toks, err := chatTokens(req, s.realTok)
	if err == nil && len(toks) > s.maxModelLen {
		err = s.promptTooLong(len(toks))
	}
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	type management struct {
		OriginalInputTokens int `json:"original_input_tokens"`
	}
	writeCompactJSON(w, http.StatusOK, struct {
		InputTokens       int        `json:"input_tokens"`
		ContextManagement management `json:"context_management"`
	}{len(toks), management{len(toks)}})
}

// promptTooLong is vLLM 0.33's error for a prompt longer than the context.
func (s *server) promptTooLong(n int) error {
	return badRequest("input_tokens", "This model's maximum context length is %d tokens. However, your prompt contains %d input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.", s.maxModelLen, n)
}

// validateMessages checks a converted Messages request as vLLM 0.33 checks
// the chat request it makes: max_tokens (sent as max_completion_tokens)
// at most the context, the prompt within it, and at least one token left
// to generate; max_tokens beyond the rest of the context is cut to it
// (messagesMaxTokens).
func (s *server) validateMessages(req *genRequest, prompt []uint32) error {
	if len(prompt) == 0 {
		return badRequest("prompt", "The prompt cannot be empty.")
	}
	if mt := *req.MaxCompletionTokens; mt > s.maxModelLen {
		return badRequest("max_completion_tokens", "max_completion_tokens=%d cannot be greater than max_model_len=%d. Please request fewer output tokens.", mt, s.maxModelLen)
	}
	if len(prompt) > s.maxModelLen {
		return s.promptTooLong(len(prompt))
	}
	if mt := s.messagesMaxTokens(req, len(prompt)); mt < 1 {
		return badRequest("max_tokens", "max_tokens must be at least 1, got %d.", mt)
	}
	return nil
}

// messagesMaxTokens is vLLM's get_max_tokens: the request's, at most the
// rest of the context.
func (s *server) messagesMaxTokens(req *genRequest, promptLen int) int {
	return min(*req.MaxCompletionTokens, s.maxModelLen-promptLen)
}

// anthropicUsage is vLLM's _build_anthropic_usage. The cache fields exist
// only with --enable-prompt-tokens-details, and input_tokens then excludes
// them.
type anthropicUsage struct {
	InputTokens              int  `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
}

// anthropicUsage is the finished request's usage. vLLM 0.33 reports, with
// the details on, the prompt tokens read from the cache and those its
// prefill wrote to it: the prompt's full blocks (capped at the prompt,
// estimate_cached_tokens) less the cached ones. A prompt whose every block
// was cached still writes its last block, which is always recomputed.
func (g *generation) anthropicUsage() anthropicUsage {
	f := g.fins[0]
	p := len(g.reqs[0].Prompt)
	u := anthropicUsage{InputTokens: p, OutputTokens: f.OutputTokens}
	if g.s.promptDetails {
		read := f.CachedTokens
		created := max(0, min(p/g.s.blockSize*g.s.blockSize, p)-read)
		u.CacheReadInputTokens, u.CacheCreationInputTokens = &read, &created
		u.InputTokens = max(0, p-read-created)
	}
	return u
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messageObject is the non-streamed answer, serialized as vLLM does
// (model_dump(exclude_none=True)): stop_sequence is left out when null.
type messageObject struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Content      []textBlock    `json:"content"`
	Model        string         `json:"model"`
	StopReason   string         `json:"stop_reason,omitempty"`
	StopSequence *string        `json:"stop_sequence,omitempty"`
	Usage        anthropicUsage `json:"usage"`
}

// anthropicStopReason is vLLM's _to_anthropic_stop_reason for the
// simulator's finishes: "length" is max_tokens, a natural stop end_turn.
func anthropicStopReason(finish string) string {
	if finish == "length" {
		return "max_tokens"
	}
	return "end_turn"
}

func (g *generation) messageObject() messageObject {
	return messageObject{
		ID: g.id, Type: "message", Role: "assistant",
		Content: []textBlock{{Type: "text", Text: string(g.texts[0])}}, Model: g.model,
		StopReason: anthropicStopReason(g.fins[0].Reason), Usage: g.anthropicUsage(),
	}
}

// Streamed events, serialized as vLLM does (model_dump_json(exclude_unset=
// True)): the fields in AnthropicStreamEvent's order (type, message, delta,
// content_block, index, usage), only those vLLM sets.
type (
	messageStartBody struct {
		ID           string         `json:"id"`
		Type         string         `json:"type"`
		Role         string         `json:"role"`
		Content      []textBlock    `json:"content"`
		Model        string         `json:"model"`
		StopReason   *string        `json:"stop_reason"`
		StopSequence *string        `json:"stop_sequence"`
		Usage        anthropicUsage `json:"usage"`
	}
	messageStartEvent struct {
		Type    string           `json:"type"`
		Message messageStartBody `json:"message"`
	}
	blockStartEvent struct {
		Type         string    `json:"type"`
		ContentBlock textBlock `json:"content_block"`
		Index        int       `json:"index"`
	}
	textDelta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	blockDeltaEvent struct {
		Type  string    `json:"type"`
		Delta textDelta `json:"delta"`
		Index int       `json:"index"`
	}
	blockStopEvent struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	stopDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	messageDeltaEvent struct {
		Type  string         `json:"type"`
		Delta stopDelta      `json:"delta"`
		Usage anthropicUsage `json:"usage"`
	}
	messageStopEvent struct {
		Type string `json:"type"`
	}
)

// streamMessages streams the answer as vLLM's message_stream_converter
// does over a chat stream with continuous usage: message_start (usage:
// the prompt tokens, no output yet) with the first token, then a text
// block (content_block_start, a text_delta per token, content_block_stop),
// message_delta with the stop reason and the final usage, and
// message_stop. No ping, no [DONE]. False when the client went away.
func (g *generation) streamMessages() bool {
	flush := startEvents(g.w)
	flush()
	write := func(typ string, v any) bool {
		b, err := marshalCompact(v)
		if err != nil {
			return false
		}
		_, err = fmt.Fprintf(g.w, "event: %s\ndata: %s\n\n", typ, b)
		return err == nil
	}
	started, open := false, false
	for {
		text, done, ok := g.nextText()
		if !ok {
			return false
		}
		if done {
			break
		}
		if !started {
			// vLLM's first chunk carries the role and the prompt's usage.
			started = true
			if !write("message_start", messageStartEvent{Type: "message_start", Message: messageStartBody{
				ID: g.id, Type: "message", Role: "assistant", Content: []textBlock{}, Model: g.model,
				Usage: anthropicUsage{InputTokens: len(g.reqs[0].Prompt)},
			}}) {
				return false
			}
		}
		if text == "" {
			continue
		}
		if !open {
			open = true
			if !write("content_block_start", blockStartEvent{Type: "content_block_start", ContentBlock: textBlock{Type: "text"}}) {
				return false
			}
		}
		if !write("content_block_delta", blockDeltaEvent{Type: "content_block_delta", Delta: textDelta{Type: "text_delta", Text: text}}) {
			return false
		}
		if len(g.sink.ch) == 0 {
			flush()
		}
	}
	// The request is done in the engine: a client that goes away from here
	// on has nothing left to abort.
	if open && !write("content_block_stop", blockStopEvent{Type: "content_block_stop"}) {
		return true
	}
	_ = write("message_delta", messageDeltaEvent{Type: "message_delta",
		Delta: stopDelta{StopReason: anthropicStopReason(g.fins[0].Reason)}, Usage: g.anthropicUsage()}) &&
		write("message_stop", messageStopEvent{Type: "message_stop"})
	flush()
	return true
}
