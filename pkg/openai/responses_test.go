package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/tokenize"
)

// responsesFixture is one case of testdata/responses.json: a body and what
// vLLM 0.33's own conversion made of it (hack/responses-fixtures/gen.py ran
// vLLM's functions on it).
type responsesFixture struct {
	Body                 json.RawMessage `json:"body"`
	Error                string          `json:"error"`
	Messages             json.RawMessage `json:"messages"`
	ToolsToJSON          *string         `json:"tools_tojson"`
	AddGenerationPrompt  bool            `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
}

// responsesFixtures reads testdata/responses.json.
func responsesFixtures(tb testing.TB) []responsesFixture {
	tb.Helper()
	data, err := os.ReadFile("testdata/responses.json")
	if err != nil {
		tb.Fatal(err)
	}
	var fx struct {
		Cases []responsesFixture `json:"cases"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		tb.Fatal(err)
	}
	if len(fx.Cases) < 15 {
		tb.Fatalf("only %d cases", len(fx.Cases))
	}
	return fx.Cases
}

func TestResponsesConvertAsVLLMDoes(t *testing.T) {
	cases := responsesFixtures(t)
	tools, err := tokenize.ParseChatTemplate([]byte(`{"chat_template": "{{ tools|tojson }}"}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		req, err := ParseResponses(c.Body)
		if err != nil {
			t.Errorf("case %d: %v\n%s", i, err, c.Body)
			continue
		}
		if c.Error != "" {
			if !errors.Is(req.Convert, ErrResponsesUnsupported) {
				t.Errorf("case %d: vLLM fails (%s), converted: %v\n%s", i, c.Error, req.Convert, c.Body)
			}
			continue
		}
		if req.Convert != nil {
			t.Errorf("case %d: %v\n%s", i, req.Convert, c.Body)
			continue
		}
		if strings.Contains(string(c.Body), "input_image") {
			// vLLM adds the image's default detail; the tokenizer refuses
			// images either way.
			continue
		}
		var got, want any
		if err := json.Unmarshal(req.Messages, &got); err != nil {
			t.Fatalf("case %d: messages are not JSON: %v\n%s", i, err, req.Messages)
		}
		_ = json.Unmarshal(c.Messages, &want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("case %d messages:\n got %s\nwant %s", i, req.Messages, c.Messages)
		}
		if req.AddGenerationPrompt != c.AddGenerationPrompt || req.ContinueFinalMessage != c.ContinueFinalMessage {
			t.Errorf("case %d: flags %v/%v, want %v/%v", i, req.AddGenerationPrompt, req.ContinueFinalMessage, c.AddGenerationPrompt, c.ContinueFinalMessage)
		}
		// The tools, printed by a template after the tokenizer's own
		// reshaping, are what vLLM's template prints.
		wantTools := "null"
		if c.ToolsToJSON != nil {
			wantTools = *c.ToolsToJSON
		}
		gotTools, err := tools.Render(tokenize.ChatInput{Messages: json.RawMessage(`[]`), Tools: req.Tools})
		if err != nil || gotTools != wantTools {
			t.Errorf("case %d tools:\n got %s (%v)\nwant %s\nfrom %s", i, gotTools, err, wantTools, req.Tools)
		}
	}
}

func TestParseResponsesFields(t *testing.T) {
	req, err := Parse("/v1/responses?x=1", []byte(`{"model":"m","input":"hi","stream":true,"max_output_tokens":64,
		"user":"u1","prompt_cache_key":"thread-9","cache_salt":"s","conversation":{"id":"conv_7"},
		"reasoning":{"effort":"low"},"chat_template_kwargs":{"enable_thinking":false,"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if req.Kind != KindResponses || req.Model != "m" || !req.Stream || req.MaxTokens != 64 || req.User != "u1" ||
		req.PromptCacheKey != "thread-9" || req.CacheSalt != "s" || req.SessionID != "conv_7" || req.Convert != nil {
		t.Errorf("fields: %+v", req)
	}
	if !req.AddSpecialTokens || !req.AddGenerationPrompt || req.ContinueFinalMessage {
		t.Errorf("flags: special %v, generation %v, continue %v", req.AddSpecialTokens, req.AddGenerationPrompt, req.ContinueFinalMessage)
	}
	if req.ToolChoice != nil {
		t.Errorf("tool_choice %s without one in the body", req.ToolChoice)
	}
	if r, err := ParseResponses([]byte(`{"input":"x","tool_choice":"none"}`)); err != nil || string(r.ToolChoice) != `"none"` {
		t.Errorf("tool_choice: %s, %v", r.ToolChoice, err)
	}
	// The body's kwargs are passed as sent, the effort beside them.
	if got, want := string(req.ChatTemplateKwargs), `{"enable_thinking":false,"x":1}`; got != want || req.ReasoningEffort != "low" {
		t.Errorf("kwargs %s effort %q, want %s low", got, req.ReasoningEffort, want)
	}
	for _, c := range []struct{ body, effort, session string }{
		{`{"input":"x","reasoning":{"effort":"none"}}`, "none", ""},
		{`{"input":"x","reasoning":{"effort":"high"},"metadata":{"session_id":"s1"}}`, "high", "s1"},
		{`{"input":"x","reasoning":{"summary":"auto"},"conversation":"conv_1"}`, ``, "conv_1"},
		// The same precedence as a chat body's.
		{`{"input":"x","metadata":{"conversation_id":"m2"},"conversation":{"id":"conv_2"},"session_id":"s0"}`, ``, "s0"},
		{`{"input":"x","metadata":{"conversation_id":"m2","session_id":7}}`, ``, "m2"},
		{`{"input":[{"role":"assistant","content":[{"type":"output_text","text":"Once"}],"type":"message","status":"incomplete"}]}`, ``, ""},
	} {
		req, err := ParseResponses([]byte(c.body))
		if err != nil || req.Convert != nil {
			t.Fatalf("%s: %v %v", c.body, err, req.Convert)
		}
		if req.ChatTemplateKwargs != nil || req.ReasoningEffort != c.effort || req.SessionID != c.session {
			t.Errorf("%s: kwargs %s effort %q session %q, want none %q %q", c.body, req.ChatTemplateKwargs, req.ReasoningEffort, req.SessionID, c.effort, c.session)
		}
	}
	// History the engine stored is not the router's to see: routed by session.
	req, err = ParseResponses([]byte(`{"model":"m","input":"next","previous_response_id":"resp_1","prompt_cache_key":"k"}`))
	if err != nil || !errors.Is(req.Convert, ErrResponsesUnsupported) || req.Messages != nil || req.PromptCacheKey != "k" {
		t.Errorf("previous_response_id: %v, %v, %s", err, req.Convert, req.Messages)
	}
	// A router converts none of it (a continuation's tools are not needed).
	if req, _ = ParseResponses([]byte(`{"input":"x","previous_response_id":"resp_1","tools":[{"type":"function","name":"f"}]}`)); req.Turn != nil || req.Tools != nil {
		t.Errorf("ParseResponses converted a continuation: turn %+v tools %s", req.Turn, req.Tools)
	}
	// Its own part of the prompt, for an engine to put around the history.
	req, err = ParseResponsesTurn([]byte(`{"model":"m","instructions":"Be brief.","previous_response_id":"resp_1",` +
		`"input":[{"type":"function_call_output","call_id":"c1","output":"42"},{"role":"user","content":"and?"}],"request_id":"resp_mine","store":false}`))
	if err != nil || req.Turn == nil || req.ResponseID != "resp_mine" || req.Store || req.Background {
		t.Fatalf("turn: %v %+v", err, req)
	}
	if got, want := string(req.Turn.System), `{"role":"system","content":"Be brief."}`; got != want {
		t.Errorf("turn system %s, want %s", got, want)
	}
	if got, want := string(req.Turn.Input), `[{"role":"tool","content":"42","tool_call_id":"c1"},{"role":"user","content":"and?"}]`; got != want {
		t.Errorf("turn input %s, want %s", got, want)
	}
	req, err = ParseResponsesTurn([]byte(`{"input":"x","previous_response_id":"resp_1","background":true}`))
	if err != nil || req.Turn == nil || req.Turn.System != nil || string(req.Turn.Input) != `[{"role":"user","content":"x"}]` || !req.Store || !req.Background || req.ResponseID != "" {
		t.Errorf("turn without instructions: %v %+v", err, req)
	}
	if req, _ = ParseResponsesTurn([]byte(`{"input":"x"}`)); req.Turn != nil || !req.Store {
		t.Errorf("a first response: turn %+v store %v", req.Turn, req.Store)
	}
	for _, bad := range []string{``, `[]`, `{"model":"m"}`, `{"input":null}`, `{"input":"x","model":3}`, `{"input":"x","stream":"yes"}`,
		`{"input":"x","max_output_tokens":-1}`, `{"input":"x","user":{}}`, `{"input":"x","store":"no"}`, `{"input":"x","request_id":1}`, `{"input":"x"} trailing`, `{"input":"x",}`} {
		if _, err := ParseResponses([]byte(bad)); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: err = %v, want ErrInvalidRequest", bad, err)
		}
	}
}

// FuzzParseResponses: any body gives an error wrapping ErrInvalidRequest
// or a request; a converted one holds valid JSON (messages, tools,
// kwargs), never both generation flags, and never panics on the way.
func FuzzParseResponses(f *testing.F) {
	for _, c := range responsesFixtures(f) {
		f.Add([]byte(c.Body))
	}
	for _, s := range []string{`{`, `null`, `{"input":[{}]}`, `{"input":[{"type":"function_call"}]}`, `{"input":"x","tools":[{"type":"namespace","tools":3}]}`,
		`{"input":[{"type":"reasoning","summary":[{"text":null}]}]}`, `{"input":"x","reasoning":{"effort":7}}`} {
		f.Add([]byte(s))
	}
	tmpl, err := tokenize.ParseChatTemplate([]byte(`{"chat_template": "{% for m in messages %}[{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments|tojson }}{% endfor %}]{% endfor %}{{ tools|tojson }}"}`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseResponses(body)
		if !parsedOrRefused(t, body, err) {
			return
		}
		if req.Convert != nil {
			if !errors.Is(req.Convert, ErrResponsesUnsupported) || req.Messages != nil {
				t.Fatalf("unconverted request: %v, %s", req.Convert, req.Messages)
			}
			return
		}
		for name, raw := range map[string][]byte{"messages": req.Messages, "tools": req.Tools, "kwargs": req.ChatTemplateKwargs} {
			if raw != nil && !json.Valid(raw) {
				t.Fatalf("%s are not valid JSON: %s", name, raw)
			}
		}
		if req.AddGenerationPrompt == req.ContinueFinalMessage {
			t.Fatalf("generation flags %v/%v", req.AddGenerationPrompt, req.ContinueFinalMessage)
		}
		// The converted request renders or is refused with an error; it
		// never panics the tokenizer.
		_, _ = tmpl.Render(tokenize.ChatInput{Messages: req.Messages, Tools: req.Tools, ChatTemplateKwargs: req.ChatTemplateKwargs,
			ReasoningEffort: req.ReasoningEffort, AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: req.ContinueFinalMessage})
	})
}

// jsonString writes what encoding/json writes with HTML escaping off.
func TestJSONStringAsEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\s`, "\b\f\n\r\t\x00\x1f\x7f", "<a&b>", "é😀", "\u2028\u2029", "bad\xffutf8\xc3", "\xed\xa0\x80", strings.Repeat("x", 300)} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		if got, want := string(jsonString(s)), strings.TrimSuffix(buf.String(), "\n"); got != want {
			t.Errorf("%q: %s, encoding/json %s", s, got, want)
		}
	}
}

func FuzzJSONString(f *testing.F) {
	f.Add("a\"\u2028\xff")
	f.Fuzz(func(t *testing.T, s string) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		if got, want := string(jsonString(s)), strings.TrimSuffix(buf.String(), "\n"); got != want {
			t.Fatalf("%q: %s, encoding/json %s", s, got, want)
		}
	})
}
