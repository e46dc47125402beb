package route

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/index"
)

// DefaultSessionMemory is how many sessions' home replicas a Router
// remembers by default (Options.SessionMemory).
const DefaultSessionMemory = 1 << 16

// SessionKey returns the request's session identity, the first of:
//
//  1. Request.SessionKey, the x-session-id header, as given;
//  2. "conv:" and a hash of the conversation's opening, for a chat request
//     whose messages include an assistant turn: the model and every message
//     up to and including the first assistant message (role and raw
//     content). Every later turn of a conversation resends that opening
//     unchanged, so its turns share the key; two conversations share it
//     only when they opened identically and got the same first answer.
//     A first turn (no assistant message yet) has no history anywhere and
//     gets no key from its messages;
//  3. "user:" and Request.User, the OpenAI `user` field (one end user may
//     run several conversations: the weakest hint).
//
// It returns "" when none applies. The key is a hint (the replica that
// served the session's previous request is the candidate's Home for the
// policy), never a pin: the policy still weighs load.
func SessionKey(req Request) string {
	if req.SessionKey != "" {
		return req.SessionKey
	}
	if req.Input.Chat && len(req.Input.Messages) > 0 {
		if h, ok := openingHash(req.Model, req.Input.Messages); ok {
			return "conv:" + strconv.FormatUint(h, 16)
		}
	}
	if req.User != "" {
		return "user:" + req.User
	}
	return ""
}

// openingHash hashes the model and the messages up to and including the
// first assistant message; ok is false without one (or on malformed JSON).
// It decodes one message at a time and stops at the first assistant
// message, so a long history is not parsed past its opening.
func openingHash(model string, msgs json.RawMessage) (uint64, bool) {
	dec := json.NewDecoder(bytes.NewReader(msgs))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return 0, false
	}
	h := xxh3.New()
	_, _ = h.WriteString(model)
	_, _ = h.Write([]byte{0})
	for dec.More() {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := dec.Decode(&m); err != nil {
			return 0, false
		}
		_, _ = h.WriteString(m.Role)
		_, _ = h.Write([]byte{0})
		_, _ = h.Write(m.Content)
		_, _ = h.Write([]byte{0})
		if m.Role == "assistant" {
			return h.Sum64(), true
		}
	}
	return 0, false
}

// homes remembers, per session key, the replica that served the session's
// last request: two generations of at most max/2 keys each; when the
// current one fills, it becomes the old one and the older is dropped, so
// memory is bounded and a session seen within the last max/2 to max
// decisions is remembered. Safe for concurrent use (one mutex; a lookup and
// an update per decision).
type homes struct {
	mu       sync.Mutex
	max      int
	cur, old map[string]index.ReplicaID
}

func newHomes(max int) *homes {
	if max <= 0 {
		return nil
	}
	return &homes{max: max, cur: make(map[string]index.ReplicaID)}
}

func (h *homes) get(key string) (index.ReplicaID, bool) {
	if h == nil || key == "" {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if id, ok := h.cur[key]; ok {
		return id, true
	}
	id, ok := h.old[key]
	return id, ok
}

func (h *homes) set(key string, id index.ReplicaID) {
	if h == nil || key == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur[key] = id
	if len(h.cur) >= max(1, h.max/2) {
		h.old, h.cur = h.cur, make(map[string]index.ReplicaID)
	}
}
