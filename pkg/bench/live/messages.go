package live

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/bench"
)

// APIs a run speaks (Options.API).
const (
	// APICompletions: POST /v1/completions with the whole history as one
	// text prompt (or token ids), the default.
	APICompletions = "completions"
	// APIMessages: POST /v1/messages (Anthropic Messages) as Claude Code
	// sends it to a vLLM server; see messagesSession.
	APIMessages = "messages"
)

// Paths of the two APIs.
const (
	pathCompletions = "/v1/completions"
	pathMessages    = "/v1/messages"
)

// billingVersion is the client version the billing block names.
const billingVersion = "2.1.90.b7e"

// toolSessionPrefixes are the session ids (bench.Session.ID) of the
// generators whose later turns are tool or environment output (agentic,
// agents, mixed's agent sessions, rl, grpo): under APIMessages they go as
// tool_result blocks answering a tool_use of the previous answer. Every
// other session's later turns are user text.
var toolSessionPrefixes = []string{"agent-", "agents-", "mixed-agent-", "rl-", "grpo-"}

func isToolSession(id string) bool {
	for _, p := range toolSessionPrefixes {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// messagesSession is one session's conversation as a Claude Code client
// keeps it and resends it whole every turn:
//
//   - system: Claude Code's billing block first, "x-anthropic-billing-header:
//     cc_version=…; cc_entrypoint=cli; cch=…;" with a cch that changes every
//     request (vLLM and kvroute leave such a block out of the prompt), then,
//     when the first turn has more than one segment, its first segment (the
//     workload's shared system or harness prompt) as a text block marked
//     cache_control ephemeral;
//   - messages: the rest of the first turn as the first user message; each
//     answer's generated text as an assistant message; each later turn's
//     text as a user message: a tool_result block answering the tool_use
//     (a "Bash" call) the previous assistant message ends with, for agent
//     sessions (isToolSession, which also send the Bash tool's
//     definition), else a text block. The last message's last block is
//     marked cache_control ephemeral, as Claude Code marks it;
//   - metadata.user_id, for a session whose client carries an identity
//     (bench.Session.Key or User): Claude Code's JSON string form,
//     {"device_id", "account_uuid", "session_id"}, the session id a UUID
//     drawn from the session's ID and the run's salt, so repetitions and
//     arms never share one. A session with Key also sends it in the session
//     header, as a gateway in front of Claude Code would; a session with
//     neither sends no metadata (a client other than Claude Code), and the
//     router keys it by its opening.
type messagesSession struct {
	r        *runner
	sess     int
	s        *bench.Session
	system   string // the shared system text; "" when the first turn has one segment
	tools    bool
	userID   string // metadata.user_id; "" for none
	messages []anthropicMessage
	chars    int // text characters of system and messages
}

type anthropicMessage struct {
	Role    string         `json:"role"`
	Content []contentBlock `json:"content"`
}

type cacheControl struct {
	Type string `json:"type"`
}

// contentBlock is a text, tool_use or tool_result block.
type contentBlock struct {
	Type         string          `json:"type"`
	Text         string          `json:"text,omitempty"`
	ID           string          `json:"id,omitempty"`
	Name         string          `json:"name,omitempty"`
	Input        json.RawMessage `json:"input,omitempty"`
	ToolUseID    string          `json:"tool_use_id,omitempty"`
	Content      string          `json:"content,omitempty"`
	CacheControl *cacheControl   `json:"cache_control,omitempty"`
}

type toolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type messagesRequest struct {
	Model     string             `json:"model"`
	MaxTokens int                `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	System    []contentBlock     `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	Tools     []toolSpec         `json:"tools,omitempty"`
	Metadata  *messagesMetadata  `json:"metadata,omitempty"`
}

type messagesMetadata struct {
	UserID string `json:"user_id"`
}

var bashTool = toolSpec{
	Name:        "Bash",
	Description: "Runs a shell command and returns its output.",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string","description":"The command to run"}},"required":["command"]}`),
}

func newMessagesSession(r *runner, sess int, s *bench.Session) *messagesSession {
	m := &messagesSession{r: r, sess: sess, s: s, tools: isToolSession(s.ID)}
	if s.Key != "" || s.User != "" {
		h := xxh3.HashString128(fmt.Sprintf("kvbench/live/session\x00%d\x00%s", r.o.Salt, s.ID))
		d := xxh3.HashString128("kvbench/live/device\x00" + s.ID)
		a := xxh3.HashString128("kvbench/live/account\x00" + s.ID)
		id, _ := json.Marshal(struct {
			DeviceID    string `json:"device_id"`
			AccountUUID string `json:"account_uuid"`
			SessionID   string `json:"session_id"`
		}{fmt.Sprintf("%016x%016x%016x%016x", d.Hi, d.Lo, d.Lo^d.Hi, d.Hi*0x9e3779b97f4a7c15), uuid(a), uuid(h)})
		m.userID = string(id)
	}
	return m
}

// uuid formats h as a version-4 UUID.
func uuid(h xxh3.Uint128) string {
	hi := h.Hi&^(0xf<<12) | 0x4<<12
	lo := h.Lo&^(0x3<<62) | 0x2<<62
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", hi>>32, hi>>16&0xffff, hi&0xffff, lo>>48, lo&0xffffffffffff)
}

// toolUseID names turn k's tool call (the tool_use of answer k-1).
func (m *messagesSession) toolUseID(k int) string {
	h := xxh3.HashString128(fmt.Sprintf("kvbench/live/tool\x00%d\x00%d\x00%s\x00%d", m.r.o.Salt, m.sess, m.s.ID, k))
	return fmt.Sprintf("toolu_%016x%08x", h.Hi, h.Lo>>32)
}

// turn appends turn k's user message (the first turn also fills the
// system text) and returns the request body.
func (m *messagesSession) turn(k int, tu bench.Turn, maxTokens int) []byte {
	toks := m.r.tokens(tu)
	if k == 0 {
		if len(tu.Append) > 1 && tu.TraceIDs == nil {
			n := tu.Append[0].Len
			m.system = string(m.r.render(toks[:n]))
			toks = toks[n:]
			m.chars += len(m.system)
		}
		text := string(m.r.render(toks))
		m.chars += len(text)
		m.messages = append(m.messages, anthropicMessage{Role: "user", Content: []contentBlock{{Type: "text", Text: text}}})
	} else {
		text := string(m.r.render(toks))
		m.chars += len(text)
		b := contentBlock{Type: "text", Text: text}
		if m.tools {
			b = contentBlock{Type: "tool_result", ToolUseID: m.toolUseID(k), Content: text}
		}
		m.messages = append(m.messages, anthropicMessage{Role: "user", Content: []contentBlock{b}})
	}
	return m.body(k, maxTokens)
}

// answered appends the answer to turn k; next tells whether another turn
// follows (an agent's answer then ends with the tool call the next turn
// answers).
func (m *messagesSession) answered(k int, out []byte, next bool) {
	var blocks []contentBlock
	if len(out) > 0 {
		blocks = append(blocks, contentBlock{Type: "text", Text: string(out)})
		m.chars += len(out)
	}
	if m.tools && next {
		blocks = append(blocks, contentBlock{Type: "tool_use", ID: m.toolUseID(k + 1), Name: bashTool.Name,
			Input: json.RawMessage(fmt.Sprintf(`{"command":"./step %d"}`, k+1))})
	}
	if len(blocks) == 0 {
		blocks = []contentBlock{{Type: "text", Text: "."}}
	}
	m.messages = append(m.messages, anthropicMessage{Role: "assistant", Content: blocks})
}

// body renders the request for turn k.
func (m *messagesSession) body(k int, maxTokens int) []byte {
	cch := xxh3.HashString(fmt.Sprintf("kvbench/live/cch\x00%d\x00%d\x00%d", m.r.o.Salt, m.sess, k))
	req := messagesRequest{
		Model: m.r.o.Model, MaxTokens: maxTokens, Stream: true,
		System: []contentBlock{{Type: "text", Text: fmt.Sprintf("x-anthropic-billing-header: cc_version=%s; cc_entrypoint=cli; cch=%05x;", billingVersion, cch&0xfffff)}},
	}
	if m.system != "" {
		req.System = append(req.System, contentBlock{Type: "text", Text: m.system, CacheControl: &cacheControl{"ephemeral"}})
	}
	// Only the last message's last block is marked: copy it so the
	// session's history stays unmarked.
	req.Messages = append([]anthropicMessage(nil), m.messages...)
	last := &req.Messages[len(req.Messages)-1]
	last.Content = append([]contentBlock(nil), last.Content...)
	last.Content[len(last.Content)-1].CacheControl = &cacheControl{"ephemeral"}
	if m.tools {
		req.Tools = []toolSpec{bashTool}
	}
	if m.userID != "" {
		req.Metadata = &messagesMetadata{UserID: m.userID}
	}
	b, _ := json.Marshal(req)
	return b
}

// anthropicUsage is a Messages answer's usage. A server that reports its
// prefix cache (vLLM with --enable-prompt-tokens-details) splits the
// prompt into input_tokens (neither read nor written), the tokens read
// from the cache and those its prefill wrote to it.
type anthropicUsage struct {
	InputTokens   int  `json:"input_tokens"`
	OutputTokens  int  `json:"output_tokens"`
	CacheRead     *int `json:"cache_read_input_tokens"`
	CacheCreation *int `json:"cache_creation_input_tokens"`
}

func (u *anthropicUsage) prompt() int {
	n := u.InputTokens
	if u.CacheRead != nil {
		n += *u.CacheRead
	}
	if u.CacheCreation != nil {
		n += *u.CacheCreation
	}
	return n
}

// anthropicEvent is one event of a Messages stream (its data; the type is
// repeated there).
type anthropicEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// readMessagesStream reads an Anthropic Messages event stream into q:
// the first content_block_delta carrying text is the first token (TTFT),
// each later one an inter-token gap; message_start's usage gives the
// prompt's size until message_delta's final usage replaces it (prompt
// tokens are input + cache read + cache creation, cached tokens the cache
// read, -1 when the server does not report it). It returns the generated
// text (text deltas only) and stops at message_stop; a stream that ends
// before it, or an error event, is an error.
func readMessagesStream(body io.Reader, q *Request, start time.Time) []byte {
	var out []byte
	last := start
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	stopped := false
	for !stopped && sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // event:, comments, blank lines
		}
		var ev anthropicEvent
		if err := json.Unmarshal(bytes.TrimSpace(data), &ev); err != nil {
			q.Err = fmt.Sprintf("bad event: %v", err)
			return out
		}
		switch ev.Type {
		case "message_start":
			if ev.Message != nil && ev.Message.Usage != nil {
				q.PromptTokens = ev.Message.Usage.prompt()
			}
		case "content_block_delta":
			if ev.Delta == nil || ev.Delta.Text+ev.Delta.Thinking+ev.Delta.PartialJSON == "" {
				continue
			}
			last = q.chunk(start, last, time.Now())
			if ev.Delta.Type == "text_delta" {
				out = append(out, ev.Delta.Text...)
			}
		case "message_delta":
			if u := ev.Usage; u != nil {
				q.PromptTokens, q.CompletionTokens, q.CachedTokens = u.prompt(), u.OutputTokens, -1
				if u.CacheRead != nil {
					q.CachedTokens = *u.CacheRead
				}
			}
		case "message_stop":
			stopped = true
		case "error":
			msg := "unknown"
			if ev.Error != nil {
				msg = ev.Error.Type + ": " + ev.Error.Message
			}
			q.Err = "error event: " + msg
			return out
		}
	}
	switch {
	case sc.Err() != nil:
		q.Err = sc.Err().Error()
	case !stopped:
		q.Err = "stream ended before message_stop"
	case q.OutputChunks == 0:
		q.Err = "no output"
	}
	return out
}
