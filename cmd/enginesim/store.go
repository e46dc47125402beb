package main

import (
	"container/list"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/openai"
)

// vLLM 0.33's Responses API response store, which it keeps when started
// with VLLM_ENABLE_RESPONSES_API_STORE=1 (entrypoints/openai/responses/
// serving.py): per process and in memory, a response whose request has
// store true (the default) is kept under its id (the body's request_id,
// else "resp_" and a uuid) with the chat messages its prompt was rendered
// from, for a later request's previous_response_id and for GET
// /v1/responses/{id}. A follow-up therefore only works on the replica that
// served the response it continues, and its prompt, the whole conversation
// so far, is a prefix-cache hit there. Without the store a request's store
// is silently ignored and every id is unknown (404). A background
// response (background.go) is stored queued when it is accepted and
// replaced by its final response when it ends, unless it was cancelled.
//
// Differences from vLLM: vLLM never drops an entry (its FIXME: a memory
// leak); the simulator keeps the newest --responses-store-max and drops
// the oldest, and a background response dropped (or replaced by a new
// response of its id) while it runs is aborted, since no one could
// retrieve or cancel it any more (vLLM lets it run). vLLM keeps a
// synchronous response's messages when the request starts and the
// response when it ends; the simulator keeps both when the response ends
// (an unfinished synchronous response is unknown to both).

// storeEnv is the environment variable that enables vLLM's response store.
const storeEnv = "VLLM_ENABLE_RESPONSES_API_STORE"

// storeEnabled reads storeEnv's value as vLLM does (bool(int(v)): an
// integer, enabled unless 0), and also accepts "true" and "false" in any
// case (vLLM fails to start on them); empty or unset is disabled.
func storeEnabled(v string) (bool, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return false, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n != 0, nil
	}
	switch strings.ToLower(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want an integer (1 enables the response store, 0 disables it)", storeEnv, v)
}

// storedResponse is one entry of the store: the response as answered or,
// for a background response, as it stands (vLLM's response_store), the
// chat messages its prompt was rendered from, history included (vLLM's
// msg_store), and a streamed background response's events (vLLM's
// event_store; nil for any other response).
type storedResponse struct {
	resp     *responseObject
	messages []chatMessage
	events   *eventLog
}

// responseStore holds the newest capacity stored responses by id; it is
// safe for concurrent use. A nil store is vLLM's disabled one: it holds
// nothing. A stored responseObject is never modified (a change stores a
// new one), so what get returns may be read without the lock.
type responseStore struct {
	mu       sync.Mutex
	capacity int
	byID     map[string]*list.Element // of *storeEntry
	order    *list.List               // oldest first

	// Entries dropped past the capacity and replaced by a response of the
	// same id, and the background runs those drops cancelled
	// (enginesim_responses_store_dropped_total, _runs_aborted_total).
	evicted, replaced, aborted atomic.Int64
}

// storeEntry is a list element's value: the id it is stored under, the
// entry, and a background response's run (nil for a synchronous one).
type storeEntry struct {
	id string
	storedResponse
	run *bgRun
}

// newResponseStore is an empty store of at most capacity responses.
func newResponseStore(capacity int) *responseStore {
	return &responseStore{capacity: capacity, byID: map[string]*list.Element{}, order: list.New()}
}

// get is (a copy of) the entry stored under id, nil when there is none.
func (st *responseStore) get(id string) *storedResponse {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if e, ok := st.byID[id]; ok {
		sr := e.Value.(*storeEntry).storedResponse
		return &sr
	}
	return nil
}

// put stores a finished synchronous response and the messages its prompt
// was rendered from under resp's id (add).
func (st *responseStore) put(resp *responseObject, messages []chatMessage) {
	st.add(&storeEntry{id: resp.ID, storedResponse: storedResponse{resp: resp, messages: messages}})
}

