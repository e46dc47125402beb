package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

type pyUsage struct {
	Prompt, Completion, Total int
	Cached                    *int
}

type pyResult struct {
	Text   string
	Finish string
	Usage  *pyUsage
	Object string
	Role   string
	Chunks int
	Roles  []string
}

type pyResponses struct {
	Text, Status, Object string
	Usage                struct{ Input, Output, Total, Cached int }
	Events               []string
}

// The official OpenAI Python client parses the simulator's JSON and SSE
// (hack/requirements-test.txt pins it; hack/install-deps.sh installs it).
func TestOpenAIPythonClient(t *testing.T) {
	s := startSim(t, "--enable-prompt-tokens-details")
	prompt := strings.Repeat("an openai client talks to a simulated engine. ", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "testdata/openai_client.py", s.base+"/v1", prompt)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("python client: %v\n%s\n(install with: pip install -r hack/requirements-test.txt)", err, stderr)
	}
	var got struct {
		Completion       pyResult    `json:"completion"`
		CompletionStream pyResult    `json:"completion_stream"`
		Chat             pyResult    `json:"chat"`
		ChatStream       pyResult    `json:"chat_stream"`
		Responses        pyResponses `json:"responses"`
		ResponsesStream  pyResponses `json:"responses_stream"`
		Errors           map[string]struct {
			Status  int
			Message string
		}
		Models []string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %s: %v", out, err)
	}
	n := tokenCount(t, s, fmt.Sprintf(`{"prompt": %q}`, prompt))
	nChat := tokenCount(t, s, fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}]}`, prompt))
	check := func(name string, r pyResult, prompt, completion, cached int) {
		t.Helper()
		if r.Usage == nil {
			t.Errorf("%s: no usage", name)
			return
		}
		u := *r.Usage
		if u.Prompt != prompt || u.Completion != completion || u.Total != prompt+completion {
			t.Errorf("%s: usage %+v, want prompt %d completion %d", name, u, prompt, completion)
		}
		switch {
		case u.Cached == nil || *u.Cached != cached:
			// vLLM 0.33 reports the details whenever enabled, a miss as 0.
			t.Errorf("%s: cached %v, want %d", name, u.Cached, cached)
		}
		if len(r.Text) != completion || r.Finish != "length" {
			t.Errorf("%s: text %q finish %q", name, r.Text, r.Finish)
		}
	}
	full := (n / 16) * 16
	check("completion", got.Completion, n, 6, 0)
	check("completion stream", got.CompletionStream, n, 6, full)
	check("chat", got.Chat, nChat, 5, 0)
	check("chat stream", got.ChatStream, nChat, 5, (nChat/16)*16)
	if got.Completion.Object != "text_completion" || got.Chat.Role != "assistant" {
		t.Errorf("object %q role %q", got.Completion.Object, got.Chat.Role)
	}
	// Same prompt, same request seed: streaming and non-streaming generate
	// the same.
	if got.Completion.Text != got.CompletionStream.Text || got.Chat.Text != got.ChatStream.Text {
		t.Errorf("streamed text differs: %q/%q, %q/%q", got.Completion.Text, got.CompletionStream.Text, got.Chat.Text, got.ChatStream.Text)
	}
	// One chunk per token plus the usage chunk.
	if got.CompletionStream.Chunks != 7 {
		t.Errorf("completion stream had %d chunks", got.CompletionStream.Chunks)
	}
	if len(got.ChatStream.Roles) != 1 || got.ChatStream.Roles[0] != "assistant" {
		t.Errorf("chat stream roles %v", got.ChatStream.Roles)
	}
	// Responses: the chat prompt with the special tokens (one more BOS),
	// cached by the second request.
	checkResponses := func(name string, r pyResponses, cached int) {
		t.Helper()
		u := r.Usage
		if r.Object != "response" || r.Status != "incomplete" || len(r.Text) != 5 ||
			u.Input != nChat+1 || u.Output != 5 || u.Total != nChat+6 || u.Cached != cached {
			t.Errorf("%s: %+v, want %d input tokens, %d cached", name, r, nChat+1, cached)
		}
	}
	checkResponses("responses", got.Responses, 0)
	checkResponses("responses stream", got.ResponsesStream, ((nChat+1)/16)*16)
	if got.Responses.Text != got.ResponsesStream.Text {
		t.Errorf("greedy responses differ: %q, %q", got.Responses.Text, got.ResponsesStream.Text)
	}
	wantEvents := "response.created response.in_progress response.output_item.added response.content_part.added " +
		strings.Repeat("response.output_text.delta ", 5) +
		"response.output_text.done response.content_part.done response.output_item.done response.incomplete"
	if got := strings.Join(got.ResponsesStream.Events, " "); got != wantEvents {
		t.Errorf("responses stream events %s", got)
	}
	if e := got.Errors["previous_response"]; e.Status != 404 || !strings.Contains(e.Message, "resp_unknown") {
		t.Errorf("previous response error %+v", e)
	}
	if e := got.Errors["unknown_model"]; e.Status != 404 || !strings.Contains(e.Message, "does not exist") {
		t.Errorf("unknown model error %+v", e)
	}
	if e := got.Errors["too_long"]; e.Status != 400 || !strings.Contains(e.Message, "maximum context length") {
		t.Errorf("too long error %+v", e)
	}
	if len(got.Models) != 1 || got.Models[0] != "sim-model" {
		t.Errorf("models %v", got.Models)
	}
}
