package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// renderedJSON is the part of a render endpoint's answer the tests read.
type renderedJSON struct {
	RequestID      string   `json:"request_id"`
	TokenIDs       []uint32 `json:"token_ids"`
	Model          string   `json:"model"`
	SamplingParams struct {
		MaxTokens int `json:"max_tokens"`
	} `json:"sampling_params"`
}

// TestRenderEndpoints: with --enable-scale-out each API's render endpoint
// answers with the token ids its generation endpoint runs, rendered by the
// model's template (a chat with reasoning_effort, a Claude Code Messages
// turn with tools, a Responses input, a completions batch: one
// GenerateRequest a prompt), and with the max_tokens it would run; a body
// the endpoint refuses gets its API's error; without the flag the
// endpoints do not exist.
func TestRenderEndpoints(t *testing.T) {
	dir := tokenizerDir(t, "qwen3")
	ref := loadReference(t, dir)
	s := startSim(t, "--tokenizer-dir", dir, "--kv-events-disable", "--enable-scale-out", "--max-model-len", "8192")
	refIDs := func(in route.TokenizeInput) []uint32 {
		t.Helper()
		got, err := ref.Tokenize(in)
		if err != nil {
			t.Fatal(err)
		}
		return got.IDs
	}
	parse := func(path, body string) openai.Request {
		t.Helper()
		p, err := openai.Parse(path, []byte(body))
		if err != nil || p.Convert != nil {
			t.Fatalf("%s: %v %v", path, err, p.Convert)
		}
		return p
	}
	chat := `{"model": "sim-model", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}], "reasoning_effort": "none", "max_tokens": 7}`
	responses := `{"model": "sim-model", "instructions": "Answer in French.", "input": "Hello there", "max_output_tokens": 5}`
	p := parse("/v1/chat/completions", chat)
	chatIDs := refIDs(route.TokenizeInput{Chat: true, Messages: p.Messages, ReasoningEffort: p.ReasoningEffort, AddGenerationPrompt: true})
	p = parse("/v1/messages", claudeCodeTurn)
	msgIDs := refIDs(route.TokenizeInput{Chat: true, Messages: p.Messages, Tools: p.Tools, AddGenerationPrompt: true})
	p = parse("/v1/responses", responses)
	respIDs := refIDs(route.TokenizeInput{Chat: true, Messages: p.Messages, AddGenerationPrompt: true, AddSpecialTokens: true})
	for _, c := range []struct {
		path, body string
		want       []uint32
		maxTokens  int
	}{
		{"/v1/chat/completions", chat, chatIDs, 7},
		{"/v1/messages", claudeCodeTurn, msgIDs, 3},
		{"/v1/responses", responses, respIDs, 5},
	} {
		code, b := s.post(t, c.path+"/render", c.body)
		var got renderedJSON
		if err := json.Unmarshal(b, &got); code != http.StatusOK || err != nil {
			t.Fatalf("%s/render: %d %s (%v)", c.path, code, b, err)
		}
		if !slices.Equal(got.TokenIDs, c.want) || got.Model != "sim-model" || got.SamplingParams.MaxTokens != c.maxTokens || got.RequestID == "" {
			t.Errorf("%s/render: %d ids, model %q, max_tokens %d; want the reference's %d ids and max_tokens %d",
				c.path, len(got.TokenIDs), got.Model, got.SamplingParams.MaxTokens, len(c.want), c.maxTokens)
		}
	}
	// The generation endpoint runs those very ids.
	code, b := s.post(t, "/v1/chat/completions", chat)
	var cr completionJSON
	if err := json.Unmarshal(b, &cr); code != http.StatusOK || err != nil || cr.Usage == nil || cr.Usage.PromptTokens != len(chatIDs) {
		t.Errorf("chat ran %s, want %d prompt tokens", b, len(chatIDs))
	}
	// A completions batch: one GenerateRequest a prompt.
	code, b = s.post(t, "/v1/completions/render", `{"model": "sim-model", "prompt": ["Hello world", "Goodbye"], "max_tokens": 2}`)
	var batch []renderedJSON
	if err := json.Unmarshal(b, &batch); code != http.StatusOK || err != nil || len(batch) != 2 {
		t.Fatalf("completions/render: %d %s", code, b)
	}
	for i, prompt := range []string{"Hello world", "Goodbye"} {
		if want := refIDs(route.TokenizeInput{Prompt: prompt, AddSpecialTokens: true}); !slices.Equal(batch[i].TokenIDs, want) {
			t.Errorf("prompt %d: %v, want %v", i, batch[i].TokenIDs, want)
		}
	}
	// Refused as the generation endpoint refuses it.
	if code, b = s.post(t, "/v1/chat/completions/render", `{"model": "sim-model", "messages": []}`); code != http.StatusBadRequest {
		t.Errorf("empty messages: %d %s", code, b)
	}
	if code, b = s.post(t, "/v1/chat/completions/render", `{"model": "other", "messages": [{"role": "user", "content": "x"}]}`); code != http.StatusNotFound {
		t.Errorf("unknown model: %d %s", code, b)
	}

	plain := startSim(t, "--kv-events-disable")
	if code, _ := plain.post(t, "/v1/chat/completions/render", chat); code != http.StatusNotFound {
		t.Errorf("without --enable-scale-out: %d", code)
	}
}

