package tokenize

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode: encoding never panics; invalid UTF-8 is refused with
// ErrInvalidUTF8; decoding gives the input back (Llama-3, gpt-oss and
// DeepSeek-V3 have no normalizer; Qwen's NFC normalizer is the identity on
// NFC text; Gemma's metaspace is undone by decoding, except for a literal
// U+2581); chunked encoding through the cache equals plain encoding.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello  world", "a\n\nB", "<|im_start|>x<|im_end|>", "'S'll 123456", "\xff\xfe", "é\u0301", "\n" + string(make([]byte, 300)) + "\nz",
		"日本語のテキスト・カタカナ123abc", "HTTPServer's  \u0301x /path//", "<start_of_turn>user\n\u2581 x\x01\U0010fffd"} {
		f.Add(s)
	}
	llama := loadEncoder(f, "llama3_1")
	qwen := loadEncoder(f, "qwen3")
	encs := []*Encoder{llama, qwen, loadEncoder(f, "gptoss"), loadEncoder(f, "deepseek_v3"), loadEncoder(f, "gemma3")}
	// One cache per encoder: ids are only valid for the encoder that made them.
	caches := map[*Encoder]*chunkCache{}
	for _, e := range encs {
		caches[e] = newChunkCache(1 << 20)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, enc := range encs {
			ids, err := enc.Encode(s, true)
			if !utf8.ValidString(s) {
				if !errors.Is(err, ErrInvalidUTF8) {
					t.Fatalf("invalid UTF-8 accepted: %v", err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			plain, err := enc.Encode(s, false)
			if err != nil {
				t.Fatal(err)
			}
			if enc == qwen && !norm.NFC.IsNormalString(s) || enc.metaspace && strings.Contains(s, "\u2581") {
				continue
			}
			got, err := enc.Decode(plain)
			if err != nil {
				t.Fatal(err)
			}
			if got != s {
				t.Fatalf("decode(encode(%q)) = %q", s, got)
			}
			chunked, err := enc.appendEncode(context.Background(), nil, s, true, caches[enc])
			if err != nil || !slices.Equal(chunked, ids) {
				t.Fatalf("chunked encoding differs (%v)", err)
			}
		}
	})
}
