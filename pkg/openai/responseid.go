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
// (response.created, or response.queued for a background response). more
// reports that prefix ends before the answer; with more false, "" means
// the body names no id where one was expected.
func ResponseID(prefix []byte, sse bool) (id string, more bool) {
	if sse {
		return streamResponseID(prefix)
	}
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil {
		return "", len(bytes.TrimSpace(prefix)) == 0
	} else if t != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return "", true
		}
		if k == "id" {
			var v any
			if err := dec.Decode(&v); err != nil {
				return "", true
			}
			s, _ := v.(string)
			return s, false
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", true
		}
	}
	if _, err := dec.Token(); err != nil {
		return "", true
	}
	return "", false
}

// streamResponseID is ResponseID for an event stream: the first event's
// data, once whole.
func streamResponseID(prefix []byte) (string, bool) {
	var data []byte
	for len(prefix) > 0 {
		line, rest, found := bytes.Cut(prefix, []byte("\n"))
		if !found {
			return "", true // the event goes on past the prefix
		}
		prefix = rest
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			if data == nil {
				continue // blank lines before the first event
			}
			var ev struct {
				Response struct {
					ID string `json:"id"`
				} `json:"response"`
			}
			_ = json.Unmarshal(data, &ev)
			return ev.Response.ID, false
		}
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
		}
	}
	return "", true
}
