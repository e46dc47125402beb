package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// PathResponses is the OpenAI Responses API path.
const PathResponses = "/v1/responses"

// ErrResponsesUnsupported: the body is a valid Responses request whose
// prompt the router cannot reproduce (history stored by the engine under
// previous_response_id, an item type vLLM refuses or renders some other
// way). The request is still routed, by its session and load.
var ErrResponsesUnsupported = errors.New("openai: responses input not reproducible")

// ParseResponses parses a /v1/responses body. The identity fields (model,
// user, prompt_cache_key, the conversation), stream and max_output_tokens
// are always read. The prompt is converted as vLLM (0.33) converts it before
// its chat template runs (entrypoints/openai/responses/utils.py
// construct_input_messages and construct_tool_dicts, with the request
// model's input_item_parsing): instructions become a system message, a
// string input a user message, and each input item a chat message —
// function calls, reasoning and assistant output merged into the preceding
// assistant message as vLLM merges them, function call outputs tool
// messages, message items passed on. Messages, Tools and ChatTemplateKwargs
// then hold that chat request's JSON, ReasoningEffort its reasoning.effort,
// AddGenerationPrompt and
// ContinueFinalMessage its flags, and AddSpecialTokens is true (vLLM
// tokenizes a Responses prompt with the tokenizer's special tokens, unlike a
// chat completion's). When the prompt cannot be reproduced, Convert reports
// why (wrapping ErrResponsesUnsupported) and Messages is nil; the request
// itself is valid. A body that is not a valid Responses request is an error
// wrapping ErrInvalidRequest.
func ParseResponses(body []byte) (Request, error) { return parseResponses(body, false) }

// ParseResponsesTurn is ParseResponses for an engine that stores
// responses: a body continuing a stored response (previous_response_id)
// has its own part of the prompt converted into Turn (and Tools, the
// template arguments and the flags filled), for the engine to put around
// the history it stored. A router does not need it: ParseResponses
// leaves a continuation unconverted.
func ParseResponsesTurn(body []byte) (Request, error) { return parseResponses(body, true) }

func parseResponses(body []byte, turn bool) (Request, error) {
	req := Request{Kind: KindResponses, AddSpecialTokens: true}
	top, err := objectFields(body)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	str := func(key string) (string, error) {
		v, ok := top[key]
		if !ok || isNull(v) {
			return "", nil
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", fmt.Errorf("%w: %s is not a string", ErrInvalidRequest, key)
		}
		return s, nil
	}
	if req.Model, err = str("model"); err != nil {
		return Request{}, err
	}
	if req.User, err = str("user"); err != nil {
		return Request{}, err
	}
	if req.PromptCacheKey, err = str("prompt_cache_key"); err != nil {
		return Request{}, err
	}
	if req.CacheSalt, err = str("cache_salt"); err != nil {
		return Request{}, err
	}
	if req.PreviousResponseID, err = str("previous_response_id"); err != nil {
		return Request{}, err
	}
	if req.ResponseID, err = str("request_id"); err != nil {
		return Request{}, err
	}
	req.Store = true
	for key, dst := range map[string]*bool{"store": &req.Store, "background": &req.Background} {
		if v, ok := top[key]; ok && !isNull(v) {
			if json.Unmarshal(v, dst) != nil {
				return Request{}, fmt.Errorf("%w: %s is not a boolean", ErrInvalidRequest, key)
			}
		}
	}
	if v, ok := top["stream"]; ok && !isNull(v) {
		if json.Unmarshal(v, &req.Stream) != nil {
			return Request{}, fmt.Errorf("%w: stream is not a boolean", ErrInvalidRequest)
		}
	}
	if v, ok := top["max_output_tokens"]; ok && !isNull(v) {
		var n int64
		if json.Unmarshal(v, &n) != nil || n < 0 {
			return Request{}, fmt.Errorf("%w: max_output_tokens is not a non-negative integer", ErrInvalidRequest)
		}
		req.MaxTokens = int(min(n, 1<<31-1))
	}
	req.SessionID = responsesSession(top)
	input, ok := top["input"]
	if !ok || isNull(input) {
		return Request{}, fmt.Errorf("%w: input is required", ErrInvalidRequest)
	}
	req.Convert = convertResponses(&req, top, turn)
	return req, nil
}

