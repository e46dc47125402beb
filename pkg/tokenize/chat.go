package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/route"
)

// ErrTemplate: the chat template failed to render (it raised, or the input
// does not fit it). The engine would reject the request the same way.
var ErrTemplate = errors.New("tokenize: chat template")

// ErrBadMessages: the messages, tools or chat_template_kwargs are not the
// JSON shape a chat request has.
var ErrBadMessages = errors.New("tokenize: malformed chat input")

// ChatTemplate renders a model's tokenizer_config.json chat template the way
// HuggingFace's apply_chat_template does (Jinja with trim_blocks and
// lstrip_blocks, raise_exception, strftime_now, tojson with Python's
// separators), after vLLM's message preprocessing. It is immutable and safe
// for concurrent use.
type ChatTemplate struct {
	base templateVariant
	// tools is the template to use when the request has tools (the
	// "tool_use" entry of a multi-template config); nil means base.
	tools *templateVariant
	// globals are the tokenizer's special tokens (bos_token, eos_token,
	// ...) passed to every render.
	globals map[string]jinja.Value
	// defaults are the engine's default template arguments
	// (EngineChat.DefaultKwargs), under the request's own; nil without.
	defaults *jinja.Dict
	// systemFirst: a template variant fails on a system message after the
	// first, so Anthropic Messages requests are rendered with their inline
	// system messages merged (vLLM's _should_merge_inline_system).
	systemFirst bool
	// offEffort is the reasoning effort vLLM uses for an Anthropic Messages
	// request with thinking disabled: "none", or "low" when the template
	// fails on "none" or renders it as it renders an effort.
	offEffort string
	// excludeToolsNone is the engine's --exclude-tools-when-tool-choice-none.
	excludeToolsNone bool
	// effortMap is the engine's --reasoning-effort-map (nil: none).
	effortMap map[string]string
	// toolsCache keeps the decoded tools of recent requests (agents resend the
	// same list every turn), handing each render its own copy.
	toolsCache toolsCache
	// bareStrip: the template calls .strip(), .lstrip() or .rstrip()
	// without arguments, which the engine implements with a narrower
	// white-space set than Python's str methods; requests whose strings
	// hold a character where the two differ are refused.
	bareStrip bool
}

// templateVariant is one compiled template and what vLLM reads from its
// source to shape the messages it is given.
type templateVariant struct {
	tmpl *jinja.Template
	// developer: the source names the developer role; when it does not,
	// developer messages are rendered as system messages
	// (developerAsSystem).
	developer bool
	// partsContent: the template loops over a message's content, so vLLM
	// gives it every content as a list of {"type": "text"} parts (its
	// "openai" content format) instead of one string (loopsOverContent).
	partsContent bool
}

// newVariant compiles src; format is the engine's content format (auto,
// string or openai; "" is auto: detected from src).
func newVariant(src, format string) (templateVariant, error) {
	t, err := compileTemplate(src)
	parts := format == ContentFormatOpenAI || (format != ContentFormatString && loopsOverContent(src))
	return templateVariant{tmpl: t, developer: namesDeveloper(src), partsContent: parts}, err
}

// bareStripCall finds string method calls without arguments.
var bareStripCall = regexp.MustCompile(`\.[lr]?strip\(\s*\)`)

type tokenizerConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	UNK          json.RawMessage `json:"unk_token"`
	PAD          json.RawMessage `json:"pad_token"`
	Additional   json.RawMessage `json:"additional_special_tokens"`
}

// templateSources returns the sources of tokenizer_config.json's
// chat_template (raw JSON): a string, or a list of named templates of which
// "default" is the template and "tool_use", if present, the one for
// requests with tools (toolSrc "" without one).
func templateSources(raw json.RawMessage) (src, toolSrc string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", errors.New("tokenizer_config.json has no chat_template")
	}
	if json.Unmarshal(raw, &src) == nil {
		return src, "", nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", "", fmt.Errorf("parse chat_template: %w", err)
	}
	for _, n := range named {
		switch n.Name {
		case "default":
			src = n.Template
		case "tool_use":
			toolSrc = n.Template
		}
	}
	if src == "" {
		return "", "", errors.New("chat_template list has no default template")
	}
	return src, toolSrc, nil
}

