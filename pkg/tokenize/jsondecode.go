package tokenize

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/jsonstr"
)

// jsonValue decodes JSON into template values, keeping object key order (the
// template's tojson must print tool schemas in the order the client sent
// them, as Python's json.loads keeps it; a repeated key keeps its first
// place and its last value, as json.loads does). It accepts exactly what
// encoding/json accepts and decodes strings as it does (invalid UTF-8 and
// unpaired surrogates become U+FFFD); numbers keep their literal's Python
// value (jsonNumberValue). A string starting with U+FDD0, the mark numbers
// use, is refused (ErrUnsupported). It reads the bytes in one pass, with no
// reflection and one string allocated per string value: a long
// conversation's messages are decoded on every request that is not a plain
// chat (Responses, Anthropic Messages, messages with tool calls).
func jsonValue(raw []byte) (jinja.Value, error) {
	d := jsonDecoder{b: raw}
	v, err := d.value(0)
	if err != nil {
		return jinja.Value{}, err
	}
	d.space()
	if d.i != len(d.b) {
		return jinja.Value{}, d.errorf("trailing data after JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack.
const maxJSONDepth = 200

type jsonDecoder struct {
	b []byte
	i int
}

func (d *jsonDecoder) errorf(format string, a ...any) error {
	return fmt.Errorf("JSON at byte %d: %s", d.i, fmt.Sprintf(format, a...))
}

func (d *jsonDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, errors.New("JSON nested too deeply")
	}
	d.space()
	if d.i >= len(d.b) {
		return jinja.Value{}, d.errorf("unexpected end of input")
	}
	switch c := d.b[d.i]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		s, err := d.str()
		if err != nil {
			return jinja.Value{}, err
		}
		if strings.HasPrefix(s, pyNumMark) {
			return jinja.Value{}, fmt.Errorf("%w: string starting with U+FDD0", ErrUnsupported)
		}
		return jinja.NewString(s), nil
	case c == '-' || '0' <= c && c <= '9':
		lit, err := d.number()
		if err != nil {
			return jinja.Value{}, err
		}
		return jsonNumberValue(lit)
	case c == 't':
		return jinja.NewBool(true), d.literal("true")
	case c == 'f':
		return jinja.NewBool(false), d.literal("false")
	case c == 'n':
		return jinja.None(), d.literal("null")
	}
	return jinja.Value{}, d.errorf("invalid character %q looking for beginning of value", d.b[d.i])
}

func (d *jsonDecoder) literal(word string) error {
	if len(d.b)-d.i < len(word) || string(d.b[d.i:d.i+len(word)]) != word {
		return d.errorf("invalid literal")
	}
	d.i += len(word)
	return nil
}

func (d *jsonDecoder) object(depth int) (jinja.Value, error) {
	d.i++ // {
	out := jinja.NewDict()
	dict := out.AsDict()
	d.space()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return out, nil
	}
	for {
		d.space()
		if d.i >= len(d.b) || d.b[d.i] != '"' {
			return jinja.Value{}, d.errorf("looking for beginning of object key string")
		}
		k, err := d.str()
		if err != nil {
			return jinja.Value{}, err
		}
		d.space()
		if d.i >= len(d.b) || d.b[d.i] != ':' {
			return jinja.Value{}, d.errorf("after object key")
		}
		d.i++
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		dict.Set(k, v)
		d.space()
		if d.i >= len(d.b) {
			return jinja.Value{}, d.errorf("unexpected end of input in object")
		}
		switch d.b[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			return out, nil
		default:
			return jinja.Value{}, d.errorf("after object key:value pair")
		}
	}
}

func (d *jsonDecoder) array(depth int) (jinja.Value, error) {
	d.i++ // [
	var items []jinja.Value
	d.space()
	if d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return jinja.NewList(items), nil
	}
	for {
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		items = append(items, v)
		d.space()
		if d.i >= len(d.b) {
			return jinja.Value{}, d.errorf("unexpected end of input in array")
		}
		switch d.b[d.i] {
		case ',':
			d.i++
		case ']':
			d.i++
			return jinja.NewList(items), nil
		default:
			return jinja.Value{}, d.errorf("after array element")
		}
	}
}

// number scans a JSON number literal (RFC 8259's grammar, as
// encoding/json checks it).
func (d *jsonDecoder) number() (string, error) {
	start := d.i
	digits := func() int {
		n := 0
		for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.b[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(d.b) && d.b[d.i] == '0':
		d.i++
	case digits() == 0:
		return "", d.errorf("invalid number")
	}
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if digits() == 0 {
			return "", d.errorf("invalid number")
		}
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return "", d.errorf("invalid number")
		}
	}
	return string(d.b[start:d.i]), nil
}

// str decodes the string at d.i (its opening quote) as encoding/json
// decodes it: the string is checked here (escapes complete, no control
// character) and its bytes decoded by jsonstr.Unquote.
func (d *jsonDecoder) str() (string, error) {
	d.i++ // "
	start := d.i
	escaped, high := false, false
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			raw := d.b[start:d.i]
			d.i++
			return jsonstr.Unquote(raw, escaped || high && !jsonstr.ValidUTF8(raw)), nil
		case c < 0x20:
			return "", d.errorf("invalid character %q in string literal", c)
		case c == '\\':
			escaped = true
			if d.i+1 >= len(d.b) {
				return "", d.errorf("unexpected end of input in string escape")
			}
			switch d.b[d.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				d.i += 2
			case 'u':
				d.i += 2
				if !d.hex4() {
					return "", d.errorf("invalid \\u escape")
				}
			default:
				return "", d.errorf("invalid escape %q in string", d.b[d.i+1])
			}
		default:
			high = high || c >= utf8.RuneSelf
			d.i++
		}
	}
	return "", d.errorf("unexpected end of input in string")
}

// hex4 skips the four hex digits of a \u escape; false when they are not.
func (d *jsonDecoder) hex4() bool {
	if len(d.b)-d.i < 4 {
		return false
	}
	for _, c := range d.b[d.i : d.i+4] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	d.i += 4
	return true
}