// responsesSession is the conversation a Responses body names, read from
// the same fields as a chat body's (sessionID).
func responsesSession(top map[string]json.RawMessage) string {
	str := func(v json.RawMessage) string {
		var s string
		_ = json.Unmarshal(v, &s)
		return s
	}
	conv := str(top["conversation"])
	if conv == "" {
		var o struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(top["conversation"], &o) == nil {
			conv = o.ID
		}
	}
	var meta map[string]json.RawMessage
	_ = json.Unmarshal(top["metadata"], &meta)
	return sessionID(str(top["session_id"]), str(top["conversation_id"]), conv, str(meta["session_id"]), str(meta["conversation_id"]))
}

// ResponsesTurn is what a Responses request continuing a stored response
// brings to its prompt. vLLM builds that prompt as System (when not nil),
// the stored conversation's messages other than system ones, the stored
// response's output messages as assistant messages, then Input.
type ResponsesTurn struct {
	// System is the instructions' system message (a JSON object), nil
	// without instructions.
	System json.RawMessage
	// Input is the request's input converted to chat messages (a JSON
	// array).
	Input json.RawMessage
}

// convertResponses fills req's chat fields from the body; nil when done.
// A body continuing a stored response (previous_response_id) is reported
// as unsupported, its prompt starting with history only the engine has;
// with turn it is first converted into req.Turn (Messages left nil).
func convertResponses(req *Request, top map[string]json.RawMessage, turn bool) error {
	errStored := fmt.Errorf("%w: previous_response_id names history stored by the engine", ErrResponsesUnsupported)
	if req.PreviousResponseID != "" && !turn {
		return errStored
	}
	var msgs []*message
	if v, ok := top["instructions"]; ok && !isNull(v) {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return fmt.Errorf("%w: instructions is not a string", ErrResponsesUnsupported)
		}
		if s != "" {
			msgs = append(msgs, newMessage("system").set("content", jsonString(s)))
		}
	}
	system := len(msgs)
	input := top["input"]
	continueFinal := false
	var s string
	if firstByte(input) == '"' && json.Unmarshal(input, &s) == nil {
		msgs = append(msgs, newMessage("user").set("content", input))
	} else {
		items, err := rawArray(input)
		if err != nil {
			return fmt.Errorf("%w: input is neither a string nor an array", ErrResponsesUnsupported)
		}
		for i, raw := range items {
			var err error
			if msgs, err = addItem(msgs, raw); err != nil {
				return fmt.Errorf("%w: input[%d]: %w", ErrResponsesUnsupported, i, err)
			}
		}
		if len(items) > 0 {
			continueFinal = partialLast(items[len(items)-1])
		}
	}
	tools, err := responsesTools(top["tools"])
	if err != nil {
		return fmt.Errorf("%w: %w", ErrResponsesUnsupported, err)
	}
	kwargs, effort, err := responsesKwargs(top)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrResponsesUnsupported, err)
	}
	req.Tools, req.ChatTemplateKwargs, req.ReasoningEffort = tools, kwargs, effort
	if v := top["tool_choice"]; !isNull(v) {
		req.ToolChoice = v
	}
	req.AddGenerationPrompt, req.ContinueFinalMessage = !continueFinal, continueFinal
	if req.PreviousResponseID != "" {
		t := &ResponsesTurn{Input: writeMessages(msgs[system:])}
		if system > 0 {
			var b bytes.Buffer
			msgs[0].write(&b)
			t.System = b.Bytes()
		}
		req.Turn = t
		return errStored
	}
	req.Messages = writeMessages(msgs)
	return nil
}

// writeMessages is msgs as a JSON array.
func writeMessages(msgs []*message) json.RawMessage {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, m := range msgs {
		if i > 0 {
			buf.WriteByte(',')
		}
		m.write(&buf)
	}
	buf.WriteByte(']')
	return buf.Bytes()
}

