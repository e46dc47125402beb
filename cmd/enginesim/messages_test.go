package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
)

// A Claude Code turn: the system blocks led by the per-request billing
// header (left out of the prompt), one user message of a text block. As
// the simulator's chat it is "You are brief." and messagesText.
var (
	messagesText   = strings.Repeat("Which replica holds my prefix? ", 4)
	messagesSystem = `"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=1f2e3;"}, {"type": "text", "text": "You are brief."}]`
	messagesBody   = fmt.Sprintf(`"model": "sim-model", %s, "messages": [{"role": "user", "content": [{"type": "text", "text": %q}]}]`, messagesSystem, messagesText)
	// The simulator's prompt for it: BOS and a byte per character of the
	// rendered chat, no special tokens added.
	messagesPrompt = 1 + len("<|system|>\nYou are brief.<|end|>\n<|user|>\n"+messagesText+"<|end|>\n<|assistant|>\n")
)

// postMessages posts body with the JSON content type and the given header
// pairs; it returns the status, the content type and the body.
func (s *sim) postMessages(t *testing.T, path, body string, header ...string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

var messageIDText = regexp.MustCompile(`^\{"id":"(chatcmpl-[^"]*)",.*"content":\[\{"type":"text","text":"([^"\\]*)"\}\]`)

// message posts a non-streamed Messages request and checks its answer
// byte for byte against vLLM's serialization (model_dump(exclude_none=
// True) through Starlette's compact JSON): the stop sequence left out,
// the stop reason max_tokens (the simulator stops on length), usage the
// given JSON. It returns the message's id and text.
func (s *sim) message(t *testing.T, body, usage string, outputTokens int, header ...string) (id, text string) {
	t.Helper()
	code, ct, b := s.postMessages(t, "/v1/messages", body, header...)
	if code != http.StatusOK || ct != "application/json" {
		t.Fatalf("messages: %d %s %s", code, ct, b)
	}
	m := messageIDText.FindSubmatch(b)
	if m == nil {
		t.Fatalf("answer %s has no id and text block", b)
	}
	id, text = string(m[1]), string(m[2])
	want := `{"id":"` + id + `","type":"message","role":"assistant","content":[{"type":"text","text":"` + text +
		`"}],"model":"sim-model","stop_reason":"max_tokens","usage":` + usage + `}`
	if string(b) != want {
		t.Errorf("answer\n%s\nwant\n%s", b, want)
	}
	if len(text) != outputTokens {
		t.Errorf("text %q, want %d tokens", text, outputTokens)
	}
	return id, text
}

// A non-streamed message without prompt token details: the usage is the
// prompt and the output, the prompt the conversation's chat prompt
// without special tokens (what /v1/chat/completions and count_tokens count
// for it); the id is vLLM's chat request id; max_tokens past the context
// is cut to it.
func TestMessages(t *testing.T) {
	s := startSim(t, "--max-model-len", "512")
	body := `{` + messagesBody + `, "max_tokens": 5, "temperature": 0}`
	usage := fmt.Sprintf(`{"input_tokens":%d,"output_tokens":5}`, messagesPrompt)
	id1, text1 := s.message(t, body, usage, 5)
	id2, text2 := s.message(t, body, usage, 5)
	if text1 != text2 || id1 == id2 {
		t.Errorf("greedy repeat: %q %q, ids %s %s", text1, text2, id1, id2)
	}
	if !regexp.MustCompile(`^chatcmpl-[0-9a-f]{16}$`).MatchString(id1) {
		t.Errorf("id %q is not vLLM's chatcmpl- and 16 hex digits", id1)
	}
	// X-Request-Id names the request, as in vLLM.
	if id, _ := s.message(t, body, usage, 5, "X-Request-Id", "turn-7"); id != "chatcmpl-turn-7" {
		t.Errorf("id %q with X-Request-Id turn-7", id)
	}
	// The converted chat, as a chat completion, counts the same prompt.
	p, err := openai.ParseMessages([]byte(body))
	if err != nil || p.Convert != nil {
		t.Fatalf("parse: %v %v", err, p.Convert)
	}
	code, b := s.post(t, "/v1/chat/completions", `{"messages": `+string(p.Messages)+`, "max_tokens": 1}`)
	var c completionJSON
	if code != http.StatusOK || json.Unmarshal(b, &c) != nil || c.Usage == nil || c.Usage.PromptTokens != messagesPrompt {
		t.Errorf("chat of the converted messages: %d %s, want %d prompt tokens", code, b, messagesPrompt)
	}
	// count_tokens: the same prompt; max_tokens, stream and sampling are
	// not its fields and are ignored.
	for _, extra := range []string{``, `, "max_tokens": "many", "stream": "yes", "temperature": "hot"`} {
		code, _, b := s.postMessages(t, "/v1/messages/count_tokens", `{`+messagesBody+extra+`}`)
		want := fmt.Sprintf(`{"input_tokens":%d,"context_management":{"original_input_tokens":%d}}`, messagesPrompt, messagesPrompt)
		if code != http.StatusOK || string(b) != want {
			t.Errorf("count_tokens%s: %d %s, want %s", extra, code, b, want)
		}
	}
	// max_tokens may be the whole context: it is cut to what the prompt
	// leaves.
	rest := 512 - messagesPrompt
	s.message(t, `{`+messagesBody+`, "max_tokens": 512, "temperature": 0}`,
		fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d}`, messagesPrompt, rest), rest)
	m := s.get(t, "/metrics")
	for _, want := range []string{
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-model"} 5`,
		`vllm:generation_tokens_total{engine="0",model_name="sim-model"} ` + fmt.Sprint(5+5+5+1+rest),
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// With --enable-prompt-tokens-details the usage splits the prompt as vLLM
// 0.33 does: cache_read_input_tokens (the prefix cache hit, 0 on a cold
// prompt), cache_creation_input_tokens (the prompt's full blocks the
// prefill wrote) and input_tokens the rest.
func TestMessagesCacheUsage(t *testing.T) {
	s := startSim(t, "--enable-prompt-tokens-details")
	body := `{` + messagesBody + `, "max_tokens": 4, "temperature": 0}`
	full := messagesPrompt / 16 * 16
	usage := func(read, created int) string {
		return fmt.Sprintf(`{"input_tokens":%d,"output_tokens":4,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d}`,
			messagesPrompt-read-created, created, read)
	}
	s.message(t, body, usage(0, full), 4)
	// The repeat reads every full block but the one holding the last
	// prompt token, which vLLM recomputes.
	read := (messagesPrompt - 1) / 16 * 16
	s.message(t, body, usage(read, full-read), 4)
	// A later turn extends the conversation: its history's blocks are read.
	turn2 := fmt.Sprintf(`{"model": "sim-model", %s, "max_tokens": 4, "temperature": 0, "messages": [
		{"role": "user", "content": [{"type": "text", "text": %q}]},
		{"role": "assistant", "content": [{"type": "text", "text": "abcd"}]},
		{"role": "user", "content": "and the next one?"}]}`, messagesSystem, messagesText)
	p2 := 1 + len("<|system|>\nYou are brief.<|end|>\n<|user|>\n"+messagesText+"<|end|>\n<|assistant|>\nabcd<|end|>\n<|user|>\nand the next one?<|end|>\n<|assistant|>\n")
	// The shared prefix is the first turn's prompt (its answer, generated
	// by the engine, is not "abcd"): its full blocks are read.
	hit := full
	created := p2/16*16 - hit
	s.message(t, turn2, fmt.Sprintf(`{"input_tokens":%d,"output_tokens":4,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d}`,
		p2-hit-created, created, hit), 4)
}

type rawEvent struct {
	name, data string
	at         time.Time
}

// readRawEvents reads a whole `event: T\ndata: J\n\n` stream, keeping
// each event's data as sent.
func readRawEvents(t *testing.T, r io.Reader) []rawEvent {
	t.Helper()
	br := bufio.NewReader(r)
	var evs []rawEvent
	var lines []string
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" && len(lines) == 0 {
			return evs
		}
		if err != nil {
			t.Fatalf("stream cut after %q: %v", lines, err)
		}
		if line = strings.TrimSuffix(line, "\n"); line != "" {
			lines = append(lines, line)
			continue
		}
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
			t.Fatalf("not an event block: %q", lines)
		}
		evs = append(evs, rawEvent{name: strings.TrimPrefix(lines[0], "event: "), data: strings.TrimPrefix(lines[1], "data: "), at: time.Now()})
		lines = nil
	}
}

