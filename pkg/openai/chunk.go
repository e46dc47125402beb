package openai

import (
	"bytes"
	"fmt"
)

// Streamed response events and non-streamed response bodies are read by
// the same in-place scanner as requests: the JSON is validated and only
// usage and the fields that show generated output are decoded. The
// result is what encoding/json gives when it decodes the document into
// the structs below (kept as the reference in the tests): keys match as
// encoding/json matches them for these ASCII names (exactly, or else
// ignoring ASCII case), null leaves a plain field as it was and clears a
// pointer, a repeated object key merges into the value before it, and a
// value of the wrong type fails the whole document.

// usageScan is usageJSON as decoded so far: a chat or completion usage
// (prompt_tokens, completion_tokens, prompt_tokens_details), a Responses
// one (input_tokens, output_tokens, input_tokens_details) or an Anthropic
// Messages one (input_tokens, output_tokens, cache_read_input_tokens,
// cache_creation_input_tokens; its input_tokens leave out the two cache
// counts, which the prompt is the sum of). An engine sends one kind; were
// several there, the counts would add and the first kind's cached tokens
// win.
type usageScan struct {
	prompt, completion, total int64
	hasDetails                bool // prompt_tokens_details is an object
	cached                    int64
	hasCached                 bool
	input, output             int64
	hasInputDetails           bool // input_tokens_details is an object
	inputCached               int64
	hasInputCached            bool
	cacheRead, cacheCreation  int64
	hasCacheRead              bool
}

func (u *usageScan) usage() Usage {
	out := Usage{PromptTokens: int(u.prompt + u.input + u.cacheRead + u.cacheCreation), CompletionTokens: int(u.completion + u.output), TotalTokens: int(u.total)}
	switch {
	case u.hasDetails && u.hasCached:
		out.CachedTokens, out.HasCachedTokens = int(u.cached), true
	case u.hasInputDetails && u.hasInputCached:
		out.CachedTokens, out.HasCachedTokens = int(u.inputCached), true
	case u.hasCacheRead:
		out.CachedTokens, out.HasCachedTokens = int(u.cacheRead), true
	}
	return out
}