// LoadChatTemplate reads tokenizer_config.json's chat_template and special
// tokens.
func LoadChatTemplate(path string) (*ChatTemplate, error) {
	return LoadEngineChatTemplate(path, EngineChat{})
}

// LoadEngineChatTemplate reads tokenizer_config.json's special tokens and
// chat template, with what the engine was started with (e) applied.
func LoadEngineChatTemplate(path string, e EngineChat) (*ChatTemplate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: read tokenizer config: %w", err)
	}
	if e, err = e.load(); err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	c, err := parseChatTemplate(data, e)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	return c, nil
}

// ParseChatTemplate builds a ChatTemplate from tokenizer_config.json
// contents.
func ParseChatTemplate(data []byte) (*ChatTemplate, error) {
	return parseChatTemplate(data, EngineChat{})
}

func parseChatTemplate(data []byte, e EngineChat) (*ChatTemplate, error) {
	var cfg tokenizerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("parse tokenizer_config.json: %w", err)
	}
	if !jinjaFiltersReplaced {
		return nil, fmt.Errorf("%w: the Jinja engine's tojson and trim could not be replaced", ErrUnsupported)
	}
	var src, toolSrc string
	var err error
	if e.Template != "" {
		src = e.Template // the engine's --chat-template serves every request
	} else if src, toolSrc, err = templateSources(cfg.ChatTemplate); err != nil {
		return nil, err
	}
	c := &ChatTemplate{globals: map[string]jinja.Value{}}
	if err := c.setEngine(e); err != nil {
		return nil, err
	}
	c.bareStrip = bareStripCall.MatchString(src) || bareStripCall.MatchString(toolSrc)
	if c.base, err = newVariant(src, e.ContentFormat); err != nil {
		return nil, fmt.Errorf("%w: compile: %w", ErrTemplate, err)
	}
	c.systemFirst = rejectsInlineSystem(src)
	if toolSrc != "" {
		v, err := newVariant(toolSrc, e.ContentFormat)
		if err != nil {
			return nil, fmt.Errorf("%w: compile tool_use: %w", ErrTemplate, err)
		}
		c.tools = &v
		c.systemFirst = c.systemFirst || rejectsInlineSystem(toolSrc)
	}
	for name, raw := range map[string]json.RawMessage{"bos_token": cfg.BOS, "eos_token": cfg.EOS, "unk_token": cfg.UNK, "pad_token": cfg.PAD} {
		if s, ok := tokenContent(raw); ok {
			c.globals[name] = jinja.NewString(s)
		}
	}
	if len(cfg.Additional) > 0 && string(cfg.Additional) != "null" {
		var list []json.RawMessage
		if err := json.Unmarshal(cfg.Additional, &list); err == nil {
			items := make([]jinja.Value, 0, len(list))
			for _, raw := range list {
				if s, ok := tokenContent(raw); ok {
					items = append(items, jinja.NewString(s))
				}
			}
			c.globals["additional_special_tokens"] = jinja.NewList(items)
		}
	}
	c.excludeToolsNone = e.ExcludeToolsWhenNone
	if c.effortMap, err = e.effortMap(); err != nil {
		return nil, err
	}
	c.offEffort = e.DisabledThinkingEffort
	if c.offEffort == "" || c.offEffort == "auto" {
		c.offEffort = c.probeDisabledThinking()
	}
	return c, nil
}

// compileTemplate compiles src with its concatenations split into one
// output tag per operand (splitConcat) and every output tag printing as
// Python's str() (printTags). A rewritten form that does not compile falls
// back to the next: printed without the split, then split alone, then src
// as written.
func compileTemplate(src string) (*jinja.Template, error) {
	split := splitConcat(src)
	for _, form := range []string{printTags(split), printTags(src), split} {
		if form == src {
			continue
		}
		if t, err := jinja.Compile(form); err == nil {
			return t, nil
		}
	}
	return jinja.Compile(src)
}

