package openai

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
)

// StoredResponsePath reports a path naming one stored response of the
// Responses API, GET /v1/responses/{id} (retrieval) or POST
// /v1/responses/{id}/cancel, and returns the id (unescaped, as the
// engines' routers read it). The query is ignored.
func StoredResponsePath(path string) (string, bool) {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	rest, ok := strings.CutPrefix(path, PathResponses+"/")
	if !ok {
		return "", false
	}
	rest = strings.TrimSuffix(rest, "/cancel")
	if rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	id, err := url.PathUnescape(rest)
	if err != nil || id == "" {
		return "", false
	}
	return id, true
}

// ResponseID reads the id of a Responses API response from the first
// bytes of its body: a JSON object's top-level "id", or, in an event
// stream, the "id" of the "response" object its first event carries
// (response.created, or response.queued for a background response). It
// reads no further than the id: the engines write it first, ahead of the
// instructions and tools the response object repeats. more reports that
// prefix ends before the answer; with more false, "" means the body names
// no id where one was expected.
func ResponseID(prefix []byte, sse bool) (id string, more bool) {
	if !sse {
		return idMember(prefix)
	}
	data, whole := firstEventData(prefix)
	if len(data) == 0 {
		return "", !whole
	}
	id, more = idMember(data, "response")
	return id, more && !whole
}

// idMember reads the string "id" member of a JSON object, inside the
// objects named by path (each a member of the one before). more reports
// that b ends before the answer.
func idMember(b []byte, path ...string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	for depth := 0; ; depth++ {
		if t, err := dec.Token(); err != nil {
			return "", true
		} else if t != json.Delim('{') {
			return "", false
		}
		want := "id"
		if depth < len(path) {
			want = path[depth]
		}
		found := false
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return "", true
			}
			if k == want {
				found = true
				break
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", true
			}
		}
		if !found {
			if _, err := dec.Token(); err != nil { // the object's end
				return "", true
			}
			return "", false
		}
		if depth == len(path) {
			var v any
			if err := dec.Decode(&v); err != nil {
				return "", true
			}
			s, _ := v.(string)
			return s, false
		}
	}
}

// firstEventData is the data of an event stream's first event, its data
// lines joined by newlines, as far as prefix holds it; whole reports that
// the event ended within prefix.
func firstEventData(prefix []byte) (data []byte, whole bool) {
	for len(prefix) > 0 {
		line, rest, found := bytes.Cut(prefix, []byte("\n"))
		prefix = rest
		line = bytes.TrimSuffix(line, []byte("\r"))
		if found && len(line) == 0 {
			if data != nil {
				return data, true
			}
			continue // blank lines before the first event
		}
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
		}
	}
	return data, false
}
