package tokenize

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize/parsedchat"
	"golang.org/x/text/unicode/norm"
)

// BenchmarkEncodeCorpus encodes every fixture text once per op (no special
// tokens, no chunk cache): the figure hack/tokenizer-fixtures/bench.py puts
// side by side with HuggingFace tokenizers on the same corpus.
func BenchmarkEncodeCorpus(b *testing.B) {
	for _, name := range benchNames {
		b.Run(name, func(b *testing.B) {
			enc := loadEncoder(b, name)
			fx := loadFixtures(b, name)
			n := 0
			for _, f := range fx.Plain {
				n += len(f.Text)
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			dst := make([]uint32, 0, 1<<16)
			for b.Loop() {
				for _, f := range fx.Plain {
					var err error
					if dst, err = enc.AppendEncode(dst[:0], f.Text, false); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// corpusText concatenates fixture texts until it holds at least n
// reference tokens. The corpus holds about 30k tokens, so it is repeated;
// repetition k shifts ASCII letters by k places (a Caesar shift) so that no
// word repeats across repetitions and a cold run stays cold for the whole
// prompt. hack/tokenizer-fixtures/bench.py builds the same text. The token
// count is the reference count of the unshifted texts (a guide only).
func corpusText(b *testing.B, enc *Encoder, fx *fixtureFile, n int) string {
	var sb strings.Builder
	tokens := 0
	for k := 0; tokens < n; k++ {
		for _, f := range fx.Plain {
			sb.WriteString(caesar(f.Text, k))
			sb.WriteString("\n")
			tokens += len(f.IDs) + 1
			if tokens >= n {
				break
			}
		}
	}
	return sb.String()
}

// caesar shifts ASCII letters by k places.
func caesar(s string, k int) string {
	if k%26 == 0 {
		return s
	}
	out := []byte(s)
	for i, c := range out {
		switch {
		case c >= 'a' && c <= 'z':
			out[i] = 'a' + byte((int(c-'a')+k)%26)
		case c >= 'A' && c <= 'Z':
			out[i] = 'A' + byte((int(c-'A')+k)%26)
		}
	}
	return string(out)
}

// Benchmark100kTokenPrompt: one prompt of about 100k tokens (the general
// fixture corpus, texts joined by newlines, see corpusText, as
// hack/tokenizer-fixtures/bench.py builds it for HuggingFace), without the
// chunk cache. "cold" empties the word cache before every op (a prompt
// whose words the process has never seen); "warm" encodes the same text
// again (every word cached).
func Benchmark100kTokenPrompt(b *testing.B) {
	for _, name := range benchNames {
		for _, mode := range []string{"cold", "warm"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				enc := loadEncoder(b, name)
				text := corpusText(b, enc, loadFixtures(b, name), 100_000)
				ids, _ := enc.Encode(text, false)
				b.SetBytes(int64(len(text)))
				var cpu time.Duration
				for b.Loop() {
					if mode == "cold" {
						b.StopTimer()
						emptyWordCache(enc.model.cache)
						b.StartTimer()
					}
					t0 := cpuTime()
					if _, err := enc.Encode(text, false); err != nil {
						b.Fatal(err)
					}
					cpu += cpuTime() - t0
				}
				b.ReportMetric(float64(len(ids)), "tokens")
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// BenchmarkChatTurn10 tokenizes a conversation's 10th turn (system prompt,
// 9 earlier exchanges of a few KB each, a new user message) after turns 1-9
// went through the same tokenizer: "reuse" serves the history from the chunk
// cache, "full" re-encodes everything. Each op gets a fresh final message.
func BenchmarkChatTurn10(b *testing.B) {
	for _, name := range fixtureNames {
		if noChatTemplate[name] {
			continue
		}
		for _, mode := range []string{"reuse", "full"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				enc := loadEncoder(b, name)
				tmpl := loadTemplate(b, name)
				cacheBytes := 0
				if mode == "reuse" {
					cacheBytes = 64 << 20
				}
				local := NewLocal(enc, tmpl, 0, cacheBytes)
				rng := rand.New(rand.NewPCG(7, 8))
				msgs := []map[string]any{{"role": "system", "content": longMessage(rng, 0)}}
				input := func(last string) route.TokenizeInput {
					all := append(msgs[:len(msgs):len(msgs)], map[string]any{"role": "user", "content": last})
					raw, _ := json.Marshal(all)
					return route.TokenizeInput{Chat: true, Messages: raw, AddGenerationPrompt: true}
				}
				for turn := 1; turn < 10; turn++ {
					user := longMessage(rng, turn)
					if _, err := local.Tokenize(input(user)); err != nil {
						b.Fatal(err)
					}
					msgs = append(msgs, map[string]any{"role": "user", "content": user}, map[string]any{"role": "assistant", "content": longMessage(rng, turn+100)})
				}
				var tokens int
				for b.Loop() {
					b.StopTimer()
					in := input(longMessage(rng, 10))
					b.StartTimer()
					got, err := local.Tokenize(in)
					if err != nil {
						b.Fatal(err)
					}
					tokens = len(got.IDs)
				}
				b.ReportMetric(float64(tokens), "tokens")
			})
		}
	}
}

// BenchmarkChat229KB tokenizes one ≈229 KB chat body (alternating user and
// assistant messages of a few KB) with the local tokenizer and its chunk
// cache warm, as a repeated large request finds it: "json" decodes the
// messages array again, "parsed" renders the request parser's decoded
// messages (openai.Request.ChatMessages), as the ext_proc path does.
func BenchmarkChat229KB(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3_1"} {
		enc := loadEncoder(b, name)
		tmpl := loadTemplate(b, name)
		rng := rand.New(rand.NewPCG(11, 12))
		var msgs []map[string]any
		var raw []byte
		for len(raw) < 229<<10 {
			role := "user"
			if len(msgs)%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]any{"role": role, "content": longMessage(rng, len(msgs))})
			raw, _ = json.Marshal(msgs)
		}
		body := append(append([]byte(`{"model":"m","messages":`), raw...), '}')
		req, err := openai.Parse("/v1/chat/completions", body)
		if err != nil {
			b.Fatal(err)
		}
		for _, mode := range []string{"json", "parsed"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				local := NewLocal(enc, tmpl, 0, DefaultPrefixCacheBytes)
				in := route.TokenizeInput{Chat: true, Messages: req.Messages, AddGenerationPrompt: true}
				if mode == "parsed" {
					in.ChatMessages = parsedchat.Messages(req.ChatMessages)
				}
				got, err := local.Tokenize(in)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if _, err := local.Tokenize(in); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(got.IDs)), "tokens")
			})
		}
	}
}

// chat100k builds a chat of about 100k reference tokens from the fixture
// corpus (corpusText: Caesar-shifted repetitions, so no word repeats
// across them), cut at newlines into alternating user and assistant
// messages of about 4 KB, ending with a user message.
func chat100k(b *testing.B, name string) []map[string]any {
	enc := loadEncoder(b, name)
	text := corpusText(b, enc, loadFixtures(b, name), 100_000)
	var msgs []map[string]any
	for len(text) > 0 {
		n := min(len(text), 4096)
		if i := strings.IndexByte(text[n:], '\n'); i >= 0 {
			n += i + 1
		} else {
			n = len(text)
		}
		role := "user"
		if len(msgs)%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": text[:n]})
		text = text[n:]
	}
	if len(msgs)%2 == 0 {
		msgs = append(msgs, map[string]any{"role": "user", "content": "continue"})
	}
	return msgs
}

// chatRequest parses msgs as the request path does (openai.Parse) and
// returns the tokenizer input with the parsed messages.
func chatRequest(b *testing.B, msgs []map[string]any) (route.TokenizeInput, int) {
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		b.Fatal(err)
	}
	req, err := openai.Parse("/v1/chat/completions", body)
	if err != nil {
		b.Fatal(err)
	}
	return route.TokenizeInput{Chat: true, Messages: req.Messages, ChatMessages: parsedchat.Messages(req.ChatMessages), AddGenerationPrompt: true}, len(body)
}