// tokenContent reads a special token given as a string or as an AddedToken
// object ({"content": ...}).
func tokenContent(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// ChatInput is what a chat template renders: the request's messages, tools
// and chat_template_kwargs (raw JSON, as the engine receives them).
type ChatInput struct {
	Messages            json.RawMessage
	Tools               json.RawMessage
	ChatTemplateKwargs  json.RawMessage
	AddGenerationPrompt bool
	// Documents is the request's documents (raw JSON array, nil for none):
	// the template's documents variable.
	Documents json.RawMessage
	// ContinueFinalMessage cuts the prompt at the end of the final
	// message's content, for the model to continue it (transformers'
	// continue_final_message, which vLLM passes on).
	ContinueFinalMessage bool
	// Parsed, when not empty, are Messages already decoded by the request
	// parser: they are rendered instead of decoding Messages again.
	Parsed []route.ChatMessage
	// SystemFirst (an Anthropic Messages request's conversation with its
	// inline system messages merged into the first) replaces Messages when
	// the template requires system-first ordering, as vLLM replaces them.
	SystemFirst json.RawMessage
	// ToolChoice is the request's tool_choice (raw JSON, nil for none): with
	// the engine's --exclude-tools-when-tool-choice-none, "none" renders
	// without the tools.
	ToolChoice json.RawMessage
	// ReasoningEffort is the request's reasoning effort ("" for none): a
	// chat request's reasoning_effort, a Responses request's
	// reasoning.effort, a Messages request's output_config.effort. It is
	// merged into the template arguments as vLLM merges it (effortArgs).
	ReasoningEffort string
	// ThinkingDisabled merges the template's disabled-thinking effort
	// (the template's offEffort) instead of ReasoningEffort.
	ThinkingDisabled bool
}

// Render returns the prompt text the engine would tokenize for in.
func (c *ChatTemplate) Render(in ChatInput) (string, error) {
	if in.SystemFirst != nil && c.systemFirst {
		in.Messages, in.Parsed = in.SystemFirst, nil
	}
	if c.excludeToolsNone && noToolChoice(in.ToolChoice) {
		in.Tools = nil
	}
	tools, err := c.toolsValue(in.Tools)
	if err != nil {
		return "", err
	}
	v := &c.base
	if !tools.IsNone() && c.tools != nil {
		v = c.tools
	}
	var msgs []jinja.Value
	switch {
	case len(in.Parsed) > 0 && !v.partsContent:
		msgs, err = prepareParsed(in.Parsed)
	case len(in.Parsed) > 0:
		// The parsed fast path keeps content only as joined text; parts
		// need the raw messages.
		msgs, err = prepareRawParsed(in.Parsed, true)
	default:
		msgs, err = prepareMessages(in.Messages, v.partsContent)
	}
	if err != nil {
		return "", err
	}
	return c.render(v, msgs, tools, in)
}

// requestTools decodes a request's tools into what vLLM hands the template
// (engineTools): None when the request has none (absent or null).
func requestTools(raw json.RawMessage) (jinja.Value, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return jinja.None(), nil
	}
	v, err := jsonValue(raw)
	if err != nil {
		return jinja.Value{}, fmt.Errorf("%w: tools: %w", ErrBadMessages, err)
	}
	if !v.IsList() {
		return jinja.Value{}, fmt.Errorf("%w: tools is not an array", ErrBadMessages)
	}
	// An empty list stays a list: vLLM passes tools=[] on, which selects a
	// tool_use template and is not none to the template (Llama 3.2 renders
	// its tool preamble for it).
	if err := engineTools(v.AsList()); err != nil {
		return jinja.Value{}, err
	}
	return v, nil
}

