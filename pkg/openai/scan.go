package openai

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unsafe"

	"github.com/kvroute/kvroute/pkg/jsonstr"
)

// scanner walks one JSON document in place, validating as it goes: every
// value the parser does not need is skipped (checked, never decoded), and
// the values it needs are decoded straight from the body's bytes. It
// accepts exactly what encoding/json accepts (RFC 8259 syntax, any bytes
// in strings except control characters, nesting up to maxDepth) and
// decodes strings as encoding/json does (invalid UTF-8 and unpaired
// surrogates become U+FFFD), so the text it returns is the text every
// encoding/json-based consumer of the same body sees.
type scanner struct {
	b []byte
	i int
}

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

// syntaxError reports malformed JSON at the scanner's offset.
func (s *scanner) syntaxError(what string) error {
	if s.i >= len(s.b) {
		return fmt.Errorf("%w: malformed JSON at offset %d: unexpected end of JSON input", ErrInvalidRequest, s.i)
	}
	return fmt.Errorf("%w: malformed JSON at offset %d: invalid character %s %s", ErrInvalidRequest, s.i+1, quoteChar(s.b[s.i]), what)
}

func quoteChar(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c < 0x20 || c >= 0x7f:
		return strconv.Quote(string(rune(c)))
	}
	return "'" + string(c) + "'"
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek is the next non-space byte (0 at the end).
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end checks that only white space follows the document.
func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.syntaxError("after top-level value")
	}
	return nil
}

// strPlain marks the bytes that stand for themselves inside a string.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special reports whether any of the 8 bytes of w is a quote, a backslash
// or a control character (the bytes that end the fast path of str).
func special(w uint64) bool {
	less := (w - lsb*0x20) & ^w & msb
	q := w ^ (lsb * '"')
	bs := w ^ (lsb * '\\')
	return less|((q-lsb) & ^q & msb)|((bs-lsb) & ^bs & msb) != 0
}

// str scans a string at s.i (which must be '"') and returns its raw bytes
// between the quotes, and whether they must be decoded by unquote (an
// escape, or bytes that are not valid UTF-8).
func (s *scanner) str() (raw []byte, complex bool, err error) {
	b := s.b
	start := s.i + 1
	i := start
	escaped := false
	// q is the next quote at or after i, found once and again only when an
	// escape takes it in: the text is crossed by the memchr-speed
	// IndexByte, and each run between escapes once more for control
	// characters and non-ASCII bytes (four operations per eight bytes).
	q := -1
	for {
		if q < i {
			if q = bytes.IndexByte(b[i:], '"'); q < 0 {
				return s.strSlow()
			}
			q += i
		}
		j := bytes.IndexByte(b[i:q], '\\')
		if j < 0 {
			j = q
		} else {
			j += i
		}
		ctl, high := ctlHigh(b[i:j])
		if ctl {
			return s.strSlow()
		}
		if j == q {
			s.i = q + 1
			raw = b[start:q]
			complex = escaped || (high && !jsonstr.ValidUTF8(raw))
			return raw, complex, nil
		}
		// An escape at j.
		escaped = true
		if j+1 >= len(b) {
			return s.strSlow()
		}
		switch b[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i = j + 2
		case 'u':
			if j+6 > len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
				return s.strSlow()
			}
			i = j + 6
		default:
			return s.strSlow()
		}
	}
}

// ctlHigh reports whether b holds a control character (below 0x20) and
// whether it holds a byte of 0x80 or more.
func ctlHigh(b []byte) (ctl, high bool) {
	var c, h uint64
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		c |= (w - lsb*0x20) & ^w
		h |= w
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			c = msb
		}
		h |= uint64(b[i])
	}
	return c&msb != 0, h&msb != 0
}

