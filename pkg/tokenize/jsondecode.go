package tokenize

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// jsonValue decodes JSON into template values, keeping object key order (the
// template's tojson must print tool schemas in the order the client sent
// them, as Python's json.loads keeps it; a repeated key keeps its first
// place and its last value, as json.loads does). It accepts exactly what
// encoding/json accepts and decodes strings as it does (invalid UTF-8 and
// unpaired surrogates become U+FFFD); numbers keep their literal's Python
// value (jsonNumberValue). A string starting with U+FDD0, the mark numbers
// use, is refused (ErrUnsupported). It reads the bytes in one pass, with no
// reflection and one string allocated per string value (a layer over
// jsonScanner, which checks the grammar): a long conversation's messages
// are decoded on every request that is not a plain chat (Responses,
// Anthropic Messages, messages with tool calls).
func jsonValue(raw []byte) (jinja.Value, error) {
	s := jsonScanner{b: raw}
	s.ws()
	v, err := templateValue(&s, 0)
	if err != nil {
		return jinja.Value{}, err
	}
	if err := s.end(); err != nil {
		return jinja.Value{}, err
	}
	return v, nil
}

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack: a
// value inside more than maxJSONDepth arrays and objects is refused.
const maxJSONDepth = 200

// templateValue reads the value at the scanner's cursor, inside depth
// arrays and objects, as a template value.
func templateValue(s *jsonScanner, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, s.fail("nested too deeply")
	}
	if s.i >= len(s.b) {
		return jinja.Value{}, s.fail("unexpected end of input")
	}
	switch c := s.b[s.i]; {
	case c == '{':
		out := jinja.NewDict()
		dict := out.AsDict()
		for more := s.enter('}'); more; {
			k, err := s.key()
			if err != nil {
				return jinja.Value{}, err
			}
			v, err := templateValue(s, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(k, v)
			if more, err = s.next('}'); err != nil {
				return jinja.Value{}, err
			}
		}
		return out, nil
	case c == '[':
		var items []jinja.Value
		for more := s.enter(']'); more; {
			v, err := templateValue(s, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			items = append(items, v)
			if more, err = s.next(']'); err != nil {
				return jinja.Value{}, err
			}
		}
		return jinja.NewList(items), nil
	case c == '"':
		t, err := s.text()
		if err != nil {
			return jinja.Value{}, err
		}
		if strings.HasPrefix(t, pyNumMark) {
			return jinja.Value{}, fmt.Errorf("%w: string starting with U+FDD0", ErrUnsupported)
		}
		return jinja.NewString(t), nil
	case c == '-' || '0' <= c && c <= '9':
		lit, err := s.number()
		if err != nil {
			return jinja.Value{}, err
		}
		return jsonNumberValue(string(lit))
	case c == 't' && s.literal("true"):
		return jinja.NewBool(true), nil
	case c == 'f' && s.literal("false"):
		return jinja.NewBool(false), nil
	case c == 'n' && s.literal("null"):
		return jinja.None(), nil
	case c == 't' || c == 'f' || c == 'n':
		return jinja.Value{}, s.fail("invalid literal")
	}
	return jinja.Value{}, s.fail("invalid character %q looking for beginning of value", s.b[s.i])
}
