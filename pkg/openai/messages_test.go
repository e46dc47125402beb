package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func TestMessagesIdentity(t *testing.T) {
	for _, c := range []struct {
		name, meta, session, client, user string
	}{
		{"legacy Claude Code user_id", `{"user_id":"user_0a1b_account_5f2e_session_9d3c-77aa"}`, "", "9d3c-77aa", ""},
		{"legacy without an account", `{"user_id":"user_0a1b_account__session_abc"}`, "", "abc", ""},
		{"JSON-string user_id (2.1.78+)", `{"user_id":"{\"device_id\":\"d1\",\"account_uuid\":\"\",\"session_id\":\"s-42\"}"}`, "", "s-42", ""},
		{"object user_id", `{"user_id":{"session_id":"s-7"}}`, "", "s-7", ""},
		{"plain user_id is the user", `{"user_id":"alice"}`, "", "", "alice"},
		{"JSON-string user_id without a session", `{"user_id":"{\"device_id\":\"d1\"}"}`, "", "", `{"device_id":"d1"}`},
		{"a named conversation first", `{"session_id":"conv-1","user_id":"user_x_account_y_session_z"}`, "conv-1", "", ""},
		{"trailing _session_ names nothing", `{"user_id":"bob_session_"}`, "", "", "bob_session_"},
		{"no metadata", `null`, "", "", ""},
	} {
		body := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"metadata":` + c.meta + `}`
		req, err := ParseMessages([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if req.SessionID != c.session || req.PromptCacheKey != c.client || req.User != c.user {
			t.Errorf("%s: session %q client %q user %q, want %q %q %q", c.name, req.SessionID, req.PromptCacheKey, req.User, c.session, c.client, c.user)
		}
	}
}

func TestMessagesErrors(t *testing.T) {
	for _, body := range []string{``, `[]`, `{"model":`, `"x"`, `{"model":"m"} x`} {
		if _, err := ParseMessages([]byte(body)); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%q: error %v, want ErrInvalidRequest", body, err)
		}
	}
	// Valid JSON vLLM would refuse: routed, not converted.
	for _, c := range []struct{ body, why string }{
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{`{"model":"","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"tool","content":"x"}]}`, "role"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":null}]}`, "content"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"video"}]}]}`, "type"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}`, "text"},
		{`{"model":"m","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":512},"messages":[{"role":"user","content":"x"}]}`, "budget"},
		{`{"model":"m","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":4096},"messages":[{"role":"user","content":"x"}]}`, "budget"},
		{`{"model":"m","max_tokens":1,"tools":[{"name":"t"}],"messages":[{"role":"user","content":"x"}]}`, "input_schema"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_addition","tool":{"type":"tool_reference","name":"t"}}]}]}`, "system"},
		{`{"model":"m","max_tokens":1,"tools":[],"messages":[{"role":"system","content":[{"type":"tool_addition","tool":{"type":"tool_reference","name":"t"}}]}]}`, "not declared"},
		{`{"model":"m","max_tokens":1,"output_config":{"effort":"extreme"},"messages":[{"role":"user","content":"x"}]}`, "effort"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a","content":["x"]}]}]}`, "non-object"},
	} {
		req, err := ParseMessages([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if !errors.Is(req.Convert, ErrMessagesUnsupported) || !strings.Contains(req.Convert.Error(), c.why) {
			t.Errorf("%s: Convert %v, want ErrMessagesUnsupported naming %q", c.body, req.Convert, c.why)
		}
		if req.Messages != nil || req.Tools != nil || req.SystemFirstMessages != nil {
			t.Errorf("%s: unconverted request keeps a prompt", c.body)
		}
	}
	// The thinking budget is not checked against max_tokens on a
	// disaggregated prefill leg.
	req, _ := ParseMessages([]byte(`{"model":"m","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true},"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"}]}`))
	if req.Convert != nil {
		t.Errorf("prefill leg: %v", req.Convert)
	}
}

func TestMessagesToolUseWithoutID(t *testing.T) {
	req, err := ParseMessages([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f"}]}]}`))
	if err != nil || req.Convert != nil {
		t.Fatal(err, req.Convert)
	}
	// vLLM names it by the second it converts the request in, and sends
	// {} for a missing input.
	want := regexp.MustCompile(`^\[\{"role":"assistant","tool_calls":\[\{"id":"call_[0-9]{10}","type":"function","function":\{"name":"f","arguments":"\{\}"\}\}\]\}\]$`)
	if !want.Match(req.Messages) {
		t.Errorf("messages %s", req.Messages)
	}
}

func TestMessagesKwargsAndFlags(t *testing.T) {
	for _, c := range []struct {
		extra, kwargs, effort string
		disabled              bool
	}{
		{``, ``, ``, false},
		{`,"output_config":{"effort":"high"}`, ``, `high`, false},
		// The body's own arguments are passed as sent; the tokenizer merges
		// the effort over them.
		{`,"output_config":{"effort":"low"},"chat_template_kwargs":{"enable_thinking":false,"x":1}`, `{"enable_thinking":false,"x":1}`, `low`, false},
		// Disabled thinking wins over an effort; the template decides.
		{`,"output_config":{"effort":"max"},"thinking":{"type":"disabled"},"chat_template_kwargs":{"x":1}`, `{"x":1}`, ``, true},
		{`,"thinking":{"type":"adaptive"}`, ``, ``, false},
		{`,"thinking":{"type":"enabled","budget_tokens":1024}`, ``, ``, false},
	} {
		req, err := ParseMessages([]byte(`{"model":"m","max_tokens":4096,"messages":[{"role":"user","content":"x"}]` + c.extra + `}`))
		if err != nil || req.Convert != nil {
			t.Fatalf("%s: %v %v", c.extra, err, req.Convert)
		}
		if string(req.ChatTemplateKwargs) != c.kwargs || req.ReasoningEffort != c.effort || req.ThinkingDisabled != c.disabled {
			t.Errorf("%s: kwargs %s effort %q disabled %v, want %s %q %v", c.extra, req.ChatTemplateKwargs, req.ReasoningEffort, req.ThinkingDisabled, c.kwargs, c.effort, c.disabled)
		}
		if !req.AddGenerationPrompt || req.AddSpecialTokens || req.Kind != KindMessages || req.MaxTokens != 4096 {
			t.Errorf("%s: flags %+v", c.extra, req)
		}
	}
	// tool_choice none becomes the chat request's "none"; the other types
	// do not change the prompt and are not carried.
	for extra, want := range map[string]string{`,"tool_choice":{"type":"none"}`: `"none"`, `,"tool_choice":{"type":"auto"}`: ``, `,"tool_choice":{"type":"tool","name":"f"}`: ``, ``: ``} {
		req, err := ParseMessages([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"x"}]` + extra + `}`))
		if err != nil || req.Convert != nil || string(req.ToolChoice) != want {
			t.Errorf("%s: tool_choice %s, %v %v", extra, req.ToolChoice, err, req.Convert)
		}
	}
	if KindOf("/v1/messages?beta=true") != KindMessages || KindOf("/v1/messages/count_tokens") != KindUnknown {
		t.Error("KindOf")
	}
	if req, err := Parse("/v1/messages", []byte(`{"model":"m","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"x"}]}`)); err != nil || req.Kind != KindMessages || !req.Stream {
		t.Errorf("Parse: %+v %v", req, err)
	}
}

// TestMessagesSystemFirst: the merged conversation is kept only when it
// differs from the plain one (an inline system message with text that is
// not already the only, leading one).
func TestMessagesSystemFirst(t *testing.T) {
	for _, c := range []struct {
		msgs, system string
		merged       bool
	}{
		{`[{"role":"user","content":"x"}]`, `"S"`, false},
		{`[{"role":"system","content":""},{"role":"user","content":"x"}]`, `"S"`, false},
		{`[{"role":"system","content":"x-anthropic-billing-header: cc"},{"role":"user","content":"x"}]`, `"S"`, false},
		{`[{"role":"user","content":"x"},{"role":"system","content":[{"type":"text","text":"R"}]}]`, `"S"`, true},
		// A leading inline system message alone is already system-first.
		{`[{"role":"system","content":"R"},{"role":"user","content":"x"}]`, `null`, false},
		{`[{"role":"user","content":"x"},{"role":"system","content":"R"}]`, `null`, true},
	} {
		req, err := ParseMessages([]byte(`{"model":"m","max_tokens":1,"system":` + c.system + `,"messages":` + c.msgs + `}`))
		if err != nil || req.Convert != nil {
			t.Fatalf("%s: %v %v", c.msgs, err, req.Convert)
		}
		if (req.SystemFirstMessages != nil) != c.merged {
			t.Errorf("%s: merged %s", c.msgs, req.SystemFirstMessages)
		}
		var got []map[string]any
		if c.merged && (json.Unmarshal(req.SystemFirstMessages, &got) != nil || got[0]["role"] != "system") {
			t.Errorf("%s: merged %s does not lead with the system message", c.msgs, req.SystemFirstMessages)
		}
	}
}

// messagesFixture is one case of testdata/messages.json: a body and what
// vLLM 0.33's own conversion made of it, with and without the inline-system
// merge (hack/messages-fixtures/gen.py ran vLLM's code on it).
type messagesFixture struct {
	Name    string          `json:"name"`
	Body    json.RawMessage `json:"body"`
	Invalid string          `json:"invalid"`
	Error   string          `json:"error"`
	Plain   messagesWant    `json:"plain"`
	Merged  messagesWant    `json:"merged"`
}

type messagesWant struct {
	Messages        json.RawMessage `json:"messages"`
	Tools           json.RawMessage `json:"tools"`
	ReasoningEffort *string         `json:"reasoning_effort"`
	Kwargs          json.RawMessage `json:"chat_template_kwargs"`
	Stream          *bool           `json:"stream"`
	MaxTokens       *int            `json:"max_tokens"`
}

func messagesFixtures(tb testing.TB) []messagesFixture {
	tb.Helper()
	data, err := os.ReadFile("testdata/messages.json")
	if err != nil {
		tb.Fatal(err)
	}
	var fx struct {
		Cases []messagesFixture `json:"cases"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		tb.Fatal(err)
	}
	if len(fx.Cases) < 60 {
		tb.Fatalf("only %d cases", len(fx.Cases))
	}
	return fx.Cases
}

// fixtureValue decodes JSON for comparison: numbers as exact decimals, and a
// tool call's arguments string as the value it holds (vLLM writes them
// with Python's json.dumps and the template sees them parsed; "Infinity"
// is Python's form of an overflowing literal).
func fixtureValue(t *testing.T, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return normalize(t, v, "")
}

func normalize(t *testing.T, v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(t, e, k)
		}
	case []any:
		for i, e := range x {
			x[i] = normalize(t, e, "")
		}
	case json.Number:
		// Python's json.loads: an integer literal is an int (-0 is 0), any
		// other a float.
		if !strings.ContainsAny(string(x), ".eE") {
			n, ok := new(big.Int).SetString(string(x), 10)
			if !ok {
				t.Fatalf("number %s", x)
			}
			return "int " + n.String()
		}
		f, _, err := big.ParseFloat(string(x), 10, 200, big.ToNearestEven)
		if err != nil {
			t.Fatalf("number %s: %v", x, err)
		}
		return "float " + f.Text('g', 40)
	case string:
		if key == "arguments" {
			return fixtureValue(t, []byte(strings.ReplaceAll(x, "Infinity", "1e400")))
		}
	}
	return v
}

func TestMessagesConvertAsVLLMDoes(t *testing.T) {
	converted := 0
	for _, c := range messagesFixtures(t) {
		req, err := ParseMessages(c.Body)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		switch c.Name {
		case "invalid_stop_sequences_too_many":
			// The limit is the engine's VLLM_MAX_STOP_STRINGS; the prompt
			// does not depend on it, and the engine answers.
			continue
		}
		if c.Invalid != "" || c.Error != "" {
			// vLLM refuses it; the router leaves the answer to the engine
			// and routes it by load. Lax forms vLLM accepts (a numeric
			// string for an integer) are refused here too: a request
			// routed by load, never a wrong prompt.
			if req.Convert == nil {
				t.Errorf("%s: vLLM refuses it (%s%s), converted", c.Name, c.Invalid, c.Error)
			}
			continue
		}
		if req.Convert != nil {
			if c.Name == "lax_types" && errors.Is(req.Convert, ErrMessagesUnsupported) {
				continue // max_tokens 64.0 and stream "true": pydantic's lax coercions
			}
			t.Errorf("%s: %v", c.Name, req.Convert)
			continue
		}
		converted++
		merged := req.SystemFirstMessages
		if merged == nil {
			merged = req.Messages
		}
		for _, cmpCase := range []struct {
			what      string
			got, want json.RawMessage
		}{
			{"messages", req.Messages, c.Plain.Messages},
			{"merged messages", merged, c.Merged.Messages},
			{"tools", nullIfNil(req.Tools), c.Plain.Tools},
		} {
			if !reflect.DeepEqual(fixtureValue(t, cmpCase.got), fixtureValue(t, cmpCase.want)) {
				t.Errorf("%s %s:\n got %s\nwant %s", c.Name, cmpCase.what, cmpCase.got, cmpCase.want)
			}
		}
		// The template arguments: vLLM's chat_template_kwargs, and its
		// reasoning_effort, which the tokenizer merges as for a chat
		// request; disabled thinking (the only way the fixture gets "none")
		// leaves the effort to the tokenizer.
		wantKw := c.Plain.Kwargs
		if isNull(wantKw) {
			wantKw = nil
		}
		switch e := c.Plain.ReasoningEffort; {
		case e != nil && *e == "none":
			if !req.ThinkingDisabled || req.ReasoningEffort != "" {
				t.Errorf("%s: vLLM disables thinking, ThinkingDisabled %v, effort %q", c.Name, req.ThinkingDisabled, req.ReasoningEffort)
			}
		case req.ThinkingDisabled:
			t.Errorf("%s: ThinkingDisabled, vLLM's effort %v", c.Name, e)
		case e != nil && req.ReasoningEffort != *e, e == nil && req.ReasoningEffort != "":
			t.Errorf("%s: effort %q, vLLM's %v", c.Name, req.ReasoningEffort, e)
		}
		if !reflect.DeepEqual(fixtureValue(t, nullIfNil(req.ChatTemplateKwargs)), fixtureValue(t, nullIfNil(wantKw))) {
			t.Errorf("%s kwargs: got %s want %s", c.Name, req.ChatTemplateKwargs, wantKw)
		}
		if c.Plain.MaxTokens != nil && req.MaxTokens != *c.Plain.MaxTokens {
			t.Errorf("%s: max tokens %d, vLLM %d", c.Name, req.MaxTokens, *c.Plain.MaxTokens)
		}
		if wantStream := c.Plain.Stream != nil && *c.Plain.Stream; req.Stream != wantStream {
			t.Errorf("%s: stream %v, vLLM %v", c.Name, req.Stream, wantStream)
		}
	}
	if converted < 60 {
		t.Errorf("only %d bodies converted", converted)
	}
}

func nullIfNil(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return json.RawMessage("null")
	}
	return raw
}

func FuzzParseMessages(f *testing.F) {
	for _, c := range messagesFixtures(f) {
		f.Add([]byte(c.Body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseMessages(body)
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		if req.Convert != nil {
			if !errors.Is(req.Convert, ErrMessagesUnsupported) || req.Messages != nil || req.SystemFirstMessages != nil || req.Tools != nil {
				t.Fatalf("unconverted request: %v, %s", req.Convert, req.Messages)
			}
			return
		}
		for name, raw := range map[string][]byte{"messages": req.Messages, "merged": req.SystemFirstMessages, "tools": req.Tools, "kwargs": req.ChatTemplateKwargs} {
			if raw != nil && !json.Valid(raw) {
				t.Fatalf("%s are not valid JSON: %s", name, raw)
			}
		}
	})
}