// render renders already prepared messages with v.
func (c *ChatTemplate) render(v *templateVariant, msgs []jinja.Value, tools jinja.Value, in ChatInput) (string, error) {
	// The engine copies data into its own scope before it runs: the map
	// is reused across renders.
	data, _ := renderData.Get().(map[string]jinja.Value)
	if data == nil {
		data = make(map[string]jinja.Value, len(c.globals)+8)
	}
	defer func() {
		clear(data)
		renderData.Put(data)
	}()
	for k, v := range c.globals {
		data[k] = v
	}
	tmpl := v.tmpl
	// Keyword arguments first, so that they never replace the request's
	// own messages, tools or generation flag: the engine's defaults, then
	// the request's. Over defaults, vLLM drops a request's None or "auto"
	// (renderers/params.py merge_kwargs).
	if c.defaults != nil {
		for _, k := range c.defaults.Keys {
			data[k] = c.defaults.Data[k]
		}
	}
	ownThinking := false
	if len(in.ChatTemplateKwargs) > 0 && string(in.ChatTemplateKwargs) != "null" {
		kw, err := jsonValue(in.ChatTemplateKwargs)
		if err != nil || !kw.IsDict() {
			return "", fmt.Errorf("%w: chat_template_kwargs is not an object", ErrBadMessages)
		}
		d := kw.AsDict()
		for _, k := range d.Keys {
			v := d.Data[k]
			if c.defaults != nil && (v.IsNone() || v.IsString() && v.AsString() == "auto") {
				continue
			}
			data[k] = v
		}
		_, ownThinking = d.Data["enable_thinking"]
	}
	effort := in.ReasoningEffort
	if in.ThinkingDisabled {
		// vLLM merges the effort it resolved for the template as a chat
		// request's reasoning_effort.
		effort = c.offEffort
	}
	thinking, reasoning := effortArgs(mapEffort(effort, c.effortMap), ownThinking)
	if thinking != nil {
		data["enable_thinking"] = jinja.NewBool(*thinking)
	}
	if reasoning != "" {
		data["reasoning_effort"] = jinja.NewString(reasoning)
	}
	if !v.developer {
		msgs = developerAsSystem(msgs)
	}
	var final string
	if in.ContinueFinalMessage {
		var err error
		if msgs, final, err = tagFinalMessage(msgs); err != nil {
			return "", err
		}
	}
	data["messages"] = jinja.NewList(msgs)
	data["tools"] = tools
	data["documents"] = jinja.None()
	if len(in.Documents) > 0 && string(in.Documents) != "null" {
		docs, err := jsonValue(in.Documents)
		if err != nil || !docs.IsList() {
			return "", fmt.Errorf("%w: documents is not an array", ErrBadMessages)
		}
		data["documents"] = docs
	}
	data["add_generation_prompt"] = jinja.NewBool(in.AddGenerationPrompt)
	if c.bareStrip {
		for _, v := range data {
			if anyString(v, pyStripDiffers, 0) {
				return "", fmt.Errorf("%w: white space the template's strip() would treat differently from Python", ErrUnsupported)
			}
		}
	}
	out, err := renderSafe(tmpl, data, renderHint(in))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if strings.Contains(out, pyMarkRune) {
		return "", errNumberLeak
	}
	if in.ContinueFinalMessage {
		return cutAtFinalTag(out, final)
	}
	return out, nil
}

// continueTag marks the end of the final message's text in a render that
// continues it; the render is cut there (transformers 5.16–5.23,
// chat_template_utils.render_jinja_template).
const continueTag = "CONTINUE_FINAL_MESSAGE_TAG "

// tagFinalMessage appends continueTag to the final message's text: its
// content string, or the last of its content parts that has a text. It
// returns the messages with the final one copied, and that text untagged.
func tagFinalMessage(msgs []jinja.Value) ([]jinja.Value, string, error) {
	if len(msgs) == 0 {
		return nil, "", fmt.Errorf("%w: continue_final_message with no messages", ErrTemplate)
	}
	src := msgs[len(msgs)-1].AsDict()
	last := jinja.NewDict()
	d := last.AsDict()
	for _, k := range src.Keys {
		v, _ := src.Get(k)
		d.Set(k, v)
	}
	c, _ := d.Get("content")
	var final string
	switch {
	case c.IsString():
		final = c.AsString()
		d.Set("content", jinja.NewString(final+continueTag))
	case c.IsList():
		parts := slices.Clone(c.AsList().Items)
		i := len(parts) - 1
		for ; i >= 0; i-- {
			if p := parts[i]; p.IsDict() && p.AsDict().Has("text") {
				t, _ := p.AsDict().Get("text")
				if !t.IsString() {
					i = -1
					break
				}
				final = t.AsString()
				cp := jinja.NewDict()
				cp.AsDict().Set("type", textType)
				cp.AsDict().Set("text", jinja.NewString(final+continueTag))
				parts[i] = cp
				break
			}
		}
		if i < 0 {
			return nil, "", fmt.Errorf("%w: continue_final_message: the final message has no text to continue", ErrTemplate)
		}
		d.Set("content", jinja.NewList(parts))
	default:
		return nil, "", fmt.Errorf("%w: continue_final_message: the final message has no content to continue", ErrTemplate)
	}
	out := slices.Clone(msgs)
	out[len(out)-1] = last
	return out, final, nil
}

