package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/route"
)

// The reshaping the fixtures check against HuggingFace's rendering is also
// checked here on its own: the dict each tool becomes, and what is refused.
func TestToolsRenderAsVLLMDumpsThem(t *testing.T) {
	ct, err := ParseChatTemplate([]byte(`{"chat_template": "{{ tools|tojson }}"}`))
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	for _, c := range []struct{ tools, want string }{
		{`[{"function": {"parameters": {"b": 1, "a": 2}, "name": "f"}}]`,
			`[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1, "a": 2}}}]`},
		{`[{"function": {"strict": true, "name": "f", "x": 1, "description": "d"}, "type": "function", "cache_control": {}}]`,
			`[{"type": "function", "function": {"name": "f", "description": "d", "parameters": null, "strict": true}}]`},
		{`[{"type": "function", "defer_loading": false, "function": {"name": "f", "strict": null}}]`,
			`[{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "defer_loading": false}, "defer_loading": false}]`},
		{`[{"type": "function", "defer_loading": true, "function": {"name": "f", "defer_loading": false}}]`,
			`[{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "defer_loading": false}, "defer_loading": true}]`},
	} {
		got, err := ct.Render(ChatInput{Messages: msgs, Tools: json.RawMessage(c.tools)})
		if err != nil || got != c.want {
			t.Errorf("%s:\n got %s, %v\nwant %s", c.tools, got, err, c.want)
		}
	}
	for _, c := range []struct {
		tools string
		want  error
	}{
		{`[{"type": "code_interpreter"}]`, ErrBadMessages},
		{`[{"type": "function"}]`, ErrBadMessages},
		{`[{"function": {"description": "no name"}}]`, ErrBadMessages},
		{`[{"function": {"name": "f", "parameters": "x"}}]`, ErrBadMessages},
		{`[{"function": {"name": "f", "description": 3}}]`, ErrBadMessages},
		{`[3]`, ErrBadMessages},
		{`[{"function": {"name": "f", "strict": "yes"}}]`, ErrUnsupported},
		{`[{"function": {"name": "f"}, "defer_loading": 1}]`, ErrUnsupported},
	} {
		if _, err := ct.Render(ChatInput{Messages: msgs, Tools: json.RawMessage(c.tools)}); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.tools, err, c.want)
		}
	}
}

func TestMessagesReshapedAsVLLMDoes(t *testing.T) {
	str, err := ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	parts, err := ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}[{{ m.role }}:{% if m.content is string %}s={{ m.content }}{% else %}{% for p in m.content %}({{ p.type }}={{ p.text }}){% endfor %}{% endif %}]{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ msgs, str, parts string }{
		{ // Responses-style parts; a null text part skipped; a tool's texts joined even as parts.
			`[{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": null}, {"type": "output_text", "text": "b"}, {"type": "refusal", "refusal": "c"}, {"type": "thinking", "thinking": "d"}]}, {"role": "tool", "content": [{"type": "text", "text": "x"}, "y"]}]`,
			"[user:a\nb\nc\nd][tool:x\ny]",
			"[user:(text=a)(text=b)(text=c)(text=d)][tool:s=x\ny]"},
		{ // developer without template support: system, merged at the front.
			`[{"role": "system", "content": "S"}, {"role": "user", "content": "u"}, {"role": "developer", "content": "D"}, {"role": "developer", "content": ""}]`,
			"[system:S\n\nD][user:u]",
			"[system:s=S\n\nD][user:(text=u)]"},
		{ // one developer message alone stays where it is, as system.
			`[{"role": "developer", "content": "D"}, {"role": "user", "content": "u"}]`,
			"[system:D][user:u]",
			"[system:(text=D)][user:(text=u)]"},
		{ // the billing header line goes from system texts only, part by part.
			`[{"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"}, {"type": "text", "text": "S\nT"}, {"type": "text", "text": "x-anthropic-billing-header: a\nkept"}, {"type": "input_text", "text": "x-anthropic-billing-header: b\nc"}]}, {"role": "user", "content": "x-anthropic-billing-header: u\nv"}]`,
			"[system:S\nT\nkept\nx-anthropic-billing-header: b\nc][user:x-anthropic-billing-header: u\nv]",
			"[system:(text=S\nT)(text=kept)(text=x-anthropic-billing-header: b\nc)][user:(text=x-anthropic-billing-header: u\nv)]"},
		{ // a string content: one part; null: none.
			`[{"role": "system", "content": "x-anthropic-billing-header: only"}, {"role": "assistant", "content": null}]`,
			"[system:][assistant:]",
			"[system:][assistant:]"},
	} {
		for _, r := range []struct {
			ct   *ChatTemplate
			want string
		}{{str, c.str}, {parts, c.parts}} {
			in := ChatInput{Messages: json.RawMessage(c.msgs)}
			got, err := r.ct.Render(in)
			if err != nil || got != r.want {
				t.Errorf("%s:\n got %q, %v\nwant %q", c.msgs, got, err, r.want)
			}
			in.Parsed = parsedMessages(t, c.msgs)
			if got, err := r.ct.Render(in); err != nil || got != r.want {
				t.Errorf("%s, parsed:\n got %q, %v\nwant %q", c.msgs, got, err, r.want)
			}
		}
	}
	if !parts.base.partsContent || str.base.partsContent {
		t.Fatal("content format misdetected")
	}
	// A template that names the developer role keeps it.
	dev, err := ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}{% if m.role == 'developer' %}D{% endif %}[{{ m.role }}]{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := dev.Render(ChatInput{Messages: json.RawMessage(`[{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}]`)}); err != nil || !strings.Contains(got, "D[developer]") {
		t.Errorf("developer-aware template: %q, %v", got, err)
	}
}

