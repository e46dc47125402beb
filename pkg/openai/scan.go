package openai

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// scanner is the request parser's cursor: pkg/jsonscan's, which walks
// the body in place as encoding/json reads it (every value the parser does
// not need is checked and skipped, the values it needs are decoded from
// the body's bytes, strings as encoding/json decodes them), with the
// readers of typed fields whose errors name the field.
type scanner struct{ jsonscan.Scanner }

func newScanner(b []byte) *scanner { return &scanner{jsonscan.New(b)} }

// invalid makes a scanner's syntax error a request's: the parser's
// errors all wrap ErrInvalidRequest.
func invalid(err error) error {
	if err == nil || errors.Is(err, ErrInvalidRequest) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
}

// kindAt names the JSON type of the value at the cursor, for type errors.
func (s *scanner) kindAt() string {
	switch c := s.Peek(); c {
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
	if err := s.Skip(depth); err != nil {
		return err
	}
	return fmt.Errorf("%w: field %q: expected %s, got %s", ErrInvalidRequest, field, want, got)
}

// stringField decodes a string or null (ok false) at the cursor.
func (s *scanner) stringField(field string, depth int) (v string, ok bool, err error) {
	if null, err := s.Null(); null || err != nil {
		return "", false, err
	}
	if s.Peek() != '"' {
		return "", false, s.typeError(field, "a string", depth)
	}
	v, err = s.Text()
	return v, err == nil, err
}

// boolField decodes a boolean or null (ok false) at the cursor.
func (s *scanner) boolField(field string, depth int) (v, ok bool, err error) {
	switch s.Peek() {
	case 'n':
		return false, false, s.Literal("null")
	case 't':
		return true, true, s.Literal("true")
	case 'f':
		return false, true, s.Literal("false")
	}
	return false, false, s.typeError(field, "a boolean", depth)
}

// intField decodes an integer or null (ok false) at the cursor.
func (s *scanner) intField(field string, depth int) (v int64, ok bool, err error) {
	if null, err := s.Null(); null || err != nil {
		return 0, false, err
	}
	c := s.Peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.typeError(field, "an integer", depth)
	}
	start := s.Pos()
	n, ok, err := s.Int()
	switch {
	case err != nil:
		return 0, false, err
	case !ok:
		return 0, false, fmt.Errorf("%w: field %q: expected an integer, got number %s", ErrInvalidRequest, field, s.Input()[start:s.Pos()])
	}
	return n, true, nil
}

// tokenID decodes one token id (a plain non-negative integer below 2^32)
// at the cursor. A number of another shape is an error naming field.
func (s *scanner) tokenID(field string) (uint32, error) {
	c := s.Peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, fmt.Errorf("%w: field %q: expected an array of token ids", ErrInvalidRequest, field)
	}
	n, ok, err := s.Int()
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("%w: field %q: expected an array of token ids", ErrInvalidRequest, field)
	case n < 0 || n > math.MaxUint32:
		return 0, fmt.Errorf("%w: field %q: token id %d out of range", ErrInvalidRequest, field, n)
	}
	return uint32(n), nil
}
