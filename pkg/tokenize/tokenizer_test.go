package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
)

func TestConfigYAMLAndValidation(t *testing.T) {
	src := `
models:
  qwen:
    kind: local
    tokenizer_json: /m/tokenizer.json
    tokenizer_config: /m/tokenizer_config.json
    chat_template: /etc/vllm/agent.jinja
    chat_template_content_format: string
    default_chat_template_kwargs: '{"enable_thinking": false}'
  llama:
    kind: remote
    timeout: 80ms
    fallback: none
    cache_size: 100
default:
  kind: approximate
`
	var cfg Config
	if err := yaml.Unmarshal([]byte(src), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	l := cfg.Models["llama"].withDefaults()
	if l.Timeout != 80*time.Millisecond || l.Fallback != FallbackNone || l.CacheSize != 100 {
		t.Errorf("llama = %+v", l)
	}
	q := cfg.Models["qwen"].withDefaults()
	if q.Template != "/etc/vllm/agent.jinja" || q.ContentFormat != ContentFormatString || q.DefaultKwargs != `{"enable_thinking": false}` {
		t.Errorf("qwen's engine chat settings = %+v", q.EngineChat)
	}
	if q.Timeout != 0 || q.TimeoutMin != DefaultTimeoutMin || q.TimeoutMax != DefaultTimeoutMax || q.Fallback != FallbackApproximate || q.TokenizerConfig != "/m/tokenizer_config.json" {
		t.Errorf("qwen = %+v", q)
	}
	bad := []struct {
		name string
		cfg  Config
	}{
		{"empty", Config{}},
		{"no kind", Config{Models: map[string]ModelConfig{"m": {}}}},
		{"unknown kind", Config{Models: map[string]ModelConfig{"m": {Kind: "sentencepiece"}}}},
		{"local without file", Config{Models: map[string]ModelConfig{"m": {Kind: KindLocal}}}},
		{"bad fallback", Config{Models: map[string]ModelConfig{"m": {Kind: KindRemote, Fallback: "retry"}}}},
		{"negative timeout", Config{Models: map[string]ModelConfig{"m": {Kind: KindRemote, Timeout: -1}}}},
		{"timeout_min over timeout_max", Config{Models: map[string]ModelConfig{"m": {Kind: KindRemote, TimeoutMin: time.Second, TimeoutMax: time.Millisecond}}}},
		{"local default", Config{Default: &ModelConfig{Kind: KindLocal, TokenizerJSON: "x"}}},
		{"empty search dir", Config{Default: &ModelConfig{Kind: KindAuto}, SearchDirs: []string{""}}},
		{"bad content format", Config{Models: map[string]ModelConfig{"m": {Kind: KindAuto, EngineChat: EngineChat{ContentFormat: "list"}}}}},
		{"default kwargs not an object", Config{Models: map[string]ModelConfig{"m": {Kind: KindAuto, EngineChat: EngineChat{DefaultKwargs: `["x"]`}}}}},
		{"unknown engine", Config{Models: map[string]ModelConfig{"m": {Kind: KindRemote, Engine: "trt"}}}},
		{"render for sglang", Config{Models: map[string]ModelConfig{"m": {Kind: KindRender, Engine: EngineSGLang}}}},
		{"render_urls on a remote tokenizer", Config{Models: map[string]ModelConfig{"m": {Kind: KindRemote, RenderURLs: []string{"http://r:8000"}}}}},
		{"render_urls not a URL", Config{Models: map[string]ModelConfig{"m": {Kind: KindRender, RenderURLs: []string{"r:8000"}}}}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil {
				t.Fatal("no error")
			}
			if _, err := New(tc.cfg, Options{}); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}

func localConfig(t testing.TB, name string) ModelConfig {
	tj, tc := tokenizerFiles(t, name)
	return ModelConfig{Kind: KindLocal, TokenizerJSON: tj, TokenizerConfig: tc}
}

func TestNewRejectsMissingAndUnsupportedFiles(t *testing.T) {
	dir := t.TempDir()
	doc := minimalTokenizerJSON(t)
	write := func(name string, mutate func(map[string]json.RawMessage)) string {
		d := map[string]json.RawMessage{}
		for k, v := range doc {
			d[k] = v
		}
		mutate(d)
		b, _ := json.Marshal(d)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		path string
		want error
	}{
		{"missing", filepath.Join(dir, "nope.json"), os.ErrNotExist},
		{"wordpiece model", write("wp.json", func(d map[string]json.RawMessage) {
			d["model"] = json.RawMessage(`{"type":"WordPiece","vocab":{"a":0}}`)
		}), ErrUnsupported},
		{"unknown split pattern", write("re.json", func(d map[string]json.RawMessage) {
			d["pre_tokenizer"] = json.RawMessage(`{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]}`)
		}), ErrUnsupported},
		{"lowercase normalizer", write("nl.json", func(d map[string]json.RawMessage) {
			d["normalizer"] = json.RawMessage(`{"type":"Lowercase"}`)
		}), ErrUnsupported},
		{"merge of unknown tokens", write("merge.json", func(d map[string]json.RawMessage) {
			d["model"] = json.RawMessage(`{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]}`)
		}), nil},
		{"not json", write("garbage.json", func(d map[string]json.RawMessage) { d["model"] = json.RawMessage(`7`) }), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Models: map[string]ModelConfig{"m": {Kind: KindLocal, TokenizerJSON: tc.path}}}, Options{})
			if err == nil {
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestTokenizerDispatch(t *testing.T) {
	reg := prometheus.NewRegistry()
	raising := filepath.Join(t.TempDir(), "tokenizer_config.json")
	if err := os.WriteFile(raising, []byte(`{"chat_template": "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}{{ messages[0].content }}"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	qwen := localConfig(t, "qwen3")
	strict := qwen
	strict.Fallback = FallbackNone
	strict.MaxInputBytes = 1000
	raiser := qwen
	raiser.TokenizerConfig = raising
	raiser.Fallback = FallbackNone
	tok, err := New(Config{
		Models: map[string]ModelConfig{
			"qwen": qwen, "strict": strict, "raiser": raiser,
			"ids": {Kind: KindPassthrough, Fallback: FallbackNone},
		},
	}, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fx := loadFixtures(t, "qwen3")
	chat := fx.Chat[0]
	tests := []struct {
		name    string
		model   string
		in      route.TokenizeInput
		want    []uint32
		source  string
		exact   bool
		wantErr error
	}{
		{"local prompt", "qwen", route.TokenizeInput{Prompt: fx.Plain[20].Text}, fx.Plain[20].IDs, SourceLocal, true, nil},
		{"local chat", "qwen", route.TokenizeInput{Chat: true, Messages: json.RawMessage(chat.MessagesJSON), Tools: json.RawMessage(chat.ToolsJSON), ChatTemplateKwargs: chat.Kwargs, AddGenerationPrompt: chat.AddGenerationPrompt}, chat.IDs, SourceLocal, true, nil},
		{"invalid utf-8 falls back", "qwen", route.TokenizeInput{Prompt: "ab\xffcd"}, approxIDs("ab\xffcd", 4), "approximate:local_bad_input", false, nil},
		{"invalid utf-8 strict", "strict", route.TokenizeInput{Prompt: "ab\xff"}, nil, "", false, ErrInvalidUTF8},
		{"too large strict", "strict", route.TokenizeInput{Prompt: strings.Repeat("a", 1001)}, nil, "", false, ErrInputTooLarge},
		{"malformed messages", "strict", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`{"role":"user"}`)}, nil, "", false, ErrBadMessages},
		{"non-text content part", "strict", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`)}, nil, "", false, ErrUnsupported},
		{"template raises", "raiser", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"a"},{"role":"user","content":"b"}]`)}, nil, "", false, ErrTemplate},
		{"template ok", "raiser", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"Hello world"}]`)}, []uint32{9707, 1879}, SourceLocal, true, nil},
		{"unknown model", "nope", route.TokenizeInput{Prompt: "x"}, nil, "", false, route.ErrUnknownModel},
		{"passthrough ids", "ids", route.TokenizeInput{Prompt: "[1, 2, 70000]"}, []uint32{1, 2, 70000}, SourcePassthrough, true, nil},
		{"passthrough text", "ids", route.TokenizeInput{Prompt: "hello"}, nil, "", false, ErrNotTokenIDs},
		{"passthrough negative id", "ids", route.TokenizeInput{Prompt: "[-1]"}, nil, "", false, ErrNotTokenIDs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tok.Tokenize(ctx, tc.model, tc.in)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.IDs, tc.want) || got.Source != tc.source || got.Exact != tc.exact {
				t.Fatalf("got %v %s exact=%v, want %v %s exact=%v", head(got.IDs), got.Source, got.Exact, head(tc.want), tc.source, tc.exact)
			}
		})
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "qwen", "local", "bad_input"); n != 1 {
		t.Errorf("fallbacks{bad_input} = %v, want 1", n)
	}
}