// cutAtFinalTag cuts a render at continueTag's last occurrence (and the
// white space before it, as Python's str.rstrip, when the template trimmed
// the tag's own).
func cutAtFinalTag(out, final string) (string, error) {
	tag := strings.TrimFunc(continueTag, pyIsSpace)
	if !strings.Contains(out, strings.TrimFunc(final, pyIsSpace)) || !strings.Contains(out, tag) {
		return "", fmt.Errorf("%w: continue_final_message: the final message does not appear in the rendered chat", ErrTemplate)
	}
	loc := strings.LastIndex(out, tag)
	if strings.HasPrefix(out[loc:], continueTag) {
		return out[:loc], nil
	}
	return strings.TrimRightFunc(out[:loc], pyIsSpace), nil
}

// renderData holds the maps render passes to the engine.
var renderData sync.Pool

// pyStripDiffers reports whether s holds a character Python's str.strip()
// removes but the engine's bare strip methods may keep.
func pyStripDiffers(s string) bool {
	for _, r := range s {
		if r != ' ' && r != '\t' && r != '\n' && r != '\r' && pyIsSpace(r) {
			return true
		}
	}
	return false
}

// anyString reports whether pred holds for a string inside v.
func anyString(v jinja.Value, pred func(string) bool, depth int) bool {
	switch {
	case depth > maxJSONDepth:
		return true
	case v.IsString():
		return pred(v.AsString())
	case v.IsList():
		for _, it := range v.AsList().Items {
			if anyString(it, pred, depth+1) {
				return true
			}
		}
	case v.IsDict():
		d := v.AsDict()
		for _, k := range d.Keys {
			if pred(k) || anyString(d.Data[k], pred, depth+1) {
				return true
			}
		}
	}
	return false
}

// renderSafe turns a panic inside the template engine into an error: a
// template is input, and input never crashes the router.
func renderSafe(t *jinja.Template, data map[string]jinja.Value, hint int) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("template engine panic: %v", r)
		}
	}()
	return renderSized(t, data, hint)
}

// renderHint is the output size render reserves for in: the JSON of its
// messages and tools, with room for the template's role markers and
// system text. A prompt is mostly its messages' text, which is never
// longer than its JSON, so the buffer rarely needs to grow, and when it
// does it grows once.
func renderHint(in ChatInput) int {
	n := 512 + len(in.Tools) + len(in.ChatTemplateKwargs)
	if len(in.Parsed) > 0 {
		for i := range in.Parsed {
			n += 32 + len(in.Parsed[i].Raw)
		}
		return n
	}
	return n + len(in.Messages)
}

