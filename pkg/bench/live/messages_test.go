package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/openai"
)

// sentBody is a /v1/messages body as the fake decodes it.
type sentBody struct {
	Model     string `json:"model"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	System    []struct {
		Type         string         `json:"type"`
		Text         string         `json:"text"`
		CacheControl map[string]any `json:"cache_control"`
	} `json:"system"`
	Messages []struct {
		Role    string `json:"role"`
		Content []struct {
			Type         string          `json:"type"`
			Text         string          `json:"text"`
			ID           string          `json:"id"`
			Name         string          `json:"name"`
			Input        json.RawMessage `json:"input"`
			ToolUseID    string          `json:"tool_use_id"`
			Content      string          `json:"content"`
			CacheControl map[string]any  `json:"cache_control"`
		} `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Metadata *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

// promptChars is what the fake counts as the prompt: every text of the
// system blocks but the billing block, and of the messages.
func (b *sentBody) promptChars() int {
	n := 0
	for _, s := range b.System {
		if !strings.HasPrefix(s.Text, "x-anthropic-billing-header") {
			n += len(s.Text)
		}
	}
	for _, m := range b.Messages {
		for _, c := range m.Content {
			n += len(c.Text) + len(c.Content)
		}
	}
	return n
}

// fakeMessages speaks the Anthropic Messages API as vLLM streams it:
// message_start, one text block of max_tokens "z" deltas, message_delta
// with the usage (a quarter of the prompt written to the cache, half read
// from it, the rest in input_tokens), message_stop. It records every body
// with its session header.
type fakeMessages struct {
	mu     sync.Mutex
	bodies []sentBody
	raw    [][]byte
	keys   []string // x-session-id of each body
	gap    time.Duration
}

func (f *fakeMessages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var raw json.RawMessage
	var b sentBody
	if r.URL.Path != "/v1/messages" || r.Header.Get("Anthropic-Version") == "" ||
		json.NewDecoder(r.Body).Decode(&raw) != nil || json.Unmarshal(raw, &b) != nil || !b.Stream {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, b)
	f.raw = append(f.raw, raw)
	f.keys = append(f.keys, r.Header.Get("x-session-id"))
	f.mu.Unlock()
	p := b.promptChars()
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	fl := w.(http.Flusher)
	event := func(typ, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
		fl.Flush()
	}
	event("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":%q,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":0}}}`, b.Model, p))
	event("content_block_start", `{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}`)
	event("ping", `{"type":"ping"}`)
	for range b.MaxTokens {
		time.Sleep(f.gap)
		event("content_block_delta", `{"type":"content_block_delta","delta":{"type":"text_delta","text":"z"},"index":0}`)
	}
	event("content_block_stop", `{"type":"content_block_stop","index":0}`)
	read, created := p/2, p/4
	event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":%d,"output_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d}}`,
		p-read-created, b.MaxTokens, created, read))
	event("message_stop", `{"type":"message_stop"}`)
}

// shortTurns makes every turn generate n tokens with no think time.
func shortTurns(w *bench.Workload, n int) {
	for i := range w.Sessions {
		for k := range w.Sessions[i].Turns {
			w.Sessions[i].Turns[k].Output = n
			w.Sessions[i].Turns[k].Gap = 0
		}
	}
}

var billingRE = regexp.MustCompile(`^x-anthropic-billing-header: cc_version=[0-9a-z.]+; cc_entrypoint=cli; cch=[0-9a-f]{5};$`)

// An agent session goes as Claude Code sends it: streamed, the billing
// block (a new cch each request) and the harness prompt as system blocks,
// the task as the first user message, each answer as an assistant
// message ending in a Bash tool_use that the next turn's tool_result
// answers, the last block marked for caching. Every turn resends the
// previous one's messages unchanged. kvroute's own parser converts every
// body as vLLM does (nothing unsupported), without the billing block, and
// the run measures TTFT, inter-token gaps and the usage's prompt and
// cached tokens.
func TestRunMessagesAgentSession(t *testing.T) {
	f := &fakeMessages{gap: time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	w := workload(t, bench.GenAgentic, 0.02) // one session, 10-20 turns
	shortTurns(w, 4)
	s := w.Sessions[0]
	rep, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000, API: APIMessages})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Requests) != len(s.Turns) || len(f.bodies) != len(s.Turns) {
		t.Fatalf("%d requests measured, %d sent; want %d", len(rep.Requests), len(f.bodies), len(s.Turns))
	}
	for _, q := range rep.Requests {
		if q.Err != "" || q.TTFT <= 0 || q.E2E < q.TTFT || len(q.ITLs) != 3 || q.OutputChunks != 4 || q.CompletionTokens != 4 ||
			q.PromptTokens != q.PromptChars || q.CachedTokens != q.PromptChars/2 {
			t.Fatalf("request %+v", q)
		}
	}
	if sum := Summarize(rep); sum.Errors != 0 || sum.HitRate < 0.45 || sum.HitRate > 0.55 {
		t.Fatalf("summary %+v", sum)
	}
	harness, task := s.Turns[0].Append[0].Len, s.Turns[0].Append[1].Len
	cch := map[string]bool{}
	for k, b := range f.bodies {
		if b.Model != "m" || b.MaxTokens != 4 || len(b.System) != 2 || !billingRE.MatchString(b.System[0].Text) || b.System[0].CacheControl != nil ||
			len(b.System[1].Text) != harness || b.System[1].CacheControl["type"] != "ephemeral" {
			t.Fatalf("turn %d: model %q, max_tokens %d, system %+v", k, b.Model, b.MaxTokens, b.System)
		}
		cch[b.System[0].Text] = true
		if len(b.Tools) != 1 || b.Tools[0].Name != "Bash" {
			t.Fatalf("turn %d: tools %+v", k, b.Tools)
		}
		if len(b.Messages) != 2*k+1 || len(b.Messages[0].Content) != 1 || len(b.Messages[0].Content[0].Text) != task {
			t.Fatalf("turn %d: %d messages, the first %+v", k, len(b.Messages), b.Messages[0])
		}
		for i, m := range b.Messages {
			want := [2]string{"user", "assistant"}[i%2]
			if m.Role != want {
				t.Fatalf("turn %d message %d: role %s, want %s", k, i, m.Role, want)
			}
			for j, c := range m.Content {
				last := i == len(b.Messages)-1 && j == len(m.Content)-1
				if (c.CacheControl != nil) != last {
					t.Fatalf("turn %d message %d block %d: cache_control %v", k, i, j, c.CacheControl)
				}
			}
			switch {
			case i%2 == 1: // an answer: the generated text, then the call the next message answers
				call := b.Messages[i+1].Content[0]
				if len(m.Content) != 2 || m.Content[0].Text != "zzzz" || m.Content[1].Type != "tool_use" || m.Content[1].Name != "Bash" ||
					!json.Valid(m.Content[1].Input) || call.Type != "tool_result" || call.ToolUseID != m.Content[1].ID || !strings.HasPrefix(call.ToolUseID, "toolu_") {
					t.Fatalf("turn %d: answer %d %+v, then %+v", k, i, m.Content, call)
				}
			case i > 0: // a tool output: turn i/2's new tokens
				if got, want := len(m.Content[0].Content), s.Turns[i/2].Append[0].Len; m.Content[0].Type != "tool_result" || got != want {
					t.Fatalf("turn %d message %d: %s of %d chars, want a tool_result of %d", k, i, m.Content[0].Type, got, want)
				}
			}
		}
		if k > 0 {
			prev, cur := f.bodies[k-1].Messages, b.Messages
			for i := range prev {
				a, _ := json.Marshal(prev[i].Content[0].Text + prev[i].Content[0].Content)
				c, _ := json.Marshal(cur[i].Content[0].Text + cur[i].Content[0].Content)
				if string(a) != string(c) || prev[i].Role != cur[i].Role {
					t.Fatalf("turn %d changed message %d of turn %d", k, i, k-1)
				}
			}
		}
		req, err := openai.ParseMessages(f.raw[k])
		if err != nil || req.Convert != nil || !req.Stream || req.MaxTokens != 4 {
			t.Fatalf("turn %d: kvroute's parser: %v, convert %v, stream %v, max_tokens %d", k, err, req.Convert, req.Stream, req.MaxTokens)
		}
		var chat []struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCalls  []any           `json:"tool_calls"`
			ToolCallID string          `json:"tool_call_id"`
		}
		if err := json.Unmarshal(req.Messages, &chat); err != nil {
			t.Fatal(err)
		}
		var sys string
		if len(chat) != 2*k+2 || chat[0].Role != "system" || json.Unmarshal(chat[0].Content, &sys) != nil || sys != b.System[1].Text {
			t.Fatalf("turn %d: converted to %d chat messages, the system one %s (want the harness alone)", k, len(chat), chat[0].Content)
		}
		for i, m := range chat[1:] {
			want := [2]string{"user", "assistant"}[i%2]
			if i > 0 && i%2 == 0 {
				want = "tool"
			}
			if m.Role != want || (want == "assistant") != (len(m.ToolCalls) == 1) || (want == "tool") != (m.ToolCallID != "") {
				t.Fatalf("turn %d: converted message %d %+v, want role %s", k, i+1, m, want)
			}
		}
	}
	if len(cch) != len(f.bodies) {
		t.Errorf("%d distinct billing blocks over %d requests, want a new cch each", len(cch), len(f.bodies))
	}
}

// A chat session's later turns are user text, with no tools; a session
// whose first turn is one segment has no system text but the billing
// block.
func TestRunMessagesChatAndSingleSegment(t *testing.T) {
	w := &bench.Workload{Name: "t", Sessions: []bench.Session{
		{ID: "chat-0", Key: "chat-0", Turns: []bench.Turn{
			{Append: []bench.Segment{{ID: 1, Len: 30}, {ID: 2, Len: 10}}, Output: 2},
			{Append: []bench.Segment{{ID: 3, Len: 7}}, Output: 2},
		}},
		{ID: "rl-0-0", Key: "rl-0-0", Start: time.Millisecond, Turns: []bench.Turn{
			{Append: []bench.Segment{{ID: 4, Len: 20}}, Output: 2},
			{Append: []bench.Segment{{ID: 5, Len: 5}}, Output: 2},
		}},
	}}
	f := &fakeMessages{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	rep, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000, API: APIMessages, Words: true})
	if err != nil {
		t.Fatal(err)
	}
	if s := Summarize(rep); s.Errors != 0 || s.Requests != 4 {
		t.Fatalf("summary %+v", s)
	}
	by := map[string][]sentBody{}
	for i, b := range f.bodies {
		by[f.keys[i]] = append(by[f.keys[i]], b)
	}
	chat, rl := by["chat-0"], by["rl-0-0"]
	if len(chat) != 2 || len(rl) != 2 {
		t.Fatalf("bodies by session header: %d chat, %d rl", len(chat), len(rl))
	}
	c := chat[1]
	// Words: every workload token a space and a letter.
	if len(c.System) != 2 || len(c.System[1].Text) != 60 || len(c.Tools) != 0 || len(c.Messages) != 3 ||
		c.Messages[1].Role != "assistant" || len(c.Messages[1].Content) != 1 || c.Messages[1].Content[0].Text != "zz" ||
		c.Messages[2].Content[0].Type != "text" || len(c.Messages[2].Content[0].Text) != 14 {
		t.Fatalf("chat's second turn %+v", c)
	}
	r := rl[1]
	if len(r.System) != 1 || !billingRE.MatchString(r.System[0].Text) || len(r.Messages) != 3 || len(r.Messages[0].Content[0].Text) != 40 ||
		r.Messages[2].Content[0].Type != "tool_result" || len(r.Tools) != 1 {
		t.Fatalf("rl's second turn %+v", r)
	}
}

// A session's identity reaches the server as Claude Code carries it:
// metadata.user_id, the JSON string form with a session_id, for a session
// with a header key (sent too) or a user, the same through its turns and
// different between sessions and between salts; a session with neither
// sends no metadata. kvroute's parser reads the session id.
func TestRunMessagesIdentity(t *testing.T) {
	turns := func(c uint64) []bench.Turn {
		return []bench.Turn{{Append: []bench.Segment{{ID: c, Len: 8}, {ID: c + 1, Len: 8}}, Output: 2}, {Append: []bench.Segment{{ID: c + 2, Len: 4}}, Output: 2}}
	}
	w := &bench.Workload{Name: "ids", Sessions: []bench.Session{
		{ID: "a", Key: "key-a", Turns: turns(10)},
		{ID: "b", User: "user-b", Turns: turns(20)},
		{ID: "c", Turns: turns(30)},
	}}
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	var sessions [2]map[string]string // salt -> first user text -> session id
	for salt := range 2 {
		f := &fakeMessages{}
		srv := httptest.NewServer(f)
		_, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000, API: APIMessages, Salt: uint64(salt)})
		srv.Client().CloseIdleConnections()
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(f.bodies) != 6 {
			t.Fatalf("%d bodies, want 6", len(f.bodies))
		}
		sessions[salt] = map[string]string{}
		headers := 0
		for i, b := range f.bodies {
			first := b.Messages[0].Content[0].Text
			req, err := openai.ParseMessages(f.raw[i])
			if err != nil {
				t.Fatal(err)
			}
			if f.keys[i] == "key-a" {
				headers++
			}
			if b.Metadata == nil {
				if req.SessionID != "" || req.PromptCacheKey != "" || f.keys[i] != "" {
					t.Fatalf("a body without metadata has session %q/%q, header %q", req.SessionID, req.PromptCacheKey, f.keys[i])
				}
				sessions[salt][first] = ""
				continue
			}
			var uid struct {
				DeviceID    string `json:"device_id"`
				AccountUUID string `json:"account_uuid"`
				SessionID   string `json:"session_id"`
			}
			if err := json.Unmarshal([]byte(b.Metadata.UserID), &uid); err != nil || !uuidRE.MatchString(uid.SessionID) ||
				!uuidRE.MatchString(uid.AccountUUID) || len(uid.DeviceID) != 64 || req.PromptCacheKey != uid.SessionID || req.SessionID != "" {
				// The router reads Claude Code's session as a client's
				// cache key (openai.ParseMessages).
				t.Fatalf("user_id %q (%v), parsed session %q, client key %q", b.Metadata.UserID, err, req.SessionID, req.PromptCacheKey)
			}
			if prev, ok := sessions[salt][first]; ok && prev != uid.SessionID {
				t.Fatalf("a session's turns name sessions %s and %s", prev, uid.SessionID)
			}
			sessions[salt][first] = uid.SessionID
		}
		ids := map[string]bool{}
		for _, id := range sessions[salt] {
			ids[id] = true
		}
		if headers != 2 || len(sessions[salt]) != 3 || len(ids) != 3 || !ids[""] {
			t.Fatalf("salt %d: %d requests with the header, sessions %v", salt, headers, sessions[salt])
		}
	}
	for first, id := range sessions[0] {
		if id != "" && sessions[1][first] == id {
			t.Errorf("salts 0 and 1 share session id %s", id)
		}
	}
}

// The Anthropic stream reader: TTFT at the first delta (a thinking delta
// counts, only text is the answer), pings ignored; the final usage wins
// over message_start's; no cache fields is cached -1; an error event, a
// stream cut before message_stop, or no delta is an error.
func TestReadMessagesStream(t *testing.T) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	start := `{"type":"message_start","message":{"usage":{"input_tokens":40,"output_tokens":0}}}`
	delta := func(kind, field, text string) string {
		return ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":%q,%q:%q}}`, kind, field, text))
	}
	stop := ev("message_stop", `{"type":"message_stop"}`)
	for _, c := range []struct {
		name, stream          string
		out, err              string
		chunks, prompt, cache int
	}{
		{"full", ev("message_start", start) + ev("ping", `{"type":"ping"}`) + delta("thinking_delta", "thinking", "hm") + delta("text_delta", "text", " a") + delta("text_delta", "text", " b") +
			ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":3,"output_tokens":3,"cache_read_input_tokens":32,"cache_creation_input_tokens":5}}`) + stop,
			" a b", "", 3, 40, 32},
		{"no cache fields", ev("message_start", start) + delta("text_delta", "text", "x") +
			ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":41,"output_tokens":1}}`) + stop,
			"x", "", 1, 41, -1},
		{"no usage at the end", ev("message_start", start) + delta("text_delta", "text", "x") + stop, "x", "", 1, 40, -1},
		{"error event", ev("message_start", start) + ev("error", `{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`), "", "error event: overloaded_error: busy", 0, 40, -1},
		{"cut", ev("message_start", start) + delta("text_delta", "text", "x"), "x", "stream ended before message_stop", 1, 40, -1},
		{"empty", ev("message_start", start) + stop, "", "no output", 0, 40, -1},
		{"bad json", "data: {nope\n\n", "", "bad event", 0, 0, -1},
	} {
		q := Request{CachedTokens: -1}
		out := readMessagesStream(strings.NewReader(c.stream), &q, time.Now())
		if string(out) != c.out || !strings.HasPrefix(q.Err, c.err) || (c.err == "") != (q.Err == "") ||
			q.OutputChunks != c.chunks || q.PromptTokens != c.prompt || q.CachedTokens != c.cache || (c.chunks > 0) != (q.TTFT > 0) || len(q.ITLs) != max(0, c.chunks-1) {
			t.Errorf("%s: out %q, request %+v", c.name, out, q)
		}
	}
}

