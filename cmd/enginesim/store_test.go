package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/pkg/openai"
)

// storedJSON is a Responses answer with the field a continued one adds.
type storedJSON struct {
	responsesJSON
	PreviousResponseID *string `json:"previous_response_id"`
}

// text is the response's output text.
func (r *storedJSON) text(t *testing.T) string {
	t.Helper()
	if len(r.Output) != 1 || len(r.Output[0].Content) != 1 {
		t.Fatalf("response %s: output %+v", r.ID, r.Output)
	}
	return r.Output[0].Content[0].Text
}

// respondStored posts a Responses body and returns the answer as parsed
// and as sent.
func (s *sim) respondStored(t *testing.T, body string) (storedJSON, []byte) {
	t.Helper()
	code, b := s.post(t, "/v1/responses", body)
	if code != http.StatusOK {
		t.Fatalf("responses: %d %s", code, b)
	}
	var r storedJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return r, b
}

// do sends a request without a body and returns the status and body.
func (s *sim) do(t *testing.T, method, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// checkErrorBody checks an error answer field by field: status, message,
// type, param (nil for none) and code.
func checkErrorBody(t *testing.T, code int, b []byte, wantCode int, msg, typ string, param any) {
	t.Helper()
	if code != wantCode {
		t.Fatalf("status %d, want %d: %s", code, wantCode, b)
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error == nil {
		t.Fatalf("not a vLLM error body: %s", b)
	}
	want := map[string]any{"message": msg, "type": typ, "param": param, "code": float64(wantCode)}
	for k, v := range want {
		if e.Error[k] != v {
			t.Errorf("error %s = %v, want %v (%s)", k, e.Error[k], v, b)
		}
	}
	if len(e.Error) != len(want) {
		t.Errorf("error fields %v", e.Error)
	}
}

// msgsJSON is a chat's messages as JSON, each {"role", "content"}; pairs
// holds role, content, role, content, ...
func msgsJSON(pairs ...string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < len(pairs); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":%q,"content":%s}`, pairs[i], mustJSONString(pairs[i+1]))
	}
	b.WriteByte(']')
	return b.String()
}

// checkPrompt checks that a response's prompt was rendered from the chat
// msgs: as many input tokens as /tokenize counts for it (with the special
// tokens, as vLLM tokenizes a Responses prompt), and, sent right after as
// a chat completion, every full block of it found in the prefix cache,
// so the tokens are the same too. With the simulator's tokenizer (a token
// a byte) the count pins the length, the hit the content.
func checkPrompt(t *testing.T, s *sim, r storedJSON, msgs string) {
	t.Helper()
	n := tokenCount(t, s, `{"messages": `+msgs+`, "add_special_tokens": true}`)
	if r.Usage == nil || r.Usage.InputTokens != n {
		t.Fatalf("response %s: usage %+v, want %d input tokens, the count of %s", r.ID, r.Usage, n, msgs)
	}
	code, body := s.post(t, "/v1/chat/completions", `{"messages": `+msgs+`, "add_special_tokens": true, "max_tokens": 1, "temperature": 0}`)
	var c completionJSON
	if code != http.StatusOK || json.Unmarshal(body, &c) != nil {
		t.Fatalf("chat: %d %s", code, body)
	}
	if c.Usage == nil || c.Usage.PromptTokens != n || c.Usage.PromptTokensDetails == nil {
		t.Fatalf("chat usage %+v, want %d prompt tokens with details", c.Usage, n)
	}
	if got, want := c.Usage.PromptTokensDetails.CachedTokens, (n-1)/16*16; got != want {
		t.Errorf("the chat of %s hits %d tokens cached by response %s, want all %d of its full blocks", msgs, got, r.ID, want)
	}
}

// A stored conversation of three turns: each follow-up names the one
// before, resends only its new input (and the same instructions), and is
// rendered from the whole conversation: its input tokens grow, and all
// but the new part is a prefix-cache hit on this replica.
func TestResponsesStoreChain(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--enable-prompt-tokens-details", "--max-model-len", "2048")
	const sys = "You are brief."
	q1, q2, q3 := responsesText, "And what does a router do with them?", "Which replica holds my conversation?"
	r1, _ := s.respondStored(t, `{"request_id": "resp_turn1", `+responsesInput+`, "max_output_tokens": 8, "temperature": 0}`)
	if r1.ID != "resp_turn1" || r1.PreviousResponseID != nil {
		t.Fatalf("turn 1: id %q previous %v, want the request_id and none", r1.ID, r1.PreviousResponseID)
	}
	r1.check(t, "sim-model", r1.Usage.InputTokens, 8)
	a1 := r1.text(t)
	checkPrompt(t, s, r1, msgsJSON("system", sys, "user", q1))
	turn := func(prev, q string) storedJSON {
		t.Helper()
		r, _ := s.respondStored(t, fmt.Sprintf(`{"previous_response_id": %q, "instructions": %q, "input": %q, "max_output_tokens": 8, "temperature": 0}`, prev, sys, q))
		r.check(t, "sim-model", r.Usage.InputTokens, 8)
		if r.PreviousResponseID == nil || *r.PreviousResponseID != prev || r.ID == prev {
			t.Errorf("response %s: previous_response_id %v, want %s", r.ID, r.PreviousResponseID, prev)
		}
		return r
	}
	r2 := turn(r1.ID, q2)
	a2 := r2.text(t)
	checkPrompt(t, s, r2, msgsJSON("system", sys, "user", q1, "assistant", a1, "user", q2))
	r3 := turn(r2.ID, q3)
	checkPrompt(t, s, r3, msgsJSON("system", sys, "user", q1, "assistant", a1, "user", q2, "assistant", a2, "user", q3))
	in1, in2, in3 := r1.Usage.InputTokens, r2.Usage.InputTokens, r3.Usage.InputTokens
	if !(in1 < in2 && in2 < in3) {
		t.Errorf("input tokens %d, %d, %d: the history is not in the prompt", in1, in2, in3)
	}
	// Each follow-up finds the turn before it in the cache: its prompt and
	// the answer the follow-up carries as history.
	for i, c := range []struct {
		r    storedJSON
		prev int
	}{{r2, in1}, {r3, in2}} {
		if got := *c.r.Usage.InputTokensDetails.CachedTokens; got < c.prev/16*16 || got == 0 {
			t.Errorf("turn %d: %d cached tokens, want at least the %d of the previous turn's full blocks", i+2, got, c.prev/16*16)
		}
	}
}

// The follow-up's chat is vLLM's construct_input_messages: its own
// instructions first, the stored conversation without its system
// messages, the stored output as an assistant message, then its input.
func TestResponsesStoreMessages(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--enable-prompt-tokens-details")
	q1 := strings.Repeat("What is a prefix cache? ", 3)
	r1, _ := s.respondStored(t, fmt.Sprintf(`{"request_id": "resp_a", "instructions": "Old rules.", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": %q}]}], "max_output_tokens": 4, "temperature": 0}`, q1))
	checkPrompt(t, s, r1, msgsJSON("system", "Old rules.", "user", q1))
	// New instructions replace the old ones.
	r2, _ := s.respondStored(t, `{"previous_response_id": "resp_a", "instructions": "New rules.", "input": "second question", "max_output_tokens": 4}`)
	checkPrompt(t, s, r2, msgsJSON("system", "New rules.", "user", q1, "assistant", r1.text(t), "user", "second question"))
	// None: no system message at all, the stored one dropped too.
	r3, _ := s.respondStored(t, fmt.Sprintf(`{"previous_response_id": %q, "input": [{"role": "user", "content": "third"}], "max_output_tokens": 4}`, r2.ID))
	checkPrompt(t, s, r3, msgsJSON("user", q1, "assistant", r1.text(t), "user", "second question", "assistant", r2.text(t), "user", "third"))
}

// continued, message for message.
func TestContinued(t *testing.T) {
	var stored []chatMessage
	if err := json.Unmarshal([]byte(`[{"role":"system","content":"Old."},{"role":"user","content":"q1","name":"ann"},{"role":"system","content":"Inline."},{"role":"tool","content":"42","tool_call_id":"c1"}]`), &stored); err != nil {
		t.Fatal(err)
	}
	prev := &storedResponse{messages: stored, resp: &responseObject{Output: []outputMessage{
		{Content: []outputText{{Text: "a1"}, {Text: "a2"}}},
	}}}
	for _, c := range []struct {
		body, want string
	}{
		{`{"instructions": "New.", "input": "q2", "previous_response_id": "resp_1"}`,
			`[{"role":"system","content":"New."},{"role":"user","content":"q1","name":"ann"},{"role":"tool","content":"42","tool_call_id":"c1"},` +
				`{"role":"assistant","content":"a1"},{"role":"assistant","content":"a2"},{"role":"user","content":"q2"}]`},
		{`{"input": [{"role": "user", "content": "q2"}, {"role": "user", "content": "q3"}], "previous_response_id": "resp_1"}`,
			`[{"role":"user","content":"q1","name":"ann"},{"role":"tool","content":"42","tool_call_id":"c1"},` +
				`{"role":"assistant","content":"a1"},{"role":"assistant","content":"a2"},{"role":"user","content":"q2"},{"role":"user","content":"q3"}]`},
	} {
		p, err := openai.ParseResponsesTurn([]byte(c.body))
		if err != nil || p.Turn == nil {
			t.Fatalf("%s: %v %+v", c.body, err, p)
		}
		msgs, err := continued(p.Turn, prev)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(msgs)
		if string(got) != c.want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.body, got, c.want)
		}
	}
}

