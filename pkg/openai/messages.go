package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/pyfmt"
)

// PathMessages is the Anthropic Messages API path, which vLLM serves.
const PathMessages = "/v1/messages"

// ErrMessagesUnsupported: the body is valid JSON, but vLLM would refuse it
// (its request model rejects a field the conversion reads) or the router
// cannot reproduce the chat request vLLM makes of it. The request is still
// routed, by its session and load.
var ErrMessagesUnsupported = errors.New("openai: messages body not reproducible")

// ParseMessages parses an Anthropic Messages (/v1/messages) body. The
// identity fields (model, the conversation, Claude Code's session in
// metadata.user_id as PromptCacheKey: messagesIdentity),
// stream and max_tokens are always read. The prompt is converted as vLLM
// (0.33) converts it before its chat template runs
// (entrypoints/anthropic/serving.py, to_chat_completion_request):
//   - the top-level system (a string, or its text blocks joined with no
//     separator, a block starting with Claude Code's
//     "x-anthropic-billing-header" left out) becomes the leading system
//     message;
//   - each message becomes a chat message: a lone text block as a string,
//     other blocks as content parts (images as image_url parts), thinking
//     blocks joined into "reasoning", tool_use blocks into tool_calls (their
//     input as JSON arguments);
//   - a user message's tool_result blocks become tool messages placed before
//     it (a user message left without content is dropped), an image in a
//     result a user message after its tool message, and tool references a
//     second tool message;
//   - inline system messages stay in place (SystemFirstMessages holds the
//     conversation with them merged into the leading system message: vLLM's
//     choice for a template that rejects a system message after the first);
//   - tools become chat function tools, after the tool_addition and
//     tool_removal blocks of system messages are applied.
//
// ChatTemplateKwargs is the body's chat_template_kwargs and ReasoningEffort
// its output_config.effort; with thinking disabled, ThinkingDisabled is set
// instead and the tokenizer resolves the effort for its template as vLLM
// does. AddGenerationPrompt is true and AddSpecialTokens false (a chat
// completion's defaults). When the prompt cannot be reproduced, Convert
// reports why (wrapping ErrMessagesUnsupported) and Messages is nil. Only
// a body that is not a JSON object is an error (wrapping
// ErrInvalidRequest): anything else vLLM would reject is left for the
// engine to answer, in its own error format.
func ParseMessages(body []byte) (Request, error) {
	req := Request{Kind: KindMessages, AddGenerationPrompt: true}
	top, err := objectFields(body)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	req.Model, req.CacheSalt = stringValue(top["model"]), stringValue(top["cache_salt"])
	if v, ok := top["stream"]; ok {
		_ = json.Unmarshal(v, &req.Stream)
	}
	var n int64
	if v, ok := top["max_tokens"]; ok && json.Unmarshal(v, &n) == nil && n > 0 {
		req.MaxTokens = int(min(n, 1<<31-1))
	}
	req.SessionID, req.PromptCacheKey, req.User = messagesIdentity(top)
	req.Convert = convertMessages(&req, top)
	if req.Convert != nil {
		req.Messages, req.SystemFirstMessages, req.Tools, req.ChatTemplateKwargs, req.ToolChoice = nil, nil, nil, nil, nil
	}
	return req, nil
}