// add stores e under its id, replacing an entry of that id as vLLM does
// (the newest then), and drops the oldest entries beyond the capacity. A
// replaced or dropped entry's background run is cancelled (not waited
// for: it ends on its own, and finish then finds its entry gone). It
// returns e's element, which finish names.
func (st *responseStore) add(e *storeEntry) *list.Element {
	st.mu.Lock()
	defer st.mu.Unlock()
	if old, ok := st.byID[e.id]; ok {
		st.remove(old)
		st.replaced.Add(1)
	}
	el := st.order.PushBack(e)
	st.byID[e.id] = el
	for st.order.Len() > st.capacity {
		st.remove(st.order.Front())
		st.evicted.Add(1)
	}
	return el
}

// remove drops el; st.mu is held.
func (st *responseStore) remove(el *list.Element) {
	e := el.Value.(*storeEntry)
	st.order.Remove(el)
	delete(st.byID, e.id)
	if e.run != nil {
		e.run.cancel()
		st.aborted.Add(1)
	}
}

// len is the number of stored responses.
func (st *responseStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.order.Len()
}

// collectors are the store's metrics, read at scrape time.
func (st *responseStore) collectors() []prometheus.Collector {
	dropped := func(reason string, n *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "enginesim_responses_store_dropped_total", Help: "Stored responses dropped, by reason: capacity (past --responses-store-max, oldest first), replaced (a response of the same id).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(n.Load()) })
	}
	return []prometheus.Collector{
		dropped("capacity", &st.evicted), dropped("replaced", &st.replaced),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "enginesim_responses_store_runs_aborted_total", Help: "Background responses still running when their entry was dropped, whose engine requests were aborted.",
		}, func() float64 { return float64(st.aborted.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "enginesim_responses_stored", Help: "Responses in the store.",
		}, func() float64 { return float64(st.len()) }),
	}
}

// finish stores a background response's final response in its entry el,
// unless the response was cancelled (as vLLM's responses_full_generator
// leaves a cancelled one), or the entry dropped or replaced, meanwhile.
func (st *responseStore) finish(el *list.Element, resp *responseObject) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e := el.Value.(*storeEntry)
	if cur, ok := st.byID[e.id]; !ok || cur != el || e.resp.Status == "cancelled" {
		return
	}
	e.resp = resp
}

// cancel marks the response stored under id cancelled, as vLLM's
// cancel_responses does, and returns the cancelled response and its run
// (nil if none) for the caller to cancel and wait for: 404 when unknown,
// 400 unless it is queued or in progress (a synchronous response is
// always finished, and so is a background one that completed or was
// cancelled).
func (st *responseStore) cancel(id string) (*responseObject, *bgRun, error) {
	if st == nil {
		return nil, nil, responseNotFound(id)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	el, ok := st.byID[id]
	if !ok {
		return nil, nil, responseNotFound(id)
	}
	e := el.Value.(*storeEntry)
	if s := e.resp.Status; s != "queued" && s != "in_progress" {
		return nil, nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "response_id",
			msg: "Cannot cancel a synchronous response."}
	}
	c := *e.resp
	c.Status = "cancelled"
	e.resp = &c
	return &c, e.run, nil
}

