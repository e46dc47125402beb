package route

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/index"
)

// DefaultSessionMemory is how many sessions' home replicas a Router
// remembers by default (Options.SessionMemory).
const DefaultSessionMemory = 1 << 16

// SessionKey returns the request's session identity, the first of:
//
//  1. Request.SessionKey, the x-session-id header, as sent (behind "hdr:"
//     when it begins like one of the keys below, "#" or "hdr:");
//  2. "sid:" and Request.BodySession, the conversation the body names
//     (session_id, conversation_id, conversation, metadata's session or
//     conversation id): a client's own name for one conversation, as
//     strong as the header;
//  3. "conv:" and a hash of the conversation's opening, for a chat request
//     whose messages include an assistant turn: the model and every message
//     up to and including the first assistant message (role and raw
//     content). Every later turn of a conversation resends that opening
//     unchanged, so its turns share the key; two conversations share it
//     only when they opened identically and got the same first answer.
//     A first turn (no assistant message yet) has no history anywhere and
//     gets no key from its messages;
//  4. "pck:" and Request.CacheKey, OpenAI's prompt_cache_key (or Claude
//     Code's session, from an Anthropic body's metadata.user_id, which
//     spans its subagents' conversations): a client's key for requests
//     that share a prefix, one conversation's or a whole tenant's, so
//     below the opening (a tenant's conversations must not
//     share one home, where the load bound never applies);
//  5. "user:" and Request.User, the OpenAI `user` field (one end user may
//     run several conversations: the weakest hint).
//
// A value longer than MaxKeyValue bytes, the header's or the body's, is
// replaced by its hash, so a key costs the router's books (homes, session
// book, prompt book) a bounded amount whatever a client sends.
// It returns "" when none applies. The key is a hint (the replica that
// served the session's previous request is the candidate's Home for the
// policy), never a pin: the policy still weighs load.
//
// A request it gives no key that is not a chat request (a
// /v1/completions client's, or token ids) may still be a conversation's
// next turn: Decide then looks for the
// prompt it continues among those the router sent (promptBook.continues)
// and takes that conversation's key ("conv:", Decision.SessionFromPrompt).
func SessionKey(req Request) string {
	if req.SessionKey != "" {
		return boundedKey(headerPrefix(req.SessionKey), req.SessionKey)
	}
	if req.BodySession != "" {
		return boundedKey("sid:", req.BodySession)
	}
	if in := req.Input; in.Chat && (len(in.ChatMessages) > 0 || len(in.Messages) > 0) {
		h, ok := parsedOpeningHash(req.Model, in.ChatMessages)
		if in.ChatMessages == nil {
			h, ok = openingHash(req.Model, in.Messages)
		}
		if ok {
			return "conv:" + strconv.FormatUint(h, 16)
		}
	}
	return firstTurnKey(req)
}

// firstTurnKey is the key a conversation's first turn gets from the body's
// weaker hints, prompt_cache_key or else user (SessionKey's 4 and 5; ""
// without either). Its later turns are keyed by their opening, and the
// session book carries the session over (see Decide).
func firstTurnKey(req Request) string {
	switch {
	case req.CacheKey != "":
		return boundedKey("pck:", req.CacheKey)
	case req.User != "":
		return boundedKey("user:", req.User)
	}
	return ""
}

// derivedPrefixes begin the keys SessionKey derives from a body (and
// "hdr:", the escape below, and "#", a hashed value's mark).
var derivedPrefixes = []string{"sid:", "conv:", "pck:", "user:", "hdr:", "#"}

// headerPrefix is "hdr:" for a header value that begins the way a derived
// key does, else "": a client's x-session-id keys its session as sent, but
// cannot pose as a key the router derives (a conversation's opening, a
// prompt_cache_key or a user, whose sessions the book treats as their
// kind) or as another value's hash.
func headerPrefix(v string) string {
	for _, p := range derivedPrefixes {
		if strings.HasPrefix(v, p) {
			return "hdr:"
		}
	}
	return ""
}

// MaxKeyValue is the longest value, from the session header or the body, a
// session key keeps as it is; a longer one is keyed by its hash.
const MaxKeyValue = 256

// boundedKey is prefix and v, or prefix, "#" and v's hash when v is longer
// than MaxKeyValue.
func boundedKey(prefix, v string) string {
	if len(v) <= MaxKeyValue {
		return prefix + v
	}
	return prefix + "#" + strconv.FormatUint(xxh3.HashString(v), 16)
}

