package openai

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestKindOf(t *testing.T) {
	for path, want := range map[string]Kind{
		"/v1/completions":             KindCompletion,
		"/v1/completions?x=1":         KindCompletion,
		"/v1/chat/completions":        KindChat,
		"/v1/chat/completions/":       KindChat,
		"/v1/chat/completions#frag":   KindChat,
		"/v1/embeddings":              KindUnknown,
		"/":                           KindUnknown,
		"":                            KindUnknown,
		"/v1/chat/completions/extra":  KindUnknown,
		"/V1/COMPLETIONS":             KindUnknown,
		"/prefix/v1/chat/completions": KindUnknown,
	} {
		if got := KindOf(path); got != want {
			t.Errorf("KindOf(%q) = %v, want %v", path, got, want)
		}
	}
	// Path is the inverse of KindOf on the APIs' own paths.
	for _, k := range []Kind{KindCompletion, KindChat, KindResponses, KindMessages} {
		if KindOf(k.Path()) != k {
			t.Errorf("%v: path %q", k, k.Path())
		}
	}
	if KindUnknown.Path() != "" {
		t.Errorf("unknown kind's path %q", KindUnknown.Path())
	}
}

func TestParseCompletion(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request
	}{
		{
			name: "string prompt with defaults",
			body: `{"model":"m","prompt":"hello"}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{Texts: []string{"hello"}}, AddSpecialTokens: true},
		},
		{
			name: "list of strings",
			body: `{"model":"m","prompt":["a","b"]}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{Texts: []string{"a", "b"}}, AddSpecialTokens: true},
		},
		{
			name: "token ids",
			body: `{"model":"m","prompt":[1,2,4294967295]}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{TokenIDs: [][]uint32{{1, 2, 4294967295}}}, AddSpecialTokens: true},
		},
		{
			name: "list of token id lists",
			body: `{"model":"m","prompt":[[1,2],[3]]}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{TokenIDs: [][]uint32{{1, 2}, {3}}}, AddSpecialTokens: true},
		},
		{
			name: "all routing fields",
			body: `{"model":"lora-a","prompt":"x","max_tokens":32,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"s1","add_special_tokens":false,"unknown_field":{"deep":[1]}}`,
			want: Request{Kind: KindCompletion, Model: "lora-a", Prompt: Prompt{Texts: []string{"x"}}, MaxTokens: 32, Stream: true, IncludeUsage: true, CacheSalt: "s1"},
		},
		{
			name: "stream_options present defaults include_usage to true",
			body: `{"model":"m","prompt":"x","stream":true,"stream_options":{}}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{Texts: []string{"x"}}, Stream: true, IncludeUsage: true, AddSpecialTokens: true},
		},
		{
			name: "include_usage false",
			body: `{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":false}}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{Texts: []string{"x"}}, Stream: true, AddSpecialTokens: true},
		},
		{
			name: "include_usage ignored without stream",
			body: `{"model":"m","prompt":"x","stream_options":{"include_usage":true}}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{Texts: []string{"x"}}, AddSpecialTokens: true},
		},
		{
			name: "prompt_embeds without prompt",
			body: `{"model":"m","prompt_embeds":"AAAA"}`,
			want: Request{Kind: KindCompletion, Model: "m", PromptEmbeds: true, AddSpecialTokens: true},
		},
		{
			name: "null model and max_tokens",
			body: `{"model":null,"prompt":"x","max_tokens":null}`,
			want: Request{Kind: KindCompletion, Prompt: Prompt{Texts: []string{"x"}}, AddSpecialTokens: true},
		},
		{
			name: "max_completion_tokens wins over max_tokens",
			body: `{"model":"m","prompt":"x","max_completion_tokens":7,"max_tokens":9}`,
			want: Request{Kind: KindCompletion, Model: "m", Prompt: Prompt{Texts: []string{"x"}}, MaxTokens: 7, AddSpecialTokens: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("/v1/completions", []byte(tc.body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("request mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseChat(t *testing.T) {
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]`
	decoded := []Message{
		{Role: "system", Content: "be brief", Raw: json.RawMessage(`{"role":"system","content":"be brief"}`)},
		{Role: "user", Content: "hi", Raw: json.RawMessage(`{"role":"user","content":[{"type":"text","text":"hi"}]}`)},
	}
	tests := []struct {
		name string
		body string
		want Request
	}{
		{
			name: "defaults",
			body: `{"model":"m","messages":` + msgs + `}`,
			want: Request{Kind: KindChat, Model: "m", Messages: json.RawMessage(msgs), ChatMessages: decoded, AddGenerationPrompt: true},
		},
		{
			name: "tools kwargs continue",
			body: `{"model":"m","messages":` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,"continue_final_message":true,"max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"t"}`,
			want: Request{
				Kind: KindChat, Model: "m", Messages: json.RawMessage(msgs), ChatMessages: decoded,
				Tools:                json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`),
				ChatTemplateKwargs:   json.RawMessage(`{"enable_thinking":false}`),
				ContinueFinalMessage: true, MaxTokens: 5, Stream: true, IncludeUsage: true, CacheSalt: "t",
			},
		},
		{
			name: "null tools and kwargs",
			body: `{"model":"m","messages":` + msgs + `,"tools":null,"chat_template_kwargs":null,"add_special_tokens":true}`,
			want: Request{Kind: KindChat, Model: "m", Messages: json.RawMessage(msgs), ChatMessages: decoded, AddGenerationPrompt: true, AddSpecialTokens: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("/v1/chat/completions", []byte(tc.body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("request mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name    string
		path    string
		body    string
		wantMsg string
	}{
		{"empty body", PathCompletions, ``, "empty body"},
		{"whitespace body", PathChatCompletions, " \n", "empty body"},
		{"not an object", PathCompletions, `[1,2]`, "not a JSON object"},
		{"truncated json", PathCompletions, `{"model":"m","prompt":"x"`, "JSON"},
		{"trailing garbage", PathCompletions, `{"model":"m","prompt":"x"} x`, "invalid"},
		{"model not string", PathCompletions, `{"model":3,"prompt":"x"}`, `"model": expected a string, got number`},
		{"max_tokens string", PathCompletions, `{"model":"m","prompt":"x","max_tokens":"5"}`, `"max_tokens"`},
		{"max_tokens float", PathCompletions, `{"model":"m","prompt":"x","max_tokens":1.5}`, `"max_tokens"`},
		{"max_tokens negative", PathCompletions, `{"model":"m","prompt":"x","max_tokens":-1}`, "out of range"},
		{"stream not bool", PathCompletions, `{"model":"m","prompt":"x","stream":"yes"}`, `"stream"`},
		{"missing prompt", PathCompletions, `{"model":"m"}`, `"prompt" is required`},
		{"null prompt", PathCompletions, `{"model":"m","prompt":null}`, `"prompt" is required`},
		{"prompt number", PathCompletions, `{"model":"m","prompt":5}`, `"prompt": expected`},
		{"prompt object", PathCompletions, `{"model":"m","prompt":{}}`, `"prompt": expected`},
		{"empty prompt list", PathCompletions, `{"model":"m","prompt":[]}`, "must not be empty"},
		{"mixed prompt list", PathCompletions, `{"model":"m","prompt":["a",1]}`, `"prompt[1]": expected a string`},
		{"negative token", PathCompletions, `{"model":"m","prompt":[1,-2]}`, "out of range"},
		{"token too large", PathCompletions, `{"model":"m","prompt":[4294967296]}`, "out of range"},
		{"float token", PathCompletions, `{"model":"m","prompt":[1.5]}`, "token ids"},
		{"nested mixed", PathCompletions, `{"model":"m","prompt":[[1],2]}`, `"prompt[1]"`},
		{"nested empty", PathCompletions, `{"model":"m","prompt":[[1],[]]}`, "must not be empty"},
		{"empty cache salt", PathCompletions, `{"model":"m","prompt":"x","cache_salt":""}`, "cache_salt"},
		{"cache salt number", PathCompletions, `{"model":"m","prompt":"x","cache_salt":1}`, "cache_salt"},
		{"stream_options not object", PathCompletions, `{"model":"m","prompt":"x","stream_options":true}`, "stream_options"},
		{"missing messages", PathChatCompletions, `{"model":"m"}`, `"messages" is required`},
		{"messages object", PathChatCompletions, `{"model":"m","messages":{}}`, `"messages": expected`},
		{"messages empty", PathChatCompletions, `{"model":"m","messages":[]}`, "must not be empty"},
		{"message not object", PathChatCompletions, `{"model":"m","messages":["hi"]}`, `"messages[0]": expected an object`},
		{"tools object", PathChatCompletions, `{"model":"m","messages":[{}],"tools":{}}`, `"tools"`},
		{"kwargs array", PathChatCompletions, `{"model":"m","messages":[{}],"chat_template_kwargs":[]}`, `"chat_template_kwargs"`},
		{"continue with default generation prompt", PathChatCompletions, `{"model":"m","messages":[{}],"continue_final_message":true}`, "mutually exclusive"},
		{"continue with explicit generation prompt", PathChatCompletions, `{"model":"m","messages":[{}],"continue_final_message":true,"add_generation_prompt":true}`, "mutually exclusive"},
		{"unknown path", "/v1/embeddings", `{"model":"m"}`, "unknown path"},
		{"user not string", PathChatCompletions, `{"model":"m","messages":[{}],"user":5}`, `"user": expected a string`},
		{"bad escape in skipped field", PathChatCompletions, `{"model":"m","messages":[{}],"x":"\q"}`, "malformed JSON"},
		{"control char in skipped string", PathChatCompletions, "{\"model\":\"m\",\"messages\":[{}],\"x\":\"a\u0001\"}", "malformed JSON"},
		{"bad number in skipped field", PathCompletions, `{"model":"m","prompt":"x","n":01}`, "malformed JSON"},
		{"bad literal in message", PathChatCompletions, `{"model":"m","messages":[{"role":"user","content":nul}]}`, "malformed JSON"},
		{"unterminated content", PathChatCompletions, `{"model":"m","messages":[{"role":"user","content":"ab`, "malformed JSON"},
		{"max_tokens too big", PathCompletions, `{"model":"m","prompt":"x","max_tokens":99999999999999999999}`, `"max_tokens"`},
		{"max_tokens exponent", PathCompletions, `{"model":"m","prompt":"x","max_tokens":1e3}`, `"max_tokens"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.path, []byte(tc.body))
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("error %v does not wrap ErrInvalidRequest", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tc.wantMsg)
			}
			if strings.Contains(err.Error(), "rawRequest") {
				t.Errorf("error %q leaks an internal type name", err)
			}
		})
	}
}

func TestModel(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"emb","input":"x"}`: "emb",
		`{"model":3}`:                 "",
		`{"input":"x"}`:               "",
		`not json`:                    "",
		`["model"]`:                   "",
		``:                            "",
	} {
		if got := Model([]byte(body)); got != want {
			t.Errorf("Model(%q) = %q, want %q", body, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","prompt":[[1,2],[3]],"max_tokens":4}`,
		`{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"chat_template_kwargs":{}}`,
		`{"prompt":["a","b"],"cache_salt":"s"}`,
		`{"model":"m","prompt":[1e3]}`,
		`{"model":"m","prompt":[-0,7]}`, `{"model":"m","prompt":["a\u00e9\ud800"],"model":"n"}`,
		`{`, `null`, `[]`, `""`,
	} {
		f.Add(false, []byte(s))
		f.Add(true, []byte(s))
	}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		path := PathCompletions
		if chat {
			path = PathChatCompletions
		}
		req, err := Parse(path, body)
		if !parsedOrRefused(t, body, err) {
			return
		}
		if chat {
			if req.Kind != KindChat || len(req.Messages) == 0 || !json.Valid(req.Messages) {
				t.Fatalf("chat request without valid messages: %+v", req)
			}
			if req.AddGenerationPrompt && req.ContinueFinalMessage {
				t.Fatal("both add_generation_prompt and continue_final_message")
			}
		} else {
			if req.Kind != KindCompletion || (req.Prompt.Empty() && !req.PromptEmbeds) {
				t.Fatalf("completion request without prompt: %+v", req)
			}
			if len(req.Prompt.Texts) > 0 && len(req.Prompt.TokenIDs) > 0 {
				t.Fatal("prompt has two forms")
			}
		}
		if req.MaxTokens < 0 {
			t.Fatalf("negative MaxTokens %d", req.MaxTokens)
		}
		// What was decoded is what encoding/json decodes (exact keys, the
		// last of duplicates, as a map holds them).
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("encoding/json rejects an accepted body: %v", err)
		}
		var model string
		_ = json.Unmarshal(top["model"], &model)
		if model != req.Model {
			t.Fatalf("model %q, encoding/json %q", req.Model, model)
		}
		if !chat && len(req.Prompt.Texts) > 0 {
			var one string
			var many []string
			if json.Unmarshal(top["prompt"], &one) == nil {
				many = []string{one}
			} else if err := json.Unmarshal(top["prompt"], &many); err != nil {
				t.Fatalf("prompt texts from %s: %v", top["prompt"], err)
			}
			if !slices.Equal(many, req.Prompt.Texts) {
				t.Fatalf("prompt %q, encoding/json %q", req.Prompt.Texts, many)
			}
		}
		if !chat && len(req.Prompt.TokenIDs) > 0 {
			var one []int64 // as vLLM reads them: -0 is 0
			var many [][]int64
			if json.Unmarshal(top["prompt"], &one) == nil {
				many = [][]int64{one}
			} else if err := json.Unmarshal(top["prompt"], &many); err != nil {
				t.Fatalf("prompt ids from %s: %v", top["prompt"], err)
			}
			same := slices.EqualFunc(many, req.Prompt.TokenIDs, func(a []int64, b []uint32) bool {
				return slices.EqualFunc(a, b, func(x int64, y uint32) bool { return x == int64(y) })
			})
			if !same {
				t.Fatalf("prompt %v, encoding/json %v", req.Prompt.TokenIDs, many)
			}
		}
		if !req.Stream && req.IncludeUsage {
			t.Fatal("IncludeUsage without Stream")
		}
	})
}

// reasoning_effort is carried beside the request's own kwargs, for the
// tokenizer to merge as vLLM 0.33 does (tokenize's TestRenderReasoningEffort).
func TestChatReasoningEffortAndDocuments(t *testing.T) {
	for _, c := range []struct{ body, kwargs, effort string }{
		{`"reasoning_effort":"low"`, ``, `low`},
		{`"reasoning_effort":"none","chat_template_kwargs":{"x":1,"reasoning_effort":"high"}`, `{"x":1,"reasoning_effort":"high"}`, `none`},
		{`"reasoning_effort":null,"chat_template_kwargs":{"a":2}`, `{"a":2}`, ``},
	} {
		req, err := ParseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],` + c.body + `}`))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if string(req.ChatTemplateKwargs) != c.kwargs || req.ReasoningEffort != c.effort {
			t.Errorf("%s: kwargs %s effort %q, want %s %q", c.body, req.ChatTemplateKwargs, req.ReasoningEffort, c.kwargs, c.effort)
		}
	}
	// tool_choice is kept raw (SGLang's rendering depends on it).
	for body, want := range map[string]string{`"tool_choice":"none"`: `"none"`, `"tool_choice":{"type":"function","function":{"name":"f"}}`: `{"type":"function","function":{"name":"f"}}`, `"tool_choice":null`: ``} {
		req, err := ParseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],` + body + `}`))
		if err != nil || string(req.ToolChoice) != want {
			t.Errorf("%s: tool_choice %s, %v", body, req.ToolChoice, err)
		}
	}
	req, err := ParseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[{"title":"t","text":"x"}]}`))
	if err != nil || string(req.Documents) != `[{"title":"t","text":"x"}]` {
		t.Errorf("documents: %s, %v", req.Documents, err)
	}
	for _, bad := range []string{`"reasoning_effort":"extreme"`, `"reasoning_effort":3`, `"documents":{"title":"t"}`} {
		if _, err := ParseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],` + bad + `}`)); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: err = %v, want ErrInvalidRequest", bad, err)
		}
	}
}

// parsedOrRefused checks a parse of a fuzzed body: an error must wrap
// ErrInvalidRequest, an acceptance needs valid JSON. It reports whether
// the body was accepted.
func parsedOrRefused(t *testing.T, body []byte, err error) bool {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
		}
		return false
	}
	if !json.Valid(body) {
		t.Fatalf("accepted invalid JSON %q", body)
	}
	return true
}