func TestDefaultTokenizerServesUnlistedModels(t *testing.T) {
	tok, err := New(Config{Default: &ModelConfig{Kind: KindApproximate, BytesPerToken: 2}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tok.Tokenize(context.Background(), "any", route.TokenizeInput{Prompt: "abcde"})
	if err != nil || len(got.IDs) != 3 || got.Exact || got.Source != SourceApproximate {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestApproximateIsPrefixStable(t *testing.T) {
	a := &approximate{bytesPerToken: 4, maxInputBytes: 1 << 20}
	msgs := func(n int) json.RawMessage {
		var parts []string
		for i := 0; i < n; i++ {
			parts = append(parts, fmt.Sprintf(`{"role":"user","content":"message number %d with some text"}`, i))
		}
		return json.RawMessage("[" + strings.Join(parts, ",") + "]")
	}
	short, err := a.tokenize(route.TokenizeInput{Chat: true, Messages: msgs(3)})
	if err != nil {
		t.Fatal(err)
	}
	long, err := a.tokenize(route.TokenizeInput{Chat: true, Messages: msgs(5)})
	if err != nil {
		t.Fatal(err)
	}
	// All full blocks of the shorter history are a prefix of the longer.
	full := len(short.IDs) - 1
	if !slices.Equal(short.IDs[:full], long.IDs[:full]) {
		t.Fatal("approximate ids of a longer history do not extend the shorter one")
	}
	other, _ := a.tokenize(route.TokenizeInput{Prompt: "message number 0"})
	if slices.Equal(other.IDs, short.IDs[:len(other.IDs)]) {
		t.Fatal("a prompt aliases a chat history")
	}
	if _, err := a.tokenize(route.TokenizeInput{Chat: true, Messages: json.RawMessage(`nope`)}); !errors.Is(err, ErrBadMessages) {
		t.Fatalf("err = %v", err)
	}
}

// longMessage is a few KB of multi-line text, so that chunking applies.
func longMessage(rng *rand.Rand, turn int) string {
	var b strings.Builder
	for b.Len() < 3000+rng.IntN(3000) {
		fmt.Fprintf(&b, "Step %d.%d: the function returned %d rows; next we check the index.\n", turn, rng.IntN(100), rng.IntN(1e6))
		if rng.IntN(5) == 0 {
			b.WriteString("    indented code line = value  \n\n")
		}
		if rng.IntN(7) == 0 {
			b.WriteString("混合 text, émoji 🚀 and 'quotes'\n")
		}
	}
	return b.String()
}

// TestChunkReuseEqualsFullEncoding drives multi-turn conversations through
// a cached Local and checks every turn against uncached encoding of the
// same rendered prompt; the later turns must be served mostly from cache.
func TestChunkReuseEqualsFullEncoding(t *testing.T) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			enc := loadEncoder(t, name)
			var tmpl *ChatTemplate
			if !noChatTemplate[name] {
				tmpl = loadTemplate(t, name)
			}
			local := NewLocal(enc, tmpl, 0, 8<<20)
			local.conv = nil // the chunk cache alone: the conversation memo would reuse the history first
			rng := rand.New(rand.NewPCG(1, 2))
			var msgs []map[string]any
			msgs = append(msgs, map[string]any{"role": "system", "content": longMessage(rng, 0)})
			for turn := 1; turn <= 10; turn++ {
				msgs = append(msgs, map[string]any{"role": "user", "content": longMessage(rng, turn)})
				raw, _ := json.Marshal(msgs)
				in := route.TokenizeInput{Chat: true, Messages: raw, AddGenerationPrompt: true}
				var text string
				if tmpl == nil {
					// No chat template: the conversation as a growing
					// completion prompt.
					var sb strings.Builder
					for _, m := range msgs {
						fmt.Fprintf(&sb, "%s:\n%s\n\n", m["role"], m["content"])
					}
					text = sb.String()
					in = route.TokenizeInput{Prompt: text}
				}
				got, err := local.Tokenize(in)
				if err != nil {
					t.Fatal(err)
				}
				if tmpl != nil {
					if text, err = tmpl.Render(ChatInput{Messages: raw, AddGenerationPrompt: true}); err != nil {
						t.Fatal(err)
					}
				}
				want, err := enc.Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.IDs, want) {
					t.Fatalf("turn %d: cached encoding differs from full encoding", turn)
				}
				msgs = append(msgs, map[string]any{"role": "assistant", "content": longMessage(rng, turn+100)})
			}
			hits, misses, _ := local.cache.stats()
			if hits < 3*misses {
				t.Errorf("chunk cache hits %d, misses %d: history is not being reused", hits, misses)
			}
		})
	}
}

