package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func chatBody(turns int) []byte {
	msgs := make([]map[string]string, 0, turns)
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": strings.Repeat("lorem ipsum dolor sit amet ", 40)})
	}
	b, _ := json.Marshal(map[string]any{"model": "llama", "messages": msgs, "max_tokens": 64, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	return b
}

func BenchmarkParseChat(b *testing.B) {
	body := chatBody(16) // ~17 KB
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseChat(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseCompletionTokens(b *testing.B) {
	ids := make([]int, 4096)
	for i := range ids {
		ids[i] = i * 7
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseCompletion(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStreamParser(b *testing.B) {
	var sb strings.Builder
	for range 256 {
		sb.WriteString("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n")
	}
	sb.WriteString(chatStream)
	stream := []byte(sb.String())
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		var p StreamParser
		for i := 0; i < len(stream); i += 512 {
			_, _ = p.Write(stream[i:min(i+512, len(stream))])
		}
		p.Flush()
		if u, ok := p.Usage(); !ok || u.CachedTokens != 32 {
			b.Fatal("usage lost")
		}
	}
}
