package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
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
	s := jsonScanner{b: b}
	s.ws()
	err := s.members(func(key string) error {
		var err error
		switch {
		case key == "tokens" && s.peek() == '[':
			out.Tokens, err = s.uint32s()
		case key == "tokens" && s.literal("null"):
			out.Tokens = nil
		case key == "tokens":
			err = s.fail("tokens is not an array")
		case key == "count":
			start := s.i
			if err = s.skip(1); err == nil {
				if err = json.Unmarshal(b[start:s.i], &out.Count); err != nil {
					err = fmt.Errorf("count: %w", err)
				}
			}
		default:
			err = s.skip(1)
		}
		return err
	})
	if err != nil {
		return out, err
	}
	return out, s.end()
}

// parseRenderResponse reads a render endpoint's answer (vLLM's
// GenerateRequest): an object whose "token_ids" member is the prompt's
// token ids, or, from /v1/completions/render, an array of such objects,
// one a prompt, of which the first is read (a batch routes by its first
// prompt). Every other member is skipped, checked to be JSON. No
// token_ids, or none in it, is an error.
func parseRenderResponse(b []byte) ([]uint32, error) {
	s := jsonScanner{b: b}
	s.ws()
	var ids []uint32
	var err error
	if s.peek() == '[' {
		first := true
		err = s.elements(func() error {
			if !first {
				return s.skip(1)
			}
			first = false
			var err error
			ids, err = s.renderObject(1)
			return err
		})
	} else {
		ids, err = s.renderObject(0)
	}
	if err != nil {
		return nil, err
	}
	if err := s.end(); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errors.New("no token_ids")
	}
	return ids, nil
}

// renderObject reads one GenerateRequest object's token_ids; depth arrays
// are around it.
func (s *jsonScanner) renderObject(depth int) ([]uint32, error) {
	var ids []uint32
	err := s.members(func(key string) error {
		var err error
		switch {
		case key == "token_ids" && s.peek() == '[':
			ids, err = s.uint32s()
		case key == "token_ids":
			err = s.fail("token_ids is not an array")
		default:
			err = s.skip(depth + 1)
		}
		return err
	})
	return ids, err
}
