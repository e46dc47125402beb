package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Inference paths the parser knows.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
)

// PathResponses (responses.go) and PathMessages (messages.go) are the
// others.

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
	KindResponses
	KindMessages
)

func (k Kind) String() string {
	switch k {
	case KindCompletion:
		return "completion"
	case KindChat:
		return "chat"
	case KindResponses:
		return "responses"
	case KindMessages:
		return "messages"
	}
	return "unknown"
}

// Path is the API's path (PathCompletions, PathChatCompletions,
// PathResponses, PathMessages); "" for KindUnknown.
func (k Kind) Path() string {
	switch k {
	case KindCompletion:
		return PathCompletions
	case KindChat:
		return PathChatCompletions
	case KindResponses:
		return PathResponses
	case KindMessages:
		return PathMessages
	}
	return ""
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
	case PathResponses:
		return KindResponses
	case PathMessages:
		return KindMessages
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

// Message is one chat message as the chat template sees it, decoded in
// the same pass that validates the body.
type Message struct {
	Role string
	// Content is the text the template renders: a string content as is,
	// the text of a list of content parts, the non-empty ones joined by "\n" (vLLM's
	// preprocessing), "" for null or absent content. Strings decode as
	// encoding/json decodes them (invalid UTF-8 and unpaired surrogates
	// become U+FFFD), byte for byte what the local tokenizer renders.
	Content string
	// NonText reports content parts other than text (images, audio, ...):
	// Content then holds only the text parts.
	NonText bool
	// Name is the optional participant name.
	Name string
	// Raw is the message object's JSON, a slice of the body (other fields
	// such as tool_calls are read from it when needed).
	Raw json.RawMessage
}

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
	// JSON values (nil when absent or null): slices of the body, not
	// copies.
	Messages           json.RawMessage
	Tools              json.RawMessage
	ChatTemplateKwargs json.RawMessage
	// ToolChoice is a chat or Responses request's tool_choice (raw JSON,
	// nil when absent or null; a Messages request's type none is "none"):
	// vLLM renders every tool whatever it says, unless started with
	// --exclude-tools-when-tool-choice-none and it is "none"; SGLang
	// renders only the named tool, and none for "none".
	ToolChoice json.RawMessage
	// ReasoningEffort is the reasoning effort the request asks for (a
	// chat request's reasoning_effort, a Responses request's
	// reasoning.effort, a Messages request's output_config.effort; "" for
	// none). ChatTemplateKwargs are the request's own: the tokenizer merges
	// the effort into them as vLLM does (tokenize.ChatInput).
	ReasoningEffort string
	// Documents is a chat request's documents (raw JSON array, nil when
	// absent or null), which vLLM hands the template (RAG templates).
	Documents json.RawMessage
	// ChatMessages are the messages decoded: role, text and name.
	ChatMessages []Message
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
	// User is the OpenAI "user" field (an end-user identifier).
	User string
	// PromptCacheKey is OpenAI's "prompt_cache_key" (a client-chosen key
	// for requests that share a prefix), when it is a string.
	PromptCacheKey string
	// SessionID is the conversation the body says it belongs to: the first
	// string among "session_id", "conversation_id", "conversation" (a
	// string or an object's "id"), metadata.session_id and
	// metadata.conversation_id. "" when none.
	SessionID string
	// PreviousResponseID is a Responses request's previous_response_id: the
	// engine prepends history it stored, which the router never sees.
	PreviousResponseID string
	// ResponseID is a Responses request's request_id, "" when absent: vLLM
	// and SGLang name the response (and store it) under it, and generate
	// one ("resp_...") when the client sets none.
	ResponseID string
	// Store is a Responses request's store (true when absent): the engine
	// keeps the response for a later previous_response_id or retrieval,
	// when its response store is enabled. Background is its background.
	Store, Background bool
	// Turn is, for a Responses request with PreviousResponseID, the part
	// of the prompt the request itself brings, converted as vLLM converts
	// it before it prepends the stored history; nil otherwise, or when the
	// input cannot be converted (Convert says why).
	Turn *ResponsesTurn
	// SystemFirstMessages is, for a Messages request with inline system
	// messages, Messages with those merged into the leading system message:
	// what vLLM renders when the chat template rejects a system message
	// after the first. nil when the two are the same.
	SystemFirstMessages json.RawMessage
	// ThinkingDisabled reports a Messages request with thinking disabled:
	// vLLM then picks the reasoning effort for its template ("none", or
	// "low" when the template ignores "none"), so ReasoningEffort is left
	// empty for the tokenizer to resolve.
	ThinkingDisabled bool
	// Convert is, for a Responses or Messages request, why its prompt could
	// not be converted into the chat request above (ErrResponsesUnsupported,
	// ErrMessagesUnsupported), nil when it was.
	Convert error
}