// addItem converts one input item and appends or merges it into msgs, as
// vLLM's _construct_message_from_response_item does.
func addItem(msgs []*message, raw json.RawMessage) ([]*message, error) {
	item, err := orderedObject(raw)
	if err != nil {
		return nil, err
	}
	var prevAssistant *message
	if n := len(msgs); n > 0 && msgs[n-1].role() == "assistant" {
		prevAssistant = msgs[n-1]
	}
	typ, _ := item.str("type")
	role, hasRole := item.str("role")
	switch {
	case typ == "function_call":
		call, err := toolCall(item)
		if err != nil {
			return nil, err
		}
		return addToolCall(msgs, prevAssistant, call), nil
	case typ == "custom_tool_call":
		call, err := customToolCall(item)
		if err != nil {
			return nil, err
		}
		return addToolCall(msgs, prevAssistant, call), nil
	case typ == "reasoning":
		text, err := reasoningText(item)
		if err != nil {
			return nil, err
		}
		return mergeAssistant(msgs, prevAssistant, "reasoning", text), nil
	case typ == "function_call_output" || typ == "custom_tool_call_output":
		out, _ := item.get("output")
		id, _ := item.get("call_id")
		if out == nil {
			out = json.RawMessage("null")
		}
		if id == nil {
			id = json.RawMessage("null")
		}
		return append(msgs, newMessage("tool").set("content", out).set("tool_call_id", id)), nil
	case hasRole && role == "assistant":
		text, ok, err := assistantText(item, typ == "message")
		if err != nil {
			return nil, err
		}
		if !ok {
			return append(msgs, item), nil
		}
		return mergeAssistant(msgs, prevAssistant, "content", text), nil
	case hasRole:
		return append(msgs, item), nil
	}
	if typ == "" {
		return nil, errors.New("an item with neither a type nor a role")
	}
	return nil, fmt.Errorf("input item type %q is not supported by vLLM", typ)
}

// mergeAssistant sets key to text on the preceding assistant message when
// it has no value there yet, else appends a new assistant message holding
// it: how vLLM folds reasoning and output text into one assistant turn.
func mergeAssistant(msgs []*message, prevAssistant *message, key, text string) []*message {
	if prevAssistant != nil {
		if v, ok := prevAssistant.get(key); !ok || isNull(v) {
			prevAssistant.set(key, jsonString(text))
			return msgs
		}
	}
	return append(msgs, newMessage("assistant").set(key, jsonString(text)))
}

// addToolCall adds a tool call to the preceding assistant message, or as a
// new assistant message when there is none.
func addToolCall(msgs []*message, prevAssistant *message, call json.RawMessage) []*message {
	if prevAssistant != nil {
		calls, ok := prevAssistant.get("tool_calls")
		switch {
		case !ok || isNull(calls):
			prevAssistant.set("tool_calls", json.RawMessage("["+string(call)+"]"))
			return msgs
		case firstByte(calls) == '[':
			prevAssistant.set("tool_calls", appendToArray(calls, call))
			return msgs
		}
	}
	return append(msgs, newMessage("assistant").set("tool_calls", json.RawMessage("["+string(call)+"]")))
}

// customToolCall is a custom_tool_call item as a chat tool call whose
// arguments are {"input": <the item's input>} (vLLM's
// encode_custom_tool_input).
func customToolCall(item *message) (json.RawMessage, error) {
	id, ok1 := item.str("call_id")
	name, ok2 := item.str("name")
	if !ok1 || !ok2 {
		return nil, errors.New("a custom_tool_call without string call_id and name")
	}
	input, _ := item.str("input")
	// Python writes the object with ": " after the key; the string's own
	// escapes may differ from json.dumps' in form (U+2028), never in
	// value, and the template sees the value: vLLM parses a tool call's
	// arguments into an object before rendering.
	return chatToolCall(id, name, `{"input": `+string(jsonString(input))+`}`), nil
}

