package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Inference paths the parser knows.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
)

// ErrInvalidRequest is wrapped by every error Parse returns for a malformed
// body: bad JSON, a field of the wrong type, a missing required field.
var ErrInvalidRequest = errors.New("openai: invalid request")

// Kind is the API a request belongs to.
type Kind uint8

// The kinds of request Parse understands.
const (
	KindUnknown Kind = iota
	KindCompletion
	KindChat
)

func (k Kind) String() string {
	switch k {
	case KindCompletion:
		return "completion"
	case KindChat:
		return "chat"
	}
	return "unknown"
}

// KindOf maps a request path (query string allowed) to the API it serves;
// KindUnknown for every other path.
func KindOf(path string) Kind {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch path {
	case PathCompletions:
		return KindCompletion
	case PathChatCompletions:
		return KindChat
	}
	return KindUnknown
}

// Prompt is a completions prompt in one of its four forms: a string or a
// list of strings (Texts), a list of token ids or a list of such lists
// (TokenIDs). At most one of the two is set.
type Prompt struct {
	Texts    []string
	TokenIDs [][]uint32
}

// Empty reports whether the prompt has no form at all (absent, or
// replaced by prompt_embeds).
func (p Prompt) Empty() bool { return len(p.Texts) == 0 && len(p.TokenIDs) == 0 }

// Request is the routing-relevant view of an OpenAI-compatible request.
type Request struct {
	Kind Kind
	// Model is the model string as sent; it may name a LoRA adapter.
	Model string
	// Prompt is set for completions.
	Prompt Prompt
	// PromptEmbeds reports a completions request carrying prompt_embeds.
	PromptEmbeds bool
	// Messages, Tools and ChatTemplateKwargs are the chat request's raw
	// JSON values (nil when absent or null).
	Messages           json.RawMessage
	Tools              json.RawMessage
	ChatTemplateKwargs json.RawMessage
	// AddGenerationPrompt defaults to true; ContinueFinalMessage to false.
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// AddSpecialTokens defaults to true for completions and false for chat
	// (vLLM's defaults).
	AddSpecialTokens bool
	// MaxTokens is max_completion_tokens when given, else max_tokens; 0 when
	// neither is.
	MaxTokens int
	Stream    bool
	// IncludeUsage reports a streamed request whose stream_options ask for a
	// final usage chunk. Like vLLM, a present stream_options object defaults
	// include_usage to true.
	IncludeUsage bool
	CacheSalt    string
}

// rawRequest mirrors the JSON fields the router reads. Pointers tell absent
// from zero; raw messages are checked by hand.
type rawRequest struct {
	Model                *string         `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	PromptEmbeds         json.RawMessage `json:"prompt_embeds"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	MaxTokens            *int64          `json:"max_tokens"`
	MaxCompletionTokens  *int64          `json:"max_completion_tokens"`
	Stream               *bool           `json:"stream"`
	StreamOptions        *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt *string `json:"cache_salt"`
}

// Parse parses body as a request to path's API. Unknown paths yield an
// error wrapping ErrInvalidRequest too; callers that route unknown paths
// should test KindOf first.
func Parse(path string, body []byte) (Request, error) {
	switch k := KindOf(path); k {
	case KindCompletion:
		return ParseCompletion(body)
	case KindChat:
		return ParseChat(body)
	}
	return Request{}, fmt.Errorf("%w: unknown path %q", ErrInvalidRequest, path)
}

// ParseCompletion parses a /v1/completions body.
func ParseCompletion(body []byte) (Request, error) {
	raw, err := decode(body)
	if err != nil {
		return Request{}, err
	}
	req := Request{Kind: KindCompletion, AddSpecialTokens: true}
	if err := raw.common(&req); err != nil {
		return Request{}, err
	}
	if isNull(raw.Prompt) {
		if isNull(raw.PromptEmbeds) {
			return Request{}, fmt.Errorf("%w: field \"prompt\" is required", ErrInvalidRequest)
		}
		req.PromptEmbeds = true
		return req, nil
	}
	req.PromptEmbeds = !isNull(raw.PromptEmbeds)
	p, err := parsePrompt(raw.Prompt)
	if err != nil {
		return Request{}, err
	}
	req.Prompt = p
	return req, nil
}