// Parse parses body as a request to path's API. Unknown paths yield an
// error wrapping ErrInvalidRequest too; callers that route unknown paths
// should test KindOf first.
func Parse(path string, body []byte) (Request, error) {
	switch k := KindOf(path); k {
	case KindCompletion, KindChat:
		return parse(k, body)
	case KindResponses:
		return ParseResponses(body)
	case KindMessages:
		return ParseMessages(body)
	}
	return Request{}, fmt.Errorf("%w: unknown path %q", ErrInvalidRequest, path)
}

// ParseCompletion parses a /v1/completions body.
func ParseCompletion(body []byte) (Request, error) { return parse(KindCompletion, body) }

// ParseChat parses a /v1/chat/completions body.
func ParseChat(body []byte) (Request, error) { return parse(KindChat, body) }

// fields is what one pass over the body collects; the last occurrence of
// a key wins, as in encoding/json.
type fields struct {
	maxTokens, maxCompletion        *int64
	addGen, contFinal, addSpecial   *bool
	stream                          *bool
	streamOptions, includeUsage     *bool
	cacheSalt                       *string
	prompt                          *Prompt
	promptEmbeds                    bool
	messagesSet                     bool
	sessionConv                     string
	metaSession, metaConversation   string
	sessionIDTop, conversationIDTop string
	effort                          *string
}

// parse reads body in one pass: the fields routing needs are decoded where
// they lie, every other value is validated and skipped.
func parse(kind Kind, body []byte) (Request, error) {
	req := Request{Kind: kind}
	s := newScanner(body)
	switch s.Peek() {
	case 0:
		return req, fmt.Errorf("%w: empty body", ErrInvalidRequest)
	case '{':
	default:
		return req, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
	}
	var f fields
	err := s.Object(1, func(key string) (bool, error) { return f.field(s, &req, key) })
	if err == nil {
		err = s.End()
	}
	if err != nil {
		return Request{}, invalid(err)
	}
	return f.finish(req)
}

// field decodes one top-level member the parser knows; it reports false
// for the others (skipped by the caller).
func (f *fields) field(s *scanner, req *Request, key string) (bool, error) {
	const depth = 1
	var err error
	switch key {
	case "model":
		req.Model, _, err = s.stringField(key, depth)
	case "prompt":
		if req.Kind != KindCompletion {
			return false, nil
		}
		f.prompt = nil
		if null, nerr := s.Null(); null || nerr != nil {
			return true, nerr
		}
		var p Prompt
		if p, err = s.prompt(); err == nil {
			f.prompt = &p
		}
	case "prompt_embeds":
		var null bool
		if null, err = s.Null(); !null && err == nil {
			err = s.Skip(depth)
		}
		f.promptEmbeds = !null
	case "messages":
		if req.Kind != KindChat {
			return false, nil
		}
		f.messagesSet = false
		req.Messages, req.ChatMessages = nil, nil
		if null, nerr := s.Null(); null || nerr != nil {
			return true, nerr
		}
		req.Messages, req.ChatMessages, err = s.messages()
		f.messagesSet = err == nil
	case "reasoning_effort":
		var v string
		var ok bool
		v, ok, err = s.stringField(key, depth)
		f.effort = nil
		if ok {
			f.effort = &v
		}
	case "documents":
		var raw []byte
		if raw, err = s.Raw(depth); err == nil && string(raw) != "null" {
			if raw[0] != '[' {
				return true, fmt.Errorf("%w: field \"documents\": expected an array", ErrInvalidRequest)
			}
			req.Documents = raw
		} else {
			req.Documents = nil
		}
	case "tools", "chat_template_kwargs", "tool_choice":
		var raw []byte
		if raw, err = s.Raw(depth); err != nil {
			return true, err
		}
		if string(raw) == "null" {
			raw = nil
		}
		switch key {
		case "tools":
			req.Tools = raw
		case "tool_choice":
			req.ToolChoice = raw
		default:
			req.ChatTemplateKwargs = raw
		}
	case "add_generation_prompt":
		f.addGen, err = boolPtr(s, key)
	case "continue_final_message":
		f.contFinal, err = boolPtr(s, key)
	case "add_special_tokens":
		f.addSpecial, err = boolPtr(s, key)
	case "stream":
		f.stream, err = boolPtr(s, key)
	case "max_tokens":
		f.maxTokens, err = intPtr(s, key)
	case "max_completion_tokens":
		f.maxCompletion, err = intPtr(s, key)
	case "stream_options":
		err = f.streamOpts(s)
	case "cache_salt":
		var v string
		var ok bool
		if v, ok, err = s.stringField(key, depth); ok {
			f.cacheSalt = &v
		} else {
			f.cacheSalt = nil
		}
	case "user":
		req.User, _, err = s.stringField(key, depth)
	case "prompt_cache_key":
		return s.lenientString(&req.PromptCacheKey)
	case "session_id":
		return s.lenientString(&f.sessionIDTop)
	case "conversation_id":
		return s.lenientString(&f.conversationIDTop)
	case "conversation":
		f.sessionConv = ""
		switch s.Peek() {
		case '"':
			return s.lenientString(&f.sessionConv)
		case '{':
			return true, s.Object(depth+1, func(k string) (bool, error) {
				if k == "id" {
					return s.lenientString(&f.sessionConv)
				}
				return false, nil
			})
		}
		return false, nil
	case "metadata":
		if s.Peek() != '{' {
			return false, nil
		}
		f.metaSession, f.metaConversation = "", ""
		return true, s.Object(depth+1, func(k string) (bool, error) {
			switch k {
			case "session_id":
				return s.lenientString(&f.metaSession)
			case "conversation_id":
				return s.lenientString(&f.metaConversation)
			}
			return false, nil
		})
	default:
		return false, nil
	}
	return true, err
}