// A streamed message: vLLM's event sequence and bytes (exclude_unset
// serialization), message_start only once the first token exists (after
// the prefill) with the prompt's usage and no cache fields, a text block
// with a text_delta per token, message_delta with the stop reason and the
// final usage (cache fields included), message_stop, no [DONE]; the text
// is the one the same greedy request gets unstreamed.
func TestMessagesStream(t *testing.T) {
	s := startSim(t, "--speed", "1", "--prefill-tokens-per-s", "1000", "--enable-prompt-tokens-details")
	const tokens = 6
	prefill := time.Duration(messagesPrompt) * time.Millisecond
	body := `{` + messagesBody + `, "max_tokens": 6, "temperature": 0, "stream": true}`
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream; charset=utf-8" {
		t.Fatalf("status %d content type %q", resp.StatusCode, ct)
	}
	evs := readRawEvents(t, resp.Body)
	if len(evs) != 5+tokens {
		t.Fatalf("%d events: %v", len(evs), evs)
	}
	var start struct {
		Message struct {
			ID string `json:"id"`
		} `json:"message"`
	}
	if err := json.Unmarshal([]byte(evs[0].data), &start); err != nil {
		t.Fatal(err)
	}
	id := start.Message.ID
	var deltas []string
	text := ""
	for _, ev := range evs[2 : 2+tokens] {
		var d struct {
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
			t.Fatal(err)
		}
		text += d.Delta.Text
		deltas = append(deltas, `{"type":"content_block_delta","delta":{"type":"text_delta","text":`+strconv.Quote(d.Delta.Text)+`},"index":0}`)
	}
	want := []rawEvent{
		{name: "message_start", data: `{"type":"message_start","message":{"id":"` + id + `","type":"message","role":"assistant","content":[],"model":"sim-model","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` + fmt.Sprint(messagesPrompt) + `,"output_tokens":0}}}`},
		{name: "content_block_start", data: `{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}`},
	}
	for _, d := range deltas {
		want = append(want, rawEvent{name: "content_block_delta", data: d})
	}
	full := messagesPrompt / 16 * 16
	want = append(want,
		rawEvent{name: "content_block_stop", data: `{"type":"content_block_stop","index":0}`},
		rawEvent{name: "message_delta", data: fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":%d,"output_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":0}}`, messagesPrompt-full, tokens, full)},
		rawEvent{name: "message_stop", data: `{"type":"message_stop"}`})
	for i := range want {
		if evs[i].name != want[i].name || evs[i].data != want[i].data {
			t.Errorf("event %d:\n%s %s\nwant\n%s %s", i, evs[i].name, evs[i].data, want[i].name, want[i].data)
		}
	}
	if !regexp.MustCompile(`^chatcmpl-[0-9a-f]{16}$`).MatchString(id) || len(text) != tokens {
		t.Errorf("id %q text %q", id, text)
	}
	if d := evs[0].at.Sub(sent); d < prefill*9/10 {
		t.Errorf("message_start %v after the request, before the %v prefill", d, prefill)
	}
	// Unstreamed, the same greedy request says the same, from the cache.
	read := (messagesPrompt - 1) / 16 * 16
	_, got := s.message(t, strings.Replace(body, `"stream": true`, `"stream": false`, 1),
		fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d}`,
			messagesPrompt-full, tokens, full-read, read), tokens)
	if got != text {
		t.Errorf("unstreamed %q, streamed %q", got, text)
	}
}

// Requests vLLM refuses: its request model's rejections in the OpenAI
// error shape (type "Bad Request"), everything past it in Anthropic's;
// nothing reaches the engine.
func TestMessagesErrors(t *testing.T) {
	s := startSim(t)
	user := `"messages": [{"role": "user", "content": "hi"}]`
	long := fmt.Sprintf(`"messages": [{"role": "user", "content": %q}]`, strings.Repeat("y", 4064)) // 4096 tokens
	cases := []struct {
		name, path, body, ctype string
		code                    int
		typ, msg                string // typ "" : a validation error
	}{
		{"malformed json", "", `{"model": "sim-model",`, "", 400, "", ""},
		{"not an object", "", `["model"]`, "", 400, "", ""},
		{"content type", "", `{}`, "text/plain", 400, "", "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"},
		{"no max_tokens", "", `{"model": "sim-model", ` + user + `}`, "", 400, "", "max_tokens"},
		{"zero max_tokens", "", `{"model": "sim-model", "max_tokens": 0, ` + user + `}`, "", 400, "", "max_tokens"},
		{"no model", "", `{"max_tokens": 4, ` + user + `}`, "", 400, "", "model"},
		{"bad role", "", `{"model": "sim-model", "max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}`, "", 400, "", "role"},
		{"bad block", "", `{"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]}`, "", 400, "", "video"},
		{"thinking budget", "", `{"model": "sim-model", "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}, ` + user + `}`, "", 400, "", "budget_tokens"},
		{"temperature type", "", `{"model": "sim-model", "max_tokens": 4, "temperature": "hot", ` + user + `}`, "", 400, "", "temperature"},
		{"empty cache salt", "", `{"model": "sim-model", "max_tokens": 4, "cache_salt": "", ` + user + `}`, "", 400, "", "cache_salt"},
		{"unknown model", "", `{"model": "claude-9", "max_tokens": 4, ` + user + `}`, "", 404, "not_found_error", "The model `claude-9` does not exist. Valid aliases: sim-model."},
		{"undeclared tool", "", `{"model": "sim-model", "max_tokens": 4, "messages": [{"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "Grep"}}]}, {"role": "user", "content": "hi"}]}`, "", 400, "invalid_request_error", "tool_addition references tool 'Grep', which is not declared in tools"},
		{"undeclared tool quoted", "", `{"model": "sim-model", "max_tokens": 4, "messages": [{"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "it's"}}]}, {"role": "user", "content": "hi"}]}`, "", 400, "invalid_request_error", `tool_removal references tool "it's", which is not declared in tools`},
		{"max_tokens over the context", "", `{"model": "sim-model", "max_tokens": 5000, ` + user + `}`, "", 400, "invalid_request_error", "max_completion_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output tokens."},
		{"prompt over the context", "", `{"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "` + strings.Repeat("y", 4065) + `"}]}`, "", 400, "invalid_request_error", "This model's maximum context length is 4096 tokens. However, your prompt contains 4097 input tokens"},
		{"prompt filling the context", "", `{"model": "sim-model", "max_tokens": 4, ` + long + `}`, "", 400, "invalid_request_error", "max_tokens must be at least 1, got 0."},
		{"count unknown model", "/count_tokens", `{"model": "claude-9", ` + user + `}`, "", 404, "not_found_error", "does not exist"},
		{"count prompt over the context", "/count_tokens", `{"model": "sim-model", "messages": [{"role": "user", "content": "` + strings.Repeat("y", 4065) + `"}]}`, "", 400, "invalid_request_error", "maximum context length"},
		{"count content type", "/count_tokens", `{}`, "text/plain", 400, "", "Unsupported Media Type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ct := c.ctype
			if ct == "" {
				ct = "application/json"
			}
			resp, err := s.client.Post(s.base+"/v1/messages"+c.path, ct, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.code || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			if c.typ == "" {
				// vLLM's request validation answers in the OpenAI shape.
				checkVLLMError(t, resp.StatusCode, b, 400, "Bad Request", c.msg)
				var e struct {
					Error struct{ Message string } `json:"error"`
				}
				if json.Unmarshal(b, &e) != nil || !strings.HasPrefix(e.Error.Message, "1 validation error:\n  ") {
					t.Errorf("not vLLM's validation error: %s", b)
				}
				return
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != c.typ || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("not an Anthropic %s containing %q: %s", c.typ, c.msg, b)
			}
			if want := fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":`, c.typ); !strings.HasPrefix(string(b), want) {
				t.Errorf("%s: fields out of vLLM's order", b)
			}
		})
	}
	if m := s.get(t, "/metrics"); !strings.Contains(m, `vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 0`) {
		t.Errorf("rejected requests reached the engine")
	}
}

