package jsonscan

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strconv"
	"unsafe"
)

// Scanner is a cursor over one JSON text, read in place: each method
// reads one piece of the grammar at the cursor, checks it as encoding/json
// checks it and moves past it. Values a reader does not need are skipped
// (checked, never decoded); strings are returned as their raw bytes (a
// view of the input) or decoded with Unquote. The zero value reads an
// empty text; New starts one.
//
// A reader looks at a value with Peek (which eats the white space before
// it) and calls the method for what it sees. Containers are read either
// with a function per member or element (Object, which skips the members
// the function leaves; Array), or, for readers that recurse or want no
// closure, with Enter, Comma and Close (and Key for a member's key and
// colon):
//
//	for more := s.Enter(); more; more = s.Comma() {
//		k, err := s.Key() // objects only
//		... read the value at the cursor ...
//	}
//	if err := s.Close('}'); err != nil { ... }
//
// Errors in the text are *SyntaxError.
type Scanner struct {
	b []byte
	i int
}

// New returns a scanner at the start of b.
func New(b []byte) Scanner { return Scanner{b: b} }

// Pos is the cursor's offset in the input.
func (s *Scanner) Pos() int { return s.i }

// Input is the text being read (not a copy): Input()[start:Pos()] are the
// bytes read since the cursor was at start.
func (s *Scanner) Input() []byte { return s.b }

// MaxDepth is encoding/json's bound on nested arrays and objects: one
// more is refused, as it is there.
const MaxDepth = 10000

// SyntaxError is malformed JSON. Offset and Msg are those of the
// *json.SyntaxError that encoding/json returns for the same text: Offset
// counts the bytes read up to and including the offending one (all of
// them at an unexpected end), Msg is worded as encoding/json words it.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return "malformed JSON at offset " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

// fail is the syntax error at the cursor's byte, or at the end of the
// input when the cursor is there.
func (s *Scanner) fail(context string) error {
	if s.i >= len(s.b) {
		return &SyntaxError{Offset: len(s.b), Msg: "unexpected end of JSON input"}
	}
	return &SyntaxError{Offset: s.i + 1, Msg: "invalid character " + quoteChar(s.b[s.i]) + " " + context}
}

// failInToken is fail inside a token that a space cannot end (an escape,
// a number, a literal): at the end of the input encoding/json reads one
// more byte, a space, and names it.
func (s *Scanner) failInToken(context string) error {
	if s.i >= len(s.b) {
		return &SyntaxError{Offset: len(s.b), Msg: "invalid character ' ' " + context}
	}
	return s.fail(context)
}

// quoteChar is c between single quotes as encoding/json's messages show
// it: the byte as a rune, escaped as strconv.Quote escapes it.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}

// Peek eats white space and returns the byte at the cursor: the first of
// the next value or punctuation, 0 at the end of the input.
func (s *Scanner) Peek() byte {
	for s.i < len(s.b) {
		// White space is below '!': most bytes take one comparison.
		if c := s.b[s.i]; c > ' ' || c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
		s.i++
	}
	return 0
}

// End checks that only white space follows the value just read.
func (s *Scanner) End() error {
	if s.Peek(); s.i != len(s.b) {
		return s.fail("after top-level value")
	}
	return nil
}

// Enter eats the bracket at the cursor, '{' or '[', which Peek has
// returned, and reports whether a member or element follows (false: the
// closing bracket does, for Close to eat).
func (s *Scanner) Enter() bool {
	close := s.b[s.i] + 2 // '{'+2 is '}', '['+2 is ']'
	s.i++
	return s.Peek() != close
}

// Comma eats the comma after a member's value or an element, if that is
// what follows, and reports whether it did: another member or element
// follows then. It is inlined into the loops over a container, which call
// nothing per element to move on.
func (s *Scanner) Comma() bool {
	if s.Peek() == ',' {
		s.i++
		return true
	}
	return false
}