// Retrieval and cancellation of stored responses, what is not stored, and
// what the store refuses.
func TestResponsesStoreEndpoints(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--enable-scale-out")
	// A response is retrieved as it was answered.
	r, sent := s.respondStored(t, `{"request_id": "resp_mine", "input": "hello", "max_output_tokens": 3}`)
	if r.ID != "resp_mine" {
		t.Fatalf("id %q, want the request_id", r.ID)
	}
	code, got := s.do(t, http.MethodGet, "/v1/responses/resp_mine")
	if code != http.StatusOK || !bytes.Equal(got, sent) {
		t.Errorf("GET: %d %s\nwant the answer %s", code, got, sent)
	}
	code, got = s.do(t, http.MethodGet, "/v1/responses/resp_mine?stream=false")
	if code != http.StatusOK || !bytes.Equal(got, sent) {
		t.Errorf("GET stream=false: %d %s", code, got)
	}
	// So is a streamed one: response.completed's response.
	completed := streamedResponse(t, s, `{"request_id": "resp_streamed", "input": "hello", "max_output_tokens": 3, "stream": true}`)
	code, got = s.do(t, http.MethodGet, "/v1/responses/resp_streamed")
	if code != http.StatusOK || !bytes.Equal(bytes.TrimSpace(got), completed) {
		t.Errorf("GET streamed: %d %s\nwant %s", code, got, completed)
	}
	if r, _ := s.respondStored(t, `{"previous_response_id": "resp_streamed", "input": "more", "max_output_tokens": 2}`); r.Usage.InputTokens <= 3 {
		t.Errorf("follow-up of a streamed response: %+v", r.Usage)
	}
	// store false: answered, not kept.
	if r, _ := s.respondStored(t, `{"request_id": "resp_unstored", "input": "hello", "max_output_tokens": 2, "store": false}`); r.ID != "resp_unstored" {
		t.Errorf("id %q", r.ID)
	}
	for _, c := range []struct {
		name, method, path, body string
		code                     int
		msg, typ                 string
		param                    any
	}{
		{"GET unknown", http.MethodGet, "/v1/responses/resp_nope", "", 404, "Response with id 'resp_nope' not found.", "invalid_request_error", "response_id"},
		{"GET unstored", http.MethodGet, "/v1/responses/resp_unstored", "", 404, "Response with id 'resp_unstored' not found.", "invalid_request_error", "response_id"},
		{"follow-up of unstored", http.MethodPost, "/v1/responses", `{"previous_response_id": "resp_unstored", "input": "x"}`,
			404, "Response with id 'resp_unstored' not found.", "invalid_request_error", "response_id"},
		{"follow-up of unknown", http.MethodPost, "/v1/responses", `{"previous_response_id": "resp_nope", "input": [{"type": "web_search_call", "id": "ws_1"}]}`,
			404, "Response with id 'resp_nope' not found.", "invalid_request_error", "response_id"},
		{"cancel completed", http.MethodPost, "/v1/responses/resp_mine/cancel", "", 400, "Cannot cancel a synchronous response.", "invalid_request_error", "response_id"},
		{"cancel unknown", http.MethodPost, "/v1/responses/resp_nope/cancel", "", 404, "Response with id 'resp_nope' not found.", "invalid_request_error", "response_id"},
		{"GET streaming", http.MethodGet, "/v1/responses/resp_mine?stream=true", "", 400,
			"Unknown response_id: resp_mine", "BadRequestError", "response_id"},
		{"GET bad stream", http.MethodGet, "/v1/responses/resp_mine?stream=maybe", "", 400,
			"1 validation error: query.stream: Input should be a valid boolean, unable to interpret input", "Bad Request", "query.stream"},
		{"GET bad starting_after", http.MethodGet, "/v1/responses/resp_mine?stream=true&starting_after=x", "", 400,
			"1 validation error: query.starting_after: Input should be a valid integer, unable to parse string as an integer", "Bad Request", "query.starting_after"},
		{"GET bad both", http.MethodGet, "/v1/responses/resp_mine?stream=maybe&starting_after=1.5", "", 400,
			"2 validation errors: query.stream: Input should be a valid boolean, unable to interpret input; " +
				"query.starting_after: Input should be a valid integer, unable to parse string as an integer", "Bad Request", "query.stream"},
		{"background unstored", http.MethodPost, "/v1/responses", `{"input": "x", "background": true, "store": false}`, 400,
			"background can only be used when `store` is true", "Bad Request", "background"},
		{"render a follow-up", http.MethodPost, "/v1/responses/render", `{"previous_response_id": "resp_mine", "input": "x"}`, 400,
			"previous_response_id is not supported by the stateless render endpoint.", "invalid_request_error", "previous_response_id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var code int
			var b []byte
			if c.body != "" {
				code, b = s.post(t, c.path, c.body)
			} else {
				code, b = s.do(t, c.method, c.path)
			}
			checkErrorBody(t, code, b, c.code, c.msg, c.typ, c.param)
		})
	}
	// A known response with input vLLM refuses: the input's 400.
	code, b := s.post(t, "/v1/responses", `{"previous_response_id": "resp_mine", "input": [{"type": "web_search_call", "id": "ws_1"}]}`)
	checkVLLMError(t, code, b, 400, "BadRequestError", "web_search_call")
	// The render endpoint names its request by the request_id too.
	code, b = s.post(t, "/v1/responses/render", `{"request_id": "resp_rendered", "input": "x"}`)
	var rd renderedJSON
	if code != http.StatusOK || json.Unmarshal(b, &rd) != nil || rd.RequestID != "resp_rendered" {
		t.Errorf("render: %d %s", code, b)
	}
}

