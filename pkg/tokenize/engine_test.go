package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/route"
)

// The engine's serve flags reach the local render: its own template, its
// content format, and default template arguments under the request's.
func TestEngineChatSettings(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	if err := os.WriteFile(cfgPath, []byte(`{"bos_token": "<s>", "chat_template": "{{ bos_token }}base:{% for m in messages %}{{ m.content }}{% endfor %}"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tmplPath := filepath.Join(dir, "agent.jinja")
	if err := os.WriteFile(tmplPath, []byte(`{{ bos_token }}agent[{{ enable_thinking }}|{{ effort is defined }}|{{ enable_thinking is none }}]{% for m in messages %}{% if m.content is string %}s:{{ m.content }}{% else %}{% for p in m.content %}p:{{ p.text }}{% endfor %}{% endif %}{% endfor %}`), 0o600); err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	render := func(t *testing.T, e EngineChat, kwargs string) string {
		t.Helper()
		ct, err := LoadEngineChatTemplate(cfgPath, e)
		if err != nil {
			t.Fatal(err)
		}
		in := ChatInput{Messages: msgs}
		if kwargs != "" {
			in.ChatTemplateKwargs = json.RawMessage(kwargs)
		}
		out, err := ct.Render(in)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		e      EngineChat
		kwargs string
		want   string
	}{
		{"tokenizer_config's template", EngineChat{}, "", "<s>base:hi"},
		{"the engine's template file (loops over content: parts)", EngineChat{Template: tmplPath}, "", "<s>agent[|False|False]p:hi"},
		{"its format forced to string", EngineChat{Template: tmplPath, ContentFormat: ContentFormatString}, "", "<s>agent[|False|False]s:hi"},
		{"the template given inline", EngineChat{Template: "{{ bos_token }}inline", ContentFormat: ContentFormatOpenAI}, "", "<s>inline"},
		{"default arguments", EngineChat{Template: tmplPath, DefaultKwargs: `{"enable_thinking": false}`}, "", "<s>agent[False|False|False]p:hi"},
		{"the request's win", EngineChat{Template: tmplPath, DefaultKwargs: `{"enable_thinking": false}`}, `{"enable_thinking": true, "effort": "x"}`, "<s>agent[True|True|False]p:hi"},
		// Over defaults, vLLM drops a request's None and "auto".
		{"a request's null does not", EngineChat{Template: tmplPath, DefaultKwargs: `{"enable_thinking": false}`}, `{"enable_thinking": null, "effort": "auto"}`, "<s>agent[False|False|False]p:hi"},
		// Without defaults, the request's null stays: defined, none, and
		// printed as Python prints it.
		{"a null without defaults", EngineChat{Template: tmplPath}, `{"enable_thinking": null}`, "<s>agent[None|False|True]p:hi"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := render(t, c.e, c.kwargs); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
	if _, err := LoadEngineChatTemplate(cfgPath, EngineChat{Template: filepath.Join(dir, "missing.jinja")}); err == nil {
		t.Error("a missing template file loaded")
	}
	if _, err := LoadEngineChatTemplate(cfgPath, EngineChat{DefaultKwargs: `{"a":`}); err == nil {
		t.Error("malformed default kwargs loaded")
	}
}

func TestDocumentsAndWhatTheSelfCheckSamples(t *testing.T) {
	ct, err := ParseChatTemplate([]byte(`{"chat_template": "{% if documents %}{% for d in documents %}[{{ d.title }}]{% endfor %}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "q"}]`)
	got, err := ct.Render(ChatInput{Messages: msgs, Documents: json.RawMessage(`[{"title": "a", "text": "x"}, {"title": "b", "text": "y"}]`)})
	if err != nil || got != "[a][b]q" {
		t.Errorf("documents: %q, %v", got, err)
	}
	if _, err := ct.Render(ChatInput{Messages: msgs, Documents: json.RawMessage(`{"title": "a"}`)}); err == nil {
		t.Error("documents that are not an array rendered")
	}
	// What /tokenize can be asked, and what a render endpoint can: every
	// request with its body.
	body := json.RawMessage(`{"model":"m","messages":[]}`)
	for _, c := range []struct {
		in                 route.TokenizeInput
		tokenize, rendered bool
	}{
		{route.TokenizeInput{Prompt: "x"}, true, false},
		{route.TokenizeInput{Prompt: "x", Body: body, API: "/v1/completions"}, true, true},
		{route.TokenizeInput{Chat: true, Messages: msgs}, true, false},
		{route.TokenizeInput{Chat: true, Messages: msgs, Tools: json.RawMessage(`[{"function": {"name": "f"}}]`)}, true, false},
		{route.TokenizeInput{Chat: true, Messages: msgs, Tools: json.RawMessage(` [ ] `), Body: body, API: "/v1/chat/completions"}, false, true},
		{route.TokenizeInput{Chat: true, Messages: msgs, Documents: json.RawMessage(`[{"title": "a"}]`), Body: body, API: "/v1/chat/completions"}, false, true},
		{route.TokenizeInput{Chat: true, Messages: msgs, ThinkingDisabled: true, Body: body, API: "/v1/messages"}, false, true},
		// A body the router could not convert: no local prompt to compare.
		{route.TokenizeInput{Body: body, API: "/v1/messages"}, false, false},
	} {
		if got := reproduces(&remote{}, c.in); got != c.tokenize {
			t.Errorf("%+v: sampled for /tokenize %v, want %v", c.in, got, c.tokenize)
		}
		if got := reproduces(&remote{render: true}, c.in); got != c.rendered {
			t.Errorf("%+v: sampled for render %v, want %v", c.in, got, c.rendered)
		}
	}
}

// TestExcludeToolsWhenToolChoiceNone: with the engine's
// --exclude-tools-when-tool-choice-none (exclude_tools_when_tool_choice_none),
// a request whose tool_choice is "none" renders without its tools, locally
// and in what the remote tokenizer sends /tokenize; any other choice, or
// the flag off, keeps them.
func TestExcludeToolsWhenToolChoiceNone(t *testing.T) {
	src, _ := json.Marshal(map[string]string{"chat_template": `{% if tools %}[{{ tools|length }} tools]{% endif %}{{ messages[0].content }}`})
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	for _, c := range []struct {
		exclude bool
		choice  string
		want    string
	}{
		{true, `"none"`, "hi"},
		{true, ` "none" `, "hi"},
		{true, `"auto"`, "[1 tools]hi"},
		{true, `{"type":"function","function":{"name":"f"}}`, "[1 tools]hi"},
		{true, ``, "[1 tools]hi"},
		{false, `"none"`, "[1 tools]hi"},
	} {
		ct, err := parseChatTemplate(src, EngineChat{ExcludeToolsWhenNone: c.exclude})
		if err != nil {
			t.Fatal(err)
		}
		in := ChatInput{Messages: msgs, Tools: tools}
		if c.choice != "" {
			in.ToolChoice = json.RawMessage(c.choice)
		}
		if got, err := ct.Render(in); err != nil || got != c.want {
			t.Errorf("exclude %v, tool_choice %s: %q, %v; want %q", c.exclude, c.choice, got, err, c.want)
		}
		r := &remote{cfg: ModelConfig{EngineChat: EngineChat{ExcludeToolsWhenNone: c.exclude}}}
		body, err := r.body(route.TokenizeInput{Chat: true, Messages: msgs, Tools: tools, ToolChoice: in.ToolChoice})
		if sent := strings.Contains(string(body), `"tools"`); err != nil || sent != strings.HasPrefix(c.want, "[") {
			t.Errorf("exclude %v, tool_choice %s: /tokenize body %s (%v)", c.exclude, c.choice, body, err)
		}
	}
}

// TestReasoningEffortMap: the engine's --reasoning-effort-map rewrites a
// request's effort before it reaches the template (an effort it does not
// name is kept), in the local render and in what the remote tokenizer
// sends /tokenize, and a malformed map is refused.
func TestReasoningEffortMap(t *testing.T) {
	src, _ := json.Marshal(map[string]string{"chat_template": `{{ enable_thinking }}|{{ reasoning_effort }}`})
	ct, err := parseChatTemplate(src, EngineChat{ReasoningEffortMap: `{"xhigh": "high", "minimal": "none"}`})
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role":"user","content":"x"}]`)
	for effort, want := range map[string]string{"xhigh": "True|high", "minimal": "False|none", "low": "True|low", "": "|"} {
		if got, err := ct.Render(ChatInput{Messages: msgs, ReasoningEffort: effort}); err != nil || got != want {
			t.Errorf("effort %q: %q, %v; want %q", effort, got, err, want)
		}
	}
	tok, err := New(Config{Models: map[string]ModelConfig{"m": {Kind: KindRemote, EngineChat: EngineChat{ReasoningEffortMap: `{"xhigh": "high"}`}}}},
		Options{Replicas: func(string) []string { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	body, err := tok.models["m"].remote.body(route.TokenizeInput{Chat: true, Messages: msgs, ReasoningEffort: "xhigh"})
	if err != nil || !strings.Contains(string(body), `"chat_template_kwargs":{"enable_thinking":true,"reasoning_effort":"high"}`) {
		t.Errorf("/tokenize body %s, %v", body, err)
	}
	for _, bad := range []string{`["low"]`, `{"extreme": "high"}`, `{"low": 1}`} {
		if err := (EngineChat{ReasoningEffortMap: bad}).Validate(); err == nil {
			t.Errorf("map %s accepted", bad)
		}
	}
}
