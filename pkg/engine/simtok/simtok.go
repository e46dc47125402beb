package simtok

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/zeebo/xxh3"
)

// Special token ids and the vocabulary size.
const (
	BOS       uint32 = 256
	EOS       uint32 = 257
	VocabSize        = 1 << 17
)

// Encode tokenizes text, prepending BOS when addSpecial is set.
func Encode(text string, addSpecial bool) []uint32 {
	out := make([]uint32, 0, len(text)+1)
	if addSpecial {
		out = append(out, BOS)
	}
	for i := 0; i < len(text); i++ {
		out = append(out, uint32(text[i]))
	}
	return out
}

// Decode renders tokens as text: bytes as themselves, specials as "<s>" and
// "</s>", other ids as "<|t<id>|>".
func Decode(tokens []uint32) string {
	var b strings.Builder
	b.Grow(len(tokens))
	for _, t := range tokens {
		b.WriteString(TokenString(t))
	}
	return b.String()
}

// TokenString renders one token (a single byte for byte tokens, which may be
// part of a multi-byte UTF-8 sequence).
func TokenString(t uint32) string {
	switch {
	case t < 256:
		return string([]byte{byte(t)})
	case t == BOS:
		return "<s>"
	case t == EOS:
		return "</s>"
	}
	return fmt.Sprintf("<|t%d|>", t)
}

// Valid reports whether t is inside the vocabulary.
func Valid(t int64) bool { return t >= 0 && t < VocabSize }

// Message is one chat message, already reduced to its text.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders messages with the chat template described in the package
// comment, without the leading BOS.
func RenderChat(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("<|end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}

// EncodeChat returns the tokens of the rendered chat: BOS, then the bytes of
// RenderChat. addSpecial prepends one more BOS, as a Hugging Face tokenizer
// would when asked to add special tokens to an already templated text.
func EncodeChat(msgs []Message, addGenerationPrompt, addSpecial bool) []uint32 {
	text := RenderChat(msgs, addGenerationPrompt)
	out := make([]uint32, 0, len(text)+2)
	if addSpecial {
		out = append(out, BOS)
	}
	out = append(out, BOS)
	for i := 0; i < len(text); i++ {
		out = append(out, uint32(text[i]))
	}
	return out
}

var words = []string{
	"the", "cache", "block", "token", "router", "engine", "prefix", "batch",
	"quick", "model", "stream", "event", "replica", "decode", "prefill", "queue",
	"warm", "cold", "hit", "miss", "fleet", "chain", "hash", "step",
	"lorem", "ipsum", "dolor", "sit", "amet", "gpu", "cpu", "tier",
}

// Generator produces a deterministic stream of output tokens.
type Generator struct {
	rng  *rand.Rand
	word string
	pos  int // next byte of word to emit; -1: the space before it
}

// NewGenerator returns the generator for a prompt under seed.
func NewGenerator(seed uint64, prompt []uint32) *Generator {
	// Stream the prompt's little-endian bytes through the hasher in small
	// chunks (the same hash as one call over all of them) instead of
	// materialising a copy four times the prompt's length.
	var chunk [1024]byte
	h := xxh3.New()
	for len(prompt) > 0 {
		n := min(len(prompt), len(chunk)/4)
		for i, t := range prompt[:n] {
			binary.LittleEndian.PutUint32(chunk[4*i:], t)
		}
		_, _ = h.Write(chunk[:4*n])
		prompt = prompt[n:]
	}
	return &Generator{rng: rand.New(rand.NewPCG(seed, h.Sum64()))}
}

// Next returns the next output token (always a printable ASCII byte):
// words from a fixed list, separated by single spaces.
func (g *Generator) Next() uint32 {
	if g.pos >= len(g.word) {
		first := g.word == ""
		g.word = words[g.rng.IntN(len(words))]
		g.pos = 0
		if !first {
			g.pos = -1 // the space before the word comes first
		}
	}
	if g.pos < 0 {
		g.pos = 0
		return ' '
	}
	c := g.word[g.pos]
	g.pos++
	return uint32(c)
}