// streamedResponse streams a Responses body and returns its last event's
// response as sent (response.completed, or response.incomplete for one cut
// short).
func streamedResponse(t *testing.T, s *sim, body string) []byte {
	t.Helper()
	resp, err := s.client.Post(s.base+"/v1/responses", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var last responsesEvent
	for {
		ev, err := readResponsesEvent(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		last = ev
	}
	if last.name != "response.completed" && last.name != "response.incomplete" {
		t.Fatalf("stream ended with %q", last.name)
	}
	return last.data["response"]
}

// Without the store (vLLM's default) the request_id still names the
// response, store is ignored, and every id is unknown; background mode is
// vLLM's 400.
func TestResponsesStoreDisabled(t *testing.T) {
	s := startSim(t)
	if r, _ := s.respondStored(t, `{"request_id": "resp_x", "input": "hello", "max_output_tokens": 2}`); r.ID != "resp_x" {
		t.Fatalf("id %q, want the request_id", r.ID)
	}
	const missing = "Response with id 'resp_x' not found."
	code, b := s.post(t, "/v1/responses", `{"previous_response_id": "resp_x", "input": "x"}`)
	checkErrorBody(t, code, b, 404, missing, "invalid_request_error", "response_id")
	code, b = s.do(t, http.MethodGet, "/v1/responses/resp_x")
	checkErrorBody(t, code, b, 404, missing, "invalid_request_error", "response_id")
	code, b = s.do(t, http.MethodPost, "/v1/responses/resp_x/cancel")
	checkErrorBody(t, code, b, 404, missing, "invalid_request_error", "response_id")
	code, b = s.post(t, "/v1/responses", `{"input": "x", "background": true}`)
	checkErrorBody(t, code, b, 400, "This vLLM engine does not support `store=True` and therefore does not support the background mode. "+
		"To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
		"invalid_request_error", "background")
}

// VLLM_ENABLE_RESPONSES_API_STORE enables the store as --enable-responses-store does.
func TestResponsesStoreEnv(t *testing.T) {
	t.Setenv(storeEnv, "1")
	s := startSim(t)
	s.respondStored(t, `{"request_id": "resp_env", "input": "hello", "max_output_tokens": 2}`)
	if code, b := s.do(t, http.MethodGet, "/v1/responses/resp_env"); code != http.StatusOK {
		t.Errorf("GET: %d %s", code, b)
	}
	for v, want := range map[string]bool{"": false, "0": false, "1": true, " 2 ": true, "-1": true, "true": true, "TRUE": true, "false": false} {
		if got, err := storeEnabled(v); err != nil || got != want {
			t.Errorf("%s=%q: %v, %v; want %v", storeEnv, v, got, err, want)
		}
	}
	for _, v := range []string{"yes", "on", "1.0"} {
		if _, err := storeEnabled(v); err == nil {
			t.Errorf("%s=%q accepted", storeEnv, v)
		}
	}
	t.Setenv(storeEnv, "yes")
	if _, err := parseFlags(nil, io.Discard); err == nil {
		t.Errorf("%s=yes: the simulator starts", storeEnv)
	}
	t.Setenv(storeEnv, "")
	if _, err := parseFlags([]string{"--responses-store-max", "0"}, io.Discard); err == nil {
		t.Error("--responses-store-max 0 accepted")
	}
}

// The store keeps the newest --responses-store-max responses.
func TestResponsesStoreBound(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--responses-store-max", "2")
	for _, id := range []string{"resp_1", "resp_2", "resp_3", "resp_2"} {
		s.respondStored(t, fmt.Sprintf(`{"request_id": %q, "input": "hello", "max_output_tokens": 1}`, id))
	}
	// resp_1 dropped when resp_3 came; resp_2 stored again is the newest.
	for id, want := range map[string]int{"resp_1": 404, "resp_2": 200, "resp_3": 200} {
		if code, b := s.do(t, http.MethodGet, "/v1/responses/"+id); code != want {
			t.Errorf("GET %s: %d %s, want %d", id, code, b, want)
		}
	}
}

// Conversations continued concurrently each see their own history.
func TestResponsesStoreConcurrent(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--responses-store-max", "100")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	post := func(body string) (storedJSON, error) {
		resp, err := s.client.Post(s.base+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			return storedJSON{}, err
		}
		defer resp.Body.Close()
		var r storedJSON
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Usage == nil {
			return r, fmt.Errorf("%s: status %d, %v", body, resp.StatusCode, err)
		}
		return r, nil
	}
	// Each conversation's inputs have a length of their own, so that one
	// rendered with another's history would count other tokens.
	type turnResult struct {
		input, output string
		tokens        int
	}
	convs := make([][]turnResult, 8)
	for i := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev, last := "", 0
			for turn := range 3 {
				input := fmt.Sprintf("conversation %d turn %d %s", i, turn, strings.Repeat("x", i+1))
				body := fmt.Sprintf(`{"request_id": "resp_c%d_%d", "input": %q, "max_output_tokens": 2`, i, turn, input)
				if prev != "" {
					body += fmt.Sprintf(`, "previous_response_id": %q`, prev)
				}
				r, err := post(body + "}")
				if err != nil {
					errs <- err
					return
				}
				if r.Usage.InputTokens <= last {
					errs <- fmt.Errorf("conversation %d turn %d: %d input tokens after %d", i, turn, r.Usage.InputTokens, last)
					return
				}
				if len(r.Output) != 1 || len(r.Output[0].Content) != 1 {
					errs <- fmt.Errorf("conversation %d turn %d: output %+v", i, turn, r.Output)
					return
				}
				convs[i] = append(convs[i], turnResult{input, r.Output[0].Content[0].Text, r.Usage.InputTokens})
				prev, last = r.ID, r.Usage.InputTokens
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every turn was rendered from its own conversation's history: its
	// input tokens are the count of exactly those messages.
	for i, turns := range convs {
		var msgs []string
		for k, tr := range turns {
			msgs = append(msgs, "user", tr.input)
			if n := tokenCount(t, s, `{"messages": `+msgsJSON(msgs...)+`, "add_special_tokens": true}`); tr.tokens != n {
				t.Errorf("conversation %d turn %d: %d input tokens, want %d, the count of its own history", i, k, tr.tokens, n)
			}
			msgs = append(msgs, "assistant", tr.output)
		}
	}
}