// BenchmarkChat100k is one ≈100k-token chat request (about 50 messages of
// 4 KB of the fixture corpus; the parse of the body is included in each
// op) through the local tokenizer:
//
//   - cold: nothing cached (word cache emptied, fresh chunk cache every
//     op),
//   - prevturn: the same conversation's previous turn (everything but a
//     new assistant reply and a new user message of about 3 KB each, fresh
//     every op) was tokenized just before; its tokenization is not timed.
func BenchmarkChat100k(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3_1"} {
		enc := loadEncoder(b, name)
		tmpl := loadTemplate(b, name)
		hist := chat100k(b, name)
		for _, mode := range []string{"cold", "prevturn"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				rng := rand.New(rand.NewPCG(3, 4))
				var tokens, bodyBytes int
				var cpu time.Duration
				var ops []time.Duration
				best := time.Hour
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					local := NewLocal(enc, tmpl, 0, DefaultPrefixCacheBytes)
					msgs := hist
					if mode == "cold" {
						emptyWordCache(enc.model.cache)
					} else {
						user := map[string]any{"role": "user", "content": longMessage(rng, i)}
						prev := append(hist[:len(hist):len(hist)], user)
						in, _ := chatRequest(b, prev)
						if _, err := local.Tokenize(in); err != nil {
							b.Fatal(err)
						}
						msgs = append(prev, map[string]any{"role": "assistant", "content": longMessage(rng, i+1000)},
							map[string]any{"role": "user", "content": longMessage(rng, i+2000)})
					}
					body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
					if err != nil {
						b.Fatal(err)
					}
					bodyBytes = len(body)
					b.StartTimer()
					w0 := time.Now()
					t0 := cpuTime()
					// Labelled, so that a CPU profile can keep the timed
					// part only (pprof -tagfocus phase=timed).
					pprof.Do(context.Background(), pprof.Labels("phase", "timed"), func(context.Context) {
						req, err := openai.Parse("/v1/chat/completions", body)
						if err != nil {
							b.Fatal(err)
						}
						got, err := local.Tokenize(route.TokenizeInput{Chat: true, Messages: req.Messages,
							ChatMessages: parsedchat.Messages(req.ChatMessages), AddGenerationPrompt: true})
						if err != nil {
							b.Fatal(err)
						}
						tokens = len(got.IDs)
					})
					op := cpuTime() - t0
					best = min(best, time.Since(w0))
					cpu += op
					ops = append(ops, op)
				}
				b.ReportMetric(float64(tokens), "tokens")
				b.ReportMetric(float64(bodyBytes), "body-bytes")
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
				// The median op, which a busy machine's outliers (another
				// process's burst, a GC cycle of the setup's garbage) move
				// least.
				slices.Sort(ops)
				b.ReportMetric(float64(ops[len(ops)/2].Microseconds())/1000, "p50-cpu-ms")
				b.ReportMetric(float64(ops[0].Microseconds())/1000, "min-cpu-ms")
				// The fastest op's wall time: other processes only add to
				// it; with a single goroutine it is also its CPU time.
				b.ReportMetric(float64(best.Microseconds())/1000, "min-ms")
			})
		}
	}
}

