package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
)

type responsesJSON struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	CreatedAt         int64  `json:"created_at"`
	Model             string `json:"model"`
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int `json:"output_tokens"`
		OutputTokensDetails *struct {
			ReasoningTokens *int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int `json:"total_tokens"`
	} `json:"usage"`
}

// check verifies a finished response of outputTokens tokens (the
// simulator always stops on length: status incomplete) and returns its
// text and cached tokens.
func (r *responsesJSON) check(t *testing.T, model string, inputTokens, outputTokens int) (string, int) {
	t.Helper()
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Model != model ||
		time.Since(time.Unix(r.CreatedAt, 0)).Abs() > time.Minute {
		t.Fatalf("response header: %+v", r)
	}
	if r.Status != "incomplete" || r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("status %q details %+v, want incomplete on max_output_tokens", r.Status, r.IncompleteDetails)
	}
	if len(r.Output) != 1 {
		t.Fatalf("%d output items", len(r.Output))
	}
	o := r.Output[0]
	if !strings.HasPrefix(o.ID, "msg_") || o.Type != "message" || o.Role != "assistant" || o.Status != "completed" || len(o.Content) != 1 {
		t.Fatalf("output item %+v", o)
	}
	c := o.Content[0]
	if c.Type != "output_text" || c.Annotations == nil || len(c.Annotations) != 0 || len(c.Text) != outputTokens {
		t.Errorf("content %+v, want %d bytes of output_text", c, outputTokens)
	}
	u := r.Usage
	if u == nil || u.InputTokensDetails == nil || u.InputTokensDetails.CachedTokens == nil ||
		u.OutputTokensDetails == nil || u.OutputTokensDetails.ReasoningTokens == nil {
		t.Fatalf("usage %+v lacks a field", u)
	}
	if u.InputTokens != inputTokens || u.OutputTokens != outputTokens || u.TotalTokens != inputTokens+outputTokens ||
		*u.OutputTokensDetails.ReasoningTokens != 0 {
		t.Errorf("usage %+v, want %d input and %d output tokens", u, inputTokens, outputTokens)
	}
	return c.Text, *u.InputTokensDetails.CachedTokens
}