// Close eats the closing bracket close ('}' or ']') after a container's
// last member or element (when Comma has found no comma) or after Enter
// has found it empty.
func (s *Scanner) Close(close byte) error {
	if s.Peek() == close {
		s.i++
		return nil
	}
	if close == '}' {
		return s.fail("after object key:value pair")
	}
	return s.fail("after array element")
}

// Key reads a member's key, decoded, and the colon after it, leaving the
// cursor at the member's value.
func (s *Scanner) Key() (string, error) {
	raw, escaped, high, err := s.key()
	return Unquote(raw, needsUnquote(raw, escaped, high)), err
}

// key is Key with the key as span returns it.
func (s *Scanner) key() (raw []byte, escaped, high bool, err error) {
	if s.Peek() != '"' {
		return nil, false, false, s.fail("looking for beginning of object key string")
	}
	if raw, escaped, high, err = s.span(); err != nil {
		return nil, false, false, err
	}
	if s.Peek() != ':' {
		return nil, false, false, s.fail("after object key")
	}
	s.i++
	s.Peek()
	return raw, escaped, high, nil
}

// Object reads the object at the cursor ('{', seen with Peek), calling
// member with each key and the cursor at the member's value. member
// reports whether it read the value (consumed); if not, the value is
// skipped. depth is the number of arrays and objects around the members'
// values, this object included (see Skip). A key that needs no decoding
// is a view of the input, valid only during the call.
func (s *Scanner) Object(depth int, member func(key string) (consumed bool, err error)) error {
	for more := s.Enter(); more; more = s.Comma() {
		raw, escaped, high, err := s.key()
		if err != nil {
			return err
		}
		var k string
		if needsUnquote(raw, escaped, high) {
			k = Unquote(raw, true)
		} else {
			// No copy: member only compares the key (or copies it).
			k = unsafe.String(unsafe.SliceData(raw), len(raw))
		}
		consumed, err := member(k)
		if err != nil {
			return err
		}
		if !consumed {
			if err := s.Skip(depth); err != nil {
				return err
			}
		}
	}
	return s.Close('}')
}

// Array reads the array at the cursor ('[', seen with Peek), calling elem
// with the index of each element and the cursor at it; elem must read
// it.
func (s *Scanner) Array(elem func(i int) error) error {
	for i, more := 0, s.Enter(); more; i, more = i+1, s.Comma() {
		s.Peek()
		if err := elem(i); err != nil {
			return err
		}
	}
	return s.Close(']')
}

// Skip reads the value at the cursor (after white space), checking it,
// and decodes nothing. depth is the number of arrays and objects around
// it: an array or object inside MaxDepth others is refused.
func (s *Scanner) Skip(depth int) error {
	switch c := s.Peek(); c {
	case '"':
		_, _, _, err := s.span()
		return err
	case '{', '[':
		if depth >= MaxDepth {
			return s.fail("exceeded max depth")
		}
		for more := s.Enter(); more; more = s.Comma() {
			if c == '{' {
				// The key is checked, not its UTF-8: any bytes make a
				// valid key.
				if _, _, _, err := s.key(); err != nil {
					return err
				}
			}
			if err := s.Skip(depth + 1); err != nil {
				return err
			}
		}
		return s.Close(c + 2)
	case 't':
		return s.Literal("true")
	case 'f':
		return s.Literal("false")
	case 'n':
		return s.Literal("null")
	default:
		if c == '-' || '0' <= c && c <= '9' {
			_, err := s.Number()
			return err
		}
		return s.fail("looking for beginning of value")
	}
}

// Raw is Skip returning the value's bytes (a view of the input).
func (s *Scanner) Raw(depth int) ([]byte, error) {
	s.Peek()
	start := s.i
	err := s.Skip(depth)
	return s.b[start:s.i], err
}