// emptyWordCache forgets every word of c, as a running process meets a
// prompt whose words it has never seen: the cache's memory stays
// allocated (its maps keep their size), as it does in a process that has
// been serving requests, and only the words (the maps' entries and the
// filters' bits) are gone.
func emptyWordCache(c *wordCache) {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		clear(s.m)
		for k := range s.filter {
			s.filter[k].Store(0)
		}
		s.mu.Unlock()
	}
}

// cpuTime is the process's user and system CPU time so far: the benchmarks
// report CPU per op (cpu-ms/op), which a loaded machine inflates far less
// than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNFCCheck checks the 100k-token corpus prompt for NFC in 2 KB
// pieces (as chunks reach encodePlain): "norm" is x/text's quick check
// alone, "nfc" this package's nfc with its ASCII prefix step, side by side.
func BenchmarkNFCCheck(b *testing.B) {
	enc := loadEncoder(b, "qwen3")
	text := norm.NFC.String(corpusText(b, enc, loadFixtures(b, "qwen3"), 100_000))
	var pieces []string
	for len(text) > 0 {
		n := min(2048, len(text))
		for n < len(text) && !utf8.RuneStart(text[n]) {
			n++
		}
		pieces = append(pieces, text[:n])
		text = text[n:]
	}
	for _, mode := range []string{"norm", "nfc"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				for _, p := range pieces {
					if mode == "norm" {
						if !norm.NFC.IsNormalString(p) {
							b.Fatal("not NFC")
						}
					} else if nfc(p) != p {
						b.Fatal("changed")
					}
				}
			}
		})
	}
}

