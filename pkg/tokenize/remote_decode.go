package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// parseTokenizeResponse reads a /tokenize answer: a JSON object whose
// "tokens" member is an array of token ids and whose optional "count" is
// their number; every other member is skipped (checked to be JSON, not
// decoded). It replaces encoding/json's reflective decoding, which cost
// ~90% of kvroute's CPU per 229 KB chat with the remote tokenizer (one
// literal at a time through reflect for ~60k ids). A member given twice
// counts as its last, as encoding/json has it; a null "tokens" leaves it
// unset.
func parseTokenizeResponse(b []byte) (tokenizeResponse, error) {
	var out tokenizeResponse
	s := jscan{b: b}
	s.ws()
	err := s.members(func(key string) error {
		var err error
		switch {
		case key == "tokens" && s.peek() == '[':
			out.Tokens, err = s.ids()
		case key == "tokens" && s.literal("null"):
			out.Tokens = nil
		case key == "tokens":
			err = s.fail("tokens is not an array")
		case key == "count":
			start := s.i
			if err = s.skip(); err == nil {
				if err = json.Unmarshal(b[start:s.i], &out.Count); err != nil {
					err = fmt.Errorf("count: %w", err)
				}
			}
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return out, err
	}
	return out, s.end()
}

// members reads an object at the cursor, calling member with each key and
// the cursor at its value, which member must read.
func (s *jscan) members(member func(key string) error) error {
	if !s.eat('{') {
		return s.fail("want an object")
	}
	s.ws()
	if s.eat('}') {
		return nil
	}
	for {
		s.ws()
		key, err := s.key()
		if err != nil {
			return err
		}
		s.ws()
		if !s.eat(':') {
			return s.fail("want ':'")
		}
		s.ws()
		if err := member(key); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return nil
		}
		return s.fail("want ',' or '}'")
	}
}

// parseRenderResponse reads a render endpoint's answer (vLLM's
// GenerateRequest): an object whose "token_ids" member is the prompt's
// token ids, or, from /v1/completions/render, an array of such objects,
// one a prompt, of which the first is read (a batch routes by its first
// prompt). Every other member is skipped, checked to be JSON. No
// token_ids, or none in it, is an error.
func parseRenderResponse(b []byte) ([]uint32, error) {
	s := jscan{b: b}
	s.ws()
	list := s.eat('[')
	if list {
		s.ws()
	}
	ids, err := s.renderObject()
	if err != nil {
		return nil, err
	}
	if list {
		for {
			s.ws()
			if s.eat(']') {
				break
			}
			if !s.eat(',') {
				return nil, s.fail("want ',' or ']'")
			}
			s.ws()
			if err := s.skip(); err != nil {
				return nil, err
			}
		}
	}
	if err := s.end(); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errors.New("no token_ids")
	}
	return ids, nil
}

// renderObject reads one GenerateRequest object's token_ids.
func (s *jscan) renderObject() ([]uint32, error) {
	var ids []uint32
	err := s.members(func(key string) error {
		var err error
		switch {
		case key == "token_ids" && s.peek() == '[':
			ids, err = s.ids()
		case key == "token_ids":
			err = s.fail("token_ids is not an array")
		default:
			err = s.skip()
		}
		return err
	})
	return ids, err
}

// jscan is a cursor over JSON text.
type jscan struct {
	b []byte
	i int
}

var errJSON = errors.New("malformed JSON")

func (s *jscan) fail(what string) error {
	return fmt.Errorf("%w at byte %d: %s", errJSON, s.i, what)
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jscan) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *jscan) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

func (s *jscan) literal(lit string) bool {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// end accepts only white space after the value.
func (s *jscan) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.fail("data after the object")
	}
	return nil
}

// str skips a string and returns its quoted text.
func (s *jscan) str() ([]byte, error) {
	start := s.i
	if !s.eat('"') {
		return nil, s.fail("want a string")
	}
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start:s.i], nil
		case c == '\\':
			s.i += 2
		case c < 0x20:
			return nil, s.fail("control character in a string")
		default:
			s.i++
		}
	}
	return nil, s.fail("unterminated string")
}

// key reads an object key (decoded only when it has escapes).
func (s *jscan) key() (string, error) {
	q, err := s.str()
	if err != nil {
		return "", err
	}
	for _, c := range q {
		if c == '\\' {
			var k string
			if err := json.Unmarshal(q, &k); err != nil {
				return "", fmt.Errorf("%w: key: %w", errJSON, err)
			}
			return k, nil
		}
	}
	return string(q[1 : len(q)-1]), nil
}

// skip passes over one value, checking it is JSON.
func (s *jscan) skip() error {
	switch s.peek() {
	case '"':
		q, err := s.str()
		if err == nil && !json.Valid(q) {
			err = s.fail("bad string")
		}
		return err
	case '{', '[':
		open := s.b[s.i]
		close := byte('}')
		if open == '[' {
			close = ']'
		}
		s.i++
		s.ws()
		if s.eat(close) {
			return nil
		}
		for {
			s.ws()
			if open == '{' {
				if _, err := s.str(); err != nil {
					return err
				}
				s.ws()
				if !s.eat(':') {
					return s.fail("want ':'")
				}
				s.ws()
			}
			if err := s.skip(); err != nil {
				return err
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat(close) {
				return nil
			}
			return s.fail("want ',' or a closing bracket")
		}
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			break
		}
		s.i++
	}
	if s.i == start || !json.Valid(s.b[start:s.i]) {
		return s.fail("bad value")
	}
	return nil
}

// ids reads an array of token ids (integers in [0, 2^32)).
func (s *jscan) ids() ([]uint32, error) {
	s.i++ // '['
	out := make([]uint32, 0, (len(s.b)-s.i)/7+1)
	s.ws()
	if s.eat(']') {
		return out, nil
	}
	for {
		s.ws()
		start := s.i
		var v uint64
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			v = v*10 + uint64(s.b[s.i]-'0')
			if v > math.MaxUint32 {
				return nil, s.fail("token id out of range")
			}
			s.i++
		}
		n := s.i - start
		if n == 0 || (n > 1 && s.b[start] == '0') {
			return nil, s.fail("want a token id")
		}
		out = append(out, uint32(v))
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return out, nil
		}
		return nil, s.fail("want ',' or ']' in tokens")
	}
}
