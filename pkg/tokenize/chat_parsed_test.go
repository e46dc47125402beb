package tokenize

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
)

// TestParsedMessagesRenderAsDecoded renders tricky messages both from their
// JSON and from the request parser's decoded form: the two must agree,
// errors included, and only plain messages may skip the JSON.
func TestParsedMessagesRenderAsDecoded(t *testing.T) {
	ct, err := ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}{{ m|tojson }}|{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		msgs  string
		plain bool // whether the first message may skip its JSON
	}{
		{`[{"role":"user","content":"hi"}]`, true},
		{`[{"content":"hi","role":"user","name":"bob"}]`, true},
		{`[{"role":"user","content":null}]`, true},
		{`[{"role":"user"}]`, true},
		{`[{"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"text","text":"c"}]}]`, true},
		{`[{"role":"user","content":[{"type":"text","text":"a"},"",{"type":"text","text":""},{"type":"text","text":"c"}]}]`, true},
		{`[{"role":"user","content":"a \"quoted\" \\ line\n\u00e9\ud83d\ude00"}]`, true},
		{`[{"role":"user","content":"x","name":""}]`, false},
		{`[{"role":"user","content":"x","name":5}]`, false},
		{`[{"role":"user","content":"x","extra":{"tool_calls":[1]}}]`, false},
		{`[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]}]`, false},
		{`[{"role":"assistant","content":"x","t\u006fol_calls":[{"function":{"name":"f","arguments":"{}"}}]}]`, false},
		{`[{"role":"user","content":"ends in a backslash \\","extra":1}]`, false},
		{`[{"role":"user","content":"\\\"tool_calls\": [\\\\"}]`, true},
		{`[{"role":"user","content":"a \"k\": 1, \"x\": {"}]`, true},
		{`[{"role":"user","n\u0061me":"bob","content":"x"}]`, true},
		{`[{"role":"assistant","content":"x","reasoning_content":"think"}]`, false},
		{`[{"role":"tool","content":"42","tool_call_id":"c"}]`, false},
		{`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]`, false},
		{`[{"role":"user","content":5}]`, false},
		{`[{"role":5,"content":"x"}]`, false},
		{`[{"role":"user","role":5,"content":"x"}]`, false},
		{`[{"role":"user","content":"\ufdd0py:1"}]`, false},
		{`[{"r\u006fle":"user","content":"x"}]`, true},
		{`[{"role":"user","content":"a","content":"b"}]`, true},
	}
	for _, c := range cases {
		in := ChatInput{Messages: []byte(c.msgs)}
		want, wantErr := ct.Render(in)
		in.Parsed = parsedMessages(t, c.msgs)
		if got := plainMessage(&in.Parsed[0]); got != c.plain {
			t.Errorf("%s: plain = %v, want %v", c.msgs, got, c.plain)
		}
		got, gotErr := ct.Render(in)
		if got != want || (wantErr == nil) != (gotErr == nil) ||
			wantErr != nil && (errors.Is(wantErr, ErrUnsupported) != errors.Is(gotErr, ErrUnsupported) || errors.Is(wantErr, ErrBadMessages) != errors.Is(gotErr, ErrBadMessages)) {
			t.Errorf("%s:\n parsed %q, %v\n   json %q, %v", c.msgs, got, gotErr, want, wantErr)
		}
	}
}

// TestRenderDataNotShared: the map of template variables is reused across
// renders; a variable one request's chat_template_kwargs set is not seen
// by the next request, concurrent renders included, and a render that
// failed leaves nothing behind.
func TestRenderDataNotShared(t *testing.T) {
	ct, err := ParseChatTemplate([]byte(`{"chat_template": "{{ foo is defined }}|{{ messages|length }}|{% if bar is defined %}{{ raise_exception('bar') }}{% endif %}", "bos_token": "<s>"}`))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []byte(`[{"role":"user","content":"hi"}]`)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				switch (g + i) % 3 {
				case 0:
					out, err := ct.Render(ChatInput{Messages: msgs, ChatTemplateKwargs: []byte(`{"foo":1}`)})
					if err != nil || out != "True|1|" {
						t.Errorf("with foo: %q, %v", out, err)
					}
				case 1:
					out, err := ct.Render(ChatInput{Messages: msgs})
					if err != nil || out != "False|1|" {
						t.Errorf("without foo: %q, %v", out, err)
					}
				case 2:
					if _, err := ct.Render(ChatInput{Messages: msgs, ChatTemplateKwargs: []byte(`{"bar":1}`)}); !errors.Is(err, ErrTemplate) {
						t.Errorf("with bar: %v, want a template error", err)
					}
				}
			}
		})
	}
	wg.Wait()
}

// templateSources reads chat_template in both of tokenizer_config.json's
// forms, a string or a list of named templates, and refuses the rest.
func TestTemplateSources(t *testing.T) {
	tests := []struct {
		raw, src, tool string
		ok             bool
	}{
		{`"{{ x }}"`, "{{ x }}", "", true},
		{`[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}, {"name": "rag", "template": "R"}]`, "D", "T", true},
		{`[{"name": "default", "template": "D"}]`, "D", "", true},
		{`[{"name": "tool_use", "template": "T"}]`, "", "", false},
		{`null`, "", "", false},
		{``, "", "", false},
		{`7`, "", "", false},
	}
	for _, tt := range tests {
		src, tool, err := templateSources(json.RawMessage(tt.raw))
		if (err == nil) != tt.ok || src != tt.src || tool != tt.tool {
			t.Errorf("%s: %q, %q, %v; want %q, %q, ok %v", tt.raw, src, tool, err, tt.src, tt.tool, tt.ok)
		}
	}
}