// Literal reads word (true, false or null) at the cursor; the caller has
// seen its first byte.
func (s *Scanner) Literal(word string) error {
	for k := 0; k < len(word); k++ {
		if s.i >= len(s.b) || s.b[s.i] != word[k] {
			return s.failInToken("in literal " + word + " (expecting '" + word[k:k+1] + "')")
		}
		s.i++
	}
	return nil
}

// Null reads a null at the cursor, if that is what is there (null is
// then true), and leaves any other value.
func (s *Scanner) Null() (null bool, err error) {
	if s.Peek() != 'n' {
		return false, nil
	}
	return true, s.Literal("null")
}

// Number reads the number literal at the cursor (a '-' or a digit, seen
// with Peek) and returns its bytes.
func (s *Scanner) Number() ([]byte, error) {
	b, start := s.b, s.i
	i := s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		s.i = i
		return nil, s.failInToken("in numeric literal")
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return nil, s.failInToken("after decimal point in numeric literal")
		}
		i = digits(b, i+1)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return nil, s.failInToken("in exponent of numeric literal")
		}
		i = digits(b, i+1)
	}
	s.i = i
	return b[start:i], nil
}

// Uint reads the number at the cursor when it is a plain unsigned integer
// (digits, with no sign, fraction or exponent) of at most 19 digits, and
// returns its value. Otherwise ok is false and the cursor stays: Int or
// Number reads the number, or names its error. It is the fast path of
// arrays of token ids: returning no error leaves it a leaf function, with
// no frame to set up per id.
func (s *Scanner) Uint() (v uint64, ok bool) {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '0' {
		i++
	} else {
		for ; i < len(b) && b[i]-'0' <= 9; i++ { // a byte below '0' wraps above 9
			v = v*10 + uint64(b[i]-'0')
		}
	}
	if n := i - s.i; n == 0 || n > 19 || i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, false
	}
	s.i = i
	return v, true
}

// Int reads the number at the cursor ('-' or a digit, seen with Peek) and
// returns its value when it is an integer, with no fraction or exponent,
// that an int64 holds (ok), as encoding/json decodes such a literal into
// an int64; any other number is read as Number reads it.
func (s *Scanner) Int() (v int64, ok bool, err error) {
	start := s.i
	neg := s.i < len(s.b) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	u, ok := s.Uint()
	switch {
	case !ok:
		s.i = start
		_, err = s.Number()
		return 0, false, err
	case neg && u <= 1<<63:
		return int64(-u), true, nil // -2^63 included
	case !neg && u <= 1<<63-1:
		return int64(u), true, nil
	}
	return 0, false, nil
}

// digits is the offset of the first byte at or after i that is not a
// digit.
func digits(b []byte, i int) int {
	for i < len(b) && b[i]-'0' <= 9 { // a byte below '0' wraps above 9
		i++
	}
	return i
}

// Text reads the string at the cursor ('"', seen with Peek) and decodes
// it as encoding/json does.
func (s *Scanner) Text() (string, error) {
	raw, complex, err := s.RawString()
	return Unquote(raw, complex), err
}

// RawString reads the string at the cursor ('"', seen with Peek) and
// returns its raw bytes between the quotes (a view of the input), and
// whether they must be decoded by Unquote (they hold an escape, or bytes
// that are not valid UTF-8) to be its value.
func (s *Scanner) RawString() (raw []byte, complex bool, err error) {
	raw, escaped, high, err := s.span()
	return raw, needsUnquote(raw, escaped, high), err
}

// needsUnquote reports whether a string's raw bytes, as span returns
// them, differ from its value.
func needsUnquote(raw []byte, escaped, high bool) bool {
	return escaped || high && !ValidUTF8(raw)
}

const lsb = 0x0101010101010101

// specialBytes marks (with its high bit) the first of the eight bytes of
// w, little-endian, that is a quote, a backslash or a control character:
// the bytes a string's scan must look at one by one. Bytes after the
// first may be marked falsely (a borrow runs on); 0 when there is none.
func specialBytes(w uint64) uint64 {
	ctl := (w - lsb*0x20) & ^w
	q := w ^ (lsb * '"')
	bs := w ^ (lsb * '\\')
	return (ctl | (q-lsb) & ^q | (bs-lsb) & ^bs) & msb
}

