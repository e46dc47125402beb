package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/route"
)

// prepareParsed is prepareMessages for messages the request parser already
// decoded (route.ChatMessage): a message holding nothing but role, content
// and name becomes its template value without decoding its JSON again; any
// other message (tool calls, reasoning, non-text parts, a missing role, a
// string the template input refuses) goes through prepareMessage on its
// raw JSON, so the result is the same value either way.
func prepareParsed(msgs []route.ChatMessage) ([]jinja.Value, error) {
	out := make([]jinja.Value, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if !plainMessage(m) {
			v, err := prepareRawMessage(m.Raw, false)
			if err != nil {
				return nil, fmt.Errorf("%w: message %d: %w", ErrBadMessages, i, err)
			}
			out = append(out, v)
			continue
		}
		v := jinja.NewDict()
		d := v.AsDict()
		d.Keys = make([]string, 0, 3)
		role, ok := roleValues[m.Role]
		if !ok {
			role = jinja.NewString(m.Role)
		}
		d.Set("role", role)
		d.Set("content", jinja.NewString(m.Content))
		if m.Name != "" {
			d.Set("name", jinja.NewString(m.Name))
		}
		out = append(out, v)
	}
	return out, nil
}

// prepareRawParsed prepares parsed messages from their raw JSON, as
// prepareMessages would (for content given as parts, which the parsed
// fields keep only joined).
func prepareRawParsed(msgs []route.ChatMessage, parts bool) ([]jinja.Value, error) {
	out := make([]jinja.Value, 0, len(msgs))
	for i := range msgs {
		v, err := prepareRawMessage(msgs[i].Raw, parts)
		if err != nil {
			return nil, fmt.Errorf("%w: message %d: %w", ErrBadMessages, i, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// roleValues are the template values of the usual roles, made once: a
// string value is immutable, so every message can share one.
var roleValues = func() map[string]jinja.Value {
	m := map[string]jinja.Value{}
	for _, r := range []string{"system", "developer", "user", "assistant", "tool"} {
		m[r] = jinja.NewString(r)
	}
	return m
}()

// plainMessage reports whether m's decoded fields are all its template
// value needs: a role, text-only content, no U+FDD0 (the number marker
// jsonValue refuses) and no top-level key but role, content and name (a
// name key only when it decoded to a non-empty string).
func plainMessage(m *route.ChatMessage) bool {
	if m.Role == "" || m.NonText || len(m.Raw) == 0 {
		return false
	}
	const mark = "\ufdd0"
	if strings.Contains(m.Role, mark) || strings.Contains(m.Content, mark) || strings.Contains(m.Name, mark) {
		return false
	}
	if m.Role == "system" && strings.Contains(m.Content, route.BillingHeader) {
		return false // its text parts are stripped one by one (textContent)
	}
	hasName, ok := plainKeys(m.Raw)
	return ok && (m.Name != "" || !hasName)
}

// plainKeys scans a JSON object already validated by the request parser
// and reports whether its top-level keys are only role, content and name,
// and whether name is among them. It decodes nothing but escaped keys.
func plainKeys(raw []byte) (hasName, ok bool) {
	depth := 0
	expectKey := false
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '{', '[':
			depth++
			expectKey = depth == 1 && raw[i] == '{'
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		case '"':
			start := i
			end := stringEnd(raw, i+1)
			if end < 0 {
				return false, false
			}
			i = end
			if !expectKey {
				continue
			}
			expectKey = false
			key := raw[start+1 : i]
			if bytes.IndexByte(key, '\\') >= 0 {
				var s string
				if json.Unmarshal(raw[start:i+1], &s) != nil {
					return false, false
				}
				key = []byte(s)
			}
			// string(key) in a comparison does not allocate.
			switch string(key) {
			case "role", "content":
			case "name":
				hasName = true
			default:
				return false, false
			}
		}
	}
	return hasName, depth == 0
}

// stringEnd returns the index of the quote closing the JSON string whose
// contents start at i, or -1: it jumps from quote to quote (IndexByte), a
// quote being escaped when an odd run of backslashes precedes it.
func stringEnd(raw []byte, i int) int {
	for {
		j := bytes.IndexByte(raw[i:], '"')
		if j < 0 {
			return -1
		}
		q := i + j
		n := 0
		for k := q - 1; k >= i && raw[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q
		}
		i = q + 1
	}
}