// TestChunkingMatchesFixtures checks the chunk rule on every fixture text,
// concatenated to make long segments, cold and warm.
func TestChunkingMatchesFixtures(t *testing.T) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			enc := loadEncoder(t, name)
			fx := loadFixtures(t, name)
			cache := newChunkCache(8 << 20)
			var b strings.Builder
			for i, f := range fx.Plain {
				b.WriteString(f.Text)
				b.WriteString([]string{"\n", "\nx", " ", "\n\n", "\r\nA"}[i%5])
			}
			text := b.String()
			want, err := enc.Encode(text, true)
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 2; round++ {
				got, err := enc.appendEncode(context.Background(), nil, text, true, cache)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("round %d: chunked encoding differs", round)
				}
			}
			if hits, _, _ := cache.stats(); hits == 0 {
				t.Error("no chunk was reused on the second round")
			}
		})
	}
}

func TestHugePrompt(t *testing.T) {
	enc := loadEncoder(t, "llama3_1")
	local := NewLocal(enc, nil, 64<<20, 0)
	// About 1.2M tokens: words, numbers and punctuation.
	var b strings.Builder
	for i := 0; b.Len() < 5<<20; i++ {
		fmt.Fprintf(&b, "item %d, value=%d; ", i%1000, i%97)
	}
	got, err := local.Tokenize(route.TokenizeInput{Prompt: b.String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.IDs) < 1_000_000 {
		t.Fatalf("%d tokens, want > 1M", len(got.IDs))
	}
	dec, err := enc.Decode(got.IDs)
	if err != nil || dec != b.String() {
		t.Fatalf("decode mismatch (err %v)", err)
	}
	small := NewLocal(enc, nil, 1<<20, 0)
	if _, err := small.Tokenize(route.TokenizeInput{Prompt: b.String()}); !errors.Is(err, ErrInputTooLarge) {
		t.Fatalf("err = %v, want ErrInputTooLarge", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	enc := loadEncoder(t, "qwen3")
	if _, err := enc.Decode([]uint32{1 << 30}); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("err = %v", err)
	}
	id, ok := enc.TokenID("<|im_start|>")
	if !ok || id != 151644 {
		t.Fatalf("TokenID = %d, %v", id, ok)
	}
	s, err := enc.Decode([]uint32{id, 9707})
	if err != nil || s != "<|im_start|>Hello" {
		t.Fatalf("Decode = %q, %v", s, err)
	}
}

// minimalTokenizerJSON is a valid byte-level BPE tokenizer.json with the 256
// byte tokens, one merge and one special token (a small stand-in for the
// real files where only structure matters).
func minimalTokenizerJSON(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteLevelAlphabet[b])] = b
	}
	vocab["ab"] = 256
	model, _ := json.Marshal(map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a b"}})
	pre, _ := json.Marshal(map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]string{"Regex": patternQwen2}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	}})
	doc := map[string]json.RawMessage{
		"added_tokens":  json.RawMessage(`[{"id":257,"content":"<|x|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}]`),
		"normalizer":    json.RawMessage(`{"type":"NFC"}`),
		"pre_tokenizer": pre,
		"model":         model,
	}
	b, _ := json.Marshal(doc)
	enc, err := ParseEncoder(b)
	if err != nil {
		t.Fatalf("minimal tokenizer.json: %v", err)
	}
	ids, err := enc.Encode("xab<|x|>", false)
	if err != nil || !slices.Equal(ids, []uint32{'x', 256, 257}) {
		t.Fatalf("minimal tokenizer: %v, %v", ids, err)
	}
	return doc
}