// lenientString decodes a string at the cursor into *v (consumed), or
// sets *v to "" and leaves any other value for the caller's skip.
func (s *scanner) lenientString(v *string) (consumed bool, err error) {
	if s.Peek() != '"' {
		*v = ""
		return false, nil
	}
	t, err := s.Text()
	*v = t
	return true, err
}

func boolPtr(s *scanner, key string) (*bool, error) {
	v, ok, err := s.boolField(key, 1)
	if !ok || err != nil {
		return nil, err
	}
	return &v, nil
}

func intPtr(s *scanner, key string) (*int64, error) {
	v, ok, err := s.intField(key, 1)
	if !ok || err != nil {
		return nil, err
	}
	return &v, nil
}

// streamOpts reads stream_options: an object (include_usage inside) or
// null.
func (f *fields) streamOpts(s *scanner) error {
	f.streamOptions, f.includeUsage = nil, nil
	if null, err := s.Null(); null || err != nil {
		return err
	}
	if s.Peek() != '{' {
		return s.typeError("stream_options", "an object", 1)
	}
	t := true
	f.streamOptions = &t
	return s.Object(2, func(k string) (bool, error) {
		if k != "include_usage" {
			return false, nil
		}
		v, err := boolPtr(s, "stream_options.include_usage")
		f.includeUsage = v
		return true, err
	})
}

