package openai

import (
	"bytes"
	"errors"
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
// objects named by path (each a member of the one before), with the
// request parser's scanner, stopping at the id. more reports that b ends
// before the answer (the scanner ran out of bytes); malformed JSON, or an
// id that is not a string, answers "" with more false.
func idMember(b []byte, path ...string) (string, bool) {
	s := newScanner(b)
	var id string
	err := s.idIn(path, 1, &id)
	switch {
	case errors.Is(err, errIDFound):
		return id, false
	case err != nil:
		return "", s.Pos() >= len(b)
	}
	return "", false // no such member
}

// errIDFound ends idIn's walk once the id is read.
var errIDFound = errors.New("openai: id found")

// idIn walks the object at the cursor down path to its "id" member.
func (s *scanner) idIn(path []string, depth int, id *string) error {
	if s.Peek() != '{' {
		return errWrongType // at the end of b too: idMember tells the two apart
	}
	want := "id"
	if len(path) > 0 {
		want = path[0]
	}
	return s.Object(depth, func(key string) (bool, error) {
		if !keyIs(key, want) {
			return false, nil
		}
		if len(path) > 0 {
			return true, s.idIn(path[1:], depth+1, id)
		}
		if s.Peek() == '"' {
			var err error
			if *id, err = s.Text(); err != nil {
				return true, err
			}
		} else if err := s.Skip(depth); err != nil {
			return true, err
		}
		return true, errIDFound
	})
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