// BenchmarkParseChat100k parses the body of BenchmarkChat100k's cold
// request (openai.Parse: ≈228 KB of JSON whose text is the fixture
// corpus, CJK and emoji runs included) and reports the fastest of 20
// parses per op (min-ns), which contention inflates least, and MB/s of
// JSON at that speed.
func BenchmarkParseChat100k(b *testing.B) {
	body, err := json.Marshal(map[string]any{"model": "m", "messages": chat100k(b, "qwen3")})
	if err != nil {
		b.Fatal(err)
	}
	best := time.Hour
	for b.Loop() {
		for range 20 {
			t0 := time.Now()
			if _, err := openai.Parse("/v1/chat/completions", body); err != nil {
				b.Fatal(err)
			}
			best = min(best, time.Since(t0))
		}
	}
	b.ReportMetric(float64(best.Nanoseconds()), "min-ns")
	b.ReportMetric(float64(len(body))/best.Seconds()/1e6, "min-MB/s")
}

// BenchmarkMergeWords runs the BPE merges (no word cache) over each
// distinct pre-token of the 100k-token corpus prompt once per op, split
// by length: "short" (up to maxShortWord bytes, mergeShort) and "long"
// (mergeHeap). It isolates the merge cost of a cold prompt from
// pre-tokenization, normalization and caching.
func BenchmarkMergeWords(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3_1"} {
		enc := loadEncoder(b, name)
		text := nfc(corpusText(b, enc, loadFixtures(b, name), 100_000))
		seen := map[string]bool{}
		var short, long []string
		for i := 0; i < len(text); {
			end := nextPiece(enc.flavor, text, i)
			if w := text[i:end]; !seen[w] {
				seen[w] = true
				if len(w) <= maxShortWord {
					short = append(short, w)
				} else {
					long = append(long, w)
				}
			}
			i = end
		}
		for _, set := range []struct {
			name  string
			words []string
		}{{"short", short}, {"long", long}} {
			b.Run(name+"/"+set.name, func(b *testing.B) {
				n := 0
				for _, w := range set.words {
					n += len(w)
				}
				b.SetBytes(int64(n))
				dst := make([]uint32, 0, 1024)
				best := time.Hour
				for b.Loop() {
					t0 := time.Now()
					for _, w := range set.words {
						var err error
						if dst, err = enc.model.mergeWord(dst[:0], w); err != nil {
							b.Fatal(err)
						}
					}
					best = min(best, time.Since(t0))
				}
				b.ReportMetric(float64(len(set.words)), "words")
				// The fastest op: other processes only ever add time.
				b.ReportMetric(float64(best.Microseconds())/1000, "min-ms")
			})
		}
	}
}