// ParseChat parses a /v1/chat/completions body.
func ParseChat(body []byte) (Request, error) {
	raw, err := decode(body)
	if err != nil {
		return Request{}, err
	}
	req := Request{Kind: KindChat, AddGenerationPrompt: true}
	if err := raw.common(&req); err != nil {
		return Request{}, err
	}
	if isNull(raw.Messages) {
		return Request{}, fmt.Errorf("%w: field \"messages\" is required", ErrInvalidRequest)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw.Messages, &msgs); err != nil {
		return Request{}, fmt.Errorf("%w: field \"messages\": expected an array of objects", ErrInvalidRequest)
	}
	if len(msgs) == 0 {
		return Request{}, fmt.Errorf("%w: field \"messages\" must not be empty", ErrInvalidRequest)
	}
	for i, m := range msgs {
		if firstByte(m) != '{' {
			return Request{}, fmt.Errorf("%w: field \"messages[%d]\": expected an object", ErrInvalidRequest, i)
		}
	}
	req.Messages = raw.Messages
	if !isNull(raw.Tools) {
		if firstByte(raw.Tools) != '[' {
			return Request{}, fmt.Errorf("%w: field \"tools\": expected an array", ErrInvalidRequest)
		}
		req.Tools = raw.Tools
	}
	if !isNull(raw.ChatTemplateKwargs) {
		if firstByte(raw.ChatTemplateKwargs) != '{' {
			return Request{}, fmt.Errorf("%w: field \"chat_template_kwargs\": expected an object", ErrInvalidRequest)
		}
		req.ChatTemplateKwargs = raw.ChatTemplateKwargs
	}
	if raw.AddGenerationPrompt != nil {
		req.AddGenerationPrompt = *raw.AddGenerationPrompt
	}
	if raw.ContinueFinalMessage != nil {
		req.ContinueFinalMessage = *raw.ContinueFinalMessage
	}
	if req.AddGenerationPrompt && req.ContinueFinalMessage {
		// vLLM rejects the pair, default included: the template cannot both
		// open a new assistant turn and continue the last one.
		return Request{}, fmt.Errorf("%w: add_generation_prompt and continue_final_message are mutually exclusive (set add_generation_prompt to false)", ErrInvalidRequest)
	}
	return req, nil
}

func decode(body []byte) (rawRequest, error) {
	var raw rawRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return raw, fmt.Errorf("%w: empty body", ErrInvalidRequest)
	}
	if firstByte(body) != '{' {
		return raw, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return raw, describe(err)
	}
	return raw, nil
}

// describe turns an encoding/json error into one naming the field, without
// the decoder's internal type names.
func describe(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Errorf("%w: field %q: expected %s, got %s", ErrInvalidRequest, te.Field, typeName(te.Type.Kind().String()), te.Value)
		}
		return fmt.Errorf("%w: expected %s, got %s", ErrInvalidRequest, typeName(te.Type.Kind().String()), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%w: malformed JSON at offset %d: %v", ErrInvalidRequest, se.Offset, se)
	}
	return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
}

func typeName(kind string) string {
	switch kind {
	case "int", "int64", "int32", "uint32", "uint64":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return kind
}

// common fills the fields both APIs share.
func (raw *rawRequest) common(req *Request) error {
	if raw.Model != nil {
		req.Model = *raw.Model
	}
	if raw.AddSpecialTokens != nil {
		req.AddSpecialTokens = *raw.AddSpecialTokens
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"max_tokens", raw.MaxTokens}, {"max_completion_tokens", raw.MaxCompletionTokens}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 || *f.v > math.MaxInt32 {
			return fmt.Errorf("%w: field %q: %d out of range", ErrInvalidRequest, f.name, *f.v)
		}
		req.MaxTokens = int(*f.v) // max_completion_tokens is second: it wins
	}
	if raw.Stream != nil {
		req.Stream = *raw.Stream
	}
	if raw.StreamOptions != nil && req.Stream {
		req.IncludeUsage = raw.StreamOptions.IncludeUsage == nil || *raw.StreamOptions.IncludeUsage
	}
	if raw.CacheSalt != nil {
		if *raw.CacheSalt == "" {
			return fmt.Errorf("%w: field \"cache_salt\" must be a non-empty string when given", ErrInvalidRequest)
		}
		req.CacheSalt = *raw.CacheSalt
	}
	return nil
}

