package tokenize

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/kvroute/kvroute/pkg/jsonstr"
)

// jsonScanner is the package's one JSON reader: a cursor over JSON text
// with the grammar's pieces, each checked as encoding/json checks it (RFC
// 8259; strings may hold invalid UTF-8, which decodes to U+FFFD). Its
// users are thin layers over it: jsonValue builds template values,
// parseTokenizeResponse and parseRenderResponse read the engines' token
// ids, arrayElements splits a messages array.
//
// A reader of a value expects the cursor at the value's first byte (white
// space before it eaten) and leaves it just after the value. enter, next
// and key eat the white space around brackets, commas and colons, so that
// a container's elements are read as
//
//	for more := s.enter(']'); more; {
//		... read the element at the cursor ...
//		if more, err = s.next(']'); err != nil { ... }
//	}
//
// and members and elements do that with a function per member or element.
// Errors are *jsonSyntaxError, with the byte offset.
type jsonScanner struct {
	b []byte
	i int
}

// jsonMaxNesting is encoding/json's bound on nested arrays and objects
// (more is refused, as it is there); skip keeps to it. The template-value
// decoder has its own, lower bound (maxJSONDepth).
const jsonMaxNesting = 10000

// jsonSyntaxError is malformed JSON at a byte offset.
type jsonSyntaxError struct {
	Offset int
	msg    string
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("malformed JSON at byte %d: %s", e.Offset, e.msg)
}

// fail is a syntax error at the cursor.
func (s *jsonScanner) fail(format string, a ...any) error {
	return &jsonSyntaxError{Offset: s.i, msg: fmt.Sprintf(format, a...)}
}

// ws eats white space.
func (s *jsonScanner) ws() {
	i := s.i
	for i < len(s.b) && (s.b[i] == ' ' || s.b[i] == '\n' || s.b[i] == '\r' || s.b[i] == '\t') {
		i++
	}
	s.i = i
}

// peek is the byte at the cursor, 0 at the end.
func (s *jsonScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// eat eats c when it is at the cursor.
func (s *jsonScanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// literal eats word (true, false, null) when it is at the cursor.
func (s *jsonScanner) literal(word string) bool {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return true
	}
	return false
}

// end accepts only white space after the value.
func (s *jsonScanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.fail("data after the JSON value")
	}
	return nil
}

// enter eats the opening bracket at the cursor (the caller has seen it)
// and the white space after it, and reports whether an element follows;
// when the container is empty its closing bracket close is eaten too.
func (s *jsonScanner) enter(close byte) bool {
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == close {
		s.i++
		return false
	}
	return true
}

// next follows an element (or a member's value): it eats a comma and the
// white space after it (true: another element follows) or the closing
// bracket close (false).
func (s *jsonScanner) next(close byte) (bool, error) {
	s.ws()
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ',':
			s.i++
			s.ws()
			return true, nil
		case close:
			s.i++
			return false, nil
		}
	}
	if close == '}' {
		return false, s.fail("want ',' or '}' after an object member")
	}
	return false, s.fail("want ',' or ']' after an array element")
}

// colon eats the colon after a member's key, with white space around it,
// leaving the cursor at the member's value.
func (s *jsonScanner) colon() error {
	s.ws()
	if !s.eat(':') {
		return s.fail("want ':' after an object key")
	}
	s.ws()
	return nil
}

// key reads a member's key (decoded) and its colon.
func (s *jsonScanner) key() (string, error) {
	k, err := s.text()
	if err != nil {
		return "", err
	}
	return k, s.colon()
}

// members reads the object at the cursor, calling member with each key
// and the cursor at its value, which member must read.
func (s *jsonScanner) members(member func(key string) error) error {
	if s.peek() != '{' {
		return s.fail("want an object")
	}
	for more := s.enter('}'); more; {
		k, err := s.key()
		if err != nil {
			return err
		}
		if err := member(k); err != nil {
			return err
		}
		if more, err = s.next('}'); err != nil {
			return err
		}
	}
	return nil
}

// elements reads the array at the cursor, calling element with the cursor
// at each element, which element must read.
func (s *jsonScanner) elements(element func() error) error {
	if s.peek() != '[' {
		return s.fail("want an array")
	}
	for more := s.enter(']'); more; {
		if err := element(); err != nil {
			return err
		}
		var err error
		if more, err = s.next(']'); err != nil {
			return err
		}
	}
	return nil
}

