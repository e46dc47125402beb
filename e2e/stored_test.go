//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// storedTurn is one turn of a conversation kept in the engines' response
// store: the response's id, the replica that served it, and its usage.
type storedTurn struct {
	id, upstream  string
	input, cached int
}

// storedResponseObject is the part of a Responses object the test reads.
type storedResponseObject struct {
	ID    string `json:"id"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// respond sends one Responses body through Envoy, streamed or not, and
// returns the stored turn; a refused request fails the test.
func respond(t *testing.T, c *cluster, body map[string]any) storedTurn {
	t.Helper()
	if stream, _ := body["stream"].(bool); stream {
		resp := postStream(t, c, "/v1/responses", body)
		defer resp.Body.Close()
		var done struct {
			Response storedResponseObject `json:"response"`
		}
		terminal := []string{"response.completed", "response.incomplete"}
		if types := typedEvents(t, resp.Body, &done, terminal...); len(types) == 0 || !slices.Contains(terminal, types[len(types)-1]) {
			t.Fatalf("stream events %v", types)
		}
		r := done.Response
		return storedTurn{id: r.ID, upstream: resp.Header.Get("x-e2e-upstream"), input: r.Usage.InputTokens, cached: r.Usage.InputTokensDetails.CachedTokens}
	}
	b, _ := json.Marshal(body)
	r := c.post(t.Context(), "/v1/responses", b, nil)
	if r.err != nil || r.status != 200 {
		t.Fatalf("/v1/responses: %d %v %s", r.status, r.err, r.body)
	}
	var o storedResponseObject
	if err := json.Unmarshal(r.body, &o); err != nil {
		t.Fatal(err)
	}
	return storedTurn{id: o.ID, upstream: r.upstream, input: o.Usage.InputTokens, cached: o.Usage.InputTokensDetails.CachedTokens}
}

// storedCall sends a body-less GET, or a POST, for a stored response
// through Envoy.
func storedCall(t *testing.T, c *cluster, method, path string) (int, string, []byte) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequestWithContext(t.Context(), method, fmt.Sprintf("http://127.0.0.1:%d%s", c.listenPort, path), body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("x-e2e-upstream"), b
}

// TestResponsesStoreFollowUps: with the engines' response store on (vLLM's
// VLLM_ENABLE_RESPONSES_API_STORE), each of 4 replicas keeps its own
// responses and answers 404 for the others'. Conversations continued by
// previous_response_id alone (no session key, no history in the body),
// streamed and not, with generated ids and with the client's request_id,
// reach the replica holding them on every turn, where the engine finds the
// history cached; retrieval and cancellation go there too. A kvroute
// restarted without its memory finds each holder by asking the replicas.
func TestResponsesStoreFollowUps(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 4, engineArgs: func(int) []string { return []string{"--enable-responses-store"} }})
	const chains, turns = 4, 6
	last := make([]storedTurn, chains)
	holder := make([]string, chains)
	for turn := range turns {
		for ch := range chains {
			body := map[string]any{"model": "sim-model", "max_output_tokens": 6,
				"input": prompt(fmt.Sprintf("stored%d-t%d", ch, turn), 30), "stream": (ch+turn)%2 == 1,
				// Instructions do not carry over a stored response: clients
				// send them every turn.
				"instructions": prompt(fmt.Sprintf("stored-sys%d", ch), 40)}
			if turn > 0 {
				body["previous_response_id"] = last[ch].id
			}
			if ch == chains-1 {
				body["request_id"] = fmt.Sprintf("resp_client_%d", turn)
			}
			r := respond(t, c, body)
			if r.id == "" || r.upstream == "" {
				t.Fatalf("chain %d turn %d: id %q upstream %q", ch, turn, r.id, r.upstream)
			}
			if ch == chains-1 && r.id != fmt.Sprintf("resp_client_%d", turn) {
				t.Errorf("the client's request_id was not the response's id: %q", r.id)
			}
			if turn == 0 {
				holder[ch] = r.upstream
			} else {
				if r.upstream != holder[ch] {
					t.Errorf("chain %d turn %d served by %s, its history is on %s", ch, turn, r.upstream, holder[ch])
				}
				if r.input <= last[ch].input || r.cached < last[ch].input/2 {
					t.Errorf("chain %d turn %d: %d input tokens (%d cached) after %d: the stored history was not prepended and cached", ch, turn, r.input, r.cached, last[ch].input)
				}
			}
			last[ch] = r
		}
	}
	for ch := range chains {
		code, up, b := storedCall(t, c, http.MethodGet, "/v1/responses/"+last[ch].id)
		if code != 200 || up != holder[ch] || !strings.Contains(string(b), last[ch].id) {
			t.Errorf("retrieving chain %d's last response: %d from %s (holder %s): %s", ch, code, up, holder[ch], b)
		}
		// A completed response cannot be cancelled: the holder says so (any
		// other replica would not know it: 404).
		code, up, b = storedCall(t, c, http.MethodPost, "/v1/responses/"+last[ch].id+"/cancel")
		if code != 400 || up != holder[ch] || !strings.Contains(string(b), "Cannot cancel a synchronous response") {
			t.Errorf("cancelling chain %d's last response: %d from %s (holder %s): %s", ch, code, up, holder[ch], b)
		}
	}
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metricsPort)
	if v, err := metricSum(t.Context(), metrics, "kvroute_responses_holder_total", `source="book"`); err != nil || v != float64(chains*(turns+1)) {
		t.Errorf("holders found in the router's memory: %v (%v), want %d", v, err, chains*(turns+1))
	}

	// A restart forgets every holder: the next turns' holders are looked up.
	c.kv.Proc.Kill()
	c.waitExtProcHealthy(false)
	c.startKVRoute()
	c.waitExtProcHealthy(true)
	metrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metricsPort)
	for ch := range chains {
		r := respond(t, c, map[string]any{"model": "sim-model", "max_output_tokens": 6, "instructions": prompt(fmt.Sprintf("stored-sys%d", ch), 40),
			"input": prompt(fmt.Sprintf("stored%d-after", ch), 30), "previous_response_id": last[ch].id})
		if r.upstream != holder[ch] {
			t.Errorf("after the restart, chain %d served by %s, its history is on %s", ch, r.upstream, holder[ch])
		}
	}
	if v, err := metricSum(t.Context(), metrics, "kvroute_responses_holder_total", `source="lookup"`); err != nil || v != chains {
		t.Errorf("holders looked up after the restart: %v (%v), want %d", v, err, chains)
	}
	// An id no replica stores is looked for once, then refused by whichever
	// replica gets it, as vLLM refuses it.
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "input": "hi", "previous_response_id": "resp_nowhere"})
	if r := c.post(t.Context(), "/v1/responses", b, nil); r.status != 404 || !strings.Contains(string(r.body), "resp_nowhere") {
		t.Errorf("an unknown previous_response_id: %d %s", r.status, r.body)
	}
	if v, err := metricSum(t.Context(), metrics, "kvroute_responses_holder_total", `source="unknown"`); err != nil || v != 1 {
		t.Errorf("unknown holders: %v (%v), want 1", v, err)
	}
}
