//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// messagesResult is one /v1/messages outcome through Envoy.
type messagesResult struct {
	upstream string
	text     string
	// prompt is the engine's prompt: Anthropic's input_tokens plus the
	// cache read and written.
	prompt, cached int
}

type messagesUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
}

func (u messagesUsage) prompt() int {
	return u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
}

// postMessages sends a non-streamed Messages body through Envoy.
func postMessages(t *testing.T, c *cluster, body map[string]any) messagesResult {
	t.Helper()
	b, _ := json.Marshal(body)
	r := c.post(t.Context(), "/v1/messages", b, map[string]string{"anthropic-version": "2023-06-01"})
	if r.err != nil || r.status != 200 {
		t.Fatalf("/v1/messages: %d %v %s", r.status, r.err, r.body)
	}
	var out struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Usage messagesUsage `json:"usage"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || out.Type != "message" || len(out.Content) != 1 {
		t.Fatalf("not an Anthropic message: %v: %s", err, r.body)
	}
	return messagesResult{upstream: r.upstream, text: out.Content[0].Text, prompt: out.Usage.prompt(), cached: out.Usage.CacheReadInputTokens}
}

// claudeCodeBody is a Claude Code request: the system blocks led by the
// billing header, whose hash changes with every request, the tools, and
// the conversation so far. Claude Code names its session in
// metadata.user_id; without it (withSession false) the prompt alone can
// keep the session on its replica.
func claudeCodeBody(session, turn int, withSession bool, msgs []any) map[string]any {
	tools := []map[string]any{
		{"name": "Read", "description": "Reads a file from the local filesystem.", "input_schema": map[string]any{
			"type": "object", "properties": map[string]any{"file_path": map[string]any{"type": "string"}}, "required": []string{"file_path"}}},
		{"name": "Bash", "description": "Runs a shell command.", "input_schema": map[string]any{
			"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}, "required": []string{"command"}}},
	}
	body := map[string]any{
		"model": "sim-model", "max_tokens": 8, "stream": false,
		"system": []map[string]any{
			{"type": "text", "text": fmt.Sprintf("x-anthropic-billing-header: cc_version=2.1.0.%d; cc_entrypoint=cli; cch=%05x;", turn, session*7919+turn*104729)},
			{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
			{"type": "text", "text": prompt(fmt.Sprintf("cc-sys%d", session), 40), "cache_control": map[string]any{"type": "ephemeral"}},
		},
		"tools": tools, "messages": msgs,
	}
	if withSession {
		body["metadata"] = map[string]any{"user_id": fmt.Sprintf("user_%064x_account_00000000-0000-0000-0000-%012d_session_6b1f0c2e-0000-4000-8000-%012d", session, session, session)}
	}
	return body
}

// TestMessagesClaudeCodeSessionsStick: Claude Code sessions on the
// Anthropic Messages API (billing header, tools, a tool_use answered by a
// tool_result every turn), half naming their session in metadata.user_id:
// later turns land on the replica holding their history, the engines'
// cache reads confirm the hit, and kvroute's prompt is the engine's to the
// token (the billing header left out by both). A streamed turn's usage is
// read by the router from the event stream.
func TestMessagesClaudeCodeSessionsStick(t *testing.T) {
	c := newCluster(t, clusterOpts{kvExtra: "routing: {decision_history: 64, usage_sample_every: 1}\n"})
	const sessions, turns = 6, 4
	msgs := make([][]any, sessions)
	last := make([]messagesResult, sessions)
	tally := newSessionTally(sessions)
	for turn := range turns {
		for s := range sessions {
			user := []map[string]any{{"type": "text", "text": prompt(fmt.Sprintf("cc%d-t%d", s, turn), 25)}}
			if turn > 0 {
				// The tool's result comes first in the user turn.
				user = append([]map[string]any{{"type": "tool_result", "tool_use_id": fmt.Sprintf("toolu_%d_%d", s, turn-1),
					"content": prompt(fmt.Sprintf("file%d-%d", s, turn-1), 20)}}, user...)
			}
			msgs[s] = append(msgs[s], map[string]any{"role": "user", "content": user})
			r := postMessages(t, c, claudeCodeBody(s, turn, s%2 == 0, msgs[s]))
			tally.turn(t, c, s, turn, r.upstream, r.prompt, r.cached)
			last[s] = r
			msgs[s] = append(msgs[s], map[string]any{"role": "assistant", "content": []map[string]any{
				{"type": "text", "text": r.text},
				{"type": "tool_use", "id": fmt.Sprintf("toolu_%d_%d", s, turn), "name": "Read",
					"input": map[string]any{"file_path": fmt.Sprintf("src/f%d.go", turn)}},
			}})
		}
	}
	tally.check(t, "cache_read_input_tokens")

	// One more turn of session 1, streamed: Anthropic's events through
	// Envoy, on the history's replica, its usage read by the router from
	// message_delta.
	observed := func() float64 { return fidelityObservations(t, c) }
	before := observed()
	msgs[1] = append(msgs[1], map[string]any{"role": "user", "content": []map[string]any{
		{"type": "tool_result", "tool_use_id": fmt.Sprintf("toolu_1_%d", turns-1), "content": prompt("file1-last", 20)},
		{"type": "text", "text": "Summarize what you found."}}})
	body := claudeCodeBody(1, turns, false, msgs[1])
	body["stream"] = true
	resp := postStream(t, c, "/v1/messages", body)
	defer resp.Body.Close()
	var final struct {
		Usage messagesUsage `json:"usage"`
	}
	types := typedEvents(t, resp.Body, &final, "message_delta")
	if len(types) < 5 || types[0] != "message_start" || types[len(types)-2] != "message_delta" || types[len(types)-1] != "message_stop" {
		t.Fatalf("events %v", types)
	}
	if up := resp.Header.Get("x-e2e-upstream"); up != last[1].upstream {
		t.Errorf("streamed turn on %s, its history on %s", up, last[1].upstream)
	}
	if u := final.Usage; u.CacheReadInputTokens < last[1].prompt-16 {
		t.Errorf("streamed turn's usage %+v: its history (%d tokens) not read from the cache", u, last[1].prompt)
	}
	waitFor(t, 10*time.Second, "the router to read the stream's usage", func() bool { return observed() > before })
}