// strSlow is str byte by byte (eight at a time between special bytes): it
// finds the same end and reports malformed strings at the offset
// encoding/json names.
func (s *scanner) strSlow() (raw []byte, complex bool, err error) {
	b := s.b
	i := s.i + 1
	start := i
	escaped, high := false, uint64(0)
	for {
		// Eight bytes at a time while none needs a look.
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			if special(w) {
				break
			}
			high |= w
			i += 8
		}
		if i >= len(b) {
			s.i = i
			return nil, false, s.syntaxError("")
		}
		c := b[i]
		if strPlain[c] {
			high |= uint64(c)
			i++
			continue
		}
		switch {
		case c == '"':
			s.i = i + 1
			raw = b[start:i]
			complex = escaped || (high&msb != 0 && !jsonstr.ValidUTF8(raw))
			return raw, complex, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				s.i = len(b)
				return nil, false, s.syntaxError("")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(b) {
						s.i = len(b)
						return nil, false, s.syntaxError("")
					}
					if !isHex(b[i+k]) {
						s.i = i + k
						return nil, false, s.syntaxError("in \\u hexadecimal character escape")
					}
				}
				i += 6
			default:
				s.i = i + 1
				return nil, false, s.syntaxError("in string escape code")
			}
		default: // control character
			s.i = i
			return nil, false, s.syntaxError("in string literal")
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// unquote decodes a string's raw bytes (from str) exactly as encoding/json
// does (jsonstr.Unquote).
func unquote(raw []byte, complex bool) string { return jsonstr.Unquote(raw, complex) }

// number scans a number literal and returns its bytes.
func (s *scanner) number() ([]byte, error) {
	b, start := s.b, s.i
	i := s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		s.i = i
		return nil, s.syntaxError("in numeric literal")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return nil, s.syntaxError("after decimal point in numeric literal")
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return nil, s.syntaxError("in exponent of numeric literal")
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	s.i = i
	return b[start:i], nil
}

// literal scans true, false or null.
func (s *scanner) literal(word string) error {
	for k := 0; k < len(word); k++ {
		if s.i >= len(s.b) || s.b[s.i] != word[k] {
			return s.syntaxError("in literal " + word + " (expecting '" + word[k:k+1] + "')")
		}
		s.i++
	}
	return nil
}

// skip validates the value at s.i (after white space) and moves past it.
func (s *scanner) skip(depth int) error {
	switch c := s.peek(); c {
	case '"':
		_, _, err := s.str()
		return err
	case '{':
		if depth >= maxDepth {
			return fmt.Errorf("%w: malformed JSON at offset %d: exceeded max depth", ErrInvalidRequest, s.i)
		}
		return s.object(func(string, bool) (bool, error) { return false, nil }, depth+1)
	case '[':
		if depth >= maxDepth {
			return fmt.Errorf("%w: malformed JSON at offset %d: exceeded max depth", ErrInvalidRequest, s.i)
		}
		return s.array(func(int) error { return s.skip(depth + 1) })
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || ('0' <= c && c <= '9') {
			_, err := s.number()
			return err
		}
		return s.syntaxError("looking for beginning of value")
	}
}

// raw validates the value at s.i and returns its bytes (a sub-slice of the
// body, never a copy).
func (s *scanner) raw(depth int) ([]byte, error) {
	s.ws()
	start := s.i
	if err := s.skip(depth); err != nil {
		return nil, err
	}
	return s.b[start:s.i], nil
}

// object walks the object at s.i. For each member, field is called with
// the key (decoded only when it is short and plain: keys the parser looks
// for are; valid only during the call) while s.i is at the value; it returns handled=true when it
// consumed the value, else the value is skipped.
func (s *scanner) object(field func(key string, plain bool) (handled bool, err error), depth int) error {
	s.i++ // '{'
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.syntaxError("looking for beginning of object key string")
		}
		k, complex, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.syntaxError("after object key")
		}
		s.i++
		s.ws()
		handled := false
		if !complex && len(k) <= 32 {
			// The key is a view of the body, not a copy: field only
			// compares it or formats it into an error.
			if handled, err = field(unsafe.String(unsafe.SliceData(k), len(k)), true); err != nil {
				return err
			}
		} else if complex && len(k) <= 64 {
			// An escaped key may still spell a known name ("mod\u0065l").
			if handled, err = field(unquote(k, true), true); err != nil {
				return err
			}
		}
		if !handled {
			if err := s.skip(depth); err != nil {
				return err
			}
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.syntaxError("after object key:value pair")
		}
	}
}

