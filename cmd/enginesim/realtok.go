package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// realTokenizer backs POST /tokenize with a real HuggingFace tokenizer
// (--tokenizer-dir: tokenizer.json, and tokenizer_config.json for chat),
// so that a router's local tokenizer can be checked against the engine as
// it would be against vLLM. Text prompts of completions and chats are
// tokenized with it too, so that the engine caches, and its KV events
// carry, the token ids a router with the same tokenizer computes. Generated
// tokens stay the simulator's own ids inside the engine but are sent as
// one-token words (server.tokenText), so a resent answer counts as many
// tokens as were generated; its ids differ from the engine's, so the
// blocks holding an answer are cached under ids the next turn does not
// send, as with any engine whose output does not re-tokenize to itself.
type realTokenizer struct {
	local *tokenize.Local
	// prompts tokenizes the engine's own text prompts, with the chunk
	// cache a multi-turn workload's resent history needs; local
	// (/tokenize) keeps none, so a remote tokenizer measured against it
	// pays a full tokenization as against vLLM.
	prompts *tokenize.Local
}

func loadRealTokenizer(dir string) (*realTokenizer, error) {
	mc := tokenize.ModelConfig{Kind: tokenize.KindLocal, TokenizerJSON: filepath.Join(dir, "tokenizer.json"), PrefixCacheBytes: -1}
	if cfg := filepath.Join(dir, "tokenizer_config.json"); fileExists(cfg) {
		mc.TokenizerConfig = cfg
	}
	l, err := tokenize.LoadLocal(mc)
	if err != nil {
		return nil, fmt.Errorf("--tokenizer-dir: %w", err)
	}
	return &realTokenizer{local: l, prompts: tokenize.NewLocal(l.Encoder(), nil, 0, tokenize.DefaultPrefixCacheBytes)}, nil
}

// text tokenizes a completion prompt as the engine does.
func (rt *realTokenizer) text(s string, special bool) ([]uint32, error) {
	t, err := rt.prompts.Tokenize(route.TokenizeInput{Prompt: s, AddSpecialTokens: special})
	if err != nil {
		return nil, badRequest("prompt", "%v", err)
	}
	return t.IDs, nil
}

// chat renders and tokenizes a chat request's messages (as sent), tools and
// template kwargs with the tokenizer's template; a converted Messages
// request's system-first conversation and disabled thinking go to the
// template, which uses them as vLLM does for it.
func (rt *realTokenizer) chat(req *genRequest, gen, special bool) ([]uint32, error) {
	raw, err := json.Marshal(req.Messages)
	if err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	t, err := rt.local.Tokenize(route.TokenizeInput{Chat: true, Messages: raw, Tools: req.Tools,
		ChatTemplateKwargs: req.ChatTemplateKwargs, AddGenerationPrompt: gen, AddSpecialTokens: special,
		SystemFirst: req.systemFirst, ThinkingDisabled: req.thinkingDisabled, ReasoningEffort: effortOf(req)})
	if err != nil {
		if errors.Is(err, tokenize.ErrNoChatTemplate) {
			return nil, badRequest("messages", "the tokenizer has no chat template")
		}
		return nil, badRequest("messages", "%v", err)
	}
	return t.IDs, nil
}

// effortOf is the request's reasoning effort, "" for none.
func effortOf(req *genRequest) string {
	if req.ReasoningEffort == nil {
		return ""
	}
	return *req.ReasoningEffort
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// tokenizeBody is vLLM's /tokenize request, the fields a real tokenizer
// needs (messages, tools and template kwargs kept as raw JSON).
type tokenizeBody struct {
	Model               *string         `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
}

// tokenize answers as vLLM does: a prompt gets special tokens unless
// add_special_tokens is false; a chat is rendered with the tokenizer's
// template (add_generation_prompt defaults to true) and gets none unless
// add_special_tokens is true.
func (rt *realTokenizer) tokenize(s *server, w http.ResponseWriter, r *http.Request) {
	var req tokenizeBody
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if _, _, err := s.resolveModel(req.Model); err != nil {
		writeError(w, err)
		return
	}
	var in route.TokenizeInput
	if len(req.Messages) > 0 && string(req.Messages) != "null" {
		in = route.TokenizeInput{Chat: true, Messages: req.Messages, Tools: req.Tools, ChatTemplateKwargs: req.ChatTemplateKwargs,
			AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
			AddSpecialTokens:    req.AddSpecialTokens != nil && *req.AddSpecialTokens}
	} else {
		if err := json.Unmarshal(req.Prompt, &in.Prompt); err != nil {
			writeError(w, badRequest("prompt", "prompt must be a string"))
			return
		}
		in.AddSpecialTokens = req.AddSpecialTokens == nil || *req.AddSpecialTokens
	}
	toks, err := rt.local.Tokenize(in)
	if err != nil {
		if errors.Is(err, tokenize.ErrNoChatTemplate) {
			writeError(w, badRequest("messages", "the tokenizer has no chat template"))
			return
		}
		writeError(w, badRequest("", "%v", err))
		return
	}
	ids := toks.IDs
	if ids == nil {
		ids = []uint32{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": s.maxModelLen, "tokens": ids})
}