// toolCall is a function_call item as a chat tool call: {"id": call_id,
// "function": {"name": name, "arguments": arguments}, "type": "function"},
// a namespaced function's name flattened to namespace__name.
func toolCall(item *message) (json.RawMessage, error) {
	id, ok1 := item.str("call_id")
	name, ok2 := item.str("name")
	args, ok3 := item.str("arguments")
	if !ok1 || !ok2 || !ok3 {
		return nil, errors.New("a function_call without string call_id, name and arguments")
	}
	if ns, ok := item.str("namespace"); ok && ns != "" {
		name = ns + "__" + name
	}
	return chatToolCall(id, name, args), nil
}

// chatToolCall is a chat tool call: {"id": id, "function": {"name": name,
// "arguments": args}, "type": "function"}.
func chatToolCall(id, name, args string) json.RawMessage {
	fn := newObject().set("name", jsonString(name)).set("arguments", jsonString(args))
	return newObject().set("id", jsonString(id)).set("function", fn.bytes()).set("type", jsonString("function")).bytes()
}

// reasoningText is a reasoning item's text: its first content part's text,
// else its first summary's.
func reasoningText(item *message) (string, error) {
	if enc, ok := item.get("encrypted_content"); ok && !isNull(enc) && string(enc) != `""` {
		return "", errors.New("encrypted reasoning content is not supported by vLLM")
	}
	type part struct {
		Text *string `json:"text"`
	}
	var content, summary []part
	if c, ok := item.get("content"); ok && !isNull(c) {
		if json.Unmarshal(c, &content) != nil {
			return "", errors.New("a reasoning item's content is not a list of parts")
		}
	}
	s, ok := item.get("summary")
	if !ok || json.Unmarshal(s, &summary) != nil {
		return "", errors.New("a reasoning item without a summary list")
	}
	switch {
	case len(content) > 0 && content[0].Text != nil:
		return *content[0].Text, nil
	case len(content) > 0:
		return "", errors.New("a reasoning content part without text")
	case len(summary) > 0 && summary[0].Text != nil:
		return *summary[0].Text, nil
	case len(summary) > 0:
		return "", errors.New("a reasoning summary without text")
	}
	return "", nil
}

// assistantText is the text vLLM takes from an assistant message item: a
// string content, or its first part's text. ok is false when it takes none
// (the item is then passed on as it is). An output message item (type
// "message" with a list of parts) must have a first part, not a refusal.
func assistantText(item *message, typed bool) (string, bool, error) {
	c, ok := item.get("content")
	if !ok || isNull(c) {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s, true, nil
	}
	var parts []map[string]json.RawMessage
	if json.Unmarshal(c, &parts) != nil {
		return "", false, errors.New("an assistant message's content is neither a string nor a list of parts")
	}
	if len(parts) == 0 {
		if typed {
			return "", false, errors.New("an output message without content")
		}
		return "", false, nil
	}
	var typ string
	_ = json.Unmarshal(parts[0]["type"], &typ)
	if typed && typ == "refusal" {
		return "", false, errors.New("an output message starting with a refusal part (vLLM fails on it)")
	}
	t, has := parts[0]["text"]
	if !has || isNull(t) {
		return "", false, nil
	}
	if json.Unmarshal(t, &s) != nil {
		return "", false, errors.New("an output_text part whose text is not a string")
	}
	return s, true, nil
}

// partialLast reports whether the last input item is an assistant message
// or reasoning item still in progress (status in_progress or incomplete):
// vLLM then continues it instead of starting a new turn.
func partialLast(raw json.RawMessage) bool {
	var it struct {
		Type   *string `json:"type"`
		Status string  `json:"status"`
	}
	if json.Unmarshal(raw, &it) != nil {
		return false
	}
	typ := "message"
	if it.Type != nil {
		typ = *it.Type
	}
	return (typ == "message" || typ == "reasoning") && (it.Status == "in_progress" || it.Status == "incomplete")
}

