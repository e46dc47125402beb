package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The expected answers are what vLLM 0.33's _detect_merge_inline_system
// gives (run with jinja2 on each source).
func TestRejectsInlineSystemAsVLLM(t *testing.T) {
	for _, c := range []struct {
		name, src string
		merge     bool
	}{
		{"raises on a later system message", `{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('System message must be at the beginning.') }}{% endif %}{{ m.content }}{% endfor %}`, true},
		{"renders every role", `{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}`, false},
		{"calls an undefined function", `{{ undefined_fn('x') }}{% for m in messages %}{{ m.content }}{% endfor %}`, true},
		{"prints an undefined name", `{{ foo }}{{ bos_token }}{{ messages[0].content }}`, false},
		{"tools undefined", `{% if tools %}{{ tools | tojson }}{% endif %}x`, false},
		{"strftime_now is not defined there", `{{ strftime_now('%d') }}`, true},
		{"strftime_now guarded", `{% if strftime_now is defined %}{{ strftime_now('%d') }}{% else %}26 Jul{% endif %}`, false},
		{"alternation check", `{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('alternate') }}{% endif %}{% endfor %}`, true},
		{"special token added where reached", `{% for m in messages %}{% if loop.first %}{{ bos_token + m.content }}{% endif %}{% endfor %}`, true},
		{"special token added in a set", `{% set c = bos_token + messages[0]['content'] %}{{ c }}`, true},
		{"special token added where not reached", `{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content + eos_token }}{% else %}{{ m.content }}{% endif %}{% endfor %}`, false},
		{"a string content's text part added", `{% if messages[0]['role'] == 'system' %}{% set p = messages[0]['content'][0]['text'] + '\n' %}{% endif %}{{ p }}`, true},
		{"text part added only for list content", `{% if messages[0]['content'] is string %}{{ messages[0]['content'] + 'x' }}{% else %}{{ messages[0]['content'][0]['text'] + 'x' }}{% endif %}`, false},
		{"generation tag", `{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}`, true},
		{"the words inside a string", `{{ 'bos_token + x' }}`, false},
		{"empty template", ``, true},
		{"does not compile", `{% for m in messages %}`, true},
	} {
		if got := rejectsInlineSystem(c.src); got != c.merge {
			t.Errorf("%s: rejectsInlineSystem = %v, vLLM merges: %v", c.name, got, c.merge)
		}
	}
}

// familyConfig reads a fixture family's tokenizer_config.json.
func familyConfig(t *testing.T, family string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tokenizerDir(family), "tokenizer_config.json"))
	if err != nil {
		t.Fatalf("%s: %v (run make fixtures)", family, err)
	}
	return data
}