// A client that goes away mid-stream frees its request.
func TestMessagesClientDisconnectAborts(t *testing.T) {
	abortMidEvents(t, "/v1/messages", `{"model": "sim-model", "max_tokens": 3000, "stream": true, "messages": [{"role": "user", "content": "abandon me"}]}`, "content_block_delta")
}

// claudeCodeTurn is a Claude Code agent turn: billing header and system
// prompt, tools, a tool_use answered by a tool_result, and the next user
// text.
const claudeCodeTurn = `{"model": "sim-model", "max_tokens": 3,
	"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=9a8b7;"},
		{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}}],
	"tools": [{"name": "Read", "description": "Reads a file from the local filesystem.",
		"input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
	"messages": [
		{"role": "user", "content": [{"type": "text", "text": "What does main.go do?"}]},
		{"role": "assistant", "content": [{"type": "text", "text": "Let me read it."},
			{"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "main.go"}}]},
		{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "package main\n\nfunc main() {}"},
			{"type": "text", "text": "Summarize it."}]}],
	"metadata": {"user_id": "user_0f_account_1e_session_2d"}}`

// With --tokenizer-dir a Messages request is rendered by the model's chat
// template as vLLM renders its converted chat request: the tool call and
// its result, the tools, no special tokens; count_tokens counts the same.
func TestRealTokenizerMessages(t *testing.T) {
	dir := tokenizerDir(t, "qwen3")
	ref := loadReference(t, dir)
	s := startSim(t, "--tokenizer-dir", dir, "--kv-events-disable")
	p, err := openai.ParseMessages([]byte(claudeCodeTurn))
	if err != nil || p.Convert != nil {
		t.Fatalf("parse: %v, %v", err, p.Convert)
	}
	in := route.TokenizeInput{Chat: true, Messages: p.Messages, Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs,
		ReasoningEffort: p.ReasoningEffort, AddGenerationPrompt: p.AddGenerationPrompt}
	want, err := ref.Tokenize(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Tools = nil
	bare, err := ref.Tokenize(in)
	if err != nil || len(bare.IDs) >= len(want.IDs) {
		t.Fatalf("without tools %d tokens (%v), with %d", len(bare.IDs), err, len(want.IDs))
	}
	// Generated tokens go out as one-token words.
	_, text := s.message(t, claudeCodeTurn, fmt.Sprintf(`{"input_tokens":%d,"output_tokens":3}`, len(want.IDs)), 6)
	if n := len(strings.Fields(text)); n != 3 {
		t.Errorf("text %q, want 3 words", text)
	}
	code, _, b := s.postMessages(t, "/v1/messages/count_tokens", claudeCodeTurn)
	if code != http.StatusOK || !strings.HasPrefix(string(b), fmt.Sprintf(`{"input_tokens":%d,`, len(want.IDs))) {
		t.Errorf("count_tokens: %d %s, want %d", code, b, len(want.IDs))
	}
}

// With --tokenizer-dir the engine makes vLLM's two template-dependent
// choices for a Messages request: under a template that refuses a system
// message after the first (Qwen3's, with the guard Qwen2.5's and others'
// templates have), the inline system messages are merged into the leading
// one; with thinking disabled, the template gets the effort vLLM resolves
// for it ("none" for Qwen3: enable_thinking false, the empty think block).
func TestRealTokenizerMessagesTemplateChoices(t *testing.T) {
	src := tokenizerDir(t, "qwen3")
	cfgData, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(cfgData, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = `{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}{{- raise_exception('System message must be at the beginning.') }}{%- endif %}{%- endfor %}` + cfg["chat_template"].(string)
	dir := t.TempDir()
	if cfgData, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfgData, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	ref := loadReference(t, dir)
	s := startSim(t, "--tokenizer-dir", dir, "--kv-events-disable")
	body := `{"model": "sim-model", "max_tokens": 2, "thinking": {"type": "disabled"},
		"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0;"}, {"type": "text", "text": "You are Claude Code."}],
		"messages": [
			{"role": "user", "content": "List the files."},
			{"role": "assistant", "content": "main.go and go.mod."},
			{"role": "system", "content": "<system-reminder>The user changed main.go.</system-reminder>"},
			{"role": "user", "content": "And now?"}]}`
	p, err := openai.ParseMessages([]byte(body))
	if err != nil || p.Convert != nil || p.SystemFirstMessages == nil || !p.ThinkingDisabled {
		t.Fatalf("parse: %v %v; system-first %s, thinking disabled %v", err, p.Convert, p.SystemFirstMessages, p.ThinkingDisabled)
	}
	in := route.TokenizeInput{Chat: true, Messages: p.Messages, SystemFirst: p.SystemFirstMessages, ThinkingDisabled: true,
		ChatTemplateKwargs: p.ChatTemplateKwargs, AddGenerationPrompt: true}
	want, err := ref.Tokenize(in)
	if err != nil {
		t.Fatal(err)
	}
	// Both choices matter: the conversation as sent does not render, and
	// thinking left on renders another prompt.
	noMerge := in
	noMerge.SystemFirst = nil
	if _, err := ref.Tokenize(noMerge); err == nil {
		t.Fatal("the guarded template renders an inline system message")
	}
	thinking := in
	thinking.ThinkingDisabled = false
	if on, err := ref.Tokenize(thinking); err != nil || len(on.IDs) == len(want.IDs) {
		t.Fatalf("thinking on: %d tokens (%v), disabled %d", len(on.IDs), err, len(want.IDs))
	}
	s.message(t, body, fmt.Sprintf(`{"input_tokens":%d,"output_tokens":2}`, len(want.IDs)), 4)
	code, _, b := s.postMessages(t, "/v1/messages/count_tokens", body)
	if code != http.StatusOK || !strings.HasPrefix(string(b), fmt.Sprintf(`{"input_tokens":%d,`, len(want.IDs))) {
		t.Errorf("count_tokens: %d %s, want %d", code, b, len(want.IDs))
	}
}

type pyAnthropicMessage struct {
	ID, Type, Role, Model string
	StopReason            string  `json:"stop_reason"`
	StopSequence          *string `json:"stop_sequence"`
	Blocks                []string
	Text, Streamed        string
	Usage                 pyAnthropicUsage
}

type pyAnthropicUsage struct {
	Input, Output int
	CacheRead     *int `json:"cache_read"`
	CacheCreation *int `json:"cache_creation"`
}

// The official Anthropic Python client parses the simulator's JSON and
// event stream (hack/requirements-test.txt pins it; hack/install-deps.sh
// installs it): a Claude Code shaped request, its stream through the
// client's accumulating helper and raw, count_tokens and the errors.
func TestAnthropicPythonClient(t *testing.T) {
	s := startSim(t, "--enable-prompt-tokens-details")
	text := strings.Repeat("an anthropic client talks to a simulated engine. ", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "python3", "testdata/anthropic_client.py", s.base, text).Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("python client: %v\n%s\n(install with: pip install -r hack/requirements-test.txt)", err, stderr)
	}
	var got struct {
		Create, Stream pyAnthropicMessage
		RawEvents      []string         `json:"raw_events"`
		StartUsage     pyAnthropicUsage `json:"start_usage"`
		CountTokens    int              `json:"count_tokens"`
		Errors         map[string]struct {
			Status        int
			Type, Message string
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %s: %v", out, err)
	}
	// The prompt: what count_tokens counts, the converted chat's.
	n := got.CountTokens
	p, err := openai.ParseMessages([]byte(fmt.Sprintf(`{"model": "sim-model", "max_tokens": 5,
		"system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=00000;"}, {"type": "text", "text": "You are Claude Code, a coding agent."}],
		"tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}],
		"messages": [{"role": "user", "content": [{"type": "text", "text": %q}]}]}`, text)))
	if err != nil || p.Convert != nil {
		t.Fatal(err, p.Convert)
	}
	if want := tokenCount(t, s, `{"messages": `+string(p.Messages)+`}`); n != want {
		t.Errorf("count_tokens %d, /tokenize of the converted chat %d", n, want)
	}
	full := n / 16 * 16
	read := (n - 1) / 16 * 16
	check := func(name string, m pyAnthropicMessage, read, created int) {
		t.Helper()
		if !regexp.MustCompile(`^chatcmpl-[0-9a-f]{16}$`).MatchString(m.ID) || m.Type != "message" || m.Role != "assistant" ||
			m.Model != "sim-model" || m.StopReason != "max_tokens" || m.StopSequence != nil ||
			len(m.Blocks) != 1 || m.Blocks[0] != "text" || len(m.Text) != 5 {
			t.Errorf("%s: %+v", name, m)
		}
		u := m.Usage
		if u.Output != 5 || u.CacheRead == nil || *u.CacheRead != read || u.CacheCreation == nil || *u.CacheCreation != created ||
			u.Input != n-read-created {
			t.Errorf("%s: usage %+v, want %d read and %d written of %d", name, u, read, created, n)
		}
	}
	check("create", got.Create, 0, full)
	check("stream", got.Stream, read, full-read)
	if got.Stream.Streamed != got.Stream.Text || got.Stream.Text != got.Create.Text {
		t.Errorf("greedy texts differ: %q, streamed %q, %q", got.Create.Text, got.Stream.Streamed, got.Stream.Text)
	}
	wantEvents := "message_start content_block_start " + strings.Repeat("content_block_delta ", 5) +
		"content_block_stop message_delta message_stop"
	if e := strings.Join(got.RawEvents, " "); e != wantEvents {
		t.Errorf("raw events %s", e)
	}
	if u := got.StartUsage; u.Input != n || u.Output != 0 || u.CacheRead != nil || u.CacheCreation != nil {
		t.Errorf("message_start usage %+v, want the %d prompt tokens alone", u, n)
	}
	if e := got.Errors["unknown_model"]; e.Status != 404 || e.Type != "not_found_error" || !strings.Contains(e.Message, "does not exist") {
		t.Errorf("unknown model error %+v", e)
	}
	if e := got.Errors["too_long"]; e.Status != 400 || e.Type != "invalid_request_error" || !strings.Contains(e.Message, "maximum context length") {
		t.Errorf("too long error %+v", e)
	}
	if e := got.Errors["validation"]; e.Status != 400 || e.Type != "Bad Request" || !strings.Contains(e.Message, "validation error") {
		t.Errorf("validation error %+v", e)
	}
}
