package simtok

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

func TestEncode(t *testing.T) {
	cases := []struct {
		name    string
		text    string
		special bool
		want    []uint32
	}{
		{"plain", "Hi", false, []uint32{'H', 'i'}},
		{"bos", "Hi", true, []uint32{BOS, 'H', 'i'}},
		{"empty", "", false, []uint32{}},
		{"utf8 bytes", "é", false, []uint32{0xc3, 0xa9}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Encode(c.text, c.special)
			if !slices.Equal(got, c.want) {
				t.Fatalf("Encode(%q) = %v, want %v", c.text, got, c.want)
			}
		})
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	if got := Decode(Encode("héllo", true)); got != "<s>héllo" {
		t.Fatalf("round trip: %q", got)
	}
	if got := Decode([]uint32{EOS, 300}); got != "</s><|t300|>" {
		t.Fatalf("specials: %q", got)
	}
}

func TestValid(t *testing.T) {
	for _, c := range []struct {
		id   int64
		want bool
	}{{0, true}, {VocabSize - 1, true}, {VocabSize, false}, {-1, false}} {
		if Valid(c.id) != c.want {
			t.Errorf("Valid(%d) = %v", c.id, !c.want)
		}
	}
}

func TestChatTemplate(t *testing.T) {
	msgs := []Message{{"system", "be brief"}, {"user", "hi"}}
	want := "<|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"
	if got := RenderChat(msgs, true); got != want {
		t.Fatalf("RenderChat = %q", got)
	}
	toks := EncodeChat(msgs, true, false)
	if toks[0] != BOS || Decode(toks[1:]) != want {
		t.Fatalf("EncodeChat = %q", Decode(toks))
	}
	if got := EncodeChat(msgs, false, true); got[0] != BOS || got[1] != BOS || len(got) != 2+len(RenderChat(msgs, false)) {
		t.Fatalf("EncodeChat add_special: %q", Decode(got))
	}
}

func TestGeneratorDeterministic(t *testing.T) {
	gen := func(seed uint64, prompt []uint32) string {
		g := NewGenerator(seed, prompt)
		out := make([]uint32, 64)
		for i := range out {
			out[i] = g.Next()
		}
		return Decode(out)
	}
	a, b := gen(1, []uint32{1, 2, 3}), gen(1, []uint32{1, 2, 3})
	if a != b {
		t.Fatalf("same seed and prompt differ: %q vs %q", a, b)
	}
	if a == gen(2, []uint32{1, 2, 3}) {
		t.Errorf("seed does not matter")
	}
	if a == gen(1, []uint32{1, 2, 4}) {
		t.Errorf("prompt does not matter")
	}
	for _, c := range a {
		if c != ' ' && (c < 'a' || c > 'z') {
			t.Fatalf("unexpected character %q in %q", c, a)
		}
	}
	// Whole words of the list, one space apart, no leading space (the
	// last may be cut).
	long := gen(3, []uint32{7})
	fields := strings.Split(long, " ")
	for i, f := range fields[:len(fields)-1] {
		if !slices.Contains(words, f) {
			t.Fatalf("field %d %q of %q is not a word", i, f, long)
		}
	}
}

// The streamed prompt hash equals one hash over the whole little-endian
// encoding, at every length around the chunk boundary.
func TestGeneratorSeedStreamed(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 257, 1000, 5000} {
		prompt := make([]uint32, n)
		for i := range prompt {
			prompt[i] = uint32(i*2654435761) ^ 0x5bd1e995
		}
		buf := make([]byte, 0, 4*n)
		for _, tk := range prompt {
			buf = binary.LittleEndian.AppendUint32(buf, tk)
		}
		want := rand.New(rand.NewPCG(7, xxh3.Hash(buf)))
		g := NewGenerator(7, prompt)
		for k := range 5 {
			if a, b := g.rng.Uint64(), want.Uint64(); a != b {
				t.Fatalf("prompt of %d tokens, draw %d: %x, want %x", n, k, a, b)
			}
		}
	}
}