// finish applies defaults and the cross-field rules.
func (f *fields) finish(req Request) (Request, error) {
	switch req.Kind {
	case KindCompletion:
		req.AddSpecialTokens = true
	case KindChat:
		req.AddGenerationPrompt = true
	}
	if f.addSpecial != nil {
		req.AddSpecialTokens = *f.addSpecial
	}
	for _, m := range []struct {
		name string
		v    *int64
	}{{"max_tokens", f.maxTokens}, {"max_completion_tokens", f.maxCompletion}} {
		if m.v == nil {
			continue
		}
		if *m.v < 0 || *m.v > math.MaxInt32 {
			return Request{}, fmt.Errorf("%w: field %q: %d out of range", ErrInvalidRequest, m.name, *m.v)
		}
		req.MaxTokens = int(*m.v) // max_completion_tokens is second: it wins
	}
	if f.stream != nil {
		req.Stream = *f.stream
	}
	if f.streamOptions != nil && req.Stream {
		req.IncludeUsage = f.includeUsage == nil || *f.includeUsage
	}
	if f.cacheSalt != nil {
		if *f.cacheSalt == "" {
			return Request{}, fmt.Errorf("%w: field \"cache_salt\" must be a non-empty string when given", ErrInvalidRequest)
		}
		req.CacheSalt = *f.cacheSalt
	}
	req.SessionID = sessionID(f.sessionIDTop, f.conversationIDTop, f.sessionConv, f.metaSession, f.metaConversation)
	switch req.Kind {
	case KindCompletion:
		req.Tools, req.ChatTemplateKwargs = nil, nil
		if f.prompt == nil {
			if !f.promptEmbeds {
				return Request{}, fmt.Errorf("%w: field \"prompt\" is required", ErrInvalidRequest)
			}
			req.PromptEmbeds = true
			return req, nil
		}
		req.PromptEmbeds = f.promptEmbeds
		req.Prompt = *f.prompt
		return req, nil
	}
	if !f.messagesSet {
		return Request{}, fmt.Errorf("%w: field \"messages\" is required", ErrInvalidRequest)
	}
	if len(req.ChatMessages) == 0 {
		return Request{}, fmt.Errorf("%w: field \"messages\" must not be empty", ErrInvalidRequest)
	}
	if req.Tools != nil && req.Tools[0] != '[' {
		return Request{}, fmt.Errorf("%w: field \"tools\": expected an array", ErrInvalidRequest)
	}
	if req.ChatTemplateKwargs != nil && req.ChatTemplateKwargs[0] != '{' {
		return Request{}, fmt.Errorf("%w: field \"chat_template_kwargs\": expected an object", ErrInvalidRequest)
	}
	if f.addGen != nil {
		req.AddGenerationPrompt = *f.addGen
	}
	if f.contFinal != nil {
		req.ContinueFinalMessage = *f.contFinal
	}
	if req.AddGenerationPrompt && req.ContinueFinalMessage {
		// vLLM rejects the pair, default included: the template cannot both
		// open a new assistant turn and continue the last one.
		return Request{}, fmt.Errorf("%w: add_generation_prompt and continue_final_message are mutually exclusive (set add_generation_prompt to false)", ErrInvalidRequest)
	}
	if f.effort != nil {
		if !IsReasoningEffort(*f.effort) {
			return Request{}, fmt.Errorf("%w: field \"reasoning_effort\": %q is not one of none, minimal, low, medium, high, xhigh, max", ErrInvalidRequest, *f.effort)
		}
		req.ReasoningEffort = *f.effort
	}
	return req, nil
}

// sessionID is the conversation a body names, in Request.SessionID's order
// of precedence: session_id, conversation_id, conversation (its "id" when
// an object), metadata.session_id, metadata.conversation_id.
func sessionID(sessionIDTop, conversationIDTop, conversation, metaSession, metaConversation string) string {
	for _, id := range []string{sessionIDTop, conversationIDTop, conversation, metaSession, metaConversation} {
		if id != "" {
			return id
		}
	}
	return ""
}

// TextPart reports a content part type whose "text" vLLM reads as text:
// "text", and the Responses API's "input_text" and "output_text". (Its
// "refusal" and "thinking" parts are text too, under keys of their own:
// the request parser leaves those to the tokenizer.)
func TextPart(typ string) bool {
	return typ == "text" || typ == "input_text" || typ == "output_text"
}

// reasoningEfforts are the values vLLM 0.33 accepts for a chat request's
// reasoning_effort.
var reasoningEfforts = map[string]bool{"none": true, "minimal": true, "low": true, "medium": true, "high": true, "xhigh": true, "max": true}

// IsReasoningEffort reports whether vLLM 0.33 accepts effort as a chat
// request's reasoning_effort.
func IsReasoningEffort(effort string) bool { return reasoningEfforts[effort] }

