package tokenize

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/jsonscan"
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
// jsonscan.Scanner, which checks the grammar): a long conversation's messages
// are decoded on every request that is not a plain chat (Responses,
// Anthropic Messages, messages with tool calls).
func jsonValue(raw []byte) (jinja.Value, error) {
	s := jsonscan.New(raw)
	v, err := templateValue(&s, 0)
	if err != nil {
		return jinja.Value{}, err
	}
	if err := s.End(); err != nil {
		return jinja.Value{}, err
	}
	return v, nil
}

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack: a
// value inside more than maxJSONDepth arrays and objects is refused.
const maxJSONDepth = 200

// templateValue reads the value at the scanner's cursor, inside depth
// arrays and objects, as a template value.
func templateValue(s *jsonscan.Scanner, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, fmt.Errorf("JSON nested deeper than %d arrays and objects at offset %d", maxJSONDepth, s.Pos())
	}
	switch c := s.Peek(); c {
	case '{':
		out := jinja.NewDict()
		dict := out.AsDict()
		for more := s.Enter(); more; more = s.Comma() {
			k, err := s.Key()
			if err != nil {
				return jinja.Value{}, err
			}
			v, err := templateValue(s, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(k, v)
		}
		return out, s.Close('}')
	case '[':
		var items []jinja.Value
		for more := s.Enter(); more; more = s.Comma() {
			v, err := templateValue(s, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			items = append(items, v)
		}
		return jinja.NewList(items), s.Close(']')
	case '"':
		t, err := s.Text()
		if err != nil {
			return jinja.Value{}, err
		}
		if strings.HasPrefix(t, pyNumMark) {
			return jinja.Value{}, fmt.Errorf("%w: string starting with U+FDD0", ErrUnsupported)
		}
		return jinja.NewString(t), nil
	case 't':
		if err := s.Literal("true"); err != nil {
			return jinja.Value{}, err
		}
		return jinja.NewBool(true), nil
	case 'f':
		if err := s.Literal("false"); err != nil {
			return jinja.Value{}, err
		}
		return jinja.NewBool(false), nil
	case 'n':
		if err := s.Literal("null"); err != nil {
			return jinja.Value{}, err
		}
		return jinja.None(), nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		lit, err := s.Number()
		if err != nil {
			return jinja.Value{}, err
		}
		return jsonNumberValue(string(lit))
	}
	// No value starts here: Skip words the error as encoding/json does.
	return jinja.Value{}, s.Skip(depth)
}