// BenchmarkSmallChat is the overhead harness's small request (kvbench
// overhead: a system prompt and a user turn, about 1 KB, a unique request
// number first) through openai.Parse and the local tokenizer (template
// and encoding), words warm: the per-decision cost of a small chat.
func BenchmarkSmallChat(b *testing.B) {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches; " +
		"numbers like 42 and 3.14 appear with code such as func main() { return nil } and café 日本語 text")
	var sb strings.Builder
	for i := 0; sb.Len() < 1<<10; i++ {
		sb.WriteString(words[(i*7+i/len(words))%len(words)])
		sb.WriteByte(' ')
	}
	text := sb.String()
	for _, name := range []string{"qwen3", "llama3_1"} {
		b.Run(name, func(b *testing.B) {
			local := NewLocal(loadEncoder(b, name), loadTemplate(b, name), 0, DefaultPrefixCacheBytes)
			bodies := make([][]byte, 64)
			for i := range bodies {
				body, err := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
					{"role": "system", "content": fmt.Sprintf("request %d. %s", i, text[:len(text)/2])},
					{"role": "user", "content": text[len(text)/2:]}}, "max_tokens": 64, "stream": true})
				if err != nil {
					b.Fatal(err)
				}
				bodies[i] = body
			}
			b.ReportAllocs()
			var cpu time.Duration
			best := time.Hour
			for b.Loop() {
				// One op is all the bodies: a batch long enough to time.
				t0, w0 := cpuTime(), time.Now()
				for _, body := range bodies {
					req, err := openai.Parse("/v1/chat/completions", body)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := local.Tokenize(route.TokenizeInput{Chat: true, Messages: req.Messages,
						ChatMessages: parsedchat.Messages(req.ChatMessages), AddGenerationPrompt: true}); err != nil {
						b.Fatal(err)
					}
				}
				best = min(best, time.Since(w0))
				cpu += cpuTime() - t0
			}
			n := float64(b.N * len(bodies))
			b.ReportMetric(float64(cpu.Nanoseconds())/1000/n, "cpu-us/req")
			// The fastest batch: other processes only ever add time.
			b.ReportMetric(float64(best.Nanoseconds())/1000/float64(len(bodies)), "min-us/req")
		})
	}
}

// BenchmarkToolChat is an agent's small turn: a system prompt, three tool
// schemas and a user message (about 2 KB), through openai.Parse and the
// local tokenizer, words warm. "chat" sends it to /v1/chat/completions,
// "responses" the same conversation to /v1/responses (converted into the
// chat request vLLM renders; the tokenizer then decodes the converted
// messages, as it does for chat without the parsed fast path).
func BenchmarkToolChat(b *testing.B) {
	schema := func(name string) map[string]any {
		return map[string]any{"type": "object", "properties": map[string]any{
			"path":  map[string]any{"type": "string", "description": "File path relative to the repository root for " + name},
			"limit": map[string]any{"type": "integer", "minimum": 1, "maximum": 500}}, "required": []string{"path"}}
	}
	system := strings.Repeat("You are a coding agent working in a large Go repository. Read before you write. ", 8)
	for _, api := range []string{"chat", "responses", "messages"} {
		for _, name := range []string{"qwen3", "llama3_1"} {
			b.Run(api+"/"+name, func(b *testing.B) {
				local := NewLocal(loadEncoder(b, name), loadTemplate(b, name), 0, DefaultPrefixCacheBytes)
				bodies := make([][]byte, 64)
				for i := range bodies {
					var body any
					user := fmt.Sprintf("Task %d: find where the index is pruned and explain the eviction order.", i)
					if api == "chat" {
						var tools []map[string]any
						for _, n := range []string{"read_file", "grep", "list_dir"} {
							tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
								"name": n, "description": "Tool " + n + ".", "parameters": schema(n)}})
						}
						body = map[string]any{"model": "m", "tools": tools, "messages": []map[string]string{
							{"role": "system", "content": system}, {"role": "user", "content": user}}}
					} else if api == "responses" {
						var tools []map[string]any
						for _, n := range []string{"read_file", "grep", "list_dir"} {
							tools = append(tools, map[string]any{"type": "function", "name": n, "description": "Tool " + n + ".", "parameters": schema(n)})
						}
						body = map[string]any{"model": "m", "tools": tools, "instructions": system, "input": user}
					} else {
						// Claude Code's shape: the billing block, the system
						// prompt as a text block, the task as a text block.
						var tools []map[string]any
						for _, n := range []string{"read_file", "grep", "list_dir"} {
							tools = append(tools, map[string]any{"name": n, "description": "Tool " + n + ".", "input_schema": schema(n)})
						}
						body = map[string]any{"model": "m", "max_tokens": 1024, "tools": tools,
							"system": []map[string]any{{"type": "text", "text": fmt.Sprintf("x-anthropic-billing-header: cc_version=2.1; cch=%05x;", i)},
								{"type": "text", "text": system, "cache_control": map[string]string{"type": "ephemeral"}}},
							"messages": []map[string]any{{"role": "user", "content": []map[string]string{{"type": "text", "text": user}}}}}
					}
					raw, err := json.Marshal(body)
					if err != nil {
						b.Fatal(err)
					}
					bodies[i] = raw
				}
				path := map[string]string{"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}[api]
				b.ReportAllocs()
				for b.Loop() {
					for _, body := range bodies {
						req, err := openai.Parse(path, body)
						if err != nil || req.Convert != nil {
							b.Fatal(err, req.Convert)
						}
						in := route.TokenizeInput{Chat: true, Messages: req.Messages, Tools: req.Tools,
							ChatTemplateKwargs: req.ChatTemplateKwargs, ReasoningEffort: req.ReasoningEffort, AddGenerationPrompt: true, AddSpecialTokens: req.AddSpecialTokens}
						if api == "chat" {
							in.ChatMessages = parsedchat.Messages(req.ChatMessages)
						}
						if _, err := local.Tokenize(in); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(bodies)), "ns/request")
			})
		}
	}
}