// prepareMessages parses a messages array and applies vLLM's preprocessing:
// content becomes text (textContent: joined with "\n", or text parts when
// parts is set), and an assistant's tool call arguments given as a JSON
// string become an object (an empty one when they are not a JSON object);
// empty tool_calls are dropped. Only the fields vLLM forwards to the
// template are kept.
func prepareMessages(raw json.RawMessage, parts bool) ([]jinja.Value, error) {
	all, err := jsonValue(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: messages: %w", ErrBadMessages, err)
	case all.IsNone():
		return nil, nil // null: no messages, as encoding/json reads it
	case !all.IsList():
		return nil, fmt.Errorf("%w: messages is not an array", ErrBadMessages)
	}
	list := all.AsList().Items
	out := make([]jinja.Value, 0, len(list))
	for i, m := range list {
		v, err := prepareMessage(m, parts)
		if err != nil {
			return nil, fmt.Errorf("%w: message %d: %w", ErrBadMessages, i, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// prepareRawMessage is prepareMessage on one message's JSON.
func prepareRawMessage(raw json.RawMessage, parts bool) (jinja.Value, error) {
	v, err := jsonValue(raw)
	if err != nil {
		return jinja.Value{}, err
	}
	return prepareMessage(v, parts)
}

// prepareMessage is prepareMessages' work on one decoded message.
func prepareMessage(v jinja.Value, parts bool) (jinja.Value, error) {
	if !v.IsDict() {
		return jinja.Value{}, errors.New("not an object")
	}
	in := v.AsDict()
	role, ok := in.Get("role")
	if !ok || !role.IsString() {
		return jinja.Value{}, errors.New("no role")
	}
	out := jinja.NewDict()
	d := out.AsDict()
	d.Set("role", role)
	content, err := textContent(in, role.AsString(), parts)
	if err != nil {
		return jinja.Value{}, err
	}
	d.Set("content", content)
	r := role.AsString()
	if tc, ok := in.Get("tool_calls"); ok && r == "assistant" && !tc.IsNone() {
		if !tc.IsList() {
			return jinja.Value{}, errors.New("tool_calls is not an array")
		}
		if tc.AsList().Len() > 0 {
			if err := normalizeToolCalls(tc.AsList()); err != nil {
				return jinja.Value{}, err
			}
			d.Set("tool_calls", tc)
		}
	}
	if id, ok := in.Get("tool_call_id"); ok && r == "tool" {
		d.Set("tool_call_id", id)
	}
	if name, ok := in.Get("name"); ok && name.IsString() {
		d.Set("name", name)
	}
	for _, k := range []string{"reasoning", "reasoning_content"} {
		if x, ok := in.Get(k); ok && x.IsString() && r == "assistant" {
			d.Set("reasoning", x)
			d.Set("reasoning_content", x)
		}
	}
	return out, nil
}

// textPartKeys maps the content part types vLLM reads as text to the key
// holding their text (vLLM 0.33, renderers/chat_utils/chat_message.py:
// TEXT_PART_TYPES and MM_PARSER_MAP): the Responses API's input_text and
// output_text are text parts in chat requests too.
var textPartKeys = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text",
	"refusal": "refusal", "thinking": "thinking",
}

// textContent is a message's content as vLLM gives it to the template: its
// texts (a string content is one text part; a null content none) joined
// with "\n" for a template that takes string content, or, when parts is set
// (the template loops over content), a list of {"type": "text", "text": ...}
// dicts, one a text, except for a tool message, whose texts are joined
// again. A system message's texts lose Claude Code's billing header line
// (route.WithoutBillingHeader); a null text or refusal part is skipped, as vLLM
// skips it, and an empty part is left out of a string content. A
// tool_reference part (a deferred tool a tool result names,
// which vLLM passes on for the template to expand) is its name among the
// texts of a string content, and {"type": "tool_reference", "name": ...}
// among the parts, where it also keeps a tool message's content a list.
func textContent(m *jinja.Dict, role string, parts bool) (jinja.Value, error) {
	pieces, err := contentTexts(m, role == "system")
	if err != nil {
		return jinja.Value{}, err
	}
	refs := false
	for _, p := range pieces {
		refs = refs || p.ref
	}
	if !parts || role == "tool" && !refs {
		if !parts {
			// vLLM leaves an empty part out of a string content (it joins
			// only the parts that parse to a non-empty string); a tool
			// message's parts, joined again from the parts format, keep
			// theirs.
			pieces = slices.DeleteFunc(pieces, func(p contentPiece) bool { return p.v.AsString() == "" })
		}
		if len(pieces) == 1 {
			return pieces[0].v, nil // the string value as decoded: no copy
		}
		s := make([]string, len(pieces))
		for i, p := range pieces {
			s[i] = p.v.AsString()
		}
		return jinja.NewString(strings.Join(s, "\n")), nil
	}
	items := make([]jinja.Value, len(pieces))
	for i, p := range pieces {
		part := jinja.NewDict()
		if p.ref {
			part.AsDict().Set("type", toolReferenceType)
			part.AsDict().Set("name", p.v)
		} else {
			part.AsDict().Set("type", textType)
			part.AsDict().Set("text", p.v)
		}
		items[i] = part
	}
	return jinja.NewList(items), nil
}

var (
	textType          = jinja.NewString("text")
	toolReferenceType = jinja.NewString("tool_reference")
)

// contentPiece is one content part's text, or a tool reference's name.
type contentPiece struct {
	v   jinja.Value
	ref bool
}

// contentTexts returns the text of each of a message's content parts.
func contentTexts(m *jinja.Dict, system bool) ([]contentPiece, error) {
	c, ok := m.Get("content")
	if !ok || c.IsNone() {
		return nil, nil
	}
	one := func(v jinja.Value, strip bool) []contentPiece {
		if strip {
			if rest, keep := route.WithoutBillingHeader(v.AsString()); rest != v.AsString() {
				if !keep {
					return nil
				}
				return []contentPiece{{v: jinja.NewString(rest)}}
			}
		}
		return []contentPiece{{v: v}}
	}
	if c.IsString() {
		return one(c, system), nil
	}
	if !c.IsList() {
		return nil, errors.New("content is neither a string nor an array")
	}
	texts := make([]contentPiece, 0, c.AsList().Len())
	for _, p := range c.AsList().Items {
		if p.IsString() {
			texts = append(texts, one(p, system)...)
			continue
		}
		if !p.IsDict() {
			return nil, errors.New("content part is not an object")
		}
		typ, _ := p.AsDict().Get("type")
		if typ.IsString() && typ.AsString() == "tool_reference" {
			name, ok := p.AsDict().Get("name")
			if !ok || !name.IsString() {
				return nil, fmt.Errorf("%w: a tool_reference part without a name string", ErrUnsupported)
			}
			texts = append(texts, contentPiece{v: name, ref: true})
			continue
		}
		key := ""
		if typ.IsString() {
			key = textPartKeys[typ.AsString()]
		}
		if key == "" {
			return nil, fmt.Errorf("%w: non-text content part %s", ErrUnsupported, typ.String())
		}
		text, hasText := p.AsDict().Get(key)
		switch {
		case (!hasText || text.IsNone()) && (key == "text" && typ.AsString() == "text" || key == "refusal"):
			continue
		case !hasText || !text.IsString():
			return nil, fmt.Errorf("%w: content part %s without its %s string", ErrUnsupported, typ.String(), key)
		}
		texts = append(texts, one(text, system && typ.AsString() == "text")...)
	}
	return texts, nil
}

func normalizeToolCalls(calls *jinja.List) error {
	for _, item := range calls.Items {
		if !item.IsDict() {
			return errors.New("tool_calls entry is not an object")
		}
		fn, ok := item.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return errors.New("tool call has no function object")
		}
		f := fn.AsDict()
		args, ok := f.Get("arguments")
		switch {
		case !ok || !args.IsTruthy():
			f.Set("arguments", jinja.NewDict())
		case args.IsString():
			parsed, err := jsonValue(json.RawMessage(args.AsString()))
			if err != nil || !parsed.IsDict() {
				parsed = jinja.NewDict()
			}
			f.Set("arguments", parsed)
		case !args.IsDict():
			f.Set("arguments", jinja.NewDict())
		}
	}
	return nil
}

// effortArgs are the template arguments vLLM (0.33, build_chat_params)
// merges over a chat request's own for its reasoning effort: reasoning_effort
// ("" when not merged: no effort, or "auto", which vLLM's merge drops,
// keeping the request's own) and, unless the request's arguments set it
// (own), enable_thinking (nil when not merged), true unless the effort is
// "none". effort is already rewritten through the engine's
// --reasoning-effort-map (mapEffort). Render and the remote tokenizer
// apply them, each to its own form of the arguments.
func effortArgs(effort string, own bool) (thinking *bool, reasoning string) {
	if effort == "" {
		return nil, ""
	}
	if !own {
		on := effort != "none"
		thinking = &on
	}
	if effort != "auto" {
		reasoning = effort
	}
	return thinking, reasoning
}