// messagesIdentity reads who a Messages body says it comes from:
//   - session: the conversation the body names, from the fields a chat
//     body's conversation comes from (sessionID);
//   - client: else the session in metadata.user_id, which Claude Code fills
//     as "user_<hash>_account_<uuid>_session_<uuid>" or (since 2.1.78) as a
//     JSON string holding "session_id". That session spans every
//     conversation the client holds (its subagents', its compaction and
//     title requests, each with prompts of its own), so it is reported as
//     a client-chosen cache key, as prompt_cache_key is: it keys a
//     conversation's first turn, and each conversation continues under its
//     own opening;
//   - user: a user_id without a session.
func messagesIdentity(top map[string]json.RawMessage) (session, client, user string) {
	str := stringValue
	var meta map[string]json.RawMessage
	if v := top["metadata"]; firstByte(v) == '{' {
		_ = json.Unmarshal(v, &meta)
	}
	if id := sessionID(str(top["session_id"]), str(top["conversation_id"]), str(top["conversation"]),
		str(meta["session_id"]), str(meta["conversation_id"])); id != "" {
		return id, "", ""
	}
	uid := meta["user_id"]
	var obj struct {
		SessionID string `json:"session_id"`
	}
	if firstByte(uid) == '{' && json.Unmarshal(uid, &obj) == nil && obj.SessionID != "" {
		return "", obj.SessionID, ""
	}
	u := str(uid)
	if strings.HasPrefix(u, "{") && json.Unmarshal([]byte(u), &obj) == nil && obj.SessionID != "" {
		return "", obj.SessionID, ""
	}
	if i := strings.LastIndex(u, "_session_"); i >= 0 && i+len("_session_") < len(u) {
		return "", u[i+len("_session_"):], ""
	}
	return "", "", u
}

// stringValue is a JSON string's value; "" for anything else or nothing.
func stringValue(v json.RawMessage) string {
	var s string
	if firstByte(v) == '"' {
		_ = json.Unmarshal(v, &s)
	}
	return s
}

// billingHeader starts the system block Claude Code adds to every request,
// whose value changes each time; vLLM leaves such blocks out of the prompt.
const billingHeader = "x-anthropic-billing-header"

// block is one content block of a Messages body, with the fields vLLM's
// request model reads (AnthropicContentBlock); absent and null are nil.
type block struct {
	Type      string
	Text      *string
	Source    json.RawMessage
	ID        *string
	ToolUseID *string
	Name      *string
	Input     json.RawMessage
	Content   json.RawMessage
	Thinking  *string
	Tool      json.RawMessage
}

// anthropicMessage is one message of a Messages body: content is either a
// string (Blocks nil) or blocks.
type anthropicMessage struct {
	Role     string
	Text     string
	IsString bool
	Blocks   []block
}

// blockTypes are the block types vLLM's request model accepts.
var blockTypes = map[string]bool{
	"text": true, "image": true, "tool_use": true, "tool_result": true, "tool_reference": true,
	"thinking": true, "redacted_thinking": true, "tool_addition": true, "tool_removal": true,
}