// array walks the array at s.i, calling elem with s.i at each element;
// elem must consume it.
func (s *scanner) array(elem func(i int) error) error {
	s.i++ // '['
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for n := 0; ; n++ {
		s.ws()
		if err := elem(n); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.syntaxError("after array element")
		}
	}
}

// kindAt names the JSON type of the value at s.i, for type errors.
func (s *scanner) kindAt() string {
	switch c := s.peek(); c {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// typeError skips the offending value (so that a syntax error later in it
// still wins, as in encoding/json) and names the field.
func (s *scanner) typeError(field, want string, depth int) error {
	got := s.kindAt()
	if err := s.skip(depth); err != nil {
		return err
	}
	return fmt.Errorf("%w: field %q: expected %s, got %s", ErrInvalidRequest, field, want, got)
}

// isNullAt consumes a null at s.i, if that is what is there.
func (s *scanner) isNullAt() (bool, error) {
	if s.peek() != 'n' {
		return false, nil
	}
	return true, s.literal("null")
}

// stringField decodes a string or null (ok false) at s.i.
func (s *scanner) stringField(field string, depth int) (v string, ok bool, err error) {
	if null, err := s.isNullAt(); null || err != nil {
		return "", false, err
	}
	if s.peek() != '"' {
		return "", false, s.typeError(field, "a string", depth)
	}
	raw, complex, err := s.str()
	if err != nil {
		return "", false, err
	}
	return unquote(raw, complex), true, nil
}

// boolField decodes a boolean or null (ok false) at s.i.
func (s *scanner) boolField(field string, depth int) (v, ok bool, err error) {
	switch s.peek() {
	case 'n':
		return false, false, s.literal("null")
	case 't':
		return true, true, s.literal("true")
	case 'f':
		return false, true, s.literal("false")
	}
	return false, false, s.typeError(field, "a boolean", depth)
}

// intField decodes an integer or null (ok false) at s.i.
func (s *scanner) intField(field string, depth int) (v int64, ok bool, err error) {
	if null, err := s.isNullAt(); null || err != nil {
		return 0, false, err
	}
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.typeError(field, "an integer", depth)
	}
	lit, err := s.number()
	if err != nil {
		return 0, false, err
	}
	n, ok := parseInt(lit)
	if !ok {
		return 0, false, fmt.Errorf("%w: field %q: expected an integer, got number %s", ErrInvalidRequest, field, lit)
	}
	return n, true, nil
}

// parseInt reads a valid number literal that is an integer fitting int64
// (no fraction, no exponent), as encoding/json does for an int64 field.
func parseInt(lit []byte) (int64, bool) {
	neg := len(lit) > 0 && lit[0] == '-'
	if neg {
		lit = lit[1:]
	}
	if len(lit) == 0 || len(lit) > 19 {
		return 0, false
	}
	var v uint64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if neg {
		if v > 1<<63 {
			return 0, false
		}
		return -int64(v), true
	}
	if v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}

// tokenID decodes one token id (a plain non-negative integer below 2^32)
// at s.i. A number of another shape is an error naming field.
func (s *scanner) tokenID(field string) (uint32, error) {
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, fmt.Errorf("%w: field %q: expected an array of token ids", ErrInvalidRequest, field)
	}
	lit, err := s.number()
	if err != nil {
		return 0, err
	}
	n, ok := parseInt(lit)
	switch {
	case !ok:
		return 0, fmt.Errorf("%w: field %q: expected an array of token ids", ErrInvalidRequest, field)
	case n < 0 || n > math.MaxUint32:
		return 0, fmt.Errorf("%w: field %q: token id %d out of range", ErrInvalidRequest, field, n)
	}
	return uint32(n), nil
}
