package openai

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
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

// sizedChat is a chat body of about size bytes in 16 turns of varied
// text with escapes and non-ASCII (as real prompts have).
func sizedChat(size int) []byte {
	words := strings.Fields("the quick brown fox jumps over a lazy dog; \"quoted\" text, code { x := y[i] } and café naïve 日本語 tabs\tand\nnewlines")
	msgs := make([]map[string]any, 0, 16)
	for t := range 16 {
		var sb strings.Builder
		for i := 0; sb.Len() < size/16; i++ {
			sb.WriteString(words[(i*7+t)%len(words)])
			sb.WriteByte(' ')
		}
		role := "user"
		if t%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": sb.String()})
	}
	body, _ := json.Marshal(map[string]any{"model": "llama", "messages": msgs, "max_tokens": 64, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "temperature": 0.7, "user": "u-1",
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}}})
	return body
}

func BenchmarkParseChat(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{{"17KB", chatBody(16)}, {"229KB", sizedChat(229_000)}, {"533KB", sizedChat(533_000)}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			cpu := cpuTime()
			best := time.Hour
			for b.Loop() {
				t0 := time.Now()
				if _, err := ParseChat(c.body); err != nil {
					b.Fatal(err)
				}
				best = min(best, time.Since(t0))
			}
			reportCPU(b, cpu, len(c.body))
			// The fastest parse, which a busy machine inflates least.
			b.ReportMetric(float64(len(c.body))/best.Seconds()/1e6, "min-MB/s")
		})
	}
}

// BenchmarkEncodingJSONChat is the baseline the scanner replaced: the
// same bodies through encoding/json into the fields routing reads, then
// the messages array into its elements (what Parse did before).
func BenchmarkEncodingJSONChat(b *testing.B) {
	type old struct {
		Model         *string         `json:"model"`
		Messages      json.RawMessage `json:"messages"`
		Tools         json.RawMessage `json:"tools"`
		MaxTokens     *int64          `json:"max_tokens"`
		Stream        *bool           `json:"stream"`
		StreamOptions *struct {
			IncludeUsage *bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	for _, c := range []struct {
		name string
		body []byte
	}{{"17KB", chatBody(16)}, {"229KB", sizedChat(229_000)}, {"533KB", sizedChat(533_000)}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				var v old
				if err := json.Unmarshal(c.body, &v); err != nil {
					b.Fatal(err)
				}
				var msgs []json.RawMessage
				if err := json.Unmarshal(v.Messages, &msgs); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu, len(c.body))
		})
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

// cpuTime is the process's CPU time so far. On a shared, overloaded host
// wall time per operation overstates cost; CPU time does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds CPU time per operation and MB scanned per CPU-second.
func reportCPU(b *testing.B, since time.Duration, bytes int) {
	cpu := cpuTime() - since
	if b.N == 0 || cpu <= 0 {
		return
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(bytes)*float64(b.N)/cpu.Seconds()/1e6, "MB/cpu-s")
}

// BenchmarkChunkDecode decodes the events of a streamed chat response that
// the stream parser reads in full (the role chunk, the first content chunk
// and the final usage chunk, as vLLM sends them) with the scanner and with
// encoding/json (the parser's decoder before it), side by side.
func BenchmarkChunkDecode(b *testing.B) {
	events := [][]byte{
		[]byte(`{"id":"chatcmpl-5f0e1c2d9a8b4c7e","object":"chat.completion.chunk","created":1764600000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}`),
		[]byte(`{"id":"chatcmpl-5f0e1c2d9a8b4c7e","object":"chat.completion.chunk","created":1764600000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}`),
		[]byte(`{"id":"chatcmpl-5f0e1c2d9a8b4c7e","object":"chat.completion.chunk","created":1764600000,"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":1041,"total_tokens":1105,"completion_tokens":64,"prompt_tokens_details":{"cached_tokens":1024}}}`),
	}
	n := 0
	for _, e := range events {
		n += len(e)
	}
	b.Run("scanner", func(b *testing.B) {
		b.SetBytes(int64(n))
		b.ReportAllocs()
		for b.Loop() {
			for _, e := range events {
				if _, err := scanChunk(e); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(n))
		b.ReportAllocs()
		for b.Loop() {
			for _, e := range events {
				if _, _, _, err := refScanChunk(e); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