// renderInput is what ext_proc hands the tokenizer for body on path (as
// extproc.FillRequest maps it), the body and its API included.
func renderInput(t *testing.T, path, body string) route.TokenizeInput {
	t.Helper()
	p, err := openai.Parse(path, []byte(body))
	if err != nil || p.Convert != nil {
		t.Fatalf("%s: %v %v", path, err, p.Convert)
	}
	in := route.TokenizeInput{Body: []byte(body), API: path, AddSpecialTokens: p.AddSpecialTokens}
	if p.Kind == openai.KindCompletion {
		in.Prompt = p.Prompt.Texts[0]
		return in
	}
	in.Chat, in.Messages, in.Tools, in.ChatTemplateKwargs = true, p.Messages, p.Tools, p.ChatTemplateKwargs
	in.ReasoningEffort, in.AddGenerationPrompt, in.ContinueFinalMessage = p.ReasoningEffort, p.AddGenerationPrompt, p.ContinueFinalMessage
	in.SystemFirst, in.ThinkingDisabled = p.SystemFirstMessages, p.ThinkingDisabled
	return in
}

// TestRenderSelfCheck: a local tokenizer self-checked against the engine's
// render endpoints is checked on requests /tokenize cannot reproduce (a
// Messages turn with thinking disabled and inline system text, a
// Responses body, an empty tools list), and they all match; with another
// model's files on the engine it is demoted, and its requests are then
// served by the render endpoints, from their bodies.
func TestRenderSelfCheck(t *testing.T) {
	ctx := t.Context()
	sim := startSim(t, "--tokenizer-dir", tokenizerDir(t, "qwen3"), "--kv-events-disable", "--enable-scale-out", "--max-model-len", "8192")
	tok := selfCheckedWith(t, "qwen3", sim.base, tokenize.SelfCheckRender)
	defer tok.Close()
	disabled := `{"model": "sim-model", "max_tokens": 4, "thinking": {"type": "disabled"},
		"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
		{"role": "system", "content": "Be brief from now on."}, {"role": "user", "content": "second"}]}`
	inputs := []route.TokenizeInput{
		renderInput(t, "/v1/messages", disabled),
		renderInput(t, "/v1/messages", claudeCodeTurn),
		renderInput(t, "/v1/responses", `{"model": "sim-model", "instructions": "Be terse.", "input": "Hi", "reasoning": {"effort": "low"}}`),
		renderInput(t, "/v1/chat/completions", `{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "tools": []}`),
		renderInput(t, "/v1/completions", `{"model": "sim-model", "prompt": "Hello world"}`),
	}
	if !inputs[0].ThinkingDisabled || inputs[0].SystemFirst == nil {
		t.Fatalf("the Messages body: thinking disabled %v, inline system text %v", inputs[0].ThinkingDisabled, inputs[0].SystemFirst != nil)
	}
	for _, in := range inputs {
		got, err := tok.Tokenize(ctx, "sim-model", in)
		if err != nil || got.Source != tokenize.SourceLocal {
			t.Fatalf("%s: %+v %v", in.API, got.Source, err)
		}
	}
	want := uint64(len(inputs))
	st := waitState(t, tok, "all checks", func(s tokenize.SelfCheckState) bool { return s.Checks+s.Errors >= want })
	if st.Checks != want || st.Mismatches != 0 || st.Demoted {
		t.Errorf("same files on both sides, every request checked: %+v", st)
	}

	// The engine serves Llama-3.1's tokenizer; the router wrongly has Qwen3's.
	wrong := startSim(t, "--tokenizer-dir", tokenizerDir(t, "llama3_1"), "--kv-events-disable", "--enable-scale-out", "--max-model-len", "8192")
	tok2 := selfCheckedWith(t, "qwen3", wrong.base, tokenize.SelfCheckRender)
	defer tok2.Close()
	in := inputs[0]
	first, err := tok2.Tokenize(ctx, "sim-model", in)
	if err != nil || first.Source != tokenize.SourceLocal {
		t.Fatalf("before the check: %+v, %v", first.Source, err)
	}
	st = waitState(t, tok2, "demotion", func(s tokenize.SelfCheckState) bool { return s.Demoted })
	if st.Mismatches != 1 || st.Serving != "render" || !strings.Contains(st.Reason, "render endpoint") {
		t.Errorf("demoted state: %+v", st)
	}
	after, err := tok2.Tokenize(ctx, "sim-model", in)
	if err != nil || after.Source != tokenize.SourceRender || len(after.IDs) == 0 || after.IDs[0] != 128000 {
		t.Fatalf("after demotion: source %s, err %v, ids %v", after.Source, err, after.IDs[:min(4, len(after.IDs))])
	}
	if !strings.Contains(tok2.Explain("sim-model"), "serving the engine's render endpoint instead") {
		t.Errorf("explain: %s", tok2.Explain("sim-model"))
	}
}
