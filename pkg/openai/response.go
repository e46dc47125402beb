package openai

import (
	"bytes"
	"errors"
	"fmt"
)

// ErrInvalidResponse is wrapped by ParseUsage errors.
var ErrInvalidResponse = errors.New("openai: invalid response")

// Usage is a response's token accounting.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	TotalTokens      int
	// CachedTokens is prompt_tokens_details.cached_tokens: prompt tokens
	// the engine served from its prefix cache. HasCachedTokens is false when
	// the engine did not report it (vLLM without
	// --enable-prompt-tokens-details): that is unknown, not zero.
	CachedTokens    int
	HasCachedTokens bool
}

// ParseUsage reads the top-level usage object of a non-streamed response
// body. ok is false when the body has no (or a null) usage object.
func ParseUsage(body []byte) (u Usage, ok bool, err error) {
	if firstByte(body) != '{' {
		return Usage{}, false, fmt.Errorf("%w: body is not a JSON object", ErrInvalidResponse)
	}
	us, ok, err := scanUsage(body)
	if err != nil {
		if errors.Is(err, ErrInvalidResponse) {
			return Usage{}, false, err
		}
		return Usage{}, false, fmt.Errorf("%w: %w", ErrInvalidResponse, err)
	}
	if !ok {
		return Usage{}, false, nil
	}
	return us.usage(), true, nil
}

// DefaultMaxEventBytes bounds one server-sent event (all its data lines).
const DefaultMaxEventBytes = 4 << 20

// StreamParser reads an OpenAI server-sent-events response fed in chunks of
// any size. The zero value is ready to use (with DefaultMaxEventBytes).
type StreamParser struct {
	// MaxEventBytes bounds the bytes buffered for one event; a longer event
	// is skipped and counted in Skipped. 0 means DefaultMaxEventBytes.
	MaxEventBytes int

	line     []byte // the current, unterminated line
	data     []byte // data lines of the current event, joined by '\n'
	hasData  bool
	skipping bool // the current event overflowed: drop it to its end
	skipLine bool // while skipping: the current line has bytes
	lastCR   bool // the previous chunk ended in '\r'

	usage   Usage
	hasUse  bool
	content bool
	done    bool
	events  int
	skipped int
	bad     int
}

// Write feeds the next bytes of the stream. It never fails; malformed
// events are counted (Malformed) and skipped.
func (p *StreamParser) Write(b []byte) (int, error) {
	n := len(b)
	if p.oneQuietEvent(b) {
		p.events++
		return n, nil
	}
	if p.lastCR && len(b) > 0 && b[0] == '\n' {
		b = b[1:] // the second half of a "\r\n" split across chunks
	}
	p.lastCR = false
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			p.appendLine(b)
			break
		}
		p.appendLine(b[:i])
		if b[i] == '\r' {
			if i+1 < len(b) && b[i+1] == '\n' {
				i++
			} else if i+1 == len(b) {
				p.lastCR = true
			}
		}
		b = b[i+1:]
		p.endLine()
	}
	return n, nil
}

// oneQuietEvent reports a chunk that is exactly one complete event which
// cannot change the parser's answers: the first output was already seen,
// nothing is pending, and the event is a single data line without usage
// and without the [DONE] terminator. It is the common streamed token
// chunk ("data: {...}\n\n"), which then costs two vectorized scans and
// no copy.
func (p *StreamParser) oneQuietEvent(b []byte) bool {
	if !p.content || p.skipping || p.lastCR || p.hasData || len(p.line) > 0 {
		return false
	}
	if len(b) < 8 || string(b[:5]) != "data:" || b[len(b)-1] != '\n' || bytes.IndexByte(b, '\n') != len(b)-2 {
		return false
	}
	if bytes.IndexByte(b, '\r') >= 0 || bytes.Contains(b, []byte(`"usage"`)) || bytes.Contains(b, []byte("[DONE]")) {
		return false
	}
	return true
}

// Flush dispatches an event the stream ended without terminating (no
// trailing blank line). Call it at the end of the response.
func (p *StreamParser) Flush() {
	if len(p.line) > 0 {
		p.endLine()
	}
	p.dispatch()
}

func (p *StreamParser) limit() int {
	if p.MaxEventBytes > 0 {
		return p.MaxEventBytes
	}
	return DefaultMaxEventBytes
}

func (p *StreamParser) appendLine(b []byte) {
	if p.skipping {
		p.skipLine = p.skipLine || len(b) > 0
		return
	}
	if len(p.line)+len(p.data)+len(b) > p.limit() {
		p.skipping, p.skipLine = true, true
		p.skipped++
		p.line, p.data, p.hasData = p.line[:0], p.data[:0], false
		return
	}
	p.line = append(p.line, b...)
}

// endLine handles one complete line (terminator removed).
func (p *StreamParser) endLine() {
	if p.skipping {
		if !p.skipLine {
			// Blank line: the overflowed event is over.
			p.skipping = false
		}
		p.skipLine = false
		return
	}
	line := p.line
	p.line = p.line[:0]
	if len(line) == 0 {
		p.dispatch()
		return
	}
	if line[0] == ':' {
		return // comment
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	if string(field) != "data" {
		return // event, id, retry: irrelevant here
	}
	if p.hasData {
		p.data = append(p.data, '\n')
	}
	p.data = append(p.data, value...)
	p.hasData = true
}

func (p *StreamParser) dispatch() {
	if !p.hasData {
		return
	}
	data := bytes.TrimSpace(p.data)
	p.data, p.hasData = p.data[:0], false
	p.events++
	if bytes.Equal(data, []byte("[DONE]")) {
		p.done = true
		return
	}
	// Parse only what can still change the parser's answers: content until
	// it is first seen, usage whenever the event mentions it.
	if p.content && !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	c, err := scanChunk(data)
	if err != nil {
		p.bad++
		return
	}
	if c.hasUsage {
		p.usage, p.hasUse = c.usage.usage(), true
	}
	if !p.content && c.output {
		p.content = true
	}
}

// Usage returns the last usage object the stream carried.
func (p *StreamParser) Usage() (Usage, bool) { return p.usage, p.hasUse }

// SawContent reports whether an event carried generated output (text,
// content, reasoning, tool calls) or a finish reason: the first token is out.
func (p *StreamParser) SawContent() bool { return p.content }

// Done reports whether the stream's "data: [DONE]" terminator was seen.
func (p *StreamParser) Done() bool { return p.done }

// Events counts the events dispatched.
func (p *StreamParser) Events() int { return p.events }

// Skipped counts events dropped for exceeding MaxEventBytes.
func (p *StreamParser) Skipped() int { return p.skipped }

// Malformed counts events whose data was not valid JSON.
func (p *StreamParser) Malformed() int { return p.bad }