// skip passes over the value at the cursor, checking that it is JSON.
// depth is the number of arrays and objects around it: an array or object
// inside jsonMaxNesting others is refused, as encoding/json refuses it.
func (s *jsonScanner) skip(depth int) error {
	if s.i >= len(s.b) {
		return s.fail("unexpected end of input")
	}
	switch c := s.b[s.i]; c {
	case '"':
		_, _, _, err := s.strSpan()
		return err
	case '{', '[':
		if depth >= jsonMaxNesting {
			return s.fail("exceeded max depth")
		}
		close := byte(']')
		if c == '{' {
			close = '}'
		}
		for more := s.enter(close); more; {
			if c == '{' {
				if _, _, _, err := s.strSpan(); err != nil {
					return err
				}
				if err := s.colon(); err != nil {
					return err
				}
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			var err error
			if more, err = s.next(close); err != nil {
				return err
			}
		}
		return nil
	case 't', 'f', 'n':
		if s.literal("true") || s.literal("false") || s.literal("null") {
			return nil
		}
		return s.fail("invalid literal")
	}
	_, err := s.number()
	return err
}

// number reads the number literal at the cursor (RFC 8259's grammar, as
// encoding/json checks it) and returns its bytes.
func (s *jsonScanner) number() ([]byte, error) {
	start := s.i
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		if s.i == start && s.i < len(s.b) {
			return nil, s.fail("invalid character %q looking for beginning of value", s.b[s.i])
		}
		return nil, s.fail("invalid number")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return nil, s.fail("invalid number")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return nil, s.fail("invalid number")
		}
	}
	return s.b[start:s.i], nil
}

// uint32s reads the array at the cursor (the caller has seen its '[') as
// integers in [0, 2^32) written as JSON integers, with no sign, fraction
// or exponent: the token ids the engines answer with.
func (s *jsonScanner) uint32s() ([]uint32, error) {
	b := s.b
	out := make([]uint32, 0, (len(b)-s.i)/7+1)
	for more := s.enter(']'); more; {
		i, v := s.i, uint64(0)
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			if v = v*10 + uint64(b[i]-'0'); v > math.MaxUint32 {
				return nil, s.fail("integer out of range")
			}
		}
		if n := i - s.i; n == 0 || n > 1 && b[s.i] == '0' {
			return nil, s.fail("want an integer in [0, 2^32)")
		}
		s.i = i
		out = append(out, uint32(v))
		if s.eat(',') { // the common case, without the call
			s.ws()
			continue
		}
		var err error
		if more, err = s.next(']'); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// text reads the string at the cursor and decodes it as encoding/json
// does (jsonstr.Unquote).
func (s *jsonScanner) text() (string, error) {
	raw, complex, err := s.str()
	if err != nil {
		return "", err
	}
	return jsonstr.Unquote(raw, complex), nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// specialBytes marks (with its high bit) the first of the eight bytes of w,
// little-endian, that is a quote, a backslash or a control character: the
// bytes a string's scan must look at one by one. Bytes after the first
// one may be marked falsely (a borrow runs on); 0 when there is none.
func specialBytes(w uint64) uint64 {
	ctl := (w - lsb*0x20) & ^w
	q := w ^ (lsb * '"')
	bs := w ^ (lsb * '\\')
	return (ctl | (q-lsb) & ^q | (bs-lsb) & ^bs) & msb
}

// str reads the string at the cursor (which must be at its opening quote
// for the string to be read) and returns its raw bytes between the quotes,
// checked as encoding/json checks them (escapes complete, no control
// character), and whether they need decoding by jsonstr.Unquote (an
// escape, or bytes that are not valid UTF-8).
func (s *jsonScanner) str() (raw []byte, complex bool, err error) {
	raw, escaped, high, err := s.strSpan()
	return raw, escaped || high && !jsonstr.ValidUTF8(raw), err
}

// strSpan is str without the UTF-8 check: whether the raw bytes hold an
// escape, and whether they hold a byte of 0x80 or more.
func (s *jsonScanner) strSpan() (raw []byte, escaped, high bool, err error) {
	if !s.eat('"') {
		return nil, false, false, s.fail("want a string")
	}
	b := s.b
	i, start := s.i, s.i
	var hi uint64
	for {
		// Eight bytes at a time up to the first that needs a look.
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			if m := specialBytes(w); m != 0 {
				k := bits.TrailingZeros64(m) / 8
				hi |= w & (1<<(8*k) - 1)
				i += k
				break
			}
			hi |= w
			i += 8
		}
		if i >= len(b) {
			s.i = i
			return nil, false, false, s.fail("unexpected end of input in a string")
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			raw = b[start:i]
			return raw, escaped, hi&msb != 0, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				s.i = i
				return nil, false, false, s.fail("unexpected end of input in a string escape")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					s.i = i
					return nil, false, false, s.fail("invalid \\u escape in a string")
				}
				i += 6
			default:
				s.i = i
				return nil, false, false, s.fail("invalid escape %q in a string", b[i+1])
			}
		case c < 0x20:
			s.i = i
			return nil, false, false, s.fail("invalid character %q in a string", c)
		default:
			hi |= uint64(c)
			i++
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
