package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
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