// parsePrompt decodes the four prompt forms.
func parsePrompt(msg json.RawMessage) (Prompt, error) {
	switch firstByte(msg) {
	case '"':
		var s string
		if err := json.Unmarshal(msg, &s); err != nil {
			return Prompt{}, fmt.Errorf("%w: field \"prompt\": %v", ErrInvalidRequest, err)
		}
		return Prompt{Texts: []string{s}}, nil
	case '[':
	default:
		return Prompt{}, fmt.Errorf("%w: field \"prompt\": expected a string, an array of strings, an array of token ids or an array of such arrays", ErrInvalidRequest)
	}
	// Fast paths for homogeneous lists; anything irregular falls through
	// to the element-wise walk, which names the offending element.
	switch firstByte(bytes.Trim(msg, " \t\r\n")[1:]) {
	case '"':
		var texts []string
		if json.Unmarshal(msg, &texts) == nil && len(texts) > 0 {
			return Prompt{Texts: texts}, nil
		}
	case '[':
		var lists [][]int64
		if json.Unmarshal(msg, &lists) == nil && len(lists) > 0 {
			ids := make([][]uint32, len(lists))
			ok := true
			for i, l := range lists {
				if ids[i], ok = convertIDs(l); !ok || len(l) == 0 {
					ok = false
					break
				}
			}
			if ok {
				return Prompt{TokenIDs: ids}, nil
			}
		}
	case ']':
	default:
		v, err := tokenIDs(msg, "prompt")
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{TokenIDs: [][]uint32{v}}, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(msg, &elems); err != nil {
		return Prompt{}, fmt.Errorf("%w: field \"prompt\": %v", ErrInvalidRequest, err)
	}
	if len(elems) == 0 {
		return Prompt{}, fmt.Errorf("%w: field \"prompt\" must not be empty", ErrInvalidRequest)
	}
	switch firstByte(elems[0]) {
	case '"':
		texts := make([]string, len(elems))
		for i, e := range elems {
			if firstByte(e) != '"' {
				return Prompt{}, fmt.Errorf("%w: field \"prompt[%d]\": expected a string", ErrInvalidRequest, i)
			}
			if err := json.Unmarshal(e, &texts[i]); err != nil {
				return Prompt{}, fmt.Errorf("%w: field \"prompt[%d]\": %v", ErrInvalidRequest, i, err)
			}
		}
		return Prompt{Texts: texts}, nil
	case '[':
		ids := make([][]uint32, len(elems))
		for i, e := range elems {
			if firstByte(e) != '[' {
				return Prompt{}, fmt.Errorf("%w: field \"prompt[%d]\": expected an array of token ids", ErrInvalidRequest, i)
			}
			v, err := tokenIDs(e, fmt.Sprintf("prompt[%d]", i))
			if err != nil {
				return Prompt{}, err
			}
			if len(v) == 0 {
				return Prompt{}, fmt.Errorf("%w: field \"prompt[%d]\" must not be empty", ErrInvalidRequest, i)
			}
			ids[i] = v
		}
		return Prompt{TokenIDs: ids}, nil
	default:
		v, err := tokenIDs(msg, "prompt")
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{TokenIDs: [][]uint32{v}}, nil
	}
}

func tokenIDs(msg json.RawMessage, field string) ([]uint32, error) {
	if out, ok := scanIDs(msg); ok {
		return out, nil
	}
	var ids []int64
	if err := json.Unmarshal(msg, &ids); err != nil {
		return nil, fmt.Errorf("%w: field %q: expected an array of token ids", ErrInvalidRequest, field)
	}
	out, ok := convertIDs(ids)
	if !ok {
		for i, id := range ids {
			if id < 0 || id > math.MaxUint32 {
				return nil, fmt.Errorf("%w: field \"%s[%d]\": token id %d out of range", ErrInvalidRequest, field, i, id)
			}
		}
	}
	return out, nil
}

// convertIDs narrows token ids to uint32; ok is false if one is out of range.
func convertIDs(ids []int64) ([]uint32, bool) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxUint32 {
			return nil, false
		}
		out[i] = uint32(id)
	}
	return out, true
}

// firstByte is the first non-space byte of a JSON value, 0 when none.
func firstByte(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

func isNull(b json.RawMessage) bool {
	t := bytes.TrimSpace(b)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// Model extracts a top-level "model" string from any JSON object body,
// leniently: it returns "" for anything it cannot read. It serves requests
// on paths the parser does not know (embeddings, rerank, ...).
func Model(body []byte) string {
	if firstByte(body) != '{' {
		return ""
	}
	var v struct {
		Model json.RawMessage `json:"model"`
	}
	if json.Unmarshal(body, &v) != nil || firstByte(v.Model) != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(v.Model, &s) != nil {
		return ""
	}
	return s
}

// scanIDs reads a JSON array of non-negative integers that fit in uint32
// (the common pre-tokenized prompt) without reflection. ok is false for
// anything else, which the caller then decodes the slow way for a precise
// error.
func scanIDs(b []byte) (out []uint32, ok bool) {
	b = bytes.Trim(b, " \t\r\n")
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, false
	}
	b = b[1 : len(b)-1]
	out = make([]uint32, 0, len(b)/4+1)
	i, n := 0, len(b)
	skip := func() {
		for i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	skip()
	if i == n {
		return out, true // []
	}
	for {
		start := i
		var v uint64
		for i < n && b[i] >= '0' && b[i] <= '9' {
			v = v*10 + uint64(b[i]-'0')
			if v > math.MaxUint32 {
				return nil, false
			}
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) {
			return nil, false // not a plain integer (sign, fraction, leading zero)
		}
		out = append(out, uint32(v))
		skip()
		if i == n {
			return out, true
		}
		if b[i] != ',' {
			return nil, false
		}
		i++
		skip()
	}
}