// responsesTools converts a Responses tools list into chat tools, as vLLM's
// get_function_tools selects them: function tools, the functions of a
// namespace (named namespace__name), custom tools as a one-string function;
// other tool types are not shown to the model and are dropped. nil when the
// body has no tools (an empty list when it has only dropped ones).
func responsesTools(raw json.RawMessage) (json.RawMessage, error) {
	if raw == nil || isNull(raw) {
		return nil, nil
	}
	tools, err := rawArray(raw)
	if err != nil {
		return nil, errors.New("tools is not an array")
	}
	if len(tools) == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	buf.WriteByte('[')
	n := 0
	emit := func(fn *message) {
		if n > 0 {
			buf.WriteByte(',')
		}
		n++
		newObject().set("type", jsonString("function")).set("function", fn.bytes()).write(&buf)
	}
	for i, raw := range tools {
		t, err := orderedObject(raw)
		if err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		typ, _ := t.str("type")
		if _, named := t.str("name"); !named && (typ == "function" || typ == "namespace" || typ == "custom") {
			return nil, fmt.Errorf("tools[%d]: a %s tool without a name string", i, typ)
		}
		switch typ {
		case "function":
			emit(functionFields(t, ""))
		case "namespace":
			ns, _ := t.str("name")
			subs, _ := t.get("tools")
			var list []json.RawMessage
			if json.Unmarshal(subs, &list) != nil {
				return nil, fmt.Errorf("tools[%d]: a namespace without a tools list", i)
			}
			for _, sub := range list {
				st, err := orderedObject(sub)
				if err != nil {
					return nil, fmt.Errorf("tools[%d]: %w", i, err)
				}
				if styp, _ := st.str("type"); styp == "function" {
					if _, named := st.str("name"); !named {
						return nil, fmt.Errorf("tools[%d]: a namespace function without a name string", i)
					}
					emit(functionFields(st, ns+"__"))
				}
			}
		case "custom":
			if f, ok := t.get("format"); ok {
				var format struct {
					Type string `json:"type"`
				}
				if json.Unmarshal(f, &format) == nil && format.Type == "grammar" {
					return nil, fmt.Errorf("tools[%d]: vLLM refuses custom tools with a grammar format", i)
				}
			}
			name, _ := t.get("name")
			desc, ok := t.get("description")
			if !ok {
				desc = json.RawMessage("null")
			}
			emit(newObject().set("name", name).set("description", desc).set("parameters", json.RawMessage(customToolParameters)))
		}
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

// customToolParameters is the schema vLLM shows for a custom tool's single
// freeform string argument.
const customToolParameters = `{"type": "object", "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}}, "required": ["input"], "additionalProperties": false}`

// functionFields is a Responses function tool's definition as a chat
// function object (the tokenizer puts its keys in vLLM's order).
func functionFields(t *message, prefix string) *message {
	fn := newObject()
	for _, kv := range t.kvs {
		switch kv.key {
		case "type":
		case "name":
			var s string
			if prefix != "" && json.Unmarshal(kv.val, &s) == nil {
				fn.set("name", jsonString(prefix+s))
			} else {
				fn.set("name", kv.val)
			}
		default:
			fn.set(kv.key, kv.val)
		}
	}
	return fn
}

// responsesKwargs are the template arguments vLLM passes a Responses
// request: the body's chat_template_kwargs, and reasoning.effort, which
// the tokenizer merges as a chat request's reasoning_effort. The
// generation flags go in AddGenerationPrompt and ContinueFinalMessage.
func responsesKwargs(top map[string]json.RawMessage) (kwargs json.RawMessage, effort string, err error) {
	kw := top["chat_template_kwargs"]
	if isNull(kw) {
		kw = nil
	}
	if kw != nil && firstByte(kw) != '{' {
		return nil, "", errors.New("chat_template_kwargs is not an object")
	}
	if v, ok := top["reasoning"]; ok && !isNull(v) {
		var r struct {
			Effort *string `json:"effort"`
		}
		if json.Unmarshal(v, &r) != nil {
			return nil, "", errors.New("reasoning is not an object")
		}
		if r.Effort != nil {
			return kw, *r.Effort, nil
		}
	}
	return kw, "", nil
}

// message is a JSON object with its keys in order (a chat message, or any
// object the conversion builds). Setting a key that exists replaces its
// value in place, as a Python dict does.
type message struct{ kvs []keyValue }

type keyValue struct {
	key string
	val json.RawMessage
}

func newObject() *message { return &message{} }

func newMessage(role string) *message { return newObject().set("role", jsonString(role)) }

func (m *message) set(key string, val json.RawMessage) *message {
	for i := range m.kvs {
		if m.kvs[i].key == key {
			m.kvs[i].val = val
			return m
		}
	}
	m.kvs = append(m.kvs, keyValue{key, val})
	return m
}

func (m *message) get(key string) (json.RawMessage, bool) {
	for _, kv := range m.kvs {
		if kv.key == key {
			return kv.val, true
		}
	}
	return nil, false
}

func (m *message) str(key string) (string, bool) {
	v, ok := m.get(key)
	if !ok {
		return "", false
	}
	var s string
	return s, json.Unmarshal(v, &s) == nil
}

func (m *message) role() string {
	r, _ := m.str("role")
	return r
}

func (m *message) write(buf *bytes.Buffer) {
	buf.WriteByte('{')
	for i, kv := range m.kvs {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(jsonString(kv.key))
		buf.WriteByte(':')
		buf.Write(kv.val)
	}
	buf.WriteByte('}')
}

func (m *message) bytes() json.RawMessage {
	var buf bytes.Buffer
	m.write(&buf)
	return buf.Bytes()
}

// orderedObject decodes a JSON object's members in order (the last of a
// repeated key wins, in the first one's place, as json.loads keeps it),
// with the request scanner: values are validated and kept raw (sub-slices
// of raw, not copies).
func orderedObject(raw json.RawMessage) (*message, error) {
	s := jsonscan.New(raw)
	if s.Peek() != '{' {
		return nil, errors.New("not an object")
	}
	m := newObject()
	for more := s.Enter(); more; more = s.Comma() {
		k, err := s.Key()
		if err != nil {
			return nil, err
		}
		v, err := s.Raw(1)
		if err != nil {
			return nil, err
		}
		m.set(k, v)
	}
	if err := s.Close('}'); err != nil {
		return nil, err
	}
	return m, s.End()
}

// rawArray splits a JSON array into its elements (sub-slices of raw).
func rawArray(raw json.RawMessage) ([]json.RawMessage, error) {
	s := jsonscan.New(raw)
	if s.Peek() != '[' {
		return nil, errors.New("not an array")
	}
	var out []json.RawMessage
	err := s.Array(func(int) error {
		v, err := s.Raw(1)
		out = append(out, v)
		return err
	})
	if err == nil {
		err = s.End()
	}
	return out, err
}

// objectFields decodes a body's top-level members (exact keys, the last of
// a repeated key wins).
func objectFields(body []byte) (map[string]json.RawMessage, error) {
	o, err := orderedObject(body)
	if err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	out := make(map[string]json.RawMessage, len(o.kvs))
	for _, kv := range o.kvs {
		out[kv.key] = kv.val
	}
	return out, nil
}

// jsonString encodes s as a JSON string (no HTML escaping).
func jsonString(s string) json.RawMessage {
	return appendJSONString(make([]byte, 0, len(s)+2), s)
}

// appendJSONString appends s to dst as encoding/json writes a string with
// HTML escaping off: '"' and '\\' escaped, \b \f \n \r \t, other
// control characters as \u00XX, invalid UTF-8 as \ufffd, U+2028 and
// U+2029 as escapes.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendToArray appends one JSON value to a JSON array.
func appendToArray(arr, v json.RawMessage) json.RawMessage {
	arr = bytes.TrimSpace(arr)
	inner := strings.TrimSpace(string(arr[1 : len(arr)-1]))
	if inner == "" {
		return json.RawMessage("[" + string(v) + "]")
	}
	return json.RawMessage("[" + inner + "," + string(v) + "]")
}
