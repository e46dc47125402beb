package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/pkg/jsonscan"
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
	s := jsonscan.New(b)
	if s.Peek() != '{' {
		return out, shapeError(&s, "want an object")
	}
	err := s.Object(1, func(key string) (bool, error) {
		switch key {
		case "tokens":
			if null, err := s.Null(); null || err != nil {
				out.Tokens = nil
				return true, err
			}
			if s.Peek() != '[' {
				return true, shapeError(&s, "tokens is not an array")
			}
			var err error
			out.Tokens, err = uint32s(&s)
			return true, err
		case "count":
			raw, err := s.Raw(1)
			if err == nil {
				if err = json.Unmarshal(raw, &out.Count); err != nil {
					err = fmt.Errorf("count: %w", err)
				}
			}
			return true, err
		}
		return false, nil
	})
	if err != nil {
		return out, err
	}
	return out, s.End()
}

// parseRenderResponse reads a render endpoint's answer (vLLM's
// GenerateRequest): an object whose "token_ids" member is the prompt's
// token ids, or, from /v1/completions/render, an array of such objects,
// one a prompt, of which the first is read (a batch routes by its first
// prompt). Every other member is skipped, checked to be JSON. No
// token_ids, or none in it, is an error.
func parseRenderResponse(b []byte) ([]uint32, error) {
	s := jsonscan.New(b)
	var ids []uint32
	var err error
	if s.Peek() == '[' {
		err = s.Array(func(i int) error {
			if i > 0 {
				return s.Skip(1)
			}
			var err error
			ids, err = renderObject(&s, 1)
			return err
		})
	} else {
		ids, err = renderObject(&s, 0)
	}
	if err != nil {
		return nil, err
	}
	if err := s.End(); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errors.New("no token_ids")
	}
	return ids, nil
}

// renderObject reads one GenerateRequest object's token_ids; depth arrays
// are around it.
func renderObject(s *jsonscan.Scanner, depth int) ([]uint32, error) {
	if s.Peek() != '{' {
		return nil, shapeError(s, "want an object")
	}
	var ids []uint32
	err := s.Object(depth+1, func(key string) (bool, error) {
		if key != "token_ids" {
			return false, nil
		}
		if s.Peek() != '[' {
			return true, shapeError(s, "token_ids is not an array")
		}
		var err error
		ids, err = uint32s(s)
		return true, err
	})
	return ids, err
}

// uint32s reads the array at the cursor ('[', seen with Peek) as integers
// in [0, 2^32) written as JSON integers, with no sign, fraction or
// exponent: the token ids the engines answer with.
func uint32s(s *jsonscan.Scanner) ([]uint32, error) {
	out := make([]uint32, 0, (len(s.Input())-s.Pos())/7+1)
	for more := s.Enter(); more; more = s.Comma() {
		s.Peek()
		v, ok := s.Uint()
		switch {
		case !ok:
			return nil, shapeError(s, "want an integer in [0, 2^32)")
		case v > math.MaxUint32:
			return nil, shapeError(s, "integer out of range")
		}
		out = append(out, uint32(v))
	}
	if err := s.Close(']'); err != nil {
		return nil, err
	}
	return out, nil
}

// shapeError is JSON that is not of the shape an answer has, at the
// scanner's cursor.
func shapeError(s *jsonscan.Scanner, what string) error {
	return fmt.Errorf("JSON at byte %d: %s", s.Pos(), what)
}