func (s *sim) respond(t *testing.T, body string) responsesJSON {
	t.Helper()
	resp, err := s.client.Post(s.base+"/v1/responses", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("responses: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var r responsesJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return r
}

// A Responses conversation: instructions and a user message item with an
// input_text part. As chat messages it is the system and user message of
// responsesChat.
var (
	responsesText  = strings.Repeat("Tell me about prefix caches and routers. ", 4)
	responsesInput = fmt.Sprintf(`"instructions": "You are brief.", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": %q}]}]`, responsesText)
	responsesChat  = fmt.Sprintf(`[{"role": "system", "content": "You are brief."}, {"role": "user", "content": %q}]`, responsesText)
)

// A non-streamed response: vLLM's shape; its prompt is the conversation's
// chat prompt with the special tokens added, token for token what
// /v1/chat/completions counts for it with add_special_tokens; a repeat hits
// the prefix cache, and cached_tokens is reported without
// --enable-prompt-tokens-details (vLLM always reports it here).
func TestResponses(t *testing.T) {
	s := startSim(t, "--max-model-len", "512")
	// simtok: BOS from add_special_tokens, BOS from the template, a byte per
	// character of the rendered chat.
	want := 2 + len("<|system|>\nYou are brief.<|end|>\n<|user|>\n"+responsesText+"<|end|>\n<|assistant|>\n")
	body := `{"model": "sim-model", ` + responsesInput + `, "max_output_tokens": 5, "temperature": 0}`
	first := s.respond(t, body)
	text1, cached1 := first.check(t, "sim-model", want, 5)
	if cached1 != 0 {
		t.Errorf("cold request cached %d", cached1)
	}
	second := s.respond(t, body)
	text2, cached2 := second.check(t, "sim-model", want, 5)
	if cached2 != (want/16)*16 || cached2 == 0 {
		t.Errorf("repeat cached %d, want %d", cached2, (want/16)*16)
	}
	if text1 != text2 || first.ID == second.ID || first.Output[0].ID == second.Output[0].ID {
		t.Errorf("greedy repeat: texts %q, %q; ids %s, %s", text1, text2, first.ID, second.ID)
	}
	// The same conversation as a chat completion with the special tokens.
	code, b := s.post(t, "/v1/chat/completions", `{"messages": `+responsesChat+`, "add_special_tokens": true, "max_tokens": 1}`)
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, b)
	}
	var c completionJSON
	if err := json.Unmarshal(b, &c); err != nil || c.Usage == nil {
		t.Fatalf("chat response %s: %v", b, err)
	}
	if c.Usage.PromptTokens != want {
		t.Errorf("chat counts %d prompt tokens, /v1/responses %d", c.Usage.PromptTokens, want)
	}
	if n := tokenCount(t, s, `{"messages": `+responsesChat+`, "add_special_tokens": true}`); n != want {
		t.Errorf("/tokenize counts %d, /v1/responses %d", n, want)
	}
	// A string input without a model is a user message to the base model;
	// max_output_tokens absent, the answer runs to the end of the context
	// (as a chat's).
	r := s.respond(t, `{"input": "hi", "temperature": 0}`)
	n := 2 + len("<|user|>\nhi<|end|>\n<|assistant|>\n")
	r.check(t, "sim-model", n, 512-n)
	// Accounted as chat requests are.
	m := s.get(t, "/metrics")
	for _, want := range []string{
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-model"} 4`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} ` + fmt.Sprint(cached2+(want/16)*16),
		`vllm:generation_tokens_total{engine="0",model_name="sim-model"} ` + fmt.Sprint(5+5+1+512-n),
		`vllm:num_requests_running{engine="0",model_name="sim-model"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

type responsesEvent struct {
	name string
	data map[string]json.RawMessage
	at   time.Time
}

func (e responsesEvent) str(t *testing.T, key string) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(e.data[key], &s); err != nil {
		t.Fatalf("%s: %s is %s", e.name, key, e.data[key])
	}
	return s
}

// readResponsesEvent reads one `event: T\ndata: J\n\n` block; io.EOF at the
// end of the stream.
// readUntil reads events from br up to and including the first named name.
func readUntil(t *testing.T, br *bufio.Reader, name string) {
	t.Helper()
	for {
		ev, err := readResponsesEvent(br)
		if err != nil {
			t.Fatal(err)
		}
		if ev.name == name {
			return
		}
	}
}

func readResponsesEvent(br *bufio.Reader) (responsesEvent, error) {
	var ev responsesEvent
	var lines []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err == io.EOF && line == "" && len(lines) == 0 {
				return ev, io.EOF
			}
			return ev, fmt.Errorf("stream cut after %q: %w", lines, err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			break
		}
		lines = append(lines, line)
	}
	ev.at = time.Now()
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
		return ev, fmt.Errorf("not an event block: %q", lines)
	}
	ev.name = strings.TrimPrefix(lines[0], "event: ")
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &ev.data); err != nil {
		return ev, fmt.Errorf("event data %q: %w", lines[1], err)
	}
	return ev, nil
}

// A streamed response: vLLM's event sequence with consecutive sequence
// numbers, the message item and its part opened only once the first token
// exists (after the prefill), deltas adding up to the text, and the whole
// response with its usage in response.completed; the text is the one the
// same greedy request gets unstreamed.
func TestResponsesStream(t *testing.T) {
	// Real time, prefill of 1000 tokens a second: the first token exists
	// the prompt's tokens in milliseconds after the request.
	s := startSim(t, "--speed", "1", "--prefill-tokens-per-s", "1000")
	want := 2 + len("<|system|>\nYou are brief.<|end|>\n<|user|>\n"+responsesText+"<|end|>\n<|assistant|>\n")
	prefill := time.Duration(want) * time.Millisecond
	const tokens = 6
	body := `{"model": "sim-model", ` + responsesInput + `, "max_output_tokens": 6, "temperature": 0, "stream": true}`
	sent := time.Now()
	resp, err := s.client.Post(s.base+"/v1/responses", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("status %d content type %q", resp.StatusCode, ct)
	}
	br := bufio.NewReader(resp.Body)
	var evs []responsesEvent
	for {
		ev, err := readResponsesEvent(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	wantTypes := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for range tokens {
		wantTypes = append(wantTypes, "response.output_text.delta")
	}
	wantTypes = append(wantTypes, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete")
	var got []string
	for _, ev := range evs {
		got = append(got, ev.name)
	}
	if strings.Join(got, " ") != strings.Join(wantTypes, " ") {
		t.Fatalf("events %v\nwant %v", got, wantTypes)
	}
	for i, ev := range evs {
		if typ := ev.str(t, "type"); typ != ev.name {
			t.Errorf("event %d: type %q under event %q", i, typ, ev.name)
		}
		if string(ev.data["sequence_number"]) != fmt.Sprint(i) {
			t.Errorf("event %d: sequence_number %s", i, ev.data["sequence_number"])
		}
	}
	// created and in_progress: the response in progress, nothing out yet.
	var respID string
	for _, ev := range evs[:2] {
		var r struct {
			ID     string          `json:"id"`
			Object string          `json:"object"`
			Model  string          `json:"model"`
			Status string          `json:"status"`
			Output json.RawMessage `json:"output"`
			Usage  json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal(ev.data["response"], &r); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Model != "sim-model" || r.Status != "in_progress" ||
			string(r.Output) != "[]" || string(r.Usage) != "null" {
			t.Errorf("%s: response %s", ev.name, ev.data["response"])
		}
		respID = r.ID
	}
	// The item and part open only with the first token, after the prefill.
	if d := evs[2].at.Sub(sent); d < prefill*9/10 {
		t.Errorf("output_item.added %v after the request, before the %v prefill", d, prefill)
	}
	var item struct {
		ID      string          `json:"id"`
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Status  string          `json:"status"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(evs[2].data["item"], &item); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(item.ID, "msg_") || item.Type != "message" || item.Role != "assistant" || item.Status != "in_progress" ||
		string(item.Content) != "[]" || string(evs[2].data["output_index"]) != "0" {
		t.Errorf("output_item.added %v", evs[2].data)
	}
	for _, ev := range evs[3:] {
		if ev.name == "response.output_item.done" || ev.name == "response.incomplete" {
			continue
		}
		if ev.str(t, "item_id") != item.ID || string(ev.data["output_index"]) != "0" || string(ev.data["content_index"]) != "0" {
			t.Errorf("%s names item %s output %s content %s", ev.name, ev.data["item_id"], ev.data["output_index"], ev.data["content_index"])
		}
	}
	if p := string(evs[3].data["part"]); p != `{"type":"output_text","text":"","annotations":[]}` {
		t.Errorf("content_part.added part %s", p)
	}
	text := ""
	for _, ev := range evs[4 : 4+tokens] {
		text += ev.str(t, "delta")
		if string(ev.data["logprobs"]) != "[]" {
			t.Errorf("delta logprobs %s", ev.data["logprobs"])
		}
	}
	done := evs[4+tokens:]
	if got := done[0].str(t, "text"); got != text || len(text) != tokens {
		t.Errorf("output_text.done text %q, deltas %q", got, text)
	}
	wantPart := fmt.Sprintf(`{"type":"output_text","text":%q,"annotations":[]}`, text)
	if p := string(done[1].data["part"]); p != wantPart {
		t.Errorf("content_part.done part %s, want %s", p, wantPart)
	}
	var doneItem struct {
		ID      string            `json:"id"`
		Status  string            `json:"status"`
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(done[2].data["item"], &doneItem); err != nil {
		t.Fatal(err)
	}
	if doneItem.ID != item.ID || doneItem.Status != "completed" || len(doneItem.Content) != 1 || string(doneItem.Content[0]) != wantPart {
		t.Errorf("output_item.done item %s", done[2].data["item"])
	}
	var final responsesJSON
	if err := json.Unmarshal(done[3].data["response"], &final); err != nil {
		t.Fatal(err)
	}
	finalText, cached := final.check(t, "sim-model", want, tokens)
	if final.ID != respID || final.Output[0].ID != item.ID || finalText != text || cached != 0 {
		t.Errorf("completed response %s: id, item id, text or cached tokens differ from the stream's", done[3].data["response"])
	}
	// Unstreamed, the same greedy request says the same, from the cache.
	r := s.respond(t, strings.Replace(body, `"stream": true`, `"stream": false`, 1))
	if got, cached := r.check(t, "sim-model", want, tokens); got != text || cached != (want/16)*16 {
		t.Errorf("unstreamed: %q cached %d, streamed %q", got, cached, text)
	}
}

// Requests the simulator cannot serve: vLLM's error body and status, and
// nothing reaches the engine.
func TestResponsesErrors(t *testing.T) {
	s := startSim(t)
	cases := []struct {
		name, body string
		code       int
		typ, msg   string
	}{
		{"previous response", `{"input": "and then?", "previous_response_id": "resp_abc"}`, 404, "invalid_request_error", "Response with id 'resp_abc' not found."},
		{"no input", `{"model": "sim-model"}`, 400, "BadRequestError", "input is required"},
		{"malformed json", `{"input": "x",`, 400, "BadRequestError", ""},
		{"not an object", `["input"]`, 400, "BadRequestError", ""},
		{"wrong type", `{"input": "x", "max_output_tokens": "many"}`, 400, "BadRequestError", "max_output_tokens"},
		{"wrong sampling type", `{"input": "x", "temperature": "hot"}`, 400, "BadRequestError", "temperature"},
		{"unknown model", `{"model": "gpt-9", "input": "x"}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"unsupported item", `{"input": [{"type": "web_search_call", "id": "ws_1"}]}`, 400, "BadRequestError", "web_search_call"},
		{"empty input", `{"input": []}`, 400, "BadRequestError", "messages must not be empty"},
		{"too long", `{"input": "x", "max_output_tokens": 5000}`, 400, "BadRequestError", "maximum context length is 4096"},
		{"partial final message", `{"input": [{"role": "user", "content": "hi"}, {"type": "message", "role": "assistant", "status": "in_progress", "content": [{"type": "output_text", "text": "Hel"}]}]}`,
			400, "BadRequestError", "continue_final_message"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := s.post(t, "/v1/responses", c.body)
			checkVLLMError(t, code, b, c.code, c.typ, c.msg)
		})
	}
	if m := s.get(t, "/metrics"); !strings.Contains(m, `vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 0`) {
		t.Errorf("rejected requests reached the engine")
	}
}

// A Responses client that goes away mid-stream frees its request.
func TestResponsesClientDisconnectAborts(t *testing.T) {
	abortMidEvents(t, "/v1/responses", `{"input": "abandon me", "max_output_tokens": 3000, "stream": true}`, "response.output_text.delta")
}

// abortMidEvents streams body to path, reads events until the first named
// delta, goes away, and checks the engine frees the request without
// counting it a success.
func abortMidEvents(t *testing.T, path, body, delta string) {
	t.Helper()
	s := startSim(t, "--speed", "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	readUntil(t, br, delta)
	// Generating: 3000 tokens would take 30 s of 10 ms steps.
	if m := s.get(t, "/metrics"); !strings.Contains(m, `vllm:num_requests_running{engine="0",model_name="sim-model"} 1`) {
		t.Fatal("the request is not running")
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := s.get(t, "/metrics")
		if strings.Contains(m, `vllm:num_requests_running{engine="0",model_name="sim-model"} 0`) &&
			strings.Contains(m, `vllm:num_requests_waiting{engine="0",model_name="sim-model"} 0`) {
			if strings.Contains(m, "vllm:request_success_total{") {
				t.Error("the aborted request counts as a success")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("aborted request still running after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With --tokenizer-dir a Responses request is rendered by the model's chat
// template as vLLM renders it: the converted messages as they are (an
// assistant message's tool_calls, a tool message's tool_call_id), the
// converted tools, the special tokens; /v1/chat/completions renders the
// same chat request the same.
func TestRealTokenizerResponses(t *testing.T) {
	dir := tokenizerDir(t, "qwen3")
	ref := loadReference(t, dir)
	s := startSim(t, "--tokenizer-dir", dir, "--kv-events-disable")
	body := `{"model": "sim-model", "instructions": "You are a helpful assistant.", "max_output_tokens": 3, "input": [
		{"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
		{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
		{"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}],
		"tools": [{"type": "function", "name": "get_weather", "description": "The weather of a city.",
			"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]}`
	p, err := openai.ParseResponses([]byte(body))
	if err != nil || p.Convert != nil {
		t.Fatalf("parse: %v, %v", err, p.Convert)
	}
	in := route.TokenizeInput{Chat: true, Messages: p.Messages, Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs,
		ReasoningEffort: p.ReasoningEffort, AddGenerationPrompt: p.AddGenerationPrompt, AddSpecialTokens: true}
	want, err := ref.Tokenize(in)
	if err != nil {
		t.Fatal(err)
	}
	// The tools and the tool call are in the prompt.
	in.Tools = nil
	bare, err := ref.Tokenize(in)
	if err != nil || len(bare.IDs) >= len(want.IDs) {
		t.Fatalf("without tools %d tokens (%v), with %d", len(bare.IDs), err, len(want.IDs))
	}
	r := s.respond(t, body)
	if u := r.Usage; u == nil || u.InputTokens != len(want.IDs) || u.OutputTokens != 3 {
		t.Fatalf("usage %+v, want %d input tokens", u, len(want.IDs))
	}
	chat := fmt.Sprintf(`{"messages": %s, "tools": %s, "add_special_tokens": true, "max_tokens": 1}`, p.Messages, p.Tools)
	code, b := s.post(t, "/v1/chat/completions", chat)
	var c completionJSON
	if code != http.StatusOK || json.Unmarshal(b, &c) != nil || c.Usage == nil || c.Usage.PromptTokens != len(want.IDs) {
		t.Fatalf("chat: %d %s, want %d prompt tokens", code, b, len(want.IDs))
	}
}