// openingHash hashes the model and the messages up to and including the
// first assistant message (each one's role and raw content); ok is false
// without one (or on malformed JSON). It decodes one message at a time and
// stops at the first assistant message, so a long history is not parsed
// past its opening. parsedOpeningHash is the same hash from the request
// parser's messages (ChatMessage.Role, and the content's raw JSON found in
// ChatMessage.Raw), without encoding/json.
func openingHash(model string, msgs json.RawMessage) (uint64, bool) {
	dec := json.NewDecoder(bytes.NewReader(msgs))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return 0, false
	}
	o := newOpening(model)
	for dec.More() {
		var m rawMessage
		if err := dec.Decode(&m); err != nil {
			return 0, false
		}
		if o.add(m.Role, m.Content) {
			return o.h.Sum64(), true
		}
	}
	return 0, false
}

type rawMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func parsedOpeningHash(model string, msgs []ChatMessage) (uint64, bool) {
	o := newOpening(model)
	for _, m := range msgs {
		content, ok := rawContent(m.Raw)
		if !ok { // a key written with escapes: let encoding/json match it
			var rm rawMessage
			if json.Unmarshal(m.Raw, &rm) != nil {
				return 0, false
			}
			content = rm.Content
		}
		if o.add(m.Role, content) {
			return o.h.Sum64(), true
		}
	}
	return 0, false
}

// opening accumulates openingHash: the model, then each message's role and
// raw content, NUL-separated (a system message's content without Claude
// Code's per-request billing line: systemContentKey).
type opening struct{ h *xxh3.Hasher }

func newOpening(model string) opening {
	o := opening{xxh3.New()}
	_, _ = o.h.WriteString(model)
	_, _ = o.h.Write([]byte{0})
	return o
}

// add hashes one message and reports whether it ends the opening (it is
// the first assistant message).
func (o opening) add(role string, content []byte) bool {
	_, _ = o.h.WriteString(role)
	_, _ = o.h.Write([]byte{0})
	if role == "system" {
		content = systemContentKey(content)
	}
	_, _ = o.h.Write(content)
	_, _ = o.h.Write([]byte{0})
	return role == "assistant"
}

// rawContent returns the raw JSON value of obj's "content" key as
// encoding/json would give it to a json.RawMessage field (the last one
// when repeated, keys compared case-insensitively; nil when absent). obj
// is a well-formed JSON object (the request parser validated it); ok is
// false when a key is written with escapes, which this scan does not
// decode.
func rawContent(obj []byte) (content []byte, ok bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return content, true
		}
		if obj[i] == ',' {
			i++
			continue
		}
		end := skipValue(obj, i) // the key, a string
		if end < 0 {
			return nil, false
		}
		key := obj[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, false
		}
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		i = skipSpace(obj, i+1)
		end = skipValue(obj, i)
		if end < 0 {
			return nil, false
		}
		if bytes.EqualFold(key, []byte("content")) {
			content = obj[i:end]
		}
		i = end
	}
}

// closingQuote returns the index of the quote closing the string whose
// body starts at b[i] (one not escaped by an odd run of backslashes), or
// -1.
func closingQuote(b []byte, i int) int {
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		i += j
		n := 0
		for k := i - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return i
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i], or -1 if
// it is cut short.
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			if i = closingQuote(b, i+1); i < 0 {
				return -1
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
			if depth < 0 {
				return i
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	if depth == 0 {
		return i
	}
	return -1
}

// generations is a map bounded by forgetting: two generations of at most
// max/2 keys each; when the current one fills, it becomes the old one and
// the older is dropped, so a key set within the last max/2 to max sets is
// remembered. Not safe for concurrent use: its owner locks.
type generations[K comparable, V any] struct {
	max      int
	cur, old map[K]V
}

func newGenerations[K comparable, V any](max int) generations[K, V] {
	return generations[K, V]{max: max, cur: make(map[K]V)}
}

func (g *generations[K, V]) get(k K) (V, bool) {
	if v, ok := g.cur[k]; ok {
		return v, true
	}
	v, ok := g.old[k]
	return v, ok
}

func (g *generations[K, V]) set(k K, v V) {
	g.cur[k] = v
	if len(g.cur) >= max(1, g.max/2) {
		g.old, g.cur = g.cur, make(map[K]V)
	}
}

// homes remembers, per session key, the replica that served the session's
// last request (generations of at most max keys). Safe for concurrent use
// (one mutex; a lookup and an update per decision).
type homes struct {
	mu  sync.Mutex
	gen generations[string, index.ReplicaID]
}

func newHomes(max int) *homes {
	if max <= 0 {
		return nil
	}
	return &homes{gen: newGenerations[string, index.ReplicaID](max)}
}

func (h *homes) get(key string) (index.ReplicaID, bool) {
	if h == nil || key == "" {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen.get(key)
}

func (h *homes) set(key string, id index.ReplicaID) {
	if h == nil || key == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen.set(key, id)
}
