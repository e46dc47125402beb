//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestRenderTokenizerMessages: kvroute tokenizes with the engines' render
// endpoints (tokenizer kind render; enginesims on the Qwen3 tokenizer with
// --enable-scale-out). Claude Code sessions with thinking disabled, whose
// effort the engine's template decides and which the engines' /tokenize
// cannot reproduce, are routed on the engines' own tokens: every prompt is
// the engine's to the token, from the render source, and later turns land
// on the replica holding their history, the engines' cache reads
// confirming it.
func TestRenderTokenizerMessages(t *testing.T) {
	_, dir := qwen3Tokenizer(t)
	c := newCluster(t, clusterOpts{
		engines: 3,
		engineArgs: func(int) []string {
			return []string{"--enable-scale-out", "--tokenizer-dir", dir, "--max-model-len", "16384"}
		},
		tokenizer: "{kind: render, timeout: 5s, fallback: none}",
		kvExtra:   "routing: {decision_history: 64}\n",
	})
	const sessions, turns = 4, 3
	msgs := make([][]any, sessions)
	tally := newSessionTally(sessions)
	for turn := range turns {
		for s := range sessions {
			user := []map[string]any{{"type": "text", "text": prompt(fmt.Sprintf("rd%d-t%d", s, turn), 25)}}
			if turn > 0 {
				user = append([]map[string]any{{"type": "tool_result", "tool_use_id": fmt.Sprintf("toolu_%d_%d", s, turn-1),
					"content": prompt(fmt.Sprintf("rfile%d-%d", s, turn-1), 20)}}, user...)
			}
			msgs[s] = append(msgs[s], map[string]any{"role": "user", "content": user})
			body := claudeCodeBody(s, turn, false, msgs[s])
			body["thinking"] = map[string]any{"type": "disabled"}
			r := postMessages(t, c, body)
			tally.turn(t, c, s, turn, r.upstream, r.prompt, r.cached)
			msgs[s] = append(msgs[s], map[string]any{"role": "assistant", "content": []map[string]any{
				{"type": "text", "text": r.text},
				{"type": "tool_use", "id": fmt.Sprintf("toolu_%d_%d", s, turn), "name": "Read",
					"input": map[string]any{"file_path": fmt.Sprintf("src/r%d.go", turn)}},
			}})
		}
	}
	tally.check(t, "cache_read_input_tokens")
	sources := tokenSources(t, c)
	if sources["render"] != sessions*turns || len(sources) != 1 {
		t.Errorf("token sources %v, want all %d from render", sources, sessions*turns)
	}
	t.Logf("token sources: %v", sources)
}

// TestEngineAPIKey: engines started with --api-key refuse kvroute's render
// calls (a /v1 path) unless kvroute sends the key (engine_auth): with it,
// every decision is on the engines' render tokens; without it, none is
// (the calls get 401 and fall back to approximate tokens). Clients send
// their own key through Envoy.
func TestEngineAPIKey(t *testing.T) {
	_, dir := qwen3Tokenizer(t)
	keyFile := filepath.Join(t.TempDir(), "api-key")
	if err := os.WriteFile(keyFile, []byte("sk-e2e-engines\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sources := func(withKey bool) map[string]int {
		extra := "routing: {decision_history: 64}\n"
		if withKey {
			extra += fmt.Sprintf("engine_auth: {api_key_file: %q}\n", keyFile)
		}
		c := newCluster(t, clusterOpts{
			engines: 2,
			engineArgs: func(int) []string {
				return []string{"--api-key", "sk-e2e-engines", "--enable-scale-out", "--tokenizer-dir", dir}
			},
			tokenizer: "{kind: render, timeout: 5s}",
			kvExtra:   extra,
		})
		auth := map[string]string{"Authorization": "Bearer sk-e2e-engines"}
		for i := range 6 {
			r := c.chat(t.Context(), []message{{Role: "user", Content: prompt(fmt.Sprintf("key%d", i), 30)}}, 4, auth)
			if r.err != nil || r.status != 200 {
				t.Fatalf("request %d: %d %v %s", i, r.status, r.err, r.body)
			}
		}
		if r := c.chat(t.Context(), []message{{Role: "user", Content: "no key"}}, 4, nil); r.status != 401 {
			t.Errorf("a client without the key: %d %s", r.status, r.body)
		}
		return tokenSources(t, c)
	}
	if got := sources(true); got["render"] != 7 || len(got) != 1 {
		t.Errorf("with engine_auth: token sources %v, want all 7 from render", got)
	}
	// Without the key each render call is refused (and, after a few, the
	// replicas' breakers open): every decision on approximate tokens.
	got := sources(false)
	if got["approximate:render_remote_error"] == 0 || got["approximate:render_remote_error"]+got["approximate:render_breaker_open"] != 7 {
		t.Errorf("without engine_auth: token sources %v, want all 7 approximate after refused renders", got)
	}
}

// tokenSources counts the kept decisions (up to 64) by the source of their
// tokens.
func tokenSources(t *testing.T, c *cluster) map[string]int {
	t.Helper()
	var out struct {
		Decisions []struct {
			Decision struct {
				TokenSource string `json:"token_source"`
			} `json:"decision"`
		} `json:"decisions"`
	}
	if err := c.adminJSON("/debug/decisions?limit=64", &out); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, d := range out.Decisions {
		got[d.Decision.TokenSource]++
	}
	return got
}
