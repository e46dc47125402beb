package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// tokenizerDir is where `make fixtures` puts the reference tokenizer files.
func tokenizerDir(t *testing.T, name string) string {
	t.Helper()
	base := os.Getenv("KVROUTE_TOKENIZER_CACHE")
	if base == "" {
		base = filepath.Join("..", "..", ".cache", "tokenizers")
	}
	dir := filepath.Join(base, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatalf("tokenizer files missing (%v): run `make fixtures` first", err)
	}
	return dir
}

// referenceChats reads chats and their HuggingFace ids from pkg/tokenize's
// fixtures.
type referenceChat struct {
	MessagesJSON        string          `json:"messages_json"`
	ToolsJSON           string          `json:"tools_json"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Kwargs              json.RawMessage `json:"kwargs"`
	IDs                 []uint32        `json:"ids"`
}

func referenceChats(t *testing.T, name string) []referenceChat {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "pkg", "tokenize", "testdata", name+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Chat []referenceChat `json:"chat"`
	}
	if err := json.NewDecoder(zr).Decode(&fx); err != nil {
		t.Fatal(err)
	}
	return fx.Chat
}

func (c referenceChat) input() route.TokenizeInput {
	return route.TokenizeInput{Chat: true, Messages: json.RawMessage(c.MessagesJSON), Tools: json.RawMessage(c.ToolsJSON),
		ChatTemplateKwargs: c.Kwargs, AddGenerationPrompt: c.AddGenerationPrompt}
}

// selfChecked is a router-side tokenizer serving "sim-model" locally with
// family's files, checking every request against the simulator's /tokenize.
func selfChecked(t *testing.T, family, base string) *tokenize.Tokenizer {
	return selfCheckedWith(t, family, base, tokenize.SelfCheckTokenize)
}

// selfCheckedWith is selfChecked comparing with endpoint.
func selfCheckedWith(t *testing.T, family, base string, endpoint tokenize.SelfCheckEndpoint) *tokenize.Tokenizer {
	t.Helper()
	dir := tokenizerDir(t, family)
	tok, err := tokenize.New(tokenize.Config{
		Models: map[string]tokenize.ModelConfig{"sim-model": {Kind: tokenize.KindLocal,
			TokenizerJSON: filepath.Join(dir, "tokenizer.json"), TokenizerConfig: filepath.Join(dir, "tokenizer_config.json")}},
		SelfCheck: tokenize.SelfCheckConfig{SampleRate: 1, Timeout: 30 * time.Second, Endpoint: endpoint},
	}, tokenize.Options{Replicas: func(string) []string { return []string{base} }})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func waitState(t *testing.T, tok *tokenize.Tokenizer, what string, cond func(tokenize.SelfCheckState) bool) tokenize.SelfCheckState {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := tok.SelfCheckStates()[0]
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRealTokenizerSelfCheck runs the router's self-check against the
// simulator's /tokenize backed by real tokenizer files: with the engine's
// own files every check matches (completions and chats, the engine
// rendering the chat template itself); with another model's files on the
// engine the router's local tokenizer is demoted and serves the engine's
// ids from then on.
func TestRealTokenizerSelfCheck(t *testing.T) {
	ctx := context.Background()
	chats := referenceChats(t, "qwen3")[:12]

	sim := startSim(t, "--tokenizer-dir", tokenizerDir(t, "qwen3"), "--kv-events-disable")
	tok := selfChecked(t, "qwen3", sim.base)
	prompts := []string{"Hello world", "e\u0301\u0301 numbers 12345 and Kirat Rai \U00016d70\U00016d71", "<|im_start|>user\nhi<|im_end|>"}
	for _, p := range prompts {
		for _, special := range []bool{false, true} {
			if _, err := tok.Tokenize(ctx, "sim-model", route.TokenizeInput{Prompt: p, AddSpecialTokens: special}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, c := range chats {
		got, err := tok.Tokenize(ctx, "sim-model", c.input())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.IDs, c.IDs) {
			t.Fatalf("chat %d: local ids differ from HuggingFace's", i)
		}
	}
	// A reasoning effort: rendered into the template arguments locally,
	// sent in chat_template_kwargs to /tokenize (which takes no
	// reasoning_effort), checked like the rest.
	efforts := []string{"none", "high"}
	for _, e := range efforts {
		in := chats[0].input()
		in.AddGenerationPrompt, in.ReasoningEffort = true, e
		if _, err := tok.Tokenize(ctx, "sim-model", in); err != nil {
			t.Fatal(err)
		}
	}
	want := uint64(2*len(prompts) + len(chats) + len(efforts))
	st := waitState(t, tok, "all checks", func(s tokenize.SelfCheckState) bool { return s.Checks+s.Errors >= want })
	if st.Checks != want || st.Mismatches != 0 || st.Demoted {
		t.Errorf("same files on both sides: %+v", st)
	}
	tok.Close()

	// The engine serves Llama-3.1's tokenizer; the router wrongly has Qwen3's.
	wrong := startSim(t, "--tokenizer-dir", tokenizerDir(t, "llama3_1"), "--kv-events-disable")
	tok2 := selfChecked(t, "qwen3", wrong.base)
	defer tok2.Close()
	in := chats[0].input()
	first, err := tok2.Tokenize(ctx, "sim-model", in)
	if err != nil || first.Source != tokenize.SourceLocal {
		t.Fatalf("before the check: %+v, %v", first, err)
	}
	st = waitState(t, tok2, "demotion", func(s tokenize.SelfCheckState) bool { return s.Demoted })
	if st.Mismatches != 1 || st.Serving != "remote" {
		t.Errorf("demoted state: %+v", st)
	}
	after, err := tok2.Tokenize(ctx, "sim-model", in)
	if err != nil || after.Source != tokenize.SourceRemote || slices.Equal(after.IDs, first.IDs) {
		t.Fatalf("after demotion: source %s, err %v, ids equal to the wrong local ones: %v", after.Source, err, slices.Equal(after.IDs, first.IDs))
	}
	// The engine's ids are Llama's rendering of the chat: they start with
	// <|begin_of_text|> (128000).
	if len(after.IDs) == 0 || after.IDs[0] != 128000 {
		t.Errorf("engine ids start %v", after.IDs[:min(4, len(after.IDs))])
	}
}

// TestRealTokenizerPrompts: with --tokenizer-dir the engine computes on the
// real tokenizer's ids, as vLLM does: a text prompt's usage counts Qwen3
// tokens (not bytes), the answer re-tokenizes to as many tokens as were
// generated, a resend hits the blocks its ids fill, the same ids
// sent pre-tokenized hit them too, and a chat is rendered by the model's
// template.
func TestRealTokenizerPrompts(t *testing.T) {
	dir := tokenizerDir(t, "qwen3")
	ref := loadReference(t, dir)
	s := startSim(t, "--tokenizer-dir", dir, "--kv-events-disable", "--enable-prompt-tokens-details")
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	want, err := ref.Tokenize(route.TokenizeInput{Prompt: prompt, AddSpecialTokens: true})
	if err != nil {
		t.Fatal(err)
	}
	n := len(want.IDs)
	if n >= len(prompt)/2 || n < 64 {
		t.Fatalf("reference count %d for %d bytes: not a subword tokenizer", n, len(prompt))
	}
	body := fmt.Sprintf(`{"model": "sim-model", "prompt": %q, "max_tokens": 3}`, prompt)
	first := s.complete(t, body)
	if first.Usage.PromptTokens != n || first.Usage.PromptTokensDetails == nil || first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first: usage %+v, want %d prompt tokens and nothing cached", first.Usage, n)
	}
	// The answer is words of one token each: resent, it counts as many
	// tokens as were generated.
	ans, err := ref.Tokenize(route.TokenizeInput{Prompt: first.Choices[0].Text})
	if err != nil || len(ans.IDs) != 3 || len(first.Choices[0].Text) != 6 {
		t.Fatalf("answer %q re-tokenizes to %d tokens (%v), want 3", first.Choices[0].Text, len(ans.IDs), err)
	}
	second := s.complete(t, body)
	if got := second.Usage.PromptTokensDetails; got == nil || got.CachedTokens != (n/16)*16 {
		t.Fatalf("resend: details %+v, want %d cached", got, (n/16)*16)
	}
	ids := make([]string, n)
	for i, id := range want.IDs {
		ids[i] = fmt.Sprint(id)
	}
	third := s.complete(t, `{"prompt": [`+strings.Join(ids, ",")+`], "max_tokens": 2}`)
	if got := third.Usage.PromptTokensDetails; third.Usage.PromptTokens != n || got == nil || got.CachedTokens != (n/16)*16 {
		t.Fatalf("token ids: usage %+v", third.Usage)
	}
	c := referenceChats(t, "qwen3")[0]
	if c.ToolsJSON != "null" || string(c.Kwargs) != "{}" {
		t.Fatalf("reference chat 0 has tools %q or kwargs %s: pick one without", c.ToolsJSON, c.Kwargs)
	}
	code, b := s.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model": "sim-model", "messages": %s, "max_tokens": 2, "add_generation_prompt": %v}`, c.MessagesJSON, c.AddGenerationPrompt))
	if code != 200 {
		t.Fatalf("chat: %d %s", code, b)
	}
	var cr completionJSON
	if err := json.Unmarshal(b, &cr); err != nil || cr.Usage == nil || cr.Usage.PromptTokens != len(c.IDs) {
		t.Fatalf("chat usage %s (%v), want %d prompt tokens", b, err, len(c.IDs))
	}
	// reasoning_effort reaches the template as vLLM merges it: "none" turns
	// Qwen3's thinking off, which its generation prompt shows.
	plain, err := ref.Tokenize(route.TokenizeInput{Chat: true, Messages: json.RawMessage(c.MessagesJSON), AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	off, err := ref.Tokenize(route.TokenizeInput{Chat: true, Messages: json.RawMessage(c.MessagesJSON), AddGenerationPrompt: true, ReasoningEffort: "none"})
	if err != nil || len(off.IDs) <= len(plain.IDs) {
		t.Fatalf("effort none: %d ids against %d without (%v)", len(off.IDs), len(plain.IDs), err)
	}
	code, b = s.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model": "sim-model", "messages": %s, "max_tokens": 2, "reasoning_effort": "none"}`, c.MessagesJSON))
	if err := json.Unmarshal(b, &cr); code != 200 || err != nil || cr.Usage == nil || cr.Usage.PromptTokens != len(off.IDs) {
		t.Fatalf("chat with reasoning_effort none: %d %s, want %d prompt tokens", code, b, len(off.IDs))
	}
	if code, b = s.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model": "sim-model", "messages": %s, "max_tokens": 2, "reasoning_effort": "huge"}`, c.MessagesJSON)); code != 400 || !strings.Contains(string(b), "reasoning_effort") {
		t.Errorf("unknown effort: %d %s", code, b)
	}
}

// loadReference loads the tokenizer files in dir as the router's local
// tokenizer: the reference a simulated engine's token counts are held to.
func loadReference(t *testing.T, dir string) *tokenize.Local {
	t.Helper()
	ref, err := tokenize.LoadLocal(tokenize.ModelConfig{Kind: tokenize.KindLocal,
		TokenizerJSON: filepath.Join(dir, "tokenizer.json"), TokenizerConfig: filepath.Join(dir, "tokenizer_config.json")})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}
