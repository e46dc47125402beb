package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/pkg/engine/simtok"
	"github.com/kvroute/kvroute/pkg/openai"
)

// apiError is an error with its HTTP status and vLLM error type.
type apiError struct {
	status int
	typ    string
	param  string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: param, msg: fmt.Sprintf(format, args...)}
}

// writeError writes vLLM's error body: {"error": {message, type, param,
// code}} with code the HTTP status.
func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", msg: err.Error()}
	}
	var param any
	if ae.param != "" {
		param = ae.param
	}
	writeJSON(w, ae.status, map[string]any{"error": map[string]any{
		"message": ae.msg, "type": ae.typ, "param": param, "code": ae.status,
	}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats bool  `json:"continuous_usage_stats"`
}

// chatMessage is one chat message: its role and content for the
// simulator's template, and the whole object as sent (raw) for a real
// tokenizer's template, which may read its other fields (tool_calls,
// tool_call_id, name, reasoning).
type chatMessage struct {
	Role    string
	Content json.RawMessage
	raw     json.RawMessage
}

type chatMessageFields struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (m *chatMessage) UnmarshalJSON(b []byte) error {
	var f chatMessageFields
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	m.Role, m.Content, m.raw = f.Role, f.Content, append(json.RawMessage(nil), b...)
	return nil
}

// MarshalJSON writes the message as it was received.
func (m chatMessage) MarshalJSON() ([]byte, error) {
	if m.raw != nil {
		return m.raw, nil
	}
	return json.Marshal(chatMessageFields{m.Role, m.Content})
}

// genRequest is the union of the completion, chat and tokenize request
// fields the simulator reads; unknown fields are ignored, as vLLM does. A
// Responses request is converted into one (responses.go). Tools and
// ChatTemplateKwargs and ReasoningEffort only reach a real tokenizer's
// template (the simulator's renders none of them).
type genRequest struct {
	Model                *string         `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             []chatMessage   `json:"messages"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	N                    *int            `json:"n"`
	Temperature          *float64        `json:"temperature"`
	Seed                 *int64          `json:"seed"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	CacheSalt            *string         `json:"cache_salt"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort      *string         `json:"reasoning_effort"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
	Tokens               []int64         `json:"tokens"`

	// A converted Messages request's SystemFirstMessages and
	// ThinkingDisabled (openai.Request), for a real tokenizer's template.
	systemFirst      json.RawMessage
	thinkingDisabled bool

	// A converted Responses request's request_id ("" for a new id) and
	// previous_response_id, whether its response is stored (store true,
	// the response store enabled), and whether it runs in the background
	// (background.go; the store is then enabled).
	responseID, previousID string
	keep, background       bool
}

func decodeBody(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, 64<<20)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		return badRequest("", "invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("", "invalid JSON body: trailing data")
	}
	return nil
}

// chatText reduces a message's content to text: a string, or the text
// parts of a list of parts (openai.TextPart).
func chatText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest("messages", "message content must be a string or a list of parts")
	}
	out := ""
	for _, p := range parts {
		if openai.TextPart(p.Type) {
			out += p.Text
		}
	}
	return out, nil
}

// chatTokens applies the chat template: add_generation_prompt defaults to
// true and add_special_tokens to false, as in vLLM's chat and tokenize
// endpoints.
func chatTokens(req *genRequest, rt *realTokenizer) ([]uint32, error) {
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must not be empty")
	}
	if req.ContinueFinalMessage {
		return nil, badRequest("continue_final_message", "continue_final_message is not supported by the simulator")
	}
	if e := req.ReasoningEffort; e != nil && !openai.IsReasoningEffort(*e) {
		return nil, badRequest("reasoning_effort", "reasoning_effort %q is not one of none, minimal, low, medium, high, xhigh, max", *e)
	}
	msgs := make([]simtok.Message, len(req.Messages))
	for i, m := range req.Messages {
		if m.Role == "" {
			return nil, badRequest("messages", "messages[%d].role is required", i)
		}
		text, err := chatText(m.Content)
		if err != nil {
			return nil, err
		}
		msgs[i] = simtok.Message{Role: m.Role, Content: text}
	}
	gen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	special := req.AddSpecialTokens != nil && *req.AddSpecialTokens
	if rt != nil {
		return rt.chat(req, gen, special)
	}
	return simtok.EncodeChat(msgs, gen, special), nil
}

// completionPrompts parses a completion prompt: a string, a list of
// strings, a list of token ids or a list of token-id lists. Text is encoded
// with BOS unless add_special_tokens is false, or with the real tokenizer
// when rt is set.
func completionPrompts(req *genRequest, rt *realTokenizer) ([][]uint32, error) {
	raw := req.Prompt
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	special := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	encode := func(s string) ([]uint32, error) { return simtok.Encode(s, special), nil }
	if rt != nil {
		encode = func(s string) ([]uint32, error) { return rt.text(s, special) }
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t, err := encode(s)
		if err != nil {
			return nil, err
		}
		return [][]uint32{t}, nil
	}
	var many []json.RawMessage
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
	}
	if len(many) == 0 {
		return nil, badRequest("prompt", "prompt must not be empty")
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		t, err := tokenIDs(ids)
		if err != nil {
			return nil, err
		}
		return [][]uint32{t}, nil
	}
	out := make([][]uint32, 0, len(many))
	for _, m := range many {
		if json.Unmarshal(m, &s) == nil {
			t, err := encode(s)
			if err != nil {
				return nil, err
			}
			out = append(out, t)
			continue
		}
		if err := json.Unmarshal(m, &ids); err != nil {
			return nil, badRequest("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
		}
		t, err := tokenIDs(ids)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func tokenIDs(ids []int64) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if !simtok.Valid(id) {
			return nil, badRequest("prompt", "Token id %d is out of vocabulary", id)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}
