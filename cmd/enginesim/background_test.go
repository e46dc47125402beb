package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// metric is a simulator metric's line for the base model, name its name
// with the labels after engine and model_name's place.
func metric(name string, value any) string {
	return fmt.Sprintf(`%s{engine="0",model_name="sim-model"} %v`, name, value)
}

// waitMetrics waits until the simulator's metrics contain every line of
// want.
func waitMetrics(t *testing.T, s *sim, what string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := s.get(t, "/metrics")
		missing := ""
		for _, w := range want {
			if !strings.Contains(m, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: metrics lack %q after 20s", what, missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metricValue is a base-model metric's value, -1 when absent.
func metricValue(t *testing.T, s *sim, name string) float64 {
	t.Helper()
	prefix := metric(name, "")
	for line := range strings.Lines(s.get(t, "/metrics")) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("metric %q: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// checkMetrics checks that the simulator's metrics contain every line of
// want now.
func checkMetrics(t *testing.T, s *sim, what string, want ...string) {
	t.Helper()
	m := s.get(t, "/metrics")
	for _, w := range want {
		if !strings.Contains(m, w) {
			t.Errorf("%s: metrics lack %q", what, w)
		}
	}
}

// stored GETs a stored response and returns it parsed and as sent.
func (s *sim) stored(t *testing.T, id string) (storedJSON, []byte) {
	t.Helper()
	code, b := s.do(t, http.MethodGet, "/v1/responses/"+id)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", id, code, b)
	}
	var r storedJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return r, b
}

// checkUnfinished checks a background response that has not ended
// (status queued or cancelled): vLLM's queued response, no output and no
// usage yet.
func checkUnfinished(t *testing.T, b []byte, id, status string) {
	t.Helper()
	var r map[string]json.RawMessage
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	want := map[string]string{"id": fmt.Sprintf("%q", id), "object": `"response"`, "status": fmt.Sprintf("%q", status),
		"output": "[]", "usage": "null", "incomplete_details": "null", "model": `"sim-model"`}
	for k, v := range want {
		if string(r[k]) != v {
			t.Errorf("%s = %s, want %s (%s)", k, r[k], v, b)
		}
	}
}

// postBackground posts a background body and returns the queued
// response as sent.
func (s *sim) postBackground(t *testing.T, body string) []byte {
	t.Helper()
	code, b := s.post(t, "/v1/responses", body)
	if code != http.StatusOK {
		t.Fatalf("background: %d %s", code, b)
	}
	return b
}

// A background response is answered queued at once, stays queued in the
// store while it runs (vLLM stores no in_progress status), can be
// continued while queued (its messages are stored, its output is still
// empty), and once it ends is stored as a synchronous response would be:
// its output and usage, the same id and creation time; then it is
// continued as any stored response.
func TestResponsesBackground(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--enable-prompt-tokens-details", "--speed", "1")
	const sys, tokens = "You are brief.", 100 // a second of 10 ms steps
	queued := s.postBackground(t, fmt.Sprintf(`{"request_id": "resp_bg", %s, "max_output_tokens": %d, "temperature": 0, "background": true}`, responsesInput, tokens))
	checkUnfinished(t, queued, "resp_bg", "queued")
	r, got := s.stored(t, "resp_bg")
	if r.Status != "queued" || !bytes.Equal(got, queued) {
		t.Errorf("GET while running: %s\nwant the queued answer %s", got, queued)
	}
	// Continued while queued: the stored chat without its output.
	early, _ := s.respondStored(t, `{"previous_response_id": "resp_bg", "input": "early", "max_output_tokens": 2}`)
	checkPrompt(t, s, early, msgsJSON("user", responsesText, "user", "early"))
	// Polled until it ends: queued, then the final response.
	deadline := time.Now().Add(20 * time.Second)
	for r.Status == "queued" {
		if time.Now().After(deadline) {
			t.Fatal("still queued after 20s")
		}
		time.Sleep(20 * time.Millisecond)
		r, got = s.stored(t, "resp_bg")
	}
	n := tokenCount(t, s, `{"messages": `+responsesChat+`, "add_special_tokens": true}`)
	r.check(t, "sim-model", n, tokens)
	var q storedJSON
	if err := json.Unmarshal(queued, &q); err != nil || q.CreatedAt != r.CreatedAt || r.PreviousResponseID != nil {
		t.Errorf("final response %s\nafter the queued %s", got, queued)
	}
	if _, again := s.stored(t, "resp_bg"); !bytes.Equal(again, got) {
		t.Errorf("the final response changed: %s\nthen %s", got, again)
	}
	// The same greedy request in the foreground answers the same text.
	fg, _ := s.respondStored(t, fmt.Sprintf(`{"request_id": "resp_fg", %s, "max_output_tokens": %d, "temperature": 0}`, responsesInput, tokens))
	if fg.text(t) != r.text(t) {
		t.Errorf("background text %q, foreground %q", r.text(t), fg.text(t))
	}
	next, _ := s.respondStored(t, `{"previous_response_id": "resp_bg", "instructions": "You are brief.", "input": "next", "max_output_tokens": 2}`)
	checkPrompt(t, s, next, msgsJSON("system", sys, "user", responsesText, "assistant", r.text(t), "user", "next"))
	// A finished background response cannot be cancelled.
	code, b := s.do(t, http.MethodPost, "/v1/responses/resp_bg/cancel")
	checkErrorBody(t, code, b, 400, "Cannot cancel a synchronous response.", "invalid_request_error", "response_id")
	checkMetrics(t, s, "after the requests",
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-model"} 6`,
		metric("vllm:num_requests_running", 0), metric("vllm:kv_cache_usage_perc", 0))
	// Without the request_id, a generated id.
	var gen storedJSON
	if err := json.Unmarshal(s.postBackground(t, `{"input": "x", "max_output_tokens": 1, "background": true}`), &gen); err != nil || !strings.HasPrefix(gen.ID, "resp_") || len(gen.ID) != len("resp_")+32 {
		t.Errorf("generated id %q (%v)", gen.ID, err)
	}
}

// Cancelling a background response mid-generation, and one still waiting
// in the engine behind it: each is answered cancelled, aborted in the
// engine (its blocks freed, not counted a success) and stored cancelled;
// a second cancel is vLLM's 400.
func TestResponsesBackgroundCancel(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--speed", "1", "--max-num-seqs", "1")
	// 3000 tokens would take 30 s of 10 ms steps.
	running := s.postBackground(t, `{"request_id": "resp_long", "input": "a long answer", "max_output_tokens": 3000, "background": true}`)
	waitMetrics(t, s, "the first request generating", metric("vllm:num_requests_running", 1))
	for deadline := time.Now().Add(20 * time.Second); metricValue(t, s, "vllm:generation_tokens_total") < 5; {
		if time.Now().After(deadline) {
			t.Fatal("no tokens generated in 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.postBackground(t, `{"request_id": "resp_waiting", "input": "a second long answer", "max_output_tokens": 3000, "background": true}`)
	waitMetrics(t, s, "the second request waiting", metric("vllm:num_requests_waiting", 1), metric("vllm:num_requests_running", 1))
	if r, _ := s.stored(t, "resp_long"); r.Status != "queued" {
		t.Errorf("a running background response is stored %q, want queued (as vLLM stores it)", r.Status)
	}

	code, b := s.do(t, http.MethodPost, "/v1/responses/resp_waiting/cancel")
	if code != http.StatusOK {
		t.Fatalf("cancel the waiting one: %d %s", code, b)
	}
	checkUnfinished(t, b, "resp_waiting", "cancelled")
	checkMetrics(t, s, "the waiting one cancelled", metric("vllm:num_requests_waiting", 0), metric("vllm:num_requests_running", 1))

	code, b = s.do(t, http.MethodPost, "/v1/responses/resp_long/cancel")
	if code != http.StatusOK {
		t.Fatalf("cancel the running one: %d %s", code, b)
	}
	checkUnfinished(t, b, "resp_long", "cancelled")
	// The cancel answers once the request is aborted: its blocks are free.
	checkMetrics(t, s, "the running one cancelled", metric("vllm:num_requests_running", 0),
		metric("vllm:num_requests_waiting", 0), metric("vllm:kv_cache_usage_perc", 0))
	if m := s.get(t, "/metrics"); strings.Contains(m, "vllm:request_success_total{") {
		t.Error("a cancelled request counts as a success")
	}
	// The cancelled response is the queued one, cancelled.
	var q, c map[string]any
	_ = json.Unmarshal(running, &q)
	_ = json.Unmarshal(b, &c)
	q["status"] = "cancelled"
	if fmt.Sprint(q) != fmt.Sprint(c) {
		t.Errorf("cancelled %v\nqueued %v", c, q)
	}
	for _, id := range []string{"resp_long", "resp_waiting"} {
		_, got := s.stored(t, id)
		checkUnfinished(t, got, id, "cancelled")
		code, b := s.do(t, http.MethodPost, "/v1/responses/"+id+"/cancel")
		checkErrorBody(t, code, b, 400, "Cannot cancel a synchronous response.", "invalid_request_error", "response_id")
	}
	// Stays cancelled (the cancel waited for the run to end, so no finish
	// can follow it), and the engine serves on.
	if r, _ := s.stored(t, "resp_long"); r.Status != "cancelled" {
		t.Errorf("status %q after the cancel", r.Status)
	}
	s.respondStored(t, `{"input": "after", "max_output_tokens": 2}`)
}

// streamBody posts a body and returns the response, its status checked.
func (s *sim) streamBody(ctx context.Context, t *testing.T, method, path, body string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %s: %d %s %s", method, path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp
}

// readAllEvents reads a stream to its end and returns it as sent and as
// events.
func readAllEvents(t *testing.T, r io.Reader) ([]byte, []responsesEvent) {
	t.Helper()
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read the stream: %v", err)
	}
	br := bufio.NewReader(bytes.NewReader(raw))
	var evs []responsesEvent
	for {
		ev, err := readResponsesEvent(br)
		if errors.Is(err, io.EOF) {
			return raw, evs
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// A streamed background response: its own answer is the events of a
// streamed response; they are kept, and GET with stream=true replays
// them from the one after starting_after; a client that goes away stops
// only its replay, the request runs on, and a later replay follows it to
// its end.
func TestResponsesBackgroundStream(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--speed", "1")
	const tokens = 30
	resp := s.streamBody(t.Context(), t, http.MethodPost, "/v1/responses",
		fmt.Sprintf(`{"request_id": "resp_bgs", "input": "stream me", "max_output_tokens": %d, "background": true, "stream": true}`, tokens))
	raw, evs := readAllEvents(t, resp.Body)
	resp.Body.Close()
	deltas := 0
	for i, ev := range evs {
		var seq int
		if err := json.Unmarshal(ev.data["sequence_number"], &seq); err != nil || seq != i {
			t.Errorf("event %d (%s): sequence_number %s", i, ev.name, ev.data["sequence_number"])
		}
		if ev.name == "response.output_text.delta" {
			deltas++
		}
	}
	if len(evs) < 2 || evs[0].name != "response.created" || evs[1].name != "response.in_progress" ||
		evs[len(evs)-1].name != "response.incomplete" || deltas != tokens {
		t.Fatalf("events %v: want created, in_progress, %d deltas, ..., incomplete", evs, tokens)
	}
	var created storedJSON
	if err := json.Unmarshal(evs[0].data["response"], &created); err != nil || created.ID != "resp_bgs" || created.Status != "in_progress" {
		t.Errorf("response.created's response %s", evs[0].data["response"])
	}
	// Stored as the last event's response.
	_, got := s.stored(t, "resp_bgs")
	if final := evs[len(evs)-1].data["response"]; !bytes.Equal(bytes.TrimSpace(got), final) {
		t.Errorf("stored %s\nwant the final event's %s", got, final)
	}
	replay := func(query string) []byte {
		t.Helper()
		resp := s.streamBody(t.Context(), t, http.MethodGet, "/v1/responses/resp_bgs?stream=true"+query, "")
		defer resp.Body.Close()
		b, _ := readAllEvents(t, resp.Body)
		return b
	}
	// The events from index i on, as sent.
	from := func(i int) []byte {
		blocks := bytes.SplitAfter(raw, []byte("\n\n"))
		return bytes.Join(blocks[i:], nil)
	}
	for _, c := range []struct {
		query string
		want  []byte
	}{
		{"", raw},
		{"&starting_after=-1", raw},
		{"&starting_after=-7", raw},
		{"&starting_after=5", from(6)},
		{"&starting_after=" + fmt.Sprint(len(evs)-2), from(len(evs) - 1)},
		// After the last event: nothing (vLLM's replay would wait).
		{"&starting_after=" + fmt.Sprint(len(evs)-1), nil},
		{"&starting_after=1000", nil},
	} {
		if got := replay(c.query); !bytes.Equal(got, c.want) {
			t.Errorf("replay %q:\n%s\nwant\n%s", c.query, got, c.want)
		}
	}

	// A client that goes away: the request runs on, and is followed.
	ctx, cancel := context.WithCancel(t.Context())
	resp = s.streamBody(ctx, t, http.MethodPost, "/v1/responses",
		`{"request_id": "resp_left", "input": "left behind", "max_output_tokens": 200, "background": true, "stream": true}`)
	br := bufio.NewReader(resp.Body)
	readUntil(t, br, "response.output_text.delta")
	cancel()
	resp.Body.Close()
	time.Sleep(50 * time.Millisecond)
	checkMetrics(t, s, "the client gone", metric("vllm:num_requests_running", 1))
	resp = s.streamBody(t.Context(), t, http.MethodGet, "/v1/responses/resp_left?stream=true&starting_after=0", "")
	_, evs = readAllEvents(t, resp.Body)
	resp.Body.Close()
	if len(evs) != 2+2+200+4-1 || evs[0].name != "response.in_progress" || evs[len(evs)-1].name != "response.incomplete" {
		t.Errorf("followed %d events, want %d from response.in_progress to response.incomplete", len(evs), 2+2+200+4-1)
	}
	if r, _ := s.stored(t, "resp_left"); r.Status != "incomplete" {
		t.Errorf("stored %q, want incomplete", r.Status)
	}
}

// Cancelling a streamed background response ends its replays after the
// events made so far (vLLM's would wait on), without a terminal event.
func TestResponsesBackgroundStreamCancel(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--speed", "1")
	// The streams are read to their end below: a cancel that failed to end
	// them fails the test at this deadline instead of hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp := s.streamBody(ctx, t, http.MethodPost, "/v1/responses",
		`{"request_id": "resp_sc", "input": "cancel me", "max_output_tokens": 3000, "background": true, "stream": true}`)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	readUntil(t, br, "response.output_text.delta")
	follower := s.streamBody(ctx, t, http.MethodGet, "/v1/responses/resp_sc?stream=true&starting_after=3", "")
	defer follower.Body.Close()
	code, b := s.do(t, http.MethodPost, "/v1/responses/resp_sc/cancel")
	if code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}
	checkUnfinished(t, b, "resp_sc", "cancelled")
	checkMetrics(t, s, "cancelled", metric("vllm:num_requests_running", 0), metric("vllm:kv_cache_usage_perc", 0))
	// The request's own stream had a delta before the cancel; the replay
	// from the fifth event may have had none.
	for name, r := range map[string]io.Reader{"the request's own stream": br, "a replay": follower.Body} {
		_, evs := readAllEvents(t, r)
		for _, ev := range evs {
			if ev.name != "response.output_text.delta" && ev.name != "response.content_part.added" {
				t.Errorf("%s after the cancel: %s, want deltas up to the cancel", name, ev.name)
			}
		}
	}
	_, got := s.stored(t, "resp_sc")
	checkUnfinished(t, got, "resp_sc", "cancelled")
}

// The store's bound holds for background responses: one dropped (the
// oldest past --responses-store-max, or replaced by a response of its id)
// while it runs is aborted.
func TestResponsesBackgroundBound(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--responses-store-max", "1", "--speed", "1")
	s.postBackground(t, `{"request_id": "resp_old", "input": "long", "max_output_tokens": 3000, "background": true}`)
	waitMetrics(t, s, "running", metric("vllm:num_requests_running", 1))
	s.respondStored(t, `{"request_id": "resp_new", "input": "short", "max_output_tokens": 2}`)
	waitMetrics(t, s, "the dropped one aborted", metric("vllm:num_requests_running", 0), metric("vllm:kv_cache_usage_perc", 0))
	if code, b := s.do(t, http.MethodGet, "/v1/responses/resp_old"); code != http.StatusNotFound {
		t.Errorf("GET the dropped one: %d %s", code, b)
	}
	// Replaced by a new background response of its id.
	s.postBackground(t, `{"request_id": "resp_same", "input": "first", "max_output_tokens": 3000, "background": true}`)
	waitMetrics(t, s, "the first running", metric("vllm:num_requests_running", 1))
	s.postBackground(t, `{"request_id": "resp_same", "input": "second", "max_output_tokens": 3000, "background": true}`)
	waitMetrics(t, s, "the first aborted, the second running", metric("vllm:num_requests_running", 1), metric("vllm:num_requests_waiting", 0))
	code, b := s.do(t, http.MethodPost, "/v1/responses/resp_same/cancel")
	if code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}
	checkMetrics(t, s, "both ended", metric("vllm:num_requests_running", 0), metric("vllm:kv_cache_usage_perc", 0))
	checkMetrics(t, s, "one success", `vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-model"} 1`)
	// Every drop is counted: resp_old past the capacity of 1, resp_new
	// pushed out by the first resp_same, the first resp_same replaced; two
	// of them were still running.
	checkMetrics(t, s, "drops counted",
		`enginesim_responses_store_dropped_total{reason="capacity"} 2`,
		`enginesim_responses_store_dropped_total{reason="replaced"} 1`,
		`enginesim_responses_store_runs_aborted_total 2`,
		`enginesim_responses_stored 1`)
}

// Shutdown aborts the background responses and ends their replays: the
// simulator stops at once, leaving no goroutine (TestMain's goleak).
func TestResponsesBackgroundShutdown(t *testing.T) {
	s := startSim(t, "--enable-responses-store", "--speed", "1")
	s.postBackground(t, `{"request_id": "resp_a", "input": "long", "max_output_tokens": 3000, "background": true}`)
	resp := s.streamBody(t.Context(), t, http.MethodPost, "/v1/responses",
		`{"request_id": "resp_b", "input": "long too", "max_output_tokens": 3000, "background": true, "stream": true}`)
	defer resp.Body.Close()
	follower := s.streamBody(t.Context(), t, http.MethodGet, "/v1/responses/resp_b?stream=true", "")
	defer follower.Body.Close()
	waitMetrics(t, s, "both running", metric("vllm:num_requests_running", 2))
	start := time.Now()
	s.stop()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stopping took %v (the HTTP drain waited for the replays)", d)
	}
	for _, r := range []io.Reader{resp.Body, follower.Body} {
		if _, err := io.ReadAll(r); err != nil {
			t.Errorf("a replay after the shutdown: %v", err)
		}
	}
}