// messages decodes the messages array at the cursor: each element must be an
// object; role, content and name are decoded, the rest validated and
// skipped.
func (s *scanner) messages() (json.RawMessage, []Message, error) {
	if s.Peek() != '[' {
		return nil, nil, s.typeError("messages", "an array of objects", 1)
	}
	start := s.Pos()
	var out []Message
	err := s.Array(func(i int) error {
		if s.Peek() != '{' {
			return fmt.Errorf("%w: field \"messages[%d]\": expected an object", ErrInvalidRequest, i)
		}
		m, err := s.message()
		out = append(out, m)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return s.Input()[start:s.Pos()], out, nil
}

func (s *scanner) message() (Message, error) {
	const depth = 3
	var m Message
	start := s.Pos()
	err := s.Object(depth, func(k string) (bool, error) {
		switch k {
		case "role":
			return s.lenientString(&m.Role)
		case "name":
			return s.lenientString(&m.Name)
		case "content":
			m.Content, m.NonText = "", false
			switch s.Peek() {
			case '"':
				var err error
				m.Content, err = s.Text()
				return true, err
			case '[':
				text, nonText, err := s.contentParts(depth + 1)
				m.Content, m.NonText = text, nonText
				return true, err
			case 'n':
				return false, nil
			}
			m.NonText = true
			return false, nil
		}
		return false, nil
	})
	m.Raw = s.Input()[start:s.Pos()]
	return m, err
}

// contentParts decodes a content list: strings and {"type":"text","text":
// ...} parts (or "input_text", "output_text": the Responses API's, which
// vLLM reads as text) give text, the non-empty ones joined with "\n" (an
// empty part is left out of vLLM's string content); any other part sets
// nonText.
func (s *scanner) contentParts(depth int) (string, bool, error) {
	var parts []string
	nonText := false
	err := s.Array(func(int) error {
		switch s.Peek() {
		case '"':
			t, err := s.Text()
			if t != "" {
				parts = append(parts, t)
			}
			return err
		case '{':
			var typ, text string
			var hasText bool
			err := s.Object(depth+1, func(k string) (bool, error) {
				switch k {
				case "type":
					return s.lenientString(&typ)
				case "text":
					if s.Peek() != '"' {
						hasText = false
						return false, nil
					}
					t, err := s.Text()
					text, hasText = t, err == nil
					return true, err
				}
				return false, nil
			})
			switch {
			case hasText && TextPart(typ):
				if text != "" {
					parts = append(parts, text)
				}
			default:
				nonText = true
			}
			return err
		}
		nonText = true
		return s.Skip(depth + 1)
	})
	return strings.Join(parts, "\n"), nonText, err
}

// prompt decodes the four prompt forms at the cursor.
func (s *scanner) prompt() (Prompt, error) {
	const field = "prompt"
	switch s.Peek() {
	case '"':
		t, err := s.Text()
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{Texts: []string{t}}, nil
	case '[':
	default:
		return Prompt{}, s.typeError(field, "a string, an array of strings, an array of token ids or an array of such arrays", 1)
	}
	var p Prompt
	var first byte
	err := s.Array(func(i int) error {
		c := s.Peek()
		if i == 0 {
			first = c
		}
		switch {
		case first == '"':
			if c != '"' {
				return fmt.Errorf("%w: field \"prompt[%d]\": expected a string", ErrInvalidRequest, i)
			}
			t, err := s.Text()
			if err != nil {
				return err
			}
			p.Texts = append(p.Texts, t)
		case first == '[':
			name := "prompt[" + strconv.Itoa(i) + "]"
			if c != '[' {
				return fmt.Errorf("%w: field %q: expected an array of token ids", ErrInvalidRequest, name)
			}
			ids := make([]uint32, 0, 64)
			if err := s.Array(func(int) error {
				id, err := s.tokenID(name)
				ids = append(ids, id)
				return err
			}); err != nil {
				return err
			}
			if len(ids) == 0 {
				return fmt.Errorf("%w: field %q must not be empty", ErrInvalidRequest, name)
			}
			p.TokenIDs = append(p.TokenIDs, ids)
		default:
			if len(p.TokenIDs) == 0 {
				p.TokenIDs = [][]uint32{make([]uint32, 0, 256)}
			}
			id, err := s.tokenID(field)
			if err != nil {
				return err
			}
			p.TokenIDs[0] = append(p.TokenIDs[0], id)
		}
		return nil
	})
	if err != nil {
		return Prompt{}, err
	}
	if p.Empty() {
		return Prompt{}, fmt.Errorf("%w: field \"prompt\" must not be empty", ErrInvalidRequest)
	}
	return p, nil
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
	s := newScanner(body)
	if s.Peek() != '{' {
		return ""
	}
	model := ""
	err := s.Object(1, func(k string) (bool, error) {
		if k == "model" {
			return s.lenientString(&model)
		}
		return false, nil
	})
	if err != nil || s.End() != nil {
		return ""
	}
	return model
}
