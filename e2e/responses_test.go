//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// responsesResult is one /v1/responses outcome through Envoy.
type responsesResult struct {
	id, upstream  string
	text          string
	input, cached int
}

// postResponses sends a non-streamed Responses body through Envoy.
func postResponses(t *testing.T, c *cluster, body map[string]any) responsesResult {
	t.Helper()
	b, _ := json.Marshal(body)
	r := c.post(t.Context(), "/v1/responses", b, nil)
	if r.err != nil || r.status != 200 {
		t.Fatalf("/v1/responses: %d %v %s", r.status, r.err, r.body)
	}
	var out struct {
		ID     string `json:"id"`
		Output []struct {
			Type    string `json:"type"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage struct {
			InputTokens        int `json:"input_tokens"`
			InputTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatalf("response is not JSON: %v: %s", err, r.body)
	}
	res := responsesResult{id: out.ID, upstream: r.upstream, input: out.Usage.InputTokens, cached: out.Usage.InputTokensDetails.CachedTokens}
	if len(out.Output) > 0 && len(out.Output[0].Content) > 0 {
		res.text = out.Output[0].Content[0].Text
	}
	return res
}

// TestResponsesAgentSessionsStick: coding-agent sessions on the Responses
// API (instructions, a function tool, input items growing each turn with
// the answer, a function call and its output), no session header: later
// turns land on the replica holding their history and the engine confirms
// the hit, and kvroute's prompt is the engine's to the token.
func TestResponsesAgentSessionsStick(t *testing.T) {
	c := newCluster(t, clusterOpts{kvExtra: "routing: {decision_history: 64}\n"})
	const sessions, turns = 7, 4
	tools := []map[string]any{{"type": "function", "name": "read_file", "description": "Read a file.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}}}
	items := make([][]any, sessions)
	tally := newSessionTally(sessions)
	for turn := range turns {
		for s := range sessions {
			items[s] = append(items[s], map[string]any{"type": "message", "role": "user",
				"content": []map[string]any{{"type": "input_text", "text": prompt(fmt.Sprintf("resp%d-t%d", s, turn), 25)}}})
			r := postResponses(t, c, map[string]any{"model": "sim-model", "max_output_tokens": 8,
				"instructions": prompt(fmt.Sprintf("resp-sys%d", s), 40), "tools": tools, "input": items[s]})
			tally.turn(t, c, s, turn, r.upstream, r.input, r.cached)
			id := fmt.Sprintf("call_%d_%d", s, turn)
			items[s] = append(items[s],
				map[string]any{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": r.text}}},
				map[string]any{"type": "function_call", "call_id": id, "name": "read_file", "arguments": fmt.Sprintf(`{"path": "src/f%d.go"}`, turn)},
				map[string]any{"type": "function_call_output", "call_id": id, "output": prompt(fmt.Sprintf("file%d-%d", s, turn), 20)})
		}
	}
	tally.check(t, "input_tokens_details.cached_tokens")
}

// fidelityObservations is kvroute's count of answers whose cached tokens
// it compared with its prediction (it read their usage).
func fidelityObservations(t *testing.T, c *cluster) float64 {
	t.Helper()
	v, err := metricSum(t.Context(), fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metricsPort), "kvroute_fidelity_observations_total", "")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// postStream posts body as JSON to path through Envoy and returns the
// response, which must be a 200 event stream; the caller closes its body.
func postStream(t *testing.T, c *cluster, path string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), "POST", fmt.Sprintf("http://127.0.0.1:%d%s", c.listenPort, path), bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

// typedEvents reads an event stream whose data are JSON objects with a
// "type" (the Responses and Anthropic streams), returns the types in
// order, and decodes the events of the types in lasts into into.
func typedEvents(t *testing.T, body io.Reader, into any, lasts ...string) []string {
	t.Helper()
	var types []string
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		types = append(types, ev.Type)
		if slices.Contains(lasts, ev.Type) {
			_ = json.Unmarshal([]byte(data), into)
		}
	}
	return types
}

// sessionTally counts, over a run of multi-turn sessions through the
// stack, the requests whose prompt kvroute tokenized exactly as the engine
// counted it, and the later turns that landed on the replica of their
// previous turn with the engine's cached tokens covering that turn's prompt.
type sessionTally struct {
	upstream                       []string
	prompt                         []int
	turns, later, stuck, confirmed int
	exact                          int
}

func newSessionTally(sessions int) *sessionTally {
	return &sessionTally{upstream: make([]string, sessions), prompt: make([]int, sessions)}
}

// turn records one answered request: the replica it reached, the engine's
// prompt and cached token counts; kvroute's own count is read from its
// newest decision.
func (st *sessionTally) turn(t *testing.T, c *cluster, session, turn int, upstream string, prompt, cached int) {
	t.Helper()
	var out struct {
		Decisions []struct {
			Decision struct {
				PromptTokens int    `json:"prompt_tokens,string"`
				TokenSource  string `json:"token_source"`
			} `json:"decision"`
		} `json:"decisions"`
	}
	if err := c.adminJSON("/debug/decisions?limit=1", &out); err != nil {
		t.Fatal(err)
	}
	st.turns++
	if len(out.Decisions) == 1 {
		d := out.Decisions[0].Decision
		if d.PromptTokens == prompt && d.TokenSource != "" && !strings.HasPrefix(d.TokenSource, "approximate") {
			st.exact++
		} else {
			t.Logf("session %d turn %d: kvroute read %d tokens (%s), the engine %d", session, turn, d.PromptTokens, d.TokenSource, prompt)
		}
	}
	if turn > 0 {
		st.later++
		if upstream == st.upstream[session] {
			st.stuck++
			if cached > 0 && cached >= st.prompt[session]-16 {
				st.confirmed++
			}
		}
	}
	st.upstream[session], st.prompt[session] = upstream, prompt
}

// check fails the test unless every prompt was exact and at least 90 % of
// later turns stuck, with the hit confirmed by the engine's cachedField.
func (st *sessionTally) check(t *testing.T, cachedField string) {
	t.Helper()
	t.Logf("turns %d, exact prompts %d; later turns %d, on the history's replica %d, cache hit confirmed %d",
		st.turns, st.exact, st.later, st.stuck, st.confirmed)
	if st.exact != st.turns {
		t.Errorf("kvroute's prompt matched the engine's token count for %d of %d requests", st.exact, st.turns)
	}
	if st.stuck*10 < st.later*9 {
		t.Errorf("only %d of %d later turns landed on the replica holding their history (want >= 90%%)", st.stuck, st.later)
	}
	if st.confirmed*10 < st.later*9 {
		t.Errorf("%s confirmed the history hit for only %d of %d later turns", cachedField, st.confirmed, st.later)
	}
}

// TestResponsesStreamObserved: a streamed Responses request through Envoy
// arrives as the event sequence, and kvroute reads its first token and its
// usage from the copy the observer filter sends (the router's cached-token
// fidelity counts it).
func TestResponsesStreamObserved(t *testing.T) {
	// Every stream sampled for its usage (by default one in
	// routing.usage_sample_every is followed past its first token).
	c := newCluster(t, clusterOpts{engines: 2, kvExtra: "routing: {usage_sample_every: 1}\n"})
	observed := func() float64 { return fidelityObservations(t, c) }
	before := observed()
	resp := postStream(t, c, "/v1/responses", map[string]any{"model": "sim-model", "stream": true, "max_output_tokens": 6,
		"instructions": prompt("stream-sys", 40), "input": prompt("stream-user", 20)})
	defer resp.Body.Close()
	var completed struct {
		Response struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	// Cut at max_output_tokens: vLLM ends the stream with response.incomplete.
	types := typedEvents(t, resp.Body, &completed, "response.completed", "response.incomplete")
	if len(types) < 4 || types[0] != "response.created" || types[len(types)-1] != "response.incomplete" {
		t.Fatalf("events %v", types)
	}
	if completed.Response.Usage.InputTokens == 0 {
		t.Fatal("response.incomplete carries no usage")
	}
	waitFor(t, 10*time.Second, "the router to read the stream's usage", func() bool { return observed() > before })
}