// keyIs reports whether an object key selects the field name (lower-case
// ASCII), as encoding/json matches a key against a struct field's name.
func keyIs(key, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// errWrongType stops a scan at a value of the wrong type: encoding/json
// fails the whole document then.
var errWrongType = fmt.Errorf("%w: value of the wrong type", ErrInvalidResponse)

// usageObject decodes a usage object (or null: ok false) at s.i into u,
// merging into what u holds, as encoding/json does for a pointer field
// met twice.
func (s *scanner) usageObject(u *usageScan, has *bool) error {
	if null, err := s.objectOrNull(); null || err != nil {
		if null {
			*u, *has = usageScan{}, false
		}
		return err
	}
	*has = true
	return s.Object(2, func(key string) (bool, error) {
		switch {
		case keyIs(key, "prompt_tokens"):
			return true, s.intInto(&u.prompt, nil)
		case keyIs(key, "completion_tokens"):
			return true, s.intInto(&u.completion, nil)
		case keyIs(key, "total_tokens"):
			return true, s.intInto(&u.total, nil)
		case keyIs(key, "input_tokens"):
			return true, s.intInto(&u.input, nil)
		case keyIs(key, "output_tokens"):
			return true, s.intInto(&u.output, nil)
		case keyIs(key, "prompt_tokens_details"):
			return true, s.tokensDetails(&u.hasDetails, &u.cached, &u.hasCached)
		case keyIs(key, "input_tokens_details"):
			return true, s.tokensDetails(&u.hasInputDetails, &u.inputCached, &u.hasInputCached)
		case keyIs(key, "cache_read_input_tokens"):
			return true, s.intInto(&u.cacheRead, &u.hasCacheRead)
		case keyIs(key, "cache_creation_input_tokens"):
			return true, s.intInto(&u.cacheCreation, nil)
		}
		return false, nil
	})
}

// objectOrNull consumes a null (null true) or stops at an object's '{'
// (null false); any other value is errWrongType.
func (s *scanner) objectOrNull() (null bool, err error) {
	switch s.Peek() {
	case 'n':
		return true, s.Literal("null")
	case '{':
		return false, nil
	}
	return false, errWrongType
}

// tokensDetails decodes a prompt_tokens_details (or input_tokens_details)
// object's cached_tokens.
func (s *scanner) tokensDetails(has *bool, cached *int64, hasCached *bool) error {
	if null, err := s.objectOrNull(); null || err != nil {
		if null {
			*has, *hasCached, *cached = false, false, 0
		}
		return err
	}
	*has = true
	return s.Object(3, func(key string) (bool, error) {
		if keyIs(key, "cached_tokens") {
			return true, s.intInto(cached, hasCached)
		}
		return false, nil
	})
}

// intInto decodes an integer into *v. Null leaves *v as it is, or, for a
// pointer field (set not nil), clears *set.
func (s *scanner) intInto(v *int64, set *bool) error {
	if null, err := s.Null(); null || err != nil {
		if null && set != nil {
			*v, *set = 0, false
		}
		return err
	}
	c := s.Peek()
	if c != '-' && (c < '0' || c > '9') {
		return errWrongType
	}
	n, ok, err := s.Int()
	switch {
	case err != nil:
		return err
	case !ok:
		return errWrongType
	}
	*v = n
	if set != nil {
		*set = true
	}
	return nil
}

// strInto scans a string or null into *nonEmpty (whether the decoded
// string is non-empty: it is exactly when its raw bytes are). Null
// leaves it as it is, or, for a pointer field (ptr), clears it.
func (s *scanner) strInto(nonEmpty *bool, ptr bool) error {
	if null, err := s.Null(); null || err != nil {
		if null && ptr {
			*nonEmpty = false
		}
		return err
	}
	if s.Peek() != '"' {
		return errWrongType
	}
	raw, _, err := s.RawString()
	*nonEmpty = len(raw) > 0
	return err
}

// choiceScan is one element of choices as decoded so far.
type choiceScan struct {
	text, content, reasoningContent, reasoning, finish bool
	toolCalls                                          bool // tool_calls is present, not null, not "[]"
}

func (c *choiceScan) output() bool {
	return c.text || c.content || c.reasoningContent || c.reasoning || c.toolCalls || c.finish
}

// choice decodes one element of choices at s.i.
func (s *scanner) choice(c *choiceScan) error {
	switch s.Peek() {
	case 'n':
		return s.Literal("null") // a struct element: left as it is
	case '{':
	default:
		return errWrongType
	}
	return s.Object(3, func(key string) (bool, error) {
		switch {
		case keyIs(key, "text"):
			return true, s.strInto(&c.text, false)
		case keyIs(key, "finish_reason"):
			// Any string, even "", is a finish reason.
			if null, err := s.Null(); null || err != nil {
				if null {
					c.finish = false
				}
				return true, err
			}
			if s.Peek() != '"' {
				return true, errWrongType
			}
			_, _, err := s.RawString()
			c.finish = true
			return true, err
		case keyIs(key, "delta"):
			switch s.Peek() {
			case 'n':
				return true, s.Literal("null")
			case '{':
			default:
				return true, errWrongType
			}
			return true, s.Object(4, func(key string) (bool, error) {
				switch {
				case keyIs(key, "content"):
					return true, s.strInto(&c.content, true)
				case keyIs(key, "reasoning_content"):
					return true, s.strInto(&c.reasoningContent, true)
				case keyIs(key, "reasoning"):
					return true, s.strInto(&c.reasoning, true)
				case keyIs(key, "tool_calls"):
					raw, err := s.Raw(4)
					c.toolCalls = len(raw) > 0 && !isNull(raw) && string(bytes.TrimSpace(raw)) != "[]"
					return true, err
				}
				return false, nil
			})
		}
		return false, nil
	})
}

// chunkScan is what one streamed event tells the stream parser.
type chunkScan struct {
	usage    usageScan
	hasUsage bool
	output   bool // a choice carries generated output or a finish reason
}

// streamStarted are the typed stream events sent before any output: the
// Responses stream's first events, and an Anthropic Messages stream's
// message_start and ping. Every other event of those streams (an output
// item, a content block or its delta, the end) shows that generation has
// begun.
var streamStarted = map[string]bool{"response.created": true, "response.in_progress": true, "response.queued": true,
	"message_start": true, "ping": true}

// scanChunk decodes a streamed event's JSON. Any error (malformed JSON, a
// value of the wrong type) means the event is malformed.
func scanChunk(data []byte) (chunkScan, error) {
	var c chunkScan
	s := newScanner(data)
	switch s.Peek() {
	case 'n':
		if err := s.Literal("null"); err != nil {
			return c, err
		}
		return c, s.End()
	case '{':
	default:
		if err := s.Skip(0); err != nil {
			return c, err
		}
		return c, errWrongType
	}
	var choices []choiceScan
	var typ *string
	var inner usageScan
	var hasInner, hasResponse bool
	err := s.Object(1, func(key string) (bool, error) {
		switch {
		case keyIs(key, "usage"):
			return true, s.usageObject(&c.usage, &c.hasUsage)
		case keyIs(key, "type"):
			// A Responses stream event: its type says whether output began.
			if null, err := s.Null(); null || err != nil {
				if null {
					typ = nil
				}
				return true, err
			}
			if s.Peek() != '"' {
				return true, errWrongType
			}
			t, err := s.Text()
			typ = &t
			return true, err
		case keyIs(key, "response"):
			// A Responses stream event's response object, whose usage the
			// final event fills.
			if null, err := s.objectOrNull(); null || err != nil {
				if null {
					hasResponse, hasInner, inner = false, false, usageScan{}
				}
				return true, err
			}
			hasResponse = true
			return true, s.Object(2, func(key string) (bool, error) {
				if keyIs(key, "usage") {
					return true, s.usageObject(&inner, &hasInner)
				}
				return false, nil
			})
		case keyIs(key, "choices"):
			switch s.Peek() {
			case 'n':
				choices = choices[:0]
				return true, s.Literal("null")
			case '[':
			default:
				return true, errWrongType
			}
			choices = choices[:0]
			return true, s.Array(func(int) error {
				choices = append(choices, choiceScan{})
				return s.choice(&choices[len(choices)-1])
			})
		}
		return false, nil
	})
	if err == nil {
		err = s.End()
	}
	if err != nil {
		return chunkScan{}, err
	}
	for i := range choices {
		if choices[i].output() {
			c.output = true
			break
		}
	}
	if typ != nil && !streamStarted[*typ] {
		c.output = true
	}
	if hasResponse && hasInner {
		c.usage, c.hasUsage = inner, true
	}
	return c, nil
}

// scanUsage finds a response body's top-level usage object.
func scanUsage(body []byte) (u usageScan, ok bool, err error) {
	s := newScanner(body)
	if s.Peek() != '{' {
		return u, false, errWrongType
	}
	err = s.Object(1, func(key string) (bool, error) {
		if keyIs(key, "usage") {
			return true, s.usageObject(&u, &ok)
		}
		return false, nil
	})
	if err == nil {
		err = s.End()
	}
	return u, ok, err
}