// TestMessagesProbesOnFamilyTemplates compares both probes with what
// vLLM's own code decided for each fixture family's template
// (hack/messages-fixtures/merge_oracle.py wrote the two files).
func TestMessagesProbesOnFamilyTemplates(t *testing.T) {
	var merge map[string]map[string]bool
	var effort map[string]string
	for path, v := range map[string]any{"testdata/merge_inline_system.json": &merge, "testdata/disabled_thinking_effort.json": &effort} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	checked := 0
	for family, want := range effort {
		data := familyConfig(t, family)
		c, err := ParseChatTemplate(data)
		if err != nil {
			t.Logf("%s: %v", family, err)
			continue
		}
		if got := c.offEffort; got != want {
			t.Errorf("%s: disabled-thinking effort %q, vLLM %q", family, got, want)
		}
		wantMerge := false
		for _, m := range merge[family] {
			wantMerge = wantMerge || m
		}
		if got := c.systemFirst; got != wantMerge {
			t.Errorf("%s: merges inline system messages %v, vLLM %v", family, got, wantMerge)
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("only %d families checked", checked)
	}
}

// TestMessagesChoicesInRender: a Messages request renders with the merged
// conversation only under a template that rejects inline system messages,
// and with disabled thinking as with the resolved effort's arguments (the
// request's own enable_thinking kept).
func TestMessagesChoicesInRender(t *testing.T) {
	plain := json.RawMessage(`[{"role":"user","content":"a"},{"role":"system","content":"R"},{"role":"user","content":"b"}]`)
	merged := json.RawMessage(`[{"role":"system","content":"R"},{"role":"user","content":"a"},{"role":"user","content":"b"}]`)
	cfg := func(src string) []byte {
		b, _ := json.Marshal(map[string]string{"chat_template": src})
		return b
	}
	const show = `{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}|{{ enable_thinking }}|{{ reasoning_effort }}`
	strict, err := ParseChatTemplate(cfg(`{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('first only') }}{% endif %}{% endfor %}` + show))
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := ParseChatTemplate(cfg(show))
	if err != nil {
		t.Fatal(err)
	}
	if !strict.systemFirst || lenient.systemFirst {
		t.Fatal("probe")
	}
	// Both templates render reasoning_effort, so "none" differs from the
	// efforts: vLLM keeps "none".
	if strict.offEffort != "none" || lenient.offEffort != "none" {
		t.Fatalf("efforts %q %q", strict.offEffort, lenient.offEffort)
	}
	for _, c := range []struct {
		tmpl   *ChatTemplate
		in     ChatInput
		want   string
		failed bool
	}{
		{strict, ChatInput{Messages: plain}, "", true},
		{strict, ChatInput{Messages: plain, SystemFirst: merged}, "<system>R<user>a<user>b||", false},
		{lenient, ChatInput{Messages: plain, SystemFirst: merged}, "<user>a<system>R<user>b||", false},
		{lenient, ChatInput{Messages: plain, ThinkingDisabled: true}, "<user>a<system>R<user>b|False|none", false},
		{lenient, ChatInput{Messages: plain, ThinkingDisabled: true, ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":true,"reasoning_effort":"high"}`)},
			"<user>a<system>R<user>b|True|none", false},
		// Disabled thinking wins over a requested effort.
		{lenient, ChatInput{Messages: plain, ThinkingDisabled: true, ReasoningEffort: "max"}, "<user>a<system>R<user>b|False|none", false},
	} {
		got, err := c.tmpl.Render(c.in)
		if (err != nil) != c.failed || got != c.want {
			t.Errorf("%+v: %q, %v; want %q (fails %v)", c.in, got, err, c.want, c.failed)
		}
	}
	// A template that ignores the effort gets "low"; the engine's flag
	// fixes it.
	ignores, err := ParseChatTemplate(cfg(`{% for m in messages %}{{ m.content }}{% endfor %}`))
	if err != nil || ignores.offEffort != "low" {
		t.Fatalf("ignoring template: %v %q", err, ignores.offEffort)
	}
	fixed, err := parseChatTemplate(cfg(show), EngineChat{DisabledThinkingEffort: "medium"})
	if err != nil || fixed.offEffort != "medium" {
		t.Fatalf("engine flag: %v %q", err, fixed.offEffort)
	}
	if err := (EngineChat{DisabledThinkingEffort: "huge"}).Validate(); err == nil || !strings.Contains(err.Error(), "anthropic_disabled_thinking_effort") {
		t.Errorf("Validate: %v", err)
	}
}

// TestToolReferenceParts: a tool message naming deferred tools (what an
// Anthropic tool_result's tool_reference items become) reaches a string
// content template as the names joined with "\n", a parts template as the
// tool_reference dicts themselves (the content stays a list); an empty part
// is left out of a string content only (vLLM 0.33, chat_message.py).
func TestToolReferenceParts(t *testing.T) {
	msgs := json.RawMessage(`[{"role":"tool","tool_call_id":"t1","content":[{"type":"tool_reference","name":"Grep"},{"type":"tool_reference","name":"Glob"}]},` +
		`{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}]},` +
		`{"role":"tool","content":[{"type":"text","text":"x"},{"type":"text","text":""}]}]`)
	str, err := ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	parts, err := ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}[{{ m.role }}:{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{{ p|tojson }}{% endfor %}{% endif %}]{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tmpl *ChatTemplate
		want string
	}{
		{str, "[tool:Grep\nGlob][user:a\nb][tool:x]"},
		{parts, `[tool:{"type": "tool_reference", "name": "Grep"}{"type": "tool_reference", "name": "Glob"}][user:{"type": "text", "text": "a"}{"type": "text", "text": ""}{"type": "text", "text": "b"}]` + "[tool:x\n]"},
	} {
		got, err := c.tmpl.Render(ChatInput{Messages: msgs})
		if err != nil || got != c.want {
			t.Errorf("got %q, %v\nwant %q", got, err, c.want)
		}
	}
	if _, err := str.Render(ChatInput{Messages: json.RawMessage(`[{"role":"tool","content":[{"type":"tool_reference"}]}]`)}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a tool reference without a name: %v", err)
	}
}

// TestRenderReasoningEffort: a request's reasoning effort reaches the
// template as vLLM 0.33 (build_chat_params, merge_kwargs) passes it: as
// reasoning_effort over the request's own arguments, unless "auto", and
// enable_thinking, true unless "none", where the request's arguments do not
// set it. The remote tokenizer sends the same arguments.
func TestRenderReasoningEffort(t *testing.T) {
	src, _ := json.Marshal(map[string]string{"chat_template": `{{ enable_thinking }}|{{ reasoning_effort }}|{{ x }}`})
	tmpl, err := ParseChatTemplate(src)
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	for _, c := range []struct {
		effort, kwargs, want, sent string
	}{
		{"", "", "||", ""},
		{"low", "", "True|low|", `{"enable_thinking":true,"reasoning_effort":"low"}`},
		{"none", `{"x":1,"reasoning_effort":"high"}`, "False|none|1", `{"enable_thinking":false,"reasoning_effort":"none","x":1}`},
		{"none", `{"enable_thinking":true}`, "True|none|", `{"enable_thinking":true,"reasoning_effort":"none"}`},
		{"auto", `{"reasoning_effort":"high"}`, "True|high|", `{"enable_thinking":true,"reasoning_effort":"high"}`},
	} {
		in := ChatInput{Messages: msgs, ReasoningEffort: c.effort}
		if c.kwargs != "" {
			in.ChatTemplateKwargs = json.RawMessage(c.kwargs)
		}
		if got, err := tmpl.Render(in); err != nil || got != c.want {
			t.Errorf("effort %q kwargs %s: %q, %v; want %q", c.effort, c.kwargs, got, err, c.want)
		}
		if c.effort == "" {
			continue
		}
		sent, err := withEffort(in.ChatTemplateKwargs, c.effort)
		if err != nil || string(sent) != c.sent {
			t.Errorf("effort %q kwargs %s: sends %s, %v; want %s", c.effort, c.kwargs, sent, err, c.sent)
		}
	}
	if _, err := withEffort(json.RawMessage(`[1]`), "low"); !errors.Is(err, ErrBadMessages) {
		t.Errorf("kwargs not an object: %v", err)
	}
}