// ctlHigh reports whether b holds a control character (below 0x20) and
// whether it holds a byte of 0x80 or more.
func ctlHigh(b []byte) (ctl, high bool) {
	var c, h uint64
	for ; len(b) >= 8; b = b[8:] {
		w := binary.LittleEndian.Uint64(b)
		c |= (w - lsb*0x20) & ^w
		h |= w
	}
	for _, x := range b {
		if x < 0x20 {
			c = msb
		}
		h |= uint64(x)
	}
	return c&msb != 0, h&msb != 0
}

// shortWords is how many eight-byte words of a string span reads before
// it takes the string as long (see span).
const shortWords = 2

// span reads the string at the cursor (at its opening quote) and returns
// its raw bytes, whether they hold an escape, and whether they hold a
// byte of 0x80 or more; a malformed string is an error at the byte
// encoding/json names.
//
// Most strings are short (keys, roles, ids): their first shortWords words
// are read eight bytes at a time, which finds a closing quote there
// without a call. A longer string (a message's text) is read in runs
// between backslashes: IndexByte (vector instructions, memchr speed)
// finds the closing quote once and each backslash before it, and each
// run is checked for control characters and non-ASCII bytes eight bytes
// at a time (four operations a word). Measured on the request parser's and
// the tokenizer's bodies (docs/benchmarks.md), the word scan alone is
// half as fast on long texts and IndexByte alone half as fast on keys.
func (s *Scanner) span() (raw []byte, escaped, high bool, err error) {
	b := s.b
	start := s.i + 1
	i := start
	var hi uint64
	for n := 0; n < shortWords && i+8 <= len(b); n++ {
		w := binary.LittleEndian.Uint64(b[i:])
		if m := specialBytes(w); m != 0 {
			k := bits.TrailingZeros64(m) / 8
			hi |= w & (1<<(8*k) - 1)
			if i += k; b[i] == '"' {
				s.i = i + 1
				return b[start:i], false, hi&msb != 0, nil
			}
			break // an escape or a control character: the long way reads it
		}
		hi |= w
		i += 8
	}
	return s.spanLong(start, i, hi)
}

// spanLong is span from i on, with hi the bytes before i ORed.
func (s *Scanner) spanLong(start, i int, hi uint64) (raw []byte, escaped, high bool, err error) {
	b := s.b
	// q is the closing quote, as far as is known: the first quote at or
	// after i (found again once an escaped quote is passed), len(b) when
	// there is none.
	q := -1
	for {
		if q < i {
			if q = bytes.IndexByte(b[i:], '"'); q < 0 {
				q = len(b)
			} else {
				q += i
			}
		}
		j := q // the run's end: a backslash, the quote or the end of b
		if k := bytes.IndexByte(b[i:q], '\\'); k >= 0 {
			j = i + k
		}
		ctl, h := ctlHigh(b[i:j])
		if ctl {
			for b[i] >= 0x20 {
				i++
			}
			s.i = i
			return nil, false, false, s.fail("in string literal")
		}
		if h {
			hi |= msb
		}
		switch {
		case j == len(b):
			s.i = j
			return nil, false, false, s.fail("in string literal")
		case j == q:
			s.i = q + 1
			return b[start:q], escaped, hi&msb != 0, nil
		}
		escaped = true
		if j+1 >= len(b) {
			s.i = len(b)
			return nil, false, false, s.failInToken("in string escape code")
		}
		switch b[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i = j + 2
		case 'u':
			for k := 2; k < 6; k++ {
				if j+k >= len(b) || !isHex(b[j+k]) {
					s.i = j + k
					return nil, false, false, s.failInToken("in \\u hexadecimal character escape")
				}
			}
			i = j + 6
		default:
			s.i = j + 1
			return nil, false, false, s.fail("in string escape code")
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