// A server error reaches the request as its status; bad API options are
// refused.
func TestRunMessagesErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`, http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	w := workload(t, bench.GenChat, 0.005)
	rep, err := Run(context.Background(), Options{URL: srv.URL, Workload: w, Speed: 1000, API: APIMessages})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Requests) != len(w.Sessions) || rep.Requests[0].Status != 503 || !strings.Contains(rep.Requests[0].Err, "overloaded_error") {
		t.Fatalf("requests %+v", rep.Requests)
	}
	for _, o := range []Options{
		{URL: srv.URL, Workload: w, API: "chat"},
		{URL: srv.URL, Workload: w, API: APIMessages, TokenIDs: true},
	} {
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("API %q, token ids %v: %v", o.API, o.TokenIDs, err)
		}
	}
	bo := &BenchOptions{Root: t.TempDir(), Tokenizer: TokenizerIDs, Run: Options{API: APIMessages},
		Workload: func(int) (*bench.Workload, uint64, error) { return nil, 0, nil }}
	if err := bo.defaults(); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "Messages API") {
		t.Errorf("a Messages bench on token ids: %v", err)
	}
}

// The generators' agent-loop sessions send their later turns as tool
// results; chats and the rest as text.
func TestToolSessions(t *testing.T) {
	for _, c := range []struct {
		gen   string
		tools int // -1: some but not all
	}{{bench.GenAgents, 1}, {bench.GenAgentic, 1}, {bench.GenRL, 1}, {bench.GenGRPO, 1}, {bench.GenChat, 0}, {bench.GenHerding, 0}, {bench.GenMixed, -1}} {
		w := workload(t, c.gen, 0.05)
		n := 0
		for _, s := range w.Sessions {
			if isToolSession(s.ID) {
				n++
			}
		}
		want := map[int]bool{1: n == len(w.Sessions), 0: n == 0, -1: n > 0 && n < len(w.Sessions)}[c.tools]
		if !want {
			t.Errorf("%s: %d of %d sessions are tool sessions", c.gen, n, len(w.Sessions))
		}
	}
}
