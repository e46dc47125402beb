package tokenize

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize/parsedchat"
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
				for b.Loop() {
					if mode == "cold" {
						b.StopTimer()
						enc.model.cache = newWordCache(wordCacheEntries)
						b.StartTimer()
					}
					if _, err := enc.Encode(text, false); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(ids)), "tokens")
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
