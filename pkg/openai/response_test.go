package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Usage
		wantOK  bool
		wantErr bool
	}{
		{
			name:   "with cached tokens",
			body:   `{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":64}}}`,
			want:   Usage{PromptTokens: 100, CompletionTokens: 5, TotalTokens: 105, CachedTokens: 64, HasCachedTokens: true},
			wantOK: true,
		},
		{
			name:   "details null",
			body:   `{"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":null}}`,
			want:   Usage{PromptTokens: 10, CompletionTokens: 1, TotalTokens: 11},
			wantOK: true,
		},
		{
			name:   "cached zero is known",
			body:   `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`,
			want:   Usage{PromptTokens: 10, HasCachedTokens: true},
			wantOK: true,
		},
		{name: "no usage", body: `{"choices":[]}`},
		{name: "null usage", body: `{"usage":null}`},
		{name: "not json", body: `oops`, wantErr: true},
		{name: "usage wrong type", body: `{"usage":"x"}`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := ParseUsage([]byte(tc.body))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalidResponse) {
				t.Errorf("error %v does not wrap ErrInvalidResponse", err)
			}
			if ok != tc.wantOK {
				t.Errorf("ok = %v, want %v", ok, tc.wantOK)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("usage mismatch (-want +got):\n%s", d)
			}
		})
	}
}

const chatStream = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
	": keep-alive comment\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"total_tokens\":42,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
	"data: [DONE]\n\n"

// feed writes s to a fresh parser in pieces cut at the given offsets.
func feed(s string, cuts ...int) *StreamParser {
	p := &StreamParser{}
	prev := 0
	for _, c := range cuts {
		_, _ = p.Write([]byte(s[prev:c]))
		prev = c
	}
	_, _ = p.Write([]byte(s[prev:]))
	p.Flush()
	return p
}

func TestStreamParserEverySplit(t *testing.T) {
	want := Usage{PromptTokens: 40, CompletionTokens: 2, TotalTokens: 42, CachedTokens: 32, HasCachedTokens: true}
	for _, s := range []string{chatStream, strings.ReplaceAll(chatStream, "\n", "\r\n")} {
		for i := 0; i <= len(s); i++ {
			for _, j := range []int{i, (i + len(s)) / 2, len(s)} {
				if j < i {
					continue
				}
				p := feed(s, i, j)
				u, ok := p.Usage()
				if !ok || u != want {
					t.Fatalf("cut at %d,%d: usage %+v ok=%v, want %+v", i, j, u, ok, want)
				}
				if !p.SawContent() || !p.Done() || p.Malformed() != 0 || p.Events() != 5 {
					t.Fatalf("cut at %d,%d: content=%v done=%v malformed=%d events=%d", i, j, p.SawContent(), p.Done(), p.Malformed(), p.Events())
				}
			}
		}
	}
}

func TestStreamParserByteAtATime(t *testing.T) {
	p := &StreamParser{}
	for i := range len(chatStream) {
		_, _ = p.Write([]byte{chatStream[i]})
	}
	if u, ok := p.Usage(); !ok || u.CachedTokens != 32 {
		t.Fatalf("usage %+v ok=%v", u, ok)
	}
}

func TestStreamParserContent(t *testing.T) {
	tests := []struct {
		name        string
		stream      string
		wantContent bool
	}{
		{"role only", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", false},
		{"completion text", "data: {\"choices\":[{\"text\":\"x\"}]}\n\n", true},
		{"empty completion text", "data: {\"choices\":[{\"text\":\"\"}]}\n\n", false},
		{"reasoning", "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n", true},
		{"tool call", "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n", true},
		{"empty tool calls", "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n", false},
		{"finish only", "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n", true},
		{"multi-line data", "data: {\"choices\":\ndata: [{\"text\":\"x\"}]}\n\n", true},
		{"no trailing blank line", "data: {\"choices\":[{\"text\":\"x\"}]}", true},
		{"malformed then content", "data: {oops\n\ndata: {\"choices\":[{\"text\":\"x\"}]}\n\n", true},
		{"other fields ignored", "event: message\nid: 3\nretry: 10\ndata:{\"choices\":[{\"text\":\"x\"}]}\n\n", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := feed(tc.stream)
			if p.SawContent() != tc.wantContent {
				t.Errorf("SawContent = %v, want %v", p.SawContent(), tc.wantContent)
			}
		})
	}
}

func TestStreamParserContinuousUsageKeepsLast(t *testing.T) {
	s := "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\n" +
		"data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n"
	u, ok := feed(s).Usage()
	if !ok || u.CompletionTokens != 2 || u.HasCachedTokens {
		t.Fatalf("usage %+v ok=%v, want the last chunk's", u, ok)
	}
}

func TestStreamParserOversizedEventSkipped(t *testing.T) {
	big := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", 200) + "\"}]}\n" +
		"data: more\n\n"
	tail := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n"
	p := &StreamParser{MaxEventBytes: 100}
	for _, c := range []string{big[:50], big[50:150], big[150:], tail} {
		_, _ = p.Write([]byte(c))
	}
	if p.Skipped() != 1 {
		t.Errorf("Skipped = %d, want 1", p.Skipped())
	}
	if p.SawContent() {
		t.Error("content seen from a skipped event")
	}
	if u, ok := p.Usage(); !ok || u.CachedTokens != 1 {
		t.Errorf("usage after a skipped event: %+v ok=%v", u, ok)
	}
}

func FuzzStreamParser(f *testing.F) {
	f.Add([]byte(chatStream), uint16(7))
	f.Add([]byte("data: [DONE]\r\n\r\n"), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, step uint16) {
		n := int(step%64) + 1
		a := &StreamParser{MaxEventBytes: 256}
		for i := 0; i < len(data); i += n {
			_, _ = a.Write(data[i:min(i+n, len(data))])
		}
		a.Flush()
		b := &StreamParser{MaxEventBytes: 256}
		_, _ = b.Write(data)
		b.Flush()
		ua, oka := a.Usage()
		ub, okb := b.Usage()
		if ua != ub || oka != okb || a.SawContent() != b.SawContent() || a.Done() != b.Done() {
			t.Fatalf("chunking changed the result: %+v/%v vs %+v/%v", ua, oka, ub, okb)
		}
	})
}

// An Anthropic Messages stream as vLLM writes it: named events, the first
// token in the first content block delta, the whole usage in message_delta
// (input_tokens there leave out the cached tokens).
func TestStreamParserAnthropicMessages(t *testing.T) {
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":40,\"output_tokens\":0}}}\n\n" +
		"event: ping\ndata: {\"type\":\"ping\"}\n\n"
	body := "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":8,\"output_tokens\":3,\"cache_read_input_tokens\":32}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	if p := feed(start); p.SawContent() {
		t.Error("message_start and ping taken for output")
	} else if _, ok := p.Usage(); ok {
		t.Error("message_start's nested usage taken for the stream's")
	}
	p := feed(start + body)
	u, ok := p.Usage()
	if !p.SawContent() || !ok || u != (Usage{PromptTokens: 40, CompletionTokens: 3, CachedTokens: 32, HasCachedTokens: true}) {
		t.Fatalf("content %v usage %+v %v", p.SawContent(), u, ok)
	}
	// Without prompt token details the engine reports no cache count.
	u, ok = feed("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":40,\"output_tokens\":3}}\n\n").Usage()
	if !ok || u != (Usage{PromptTokens: 40, CompletionTokens: 3}) {
		t.Fatalf("usage %+v %v", u, ok)
	}
}