// FuzzChatInput: any messages, tools and flags render or fail with one of
// the package's errors, with and without parts content, the developer role
// and default template arguments; nothing panics.
func FuzzChatInput(f *testing.F) {
	for _, s := range []struct{ msgs, tools string }{
		{`[{"role":"user","content":"hi"}]`, `[{"function":{"name":"f"}}]`},
		{`[{"role":"developer","content":[{"type":"input_text","text":"d"}]},{"role":"system","content":"x-anthropic-billing-header: a\nb"}]`, `[]`},
		{`[{"role":"assistant","content":[{"type":"text","text":null},{"type":"output_text","text":"o"}],"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]`, `null`},
		{`[{"role":"tool","content":[{"type":"refusal","refusal":"r"}]}]`, `[{"type":"function","function":{"name":"g","strict":true,"defer_loading":false},"defer_loading":true}]`},
		{`[]`, `[3]`}, {`{}`, `{}`},
	} {
		f.Add(s.msgs, s.tools, true, false)
		f.Add(s.msgs, s.tools, false, true)
	}
	var templates []*ChatTemplate
	for _, src := range []string{
		`{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}{{ tools|tojson }}`,
		`{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}{% if documents %}d{% endif %}{{ x }}`,
		`{% for m in messages %}{% if m.role == 'developer' %}D{% endif %}{{ m.content }}{% endfor %}`,
	} {
		raw, _ := json.Marshal(map[string]string{"chat_template": src})
		for _, e := range []EngineChat{{}, {DefaultKwargs: `{"x": 1}`, ContentFormat: ContentFormatString}} {
			ct, err := parseChatTemplate(raw, e)
			if err != nil {
				f.Fatal(err)
			}
			templates = append(templates, ct)
		}
	}
	f.Fuzz(func(t *testing.T, msgs, tools string, gen, cont bool) {
		for _, ct := range templates {
			_, err := ct.Render(ChatInput{Messages: json.RawMessage(msgs), Tools: json.RawMessage(tools), AddGenerationPrompt: gen,
				ContinueFinalMessage: cont, ChatTemplateKwargs: json.RawMessage(`{"x": null}`)})
			if err != nil && !errors.Is(err, ErrBadMessages) && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrTemplate) {
				t.Fatalf("error %v is none of the package's", err)
			}
		}
	})
}

// TestToolsCacheCopies: a long tools list decoded once renders the same on
// every request, and a template that changes its tools (this engine lets a
// list be appended to) changes only its own render's copy.
func TestToolsCacheCopies(t *testing.T) {
	var tools []map[string]any
	for i := range 12 {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name": fmt.Sprintf("tool%d", i), "description": strings.Repeat("A long description. ", 12),
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "number", "default": 1.0}}}}})
	}
	raw, _ := json.Marshal(tools)
	if len(raw) < minCachedTools {
		t.Fatalf("%d bytes: not cached", len(raw))
	}
	ct, err := ParseChatTemplate([]byte(`{"chat_template": "{% set _ = tools.append(1) %}{{ tools|length }}|{{ tools[0]|tojson }}"}`))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := ParseChatTemplate([]byte(`{"chat_template": "{{ tools|tojson }}"}`))
	if err != nil {
		t.Fatal(err)
	}
	in := ChatInput{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Tools: raw}
	first, err := ct.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, `13|{"type": "function", "function": {"name": "tool0"`) {
		t.Fatalf("render %q", first[:min(len(first), 80)])
	}
	want, err := plain.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if again, err := ct.Render(in); err != nil || again != first {
			t.Fatalf("a cached render differs: %q, %v", again[:min(len(again), 80)], err)
		}
		if again, err := plain.Render(in); err != nil || again != want {
			t.Fatalf("a cached tojson render differs: %v", err)
		}
	}
	if ct.toolsCache.lru == nil || len(ct.toolsCache.lru.items) != 1 {
		t.Fatal("the tools were not cached")
	}
}

// TestToolsCacheMetrics: an agent's tools list, resent every turn, is
// decoded once, and the per-model figures say so; a short list is not
// cached and not counted.
func TestToolsCacheMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	tok, err := New(Config{Models: map[string]ModelConfig{"q": localConfig(t, "qwen3")}}, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	var tools []map[string]any
	for i := range 8 {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name": fmt.Sprintf("tool%d", i), "description": strings.Repeat("Reads a file. ", 20)}})
	}
	raw, _ := json.Marshal(tools)
	short := json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	for turn, list := range []json.RawMessage{raw, raw, short, raw} {
		in := route.TokenizeInput{Chat: true, Messages: json.RawMessage(fmt.Sprintf(`[{"role":"user","content":"turn %d"}]`, turn)), Tools: list, AddGenerationPrompt: true}
		if _, err := tok.Tokenize(context.Background(), "q", in); err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
	}
	hits := counterValue(t, reg, "kvroute_tokenizer_tools_cache_hits_total", "q")
	misses := counterValue(t, reg, "kvroute_tokenizer_tools_cache_misses_total", "q")
	bytes := gaugeValue(t, reg, "kvroute_tokenizer_tools_cache_bytes", "q")
	if hits != 2 || misses != 1 || bytes != float64(len(raw)) {
		t.Fatalf("tools cache: %v hits, %v misses, %v bytes; want 2, 1 and %d", hits, misses, bytes, len(raw))
	}
}
