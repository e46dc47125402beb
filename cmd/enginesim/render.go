package main

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/pkg/engine"
)

// The render endpoints (--enable-scale-out): vLLM 0.33 serves POST
// /v1/{chat/completions,completions,responses,messages}/render, which
// validate, render and tokenize a request as its generation endpoint does
// and answer with what the engine would be given (a GenerateRequest: the
// prompt's token_ids, its sampling parameters) without generating. A
// router tokenizes with them exactly as the engine does, whatever the
// template or API. The simulator answers with the requests run would
// submit; of the sampling parameters it gives max_tokens only.

// renderingKey marks a request that came in on a render endpoint.
type renderingKey struct{}

// rendering serves h as a render endpoint: run answers with the prepared
// requests instead of running them.
func rendering(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h(w, r.WithContext(context.WithValue(r.Context(), renderingKey{}, true)))
	}
}

func isRendering(ctx context.Context) bool {
	v, _ := ctx.Value(renderingKey{}).(bool)
	return v
}

// rendered is vLLM's GenerateRequest, the fields the simulator fills.
type rendered struct {
	RequestID      string           `json:"request_id"`
	TokenIDs       []uint32         `json:"token_ids"`
	SamplingParams renderedSampling `json:"sampling_params"`
	Model          string           `json:"model"`
	CacheSalt      *string          `json:"cache_salt"`
}

type renderedSampling struct {
	MaxTokens int `json:"max_tokens"`
}

// writeRendered answers a render endpoint: one GenerateRequest, or for
// completions a list of them, one a prompt. Its request_id is id (a
// Responses body's request_id, as vLLM names it), else a new one.
func writeRendered(w http.ResponseWriter, a api, model, id string, reqs []engine.Request) {
	prefix := map[api]string{apiCompletions: "cmpl-", apiChat: "chatcmpl-", apiResponses: "resp_", apiMessages: "chatcmpl-"}[a]
	out := make([]rendered, len(reqs))
	for i, er := range reqs {
		rid := id
		if rid == "" {
			rid = randomID(prefix)
		}
		out[i] = rendered{RequestID: rid, TokenIDs: er.Prompt, SamplingParams: renderedSampling{MaxTokens: er.MaxTokens}, Model: model}
		if er.CacheSalt != "" {
			salt := er.CacheSalt
			out[i].CacheSalt = &salt
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if a == apiCompletions {
		_ = json.NewEncoder(w).Encode(out)
		return
	}
	_ = json.NewEncoder(w).Encode(out[0])
}
