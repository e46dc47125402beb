package main

import (
	"container/list"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

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
// is silently ignored and every id is unknown (404).
//
// Differences from vLLM: vLLM never drops an entry (its FIXME: a memory
// leak); the simulator keeps the newest --responses-store-max and drops
// the oldest. vLLM keeps the messages when the request starts and the
// response when it ends; the simulator keeps both when the response ends
// (an unfinished response is unknown to both). Background mode is not
// simulated: background true is refused with 400, so every stored response
// is finished and synchronous (a cancel is always 400, a retrieval never
// streams).

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

// storedResponse is one entry of the store: the response as answered
// (vLLM's response_store) and the chat messages its prompt was rendered
// from, history included (vLLM's msg_store).
type storedResponse struct {
	resp     *responseObject
	messages []chatMessage
}

// responseStore holds the newest capacity stored responses by id; it is
// safe for concurrent use. A nil store is vLLM's disabled one: it holds
// nothing.
type responseStore struct {
	mu       sync.Mutex
	capacity int
	byID     map[string]*list.Element // of *storeEntry
	order    *list.List               // oldest first
}

// storeEntry is a list element's value: the id it is stored under and the
// entry.
type storeEntry struct {
	id string
	storedResponse
}

// newResponseStore is an empty store of at most capacity responses.
func newResponseStore(capacity int) *responseStore {
	return &responseStore{capacity: capacity, byID: map[string]*list.Element{}, order: list.New()}
}

// get is the entry stored under id, nil when there is none.
func (st *responseStore) get(id string) *storedResponse {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if e, ok := st.byID[id]; ok {
		return &e.Value.(*storeEntry).storedResponse
	}
	return nil
}

// put stores resp and the messages its prompt was rendered from under
// resp's id, replacing an entry of that id as vLLM does (the newest then),
// and drops the oldest entries beyond the capacity.
func (st *responseStore) put(resp *responseObject, messages []chatMessage) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if e, ok := st.byID[resp.ID]; ok {
		st.order.Remove(e)
	}
	st.byID[resp.ID] = st.order.PushBack(&storeEntry{id: resp.ID, storedResponse: storedResponse{resp: resp, messages: messages}})
	for st.order.Len() > st.capacity {
		oldest := st.order.Front()
		st.order.Remove(oldest)
		delete(st.byID, oldest.Value.(*storeEntry).id)
	}
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
// response as it was answered, 404 when unknown (or the store disabled).
// vLLM streams (stream=true) only a background stream's events from its
// event store; the simulator has no background mode, so it answers a
// stored response's stream=true with 400 (vLLM would fail that stream
// with "Unknown response_id") and ignores starting_after.
func (s *server) retrieveResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("response_id")
	stream, ok := queryBool(r.URL.Query().Get("stream"))
	if !ok {
		writeError(w, &apiError{status: http.StatusBadRequest, typ: "Bad Request", param: "query.stream",
			msg: "1 validation error: query.stream: Input should be a valid boolean, unable to interpret input"})
		return
	}
	st := s.store.get(id)
	if st == nil {
		writeError(w, responseNotFound(id))
		return
	}
	if stream {
		writeError(w, badRequest("response_id", "Unknown response_id: %s (the simulator streams no stored response: it has no background mode)", id))
		return
	}
	writeJSON(w, http.StatusOK, st.resp)
}

// cancelResponse serves POST /v1/responses/{response_id}/cancel: 404 when
// unknown; vLLM cancels only a queued or running background response, and
// every response the simulator stores is a finished synchronous one, so a
// known id is 400.
func (s *server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("response_id")
	if s.store.get(id) == nil {
		writeError(w, responseNotFound(id))
		return
	}
	writeError(w, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "response_id",
		msg: "Cannot cancel a synchronous response."})
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