// responseNotFound is vLLM's _make_not_found_error, for an unknown
// previous_response_id as for an unknown path id.
func responseNotFound(id string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "response_id",
		msg: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// continued is the chat a request continuing prev is rendered from, as
// vLLM's construct_input_messages builds it: the request's instructions as
// a system message (when it has any), prev's messages other than system
// ones (instructions do not carry over), the text of each content part of
// prev's output messages as an assistant message, then the request's own
// input.
func continued(turn *openai.ResponsesTurn, prev *storedResponse) ([]chatMessage, error) {
	var msgs []chatMessage
	if turn.System != nil {
		var m chatMessage
		if err := json.Unmarshal(turn.System, &m); err != nil {
			return nil, badRequest("instructions", "instructions convert to an invalid chat message: %v", err)
		}
		msgs = append(msgs, m)
	}
	for _, m := range prev.messages {
		if m.Role != "system" {
			msgs = append(msgs, m)
		}
	}
	for _, o := range prev.resp.Output {
		for _, c := range o.Content {
			m, err := assistantMessage(c.Text)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
		}
	}
	var input []chatMessage
	if err := json.Unmarshal(turn.Input, &input); err != nil {
		return nil, badRequest("input", "input converts to invalid chat messages: %v", err)
	}
	return append(msgs, input...), nil
}

// assistantMessage is {"role": "assistant", "content": text}.
func assistantMessage(text string) (chatMessage, error) {
	b, err := json.Marshal(chatMessageFields{Role: "assistant", Content: mustJSONString(text)})
	if err != nil {
		return chatMessage{}, err
	}
	var m chatMessage
	err = json.Unmarshal(b, &m)
	return m, err
}

// mustJSONString is s as a JSON string.
func mustJSONString(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

// retrieveResponse serves GET /v1/responses/{response_id}: the stored
// response as it stands (a background one queued until it ends, then as
// it ended, or cancelled), 404 when unknown (or the store disabled). With
// stream=true it streams a streamed background response's events from
// the one after starting_after (from the first without it) and follows
// them until the response ends (follow), as vLLM's
// responses_background_stream_generator does. Any other response has no
// events: vLLM starts a 200 stream and fails it with "Unknown
// response_id"; the simulator answers that error as a 400.
func (s *server) retrieveResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("response_id")
	q := r.URL.Query()
	var invalid []string
	stream, ok := queryBool(q.Get("stream"))
	if !ok {
		invalid = append(invalid, "query.stream: Input should be a valid boolean, unable to interpret input")
	}
	startingAfter, hasStart, ok := queryInt(q.Get("starting_after"))
	if !ok {
		invalid = append(invalid, "query.starting_after: Input should be a valid integer, unable to parse string as an integer")
	}
	if len(invalid) > 0 {
		writeError(w, queryValidationError(invalid))
		return
	}
	st := s.store.get(id)
	if st == nil {
		writeError(w, responseNotFound(id))
		return
	}
	if !stream {
		writeJSON(w, http.StatusOK, st.resp)
		return
	}
	if st.events == nil {
		writeError(w, badRequest("response_id", "Unknown response_id: %s", id))
		return
	}
	from := 0
	if hasStart {
		// vLLM starts at starting_after + 1, and below -1 would index its
		// event deque from the end; the simulator starts at the first.
		from = max(0, startingAfter+1)
	}
	follow(w, r, st.events, from)
}

// cancelResponse serves POST /v1/responses/{response_id}/cancel as vLLM's
// cancel_responses does: 404 when unknown; a queued or running background
// response is marked cancelled, its run cancelled (its request aborted in
// the engine) and waited for, and answered 200 with the cancelled
// response; any other is 400 "Cannot cancel a synchronous response.".
func (s *server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	resp, run, err := s.store.cancel(r.PathValue("response_id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if run != nil {
		run.cancel()
		<-run.done
	}
	writeJSON(w, http.StatusOK, resp)
}

// queryValidationError is vLLM's 400 for query parameters its request
// validation refuses, invalid each "loc: message" (the first names the
// param).
func queryValidationError(invalid []string) *apiError {
	label := "error"
	if len(invalid) > 1 {
		label = "errors"
	}
	param, _, _ := strings.Cut(invalid[0], ":")
	return &apiError{status: http.StatusBadRequest, typ: "Bad Request", param: param,
		msg: fmt.Sprintf("%d validation %s: %s", len(invalid), label, strings.Join(invalid, "; "))}
}

// queryInt parses an optional integer query parameter as vLLM's request
// validation does (pydantic, surrounding spaces allowed): set is false
// when it is empty, ok false when it is not an integer.
func queryInt(v string) (n int, set, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false, true
	}
	n, err := strconv.Atoi(v)
	return n, err == nil, err == nil
}

// queryBool parses a boolean query parameter as vLLM's request validation
// does (pydantic: 1, true, t, yes, y, on and their opposites, in any
// case); empty is false. ok is false for anything else.
func queryBool(v string) (b, ok bool) {
	switch strings.ToLower(v) {
	case "", "0", "false", "f", "no", "n", "off":
		return false, true
	case "1", "true", "t", "yes", "y", "on":
		return true, true
	}
	return false, false
}