// BenchmarkAgentTools: a coding agent's tools list (16 tools, 49 KB of
// JSON: long descriptions and schemas), as every turn resends it: decoded
// for each request, and from the template's cache (a copy per request).
func BenchmarkAgentTools(b *testing.B) {
	var tools []map[string]any
	for i := range 16 {
		props := map[string]any{}
		for j := range 6 {
			props[fmt.Sprintf("p%d", j)] = map[string]any{"type": "string", "description": strings.Repeat("Describes the parameter in detail. ", 6)}
		}
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": fmt.Sprintf("Tool%d", i),
			"description": strings.Repeat("A long tool description with usage notes and examples. ", 24),
			"parameters":  map[string]any{"type": "object", "properties": props, "required": []string{"p0"}}}})
	}
	raw, err := json.Marshal(tools)
	if err != nil {
		b.Fatal(err)
	}
	ct, err := ParseChatTemplate([]byte(`{"chat_template": "{{ tools|length }}"}`))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		decode func(json.RawMessage) (jinja.Value, error)
	}{{"decoded", requestTools}, {"cached", ct.toolsValue}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.decode(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPrintTags is the cost of printing output tags as Python does
// (printTags): each family's template renders a 64-message chat compiled
// as it was before (split concatenations only) and as it is (every
// dynamic output tag through kvroute_print).
func BenchmarkPrintTags(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	var msgs []map[string]any
	for len(msgs) < 64 {
		role := "user"
		if len(msgs)%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": longMessage(rng, len(msgs))[:512]})
	}
	raw, _ := json.Marshal(msgs)
	v, err := jsonValue(raw)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"qwen3", "llama3_1", "gemma3"} {
		_, cfgPath := tokenizerFiles(b, name)
		cfg, err := os.ReadFile(cfgPath)
		if err != nil {
			b.Fatal(err)
		}
		var tc struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(cfg, &tc); err != nil || tc.ChatTemplate == "" {
			b.Fatalf("%s: no chat template (%v)", name, err)
		}
		for _, form := range []struct{ name, src string }{
			{"split", splitConcat(tc.ChatTemplate)},
			{"printed", printTags(splitConcat(tc.ChatTemplate))},
		} {
			tmpl, err := jinja.Compile(form.src)
			if err != nil {
				b.Fatal(err)
			}
			data := map[string]jinja.Value{"messages": v, "add_generation_prompt": jinja.NewBool(true),
				"bos_token": jinja.NewString("<s>"), "eos_token": jinja.NewString("</s>")}
			b.Run(name+"/"+form.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := renderSafe(tmpl, data, 64<<10); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