// decodeBlocks validates a list of content blocks as vLLM's request model
// does for the fields the conversion reads.
func decodeBlocks(raw json.RawMessage) ([]block, error) {
	items, err := rawArray(raw)
	if err != nil {
		return nil, errors.New("content is neither a string nor a list of blocks")
	}
	out := make([]block, 0, len(items))
	for i, it := range items {
		o, err := orderedObject(it)
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		var b block
		typ, ok := o.str("type")
		if !ok || !blockTypes[typ] {
			v, _ := o.get("type")
			return nil, fmt.Errorf("block %d: type %s is not a block type vLLM accepts", i, v)
		}
		b.Type = typ
		for _, f := range []struct {
			key string
			dst **string
		}{{"text", &b.Text}, {"id", &b.ID}, {"tool_use_id", &b.ToolUseID}, {"name", &b.Name}, {"thinking", &b.Thinking},
			{"tool_name", nil}, {"signature", nil}, {"data", nil}} {
			v, ok := o.get(f.key)
			if !ok || isNull(v) {
				continue
			}
			var s string
			if firstByte(v) != '"' || json.Unmarshal(v, &s) != nil {
				return nil, fmt.Errorf("block %d: %s is not a string", i, f.key)
			}
			if f.dst != nil {
				*f.dst = &s
			}
		}
		for _, f := range []struct {
			key   string
			dst   *json.RawMessage
			first byte
		}{{"source", &b.Source, '{'}, {"input", &b.Input, '{'}, {"tool", &b.Tool, '{'}} {
			if v, ok := o.get(f.key); ok && !isNull(v) {
				if firstByte(v) != f.first {
					return nil, fmt.Errorf("block %d: %s is not an object", i, f.key)
				}
				*f.dst = v
			}
		}
		if v, ok := o.get("content"); ok && !isNull(v) {
			if c := firstByte(v); c != '"' && c != '[' {
				return nil, fmt.Errorf("block %d: content is neither a string nor a list", i)
			}
			if firstByte(v) == '[' {
				elems, _ := rawArray(v)
				for _, e := range elems {
					if firstByte(e) != '{' {
						return nil, fmt.Errorf("block %d: content holds a non-object", i)
					}
				}
			}
			b.Content = v
		}
		if v, ok := o.get("is_error"); ok && !isNull(v) && string(v) != "true" && string(v) != "false" {
			return nil, fmt.Errorf("block %d: is_error is not a boolean", i)
		}
		if typ == "tool_addition" || typ == "tool_removal" {
			if b.Tool == nil {
				return nil, fmt.Errorf("block %d: tool is required for %s blocks", i, typ)
			}
			var t struct{ Type string }
			_ = json.Unmarshal(b.Tool, &t)
			if typ == "tool_removal" && t.Type != "tool_reference" {
				return nil, fmt.Errorf("block %d: tool_removal only accepts a tool_reference", i)
			}
			if t.Type != "tool_reference" && t.Type != "tool_definition" {
				return nil, fmt.Errorf("block %d: tool is neither a tool_reference nor a tool_definition", i)
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// decodeContent reads a message's (or the system field's) content.
func decodeContent(raw json.RawMessage) (anthropicMessage, error) {
	var m anthropicMessage
	if firstByte(raw) == '"' {
		m.IsString = true
		return m, json.Unmarshal(raw, &m.Text)
	}
	var err error
	m.Blocks, err = decodeBlocks(raw)
	return m, err
}

func hasToolChange(bs []block) bool {
	for _, b := range bs {
		if b.Type == "tool_addition" || b.Type == "tool_removal" {
			return true
		}
	}
	return false
}

// convertMessages fills req's chat fields from the body; nil when done.
func convertMessages(req *Request, top map[string]json.RawMessage) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrMessagesUnsupported, fmt.Sprintf(format, a...))
	}
	if req.Model == "" {
		return fail("model is required")
	}
	if req.MaxTokens <= 0 {
		return fail("max_tokens must be a positive integer")
	}
	if v, ok := top["stream"]; ok && !isNull(v) && string(v) != "true" && string(v) != "false" {
		return fail("stream is not a boolean")
	}
	if v, ok := top["cache_salt"]; ok && !isNull(v) {
		// The salt changes every block's hash: vLLM refuses an empty or
		// overlong one.
		var salt string
		if json.Unmarshal(v, &salt) != nil || salt == "" || len([]rune(salt)) > 1024 {
			return fail("cache_salt must be a string of 1 to 1024 characters")
		}
	}
	if v, ok := top["tool_choice"]; ok && !isNull(v) {
		var tc struct {
			Type string  `json:"type"`
			Name *string `json:"name"`
		}
		if json.Unmarshal(v, &tc) != nil || (tc.Type != "auto" && tc.Type != "any" && tc.Type != "tool" && tc.Type != "none") {
			return fail("tool_choice.type must be auto, any, tool or none")
		}
		if tc.Type == "tool" && (tc.Name == nil || *tc.Name == "") {
			return fail("tool_choice.name is required when type is 'tool'")
		}
		if tc.Type == "none" {
			// vLLM's chat request gets tool_choice "none" (what the
			// engine's --exclude-tools-when-tool-choice-none reads); the
			// other types do not change the prompt.
			req.ToolChoice = json.RawMessage(`"none"`)
		}
	}
	var system *anthropicMessage
	if v, ok := top["system"]; ok && !isNull(v) {
		s, err := decodeContent(v)
		if err != nil {
			return fail("system: %v", err)
		}
		if hasToolChange(s.Blocks) {
			return fail("system: tool_addition and tool_removal blocks are only allowed in messages with role \"system\"")
		}
		system = &s
	}
	rawMsgs, err := rawArray(top["messages"])
	if err != nil {
		return fail("messages is not a list")
	}
	msgs := make([]anthropicMessage, len(rawMsgs))
	for i, raw := range rawMsgs {
		o, err := orderedObject(raw)
		if err != nil {
			return fail("messages[%d]: %v", i, err)
		}
		role, _ := o.str("role")
		if role != "user" && role != "assistant" && role != "system" {
			v, _ := o.get("role")
			return fail("messages[%d]: role %s is not user, assistant or system", i, v)
		}
		c, ok := o.get("content")
		if !ok || isNull(c) {
			return fail("messages[%d]: content is required", i)
		}
		m, err := decodeContent(c)
		if err != nil {
			return fail("messages[%d]: %v", i, err)
		}
		if role != "system" && hasToolChange(m.Blocks) {
			return fail("messages[%d]: tool_addition and tool_removal blocks are only allowed in messages with role \"system\"", i)
		}
		m.Role = role
		msgs[i] = m
	}
	if err := checkThinking(top, req.MaxTokens); err != nil {
		return fail("%v", err)
	}
	plain, err := chatMessages(system, msgs, false)
	if err != nil {
		return fail("%v", err)
	}
	req.Messages = plain
	inline := false
	for _, m := range msgs {
		inline = inline || m.Role == "system" && systemText(m) != ""
	}
	if inline {
		merged, err := chatMessages(system, msgs, true)
		if err != nil {
			return fail("%v", err)
		}
		if !bytes.Equal(plain, merged) {
			req.SystemFirstMessages = merged
		}
	}
	if req.Tools, err = messagesTools(top["tools"], msgs); err != nil {
		return fail("%v", err)
	}
	if req.ChatTemplateKwargs, req.ReasoningEffort, req.ThinkingDisabled, err = messagesKwargs(top); err != nil {
		return fail("%v", err)
	}
	return nil
}

// checkThinking validates the thinking and output_config fields as vLLM's
// request model does.
func checkThinking(top map[string]json.RawMessage, maxTokens int) error {
	if v, ok := top["thinking"]; ok && !isNull(v) {
		var t struct {
			Type   string          `json:"type"`
			Budget json.RawMessage `json:"budget_tokens"`
		}
		if json.Unmarshal(v, &t) != nil {
			return errors.New("thinking is not an object")
		}
		switch t.Type {
		case "disabled", "adaptive":
		case "enabled":
			var b int64
			if json.Unmarshal(t.Budget, &b) != nil || b < 1024 {
				return errors.New("thinking.budget_tokens must be an integer of at least 1024")
			}
			var kv struct {
				DoRemoteDecode any `json:"do_remote_decode"`
			}
			if v := top["kv_transfer_params"]; firstByte(v) == '{' {
				_ = json.Unmarshal(v, &kv)
			}
			if b >= int64(maxTokens) && !truthy(kv.DoRemoteDecode) {
				return errors.New("thinking.budget_tokens must be less than max_tokens")
			}
		default:
			return fmt.Errorf("thinking.type %q is not enabled, disabled or adaptive", t.Type)
		}
	}
	return nil
}

// truthy is Python's truth of a decoded JSON value.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

// systemText is an inline system message's text: a string as it is (none
// when it starts with the billing header), or its non-empty text blocks
// joined, billing blocks left out.
func systemText(m anthropicMessage) string {
	if m.IsString {
		if strings.HasPrefix(m.Text, billingHeader) {
			return ""
		}
		return m.Text
	}
	var b strings.Builder
	for _, bl := range m.Blocks {
		if bl.Type == "text" && bl.Text != nil && *bl.Text != "" && !strings.HasPrefix(*bl.Text, billingHeader) {
			b.WriteString(*bl.Text)
		}
	}
	return b.String()
}

// chatMessages is the chat conversation vLLM builds; merge moves inline
// system messages into the leading one.
func chatMessages(system *anthropicMessage, msgs []anthropicMessage, merge bool) (json.RawMessage, error) {
	var out []*message
	var sys strings.Builder
	if system != nil {
		if system.IsString {
			sys.WriteString(system.Text)
		} else {
			for _, b := range system.Blocks {
				if b.Type == "text" && b.Text != nil && *b.Text != "" && !strings.HasPrefix(*b.Text, billingHeader) {
					sys.WriteString(*b.Text)
				}
			}
		}
	}
	if merge {
		for _, m := range msgs {
			if m.Role == "system" {
				sys.WriteString(systemText(m))
			}
		}
	}
	if sys.Len() > 0 {
		out = append(out, newMessage("system").set("content", jsonString(sys.String())))
	}
	for i, m := range msgs {
		if m.Role == "system" {
			if t := systemText(m); !merge && t != "" {
				out = append(out, newMessage("system").set("content", jsonString(t)))
			}
			continue
		}
		msg := newMessage(m.Role)
		if m.IsString {
			msg.set("content", jsonString(m.Text))
		} else {
			var err error
			if out, err = convertContent(out, msg, m); err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
		}
		if _, has := msg.get("content"); m.Role == "user" && !has {
			continue
		}
		out = append(out, msg)
	}
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, m := range out {
		if i > 0 {
			buf.WriteByte(',')
		}
		m.write(&buf)
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

// convertContent converts a message's blocks into msg, appending the tool
// messages its tool results make to out (they come before msg).
func convertContent(out []*message, msg *message, m anthropicMessage) ([]*message, error) {
	var parts, calls []json.RawMessage
	var reasoning strings.Builder
	hasReasoning := false
	for _, b := range m.Blocks {
		switch b.Type {
		case "text":
			if b.Text != nil && *b.Text != "" {
				parts = append(parts, textPart(*b.Text))
			}
		case "image":
			if o, _ := orderedObject(b.Source); o != nil && len(o.kvs) > 0 {
				url, err := imageURL(b.Source)
				if err != nil {
					return nil, err
				}
				parts = append(parts, imagePart(url))
			}
		case "thinking":
			if b.Thinking != nil {
				reasoning.WriteString(*b.Thinking)
				hasReasoning = true
			}
		case "tool_use":
			calls = append(calls, toolUseCall(b))
		case "tool_result":
			if m.Role == "user" {
				var err error
				if out, err = toolResultMessages(out, b); err != nil {
					return nil, err
				}
				continue
			}
			text, err := assistantToolResult(b.Content)
			if err != nil {
				return nil, err
			}
			parts = append(parts, textPart("Tool result: "+text))
		}
	}
	if hasReasoning {
		msg.set("reasoning", jsonString(reasoning.String()))
	}
	if len(calls) > 0 {
		msg.set("tool_calls", joinArray(calls))
	}
	switch {
	case len(parts) == 1 && bytes.HasPrefix(parts[0], []byte(`{"type":"text"`)):
		var p struct{ Text string }
		_ = json.Unmarshal(parts[0], &p)
		msg.set("content", jsonString(p.Text))
	case len(parts) > 0:
		msg.set("content", joinArray(parts))
	}
	return out, nil
}

// assistantToolResult is the text vLLM prints for an assistant's
// tool_result content: str(content) when it is truthy, else "". A string
// is itself; a list (pydantic's list[dict[str, Any]]) is its Python repr
// (pyfmt.ReprJSON), an item that is not an object failing validation as
// it does there.
func assistantToolResult(content json.RawMessage) (string, error) {
	if content == nil || string(content) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(content, &items); err != nil {
		return "", errors.New("a tool_result's content is neither a string nor a list")
	}
	if len(items) == 0 {
		return "", nil
	}
	for _, it := range items {
		if t := bytes.TrimLeft(it, " \t\r\n"); len(t) == 0 || t[0] != '{' {
			return "", errors.New("a tool_result's content list holds a non-object")
		}
	}
	return pyfmt.ReprJSON(content)
}

func textPart(text string) json.RawMessage {
	return newObject().set("type", jsonString("text")).set("text", jsonString(text)).bytes()
}

func imagePart(url string) json.RawMessage {
	return newObject().set("type", jsonString("image_url")).
		set("image_url", newObject().set("url", jsonString(url)).bytes()).bytes()
}

// imageURL is an image source as a URL: a url source's url, else a data
// URI (media type image/jpeg when absent).
func imageURL(src json.RawMessage) (string, error) {
	var s map[string]json.RawMessage
	if json.Unmarshal(src, &s) != nil {
		return "", errors.New("an image source is not an object")
	}
	get := func(k, def string) (string, error) {
		v, ok := s[k]
		if !ok {
			return def, nil
		}
		var x string
		if json.Unmarshal(v, &x) != nil || firstByte(v) != '"' {
			return "", fmt.Errorf("an image source's %s is not a string", k)
		}
		return x, nil
	}
	if typ, _ := get("type", ""); typ == "url" {
		return get("url", "")
	}
	mt, err := get("media_type", "image/jpeg")
	if err != nil {
		return "", err
	}
	data, err := get("data", "")
	return "data:" + mt + ";base64," + data, err
}

// toolUseCall is a tool_use block as a chat tool call. vLLM names a call
// without an id call_<unix seconds>; its arguments are the input as JSON
// ({} when absent or empty), which the template sees parsed back.
func toolUseCall(b block) json.RawMessage {
	id := ""
	if b.ID != nil {
		id = *b.ID
	}
	if id == "" {
		id = "call_" + strconv.FormatInt(time.Now().Unix(), 10)
	}
	name := ""
	if b.Name != nil {
		name = *b.Name
	}
	args := "{}"
	if b.Input != nil {
		args = string(b.Input)
	}
	fn := newObject().set("name", jsonString(name)).set("arguments", jsonString(args))
	return newObject().set("id", jsonString(id)).set("type", jsonString("function")).set("function", fn.bytes()).bytes()
}

// toolResultMessages appends the messages a user's tool_result block
// becomes: a tool message with its text (a string content, or its text
// items joined by "\n"), a user message with its images, and a tool
// message with its tool references.
func toolResultMessages(out []*message, b block) ([]*message, error) {
	id := ""
	if b.ToolUseID != nil {
		id = *b.ToolUseID
	}
	var text string
	var images, refs []json.RawMessage
	switch firstByte(b.Content) {
	case '"':
		_ = json.Unmarshal(b.Content, &text)
	case '[':
		items, _ := rawArray(b.Content)
		var texts []string
		for _, raw := range items {
			it, err := orderedObject(raw)
			if err != nil {
				return nil, err
			}
			switch typ, _ := it.str("type"); typ {
			case "text":
				t := ""
				if v, ok := it.get("text"); ok {
					if json.Unmarshal(v, &t) != nil || firstByte(v) != '"' {
						return nil, errors.New("a tool_result text item whose text is not a string")
					}
				}
				texts = append(texts, t)
			case "image":
				src, ok := it.get("source")
				if !ok {
					src = json.RawMessage("{}")
				}
				url, err := imageURL(src)
				if err != nil {
					return nil, err
				}
				if url != "" {
					images = append(images, imagePart(url))
				}
			case "tool_reference":
				name, _ := it.str("tool_name")
				if name == "" {
					name, _ = it.str("name")
				}
				if name != "" {
					refs = append(refs, newObject().set("type", jsonString("tool_reference")).set("name", jsonString(name)).bytes())
				}
			}
		}
		text = strings.Join(texts, "\n")
	}
	out = append(out, newMessage("tool").set("tool_call_id", jsonString(id)).set("content", jsonString(text)))
	if len(images) > 0 {
		out = append(out, newMessage("user").set("content", joinArray(images)))
	}
	if len(refs) > 0 {
		out = append(out, newMessage("tool").set("tool_call_id", jsonString(id)).set("content", joinArray(refs)))
	}
	return out, nil
}

// anthropicTool is a tool definition as vLLM's request model reads it.
type anthropicTool struct {
	name   string
	fields *message // description, input_schema, strict, defer_loading
}

// decodeTool validates one tool definition; a schema without "type" gets
// "type": "object" at its end, as vLLM's validator adds it.
func decodeTool(raw json.RawMessage) (anthropicTool, error) {
	o, err := orderedObject(raw)
	if err != nil {
		return anthropicTool{}, err
	}
	name, ok := o.str("name")
	if v, _ := o.get("name"); !ok || firstByte(v) != '"' {
		return anthropicTool{}, errors.New("a tool without a name string")
	}
	t := anthropicTool{name: name, fields: newObject()}
	desc, ok := o.get("description")
	if !ok {
		desc = json.RawMessage("null")
	} else if !isNull(desc) && firstByte(desc) != '"' {
		return anthropicTool{}, fmt.Errorf("tool %q: description is not a string", name)
	}
	schema, ok := o.get("input_schema")
	if !ok || firstByte(schema) != '{' {
		return anthropicTool{}, fmt.Errorf("tool %q: input_schema is not an object", name)
	}
	so, err := orderedObject(schema)
	if err != nil {
		return anthropicTool{}, err
	}
	if _, has := so.get("type"); !has {
		schema = so.set("type", jsonString("object")).bytes()
	}
	t.fields.set("description", desc).set("input_schema", schema)
	for _, k := range []string{"strict", "defer_loading"} {
		v, ok := o.get(k)
		if !ok {
			v = json.RawMessage("null")
		} else if !isNull(v) && string(v) != "true" && string(v) != "false" {
			return anthropicTool{}, fmt.Errorf("tool %q: %s is not a boolean", name, k)
		}
		t.fields.set(k, v)
	}
	return t, nil
}

// messagesTools is the chat tools list vLLM hands the template: the body's
// tools with the system messages' tool_addition and tool_removal blocks
// applied (a tool added by reference loses defer_loading, one added by
// value is declared or replaced, a removed one dropped), each as
// {"type": "function", "function": {name, description, parameters,
// strict, defer_loading}}. nil without tools.
func messagesTools(raw json.RawMessage, msgs []anthropicMessage) (json.RawMessage, error) {
	var tools []anthropicTool
	declared := raw != nil && !isNull(raw)
	if declared {
		items, err := rawArray(raw)
		if err != nil {
			return nil, errors.New("tools is not a list")
		}
		for i, it := range items {
			t, err := decodeTool(it)
			if err != nil {
				return nil, fmt.Errorf("tools[%d]: %w", i, err)
			}
			tools = append(tools, t)
		}
	}
	// A dict by name, in first-declared order (a later tool of the same
	// name replaces an earlier one in its place).
	var order []string
	byName := map[string]anthropicTool{}
	put := func(t anthropicTool) {
		if _, ok := byName[t.name]; !ok {
			order = append(order, t.name)
		}
		byName[t.name] = t
	}
	for _, t := range tools {
		put(t)
	}
	changed := false
	removed := map[string]bool{}
	for _, m := range msgs {
		for _, b := range m.Blocks {
			if b.Type != "tool_addition" && b.Type != "tool_removal" {
				continue
			}
			changed = true
			var ch struct {
				Type       string          `json:"type"`
				Name       *string         `json:"name"`
				Definition json.RawMessage `json:"definition"`
			}
			if json.Unmarshal(b.Tool, &ch) != nil {
				return nil, fmt.Errorf("a %s block's tool is malformed", b.Type)
			}
			var name string
			if ch.Type == "tool_definition" {
				t, err := decodeTool(ch.Definition)
				if err != nil {
					return nil, fmt.Errorf("a %s block's definition: %w", b.Type, err)
				}
				name = t.name
				put(t)
			} else {
				if ch.Name == nil {
					return nil, fmt.Errorf("a %s block's tool_reference has no name", b.Type)
				}
				name = *ch.Name
				t, ok := byName[name]
				if !ok {
					return nil, fmt.Errorf("%s references tool %q, which is not declared in tools", b.Type, name)
				}
				if b.Type == "tool_addition" {
					cp := newObject()
					cp.kvs = append(cp.kvs, t.fields.kvs...)
					cp.set("defer_loading", json.RawMessage("null"))
					put(anthropicTool{name: name, fields: cp})
				}
			}
			if b.Type == "tool_removal" {
				removed[name] = true
			} else {
				delete(removed, name)
			}
		}
	}
	if !declared && !changed {
		return nil, nil
	}
	var buf bytes.Buffer
	buf.WriteByte('[')
	n := 0
	for _, name := range order {
		if changed && removed[name] {
			continue
		}
		t := byName[name]
		if n > 0 {
			buf.WriteByte(',')
		}
		n++
		desc, _ := t.fields.get("description")
		schema, _ := t.fields.get("input_schema")
		strict, _ := t.fields.get("strict")
		deferred, _ := t.fields.get("defer_loading")
		fn := newObject().set("name", jsonString(name)).set("description", desc).set("parameters", schema).
			set("strict", strict).set("defer_loading", deferred)
		newObject().set("type", jsonString("function")).set("function", fn.bytes()).write(&buf)
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

// anthropicEfforts are the output_config.effort values vLLM accepts.
var anthropicEfforts = map[string]bool{"low": true, "medium": true, "high": true, "xhigh": true, "max": true}

// messagesKwargs are the template arguments vLLM passes a Messages
// request: its chat_template_kwargs, and output_config.effort, which the
// tokenizer merges as a chat request's reasoning_effort. With thinking
// disabled the effort is the template's own (disabled reports it; effort
// is then "").
func messagesKwargs(top map[string]json.RawMessage) (kwargs json.RawMessage, effort string, disabled bool, err error) {
	kw := top["chat_template_kwargs"]
	if isNull(kw) {
		kw = nil
	}
	if kw != nil && firstByte(kw) != '{' {
		return nil, "", false, errors.New("chat_template_kwargs is not an object")
	}
	if v, ok := top["output_config"]; ok && !isNull(v) {
		var oc struct {
			Effort *string `json:"effort"`
		}
		if json.Unmarshal(v, &oc) != nil {
			return nil, "", false, errors.New("output_config is malformed")
		}
		if oc.Effort != nil {
			if !anthropicEfforts[*oc.Effort] {
				return nil, "", false, fmt.Errorf("output_config.effort %q is not low, medium, high, xhigh or max", *oc.Effort)
			}
			effort = *oc.Effort
		}
	}
	var th struct {
		Type string `json:"type"`
	}
	if v := top["thinking"]; firstByte(v) == '{' {
		_ = json.Unmarshal(v, &th)
	}
	if th.Type == "disabled" {
		return kw, "", true, nil
	}
	return kw, effort, false, nil
}

// joinArray is a JSON array of the given values.
func joinArray(vals []json.RawMessage) json.RawMessage {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, v := range vals {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(v)
	}
	buf.WriteByte(']')
	return buf.Bytes()
}
