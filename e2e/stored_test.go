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
	"time"
)

// storedTurn is one turn of a conversation kept in the engines' response
// store: the response's id, the replica that served it, and its usage.
type storedTurn struct {
	id, upstream  string
	input, cached int
}

// storedResponseObject is the part of a streamed Responses object the
// test reads.
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
	r := postResponses(t, c, body)
	return storedTurn{id: r.id, upstream: r.upstream, input: r.input, cached: r.cached}
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

// backgroundObject is the part of a background Responses object the test
// reads.
type backgroundObject struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Output []any  `json:"output"`
	Usage  *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// decodeBackground decodes a Responses object or fails the test.
func decodeBackground(t *testing.T, what string, b []byte) backgroundObject {
	t.Helper()
	var o backgroundObject
	if err := json.Unmarshal(b, &o); err != nil || o.ID == "" {
		t.Fatalf("%s: not a response object (%v): %s", what, err, b)
	}
	return o
}

// TestResponsesStoreBackground: background Responses requests (vLLM's
// background mode, the engines' response store on) through Envoy and
// kvroute. Each is answered queued at once by the replica that then runs
// and stores it; polling GET /v1/responses/{id} reaches that replica every
// time (never another, which would answer 404) until the response has
// ended; a long one is cancelled there mid-generation (aborted in its
// engine) and stays cancelled; a finished one is continued by
// previous_response_id on its replica, its history cached there; a
// streamed one is replayed there with stream=true.
func TestResponsesStoreBackground(t *testing.T) {
	// 5 ms a token (10 speed, 50 ms steps): 100 tokens take 0.5 s, 3000 15 s.
	c := newCluster(t, clusterOpts{engines: 4, engineArgs: func(int) []string {
		return []string{"--enable-responses-store", "--decode-step-ms", "50"}
	}})
	const n, tokens = 8, 100
	type bg struct {
		id, holder string
		input      int
	}
	post := func(body map[string]any) (backgroundObject, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		r := c.post(t.Context(), "/v1/responses", b, nil)
		if r.err != nil || r.status != 200 || r.upstream == "" {
			t.Fatalf("background /v1/responses: %d %v from %q: %s", r.status, r.err, r.upstream, r.body)
		}
		o := decodeBackground(t, "background answer", r.body)
		if o.Status != "queued" || len(o.Output) != 0 || o.Usage != nil {
			t.Errorf("background answer %s, want queued without output or usage", r.body)
		}
		return o, r.upstream
	}
	// get retrieves a response from its holder: any other replica would
	// answer 404.
	get := func(id, holder string) backgroundObject {
		t.Helper()
		code, up, b := storedCall(t, c, http.MethodGet, "/v1/responses/"+id)
		if code != 200 || up != holder {
			t.Fatalf("GET %s: %d from %s, its holder is %s: %s", id, code, up, holder, b)
		}
		return decodeBackground(t, "GET "+id, b)
	}
	bgs := make([]bg, n)
	holders := map[string]bool{}
	for i := range bgs {
		o, up := post(map[string]any{"model": "sim-model", "background": true, "max_output_tokens": tokens,
			"instructions": prompt(fmt.Sprintf("bg-sys%d", i), 40), "input": prompt(fmt.Sprintf("bg%d", i), 30)})
		bgs[i] = bg{id: o.ID, holder: up}
		holders[up] = true
	}
	if len(holders) < 2 {
		t.Errorf("%d background requests all went to %v", n, holders)
	}
	queuedPolls := 0
	for i, b := range bgs {
		polls := 0
		for deadline := time.Now().Add(30 * time.Second); ; polls++ {
			o := get(b.id, b.holder)
			if o.Status != "queued" {
				// The simulator stops every request on length.
				if o.Status != "incomplete" || o.Usage == nil || o.Usage.OutputTokens != tokens || len(o.Output) != 1 {
					t.Fatalf("background %d ended %+v, want incomplete with %d output tokens", i, o, tokens)
				}
				bgs[i].input = o.Usage.InputTokens
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("background %d still queued after 30s", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("background %d (%s on %s) ended after %d polls", i, b.id, b.holder, polls)
		queuedPolls += polls
	}
	if queuedPolls == 0 {
		t.Error("no poll saw a background response queued")
	}

	// A long one, cancelled mid-generation by its holder.
	long, holder := post(map[string]any{"model": "sim-model", "background": true, "max_output_tokens": 3000, "input": prompt("bg-long", 30)})
	metrics := fmt.Sprintf("http://%s/metrics", holder)
	before, err := metricSum(t.Context(), metrics, "vllm:generation_tokens_total", "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the long request to generate", func() bool {
		v, err := metricSum(t.Context(), metrics, "vllm:generation_tokens_total", "")
		return err == nil && v >= before+20
	})
	if o := get(long.ID, holder); o.Status != "queued" {
		t.Fatalf("the long request is %q before its cancel", o.Status)
	}
	code, up, b := storedCall(t, c, http.MethodPost, "/v1/responses/"+long.ID+"/cancel")
	if code != 200 || up != holder {
		t.Fatalf("cancel: %d from %s, its holder is %s: %s", code, up, holder, b)
	}
	if o := decodeBackground(t, "cancel", b); o.Status != "cancelled" || o.ID != long.ID {
		t.Errorf("cancel answered %s, want the response cancelled", b)
	}
	if v, err := metricSum(t.Context(), metrics, "vllm:num_requests_running", ""); err != nil || v != 0 {
		t.Errorf("the holder runs %v requests (%v) after the cancel, want 0", v, err)
	}
	if o := get(long.ID, holder); o.Status != "cancelled" {
		t.Errorf("after the cancel, GET: %q", o.Status)
	}
	code, up, b = storedCall(t, c, http.MethodPost, "/v1/responses/"+long.ID+"/cancel")
	if code != 400 || up != holder || !strings.Contains(string(b), "Cannot cancel a synchronous response") {
		t.Errorf("a second cancel: %d from %s: %s", code, up, b)
	}

	// A finished one continued on its holder, its history cached there.
	for i, b := range bgs[:2] {
		r := respond(t, c, map[string]any{"model": "sim-model", "max_output_tokens": 6, "previous_response_id": b.id,
			"instructions": prompt(fmt.Sprintf("bg-sys%d", i), 40), "input": prompt(fmt.Sprintf("bg%d-next", i), 30)})
		if r.upstream != b.holder {
			t.Errorf("background %d continued on %s, it is stored on %s", i, r.upstream, b.holder)
		}
		if r.input <= b.input || r.cached < b.input/2 {
			t.Errorf("background %d continued: %d input tokens (%d cached) after %d: the stored history was not prepended and cached", i, r.input, r.cached, b.input)
		}
	}

	// A streamed one: its own stream, then a replay from its holder.
	resp := postStream(t, c, "/v1/responses", map[string]any{"model": "sim-model", "background": true, "stream": true,
		"max_output_tokens": tokens, "input": prompt("bg-stream", 30)})
	var done struct {
		Response backgroundObject `json:"response"`
	}
	types := typedEvents(t, resp.Body, &done, "response.incomplete")
	resp.Body.Close()
	sholder := resp.Header.Get("x-e2e-upstream")
	if len(types) != tokens+8 || types[len(types)-1] != "response.incomplete" || done.Response.ID == "" {
		t.Fatalf("background stream events %v", types)
	}
	code, up, b = storedCall(t, c, http.MethodGet, "/v1/responses/"+done.Response.ID+"?stream=true&starting_after=1")
	if code != 200 || up != sholder {
		t.Fatalf("replay: %d from %s, its holder is %s: %s", code, up, sholder, b)
	}
	if replayed := typedEvents(t, strings.NewReader(string(b)), &done, "response.incomplete"); !slices.Equal(replayed, types[2:]) {
		t.Errorf("replayed %v\nwant %v", replayed, types[2:])
	}
}

// TestResponsesStoreActiveActive: two routers behind one Envoy share no
// memory. A follow-up that reaches the router which did not route its
// previous turn (or whose observer stream Envoy sent to the other router,
// so that no router read the response's id) finds the holder by asking the
// replicas. Every turn is served by the replica holding its conversation.
func TestResponsesStoreActiveActive(t *testing.T) {
	t.Setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1") // the engines inherit it
	aa := newActiveActive(t, 2)
	c := aa.front
	const chains, turns = 4, 6
	last := make([]storedTurn, chains)
	for turn := range turns {
		for ch := range chains {
			body := map[string]any{"model": "sim-model", "max_output_tokens": 6,
				"instructions": prompt(fmt.Sprintf("aa-sys%d", ch), 40), "input": prompt(fmt.Sprintf("aa%d-t%d", ch, turn), 30)}
			if turn > 0 {
				body["previous_response_id"] = last[ch].id
			}
			r := respond(t, c, body)
			if turn > 0 && r.upstream != last[ch].upstream {
				t.Errorf("chain %d turn %d served by %s, its history is on %s", ch, turn, r.upstream, last[ch].upstream)
			}
			last[ch] = r
		}
	}
	by := map[string]float64{}
	for i, r := range aa.routers {
		url := fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metricsPort)
		for _, src := range []string{"book", "lookup", "unknown", "skipped", "busy"} {
			v, err := metricSum(t.Context(), url, "kvroute_responses_holder_total", `source="`+src+`"`)
			if err != nil {
				t.Fatalf("router %d: %v", i, err)
			}
			by[src] += v
		}
	}
	t.Logf("holders found, both routers: %v", by)
	if by["book"]+by["lookup"] != chains*(turns-1) || by["unknown"]+by["skipped"]+by["busy"] != 0 {
		t.Errorf("holders %v: want all %d follow-ups' found, none unknown, skipped or busy", by, chains*(turns-1))
	}
	if by["lookup"] == 0 {
		t.Errorf("no follow-up reached a router without its holder: the two routers did not share the traffic")
	}
}