// TestInvalidUTF8RefusedInEveryPiece: the UTF-8 check is made per piece
// (segments between added tokens, chunks of long segments) and skipped for
// cached chunks; a bad byte anywhere — in a short segment, in a new chunk
// after cached ones, next to an added token, in the last chunk — is still
// refused, with or without the cache, and valid text still encodes as a
// whole.
func TestInvalidUTF8RefusedInEveryPiece(t *testing.T) {
	enc := loadEncoder(t, "qwen3")
	var b strings.Builder
	for i := 0; b.Len() < 20_000; i++ {
		fmt.Fprintf(&b, "Line %d of the history, with café and 日本語.\n", i)
	}
	long := b.String()
	cache := newChunkCache(8 << 20)
	if _, err := enc.appendEncode(context.Background(), nil, long, false, cache); err != nil {
		t.Fatal(err)
	}
	if hits, _, _ := cache.stats(); hits != 0 {
		t.Fatalf("hits before reuse: %d", hits)
	}
	bad := []string{
		long + "tail \xff here\n",                     // new chunk after cached ones
		long[:5000] + "\xc3" + long[5000:],            // inside a cached chunk's span
		"short \xe6\x97 segment",                      // a segment below the chunk size
		long + "<|im_start|>\xfe<|im_end|>",           // between two added tokens
		"<|im_start|>user\n" + long + "\xed\xa0\x80x", // a surrogate half in the last chunk
	}
	for i, text := range bad {
		for _, c := range []*chunkCache{nil, cache} {
			if _, err := enc.appendEncode(context.Background(), nil, text, false, c); !errors.Is(err, ErrInvalidUTF8) {
				t.Errorf("case %d (cache %v): err = %v, want ErrInvalidUTF8", i, c != nil, err)
			}
		}
	}
	text := long + "<|im_start|>assistant\n" + long
	want, err := enc.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := enc.appendEncode(context.Background(), nil, text, false, cache)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("valid text through the warm cache: %v (equal %v)", err, slices.Equal(got, want))
	}
	if hits, _, _ := cache.stats(); hits == 0 {
		t.Fatal("the history was not served from the cache")
	}
}
