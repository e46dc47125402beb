package tokenize

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"
)

// parallelText is a text of about n bytes: fixture texts and long
// messages, with every kind of added token of the family between them
// (lstrip and rstrip ones included) and runs of several in a row.
func parallelText(t *testing.T, enc *Encoder, name string, n int, seed uint64) string {
	t.Helper()
	fx := loadFixtures(t, name)
	rng := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		switch rng.IntN(4) {
		case 0:
			b.WriteString(longMessage(rng, i))
		default:
			b.WriteString(fx.Plain[rng.IntN(len(fx.Plain))].Text)
		}
		for range rng.IntN(3) {
			if rng.IntN(3) == 0 {
				b.WriteString(" \n ")
			}
			b.WriteString(enc.added[rng.IntN(len(enc.added))].content)
		}
	}
	return b.String()
}

// TestParallelEncodeEqualsSequential: a long text encoded on several
// goroutines gives the ids, safe cuts and chunk cache contents of the
// one-goroutine encoding, for every family, with and without a chunk
// cache (same lookups, same entries stored); and the goroutines are all
// joined.
func TestParallelEncodeEqualsSequential(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			enc := loadEncoder(t, name)
			seq := *enc
			seq.maxWorkers = 1
			par := *enc
			par.maxWorkers = 4
			for seed := range uint64(2) {
				text := parallelText(t, enc, name, 130<<10+int(seed)*50_000, seed)
				if par.workers(len(text)) < 4 {
					t.Fatalf("%d bytes: only %d workers", len(text), par.workers(len(text)))
				}
				want, err := seq.Encode(text, true)
				if err != nil {
					t.Fatal(err)
				}
				got, err := par.Encode(text, true)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d: parallel ids differ from sequential (first at %d)", seed, firstDiff(got, want))
				}
				// Through chunk caches, with safe cuts, as a chat turn.
				cs, cp := newChunkCache(64<<20), newChunkCache(64<<20)
				es, _, err := seq.encodeReusing(context.Background(), nil, text, cs)
				if err != nil {
					t.Fatal(err)
				}
				ep, _, err := par.encodeReusing(context.Background(), nil, text, cp)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ep.ids, es.ids) || !slices.Equal(ep.cuts, es.cuts) {
					t.Fatalf("seed %d: parallel turn differs: ids equal %v, %d vs %d cuts", seed, slices.Equal(ep.ids, es.ids), len(ep.cuts), len(es.cuts))
				}
				plain, err := seq.Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ep.ids, plain) {
					t.Fatalf("seed %d: cached turn differs from plain encoding", seed)
				}
				// The same chunks looked up and the same ids stored (a chunk
				// that occurs twice can miss twice when two goroutines meet
				// it at once, where one goroutine would hit the second time).
				hs, ms, bs := cs.stats()
				hp, mp, bp := cp.stats()
				if hs+ms != hp+mp || bs != bp || ms == 0 {
					t.Fatalf("seed %d: chunk caches differ: sequential %d/%d/%d, parallel %d/%d/%d", seed, hs, ms, bs, hp, mp, bp)
				}
			}
		})
	}
}

// TestParallelEncodeErrors: invalid UTF-8 anywhere (also late, in
// another goroutine's run) and a cancelled context fail a parallel
// encoding as they fail a sequential one.
func TestParallelEncodeErrors(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	enc := loadEncoder(t, "qwen3")
	par := *enc
	par.maxWorkers = 4
	text := parallelText(t, enc, "qwen3", 130<<10, 1)
	for _, at := range []int{0, len(text) / 2, len(text) - 1} {
		for at > 0 && !utf8.RuneStart(text[at]) {
			at--
		}
		bad := text[:at] + "\xff" + text[at:]
		if _, err := par.Encode(bad, false); !errors.Is(err, ErrInvalidUTF8) {
			t.Fatalf("invalid byte at %d: %v, want ErrInvalidUTF8", at, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := par.appendEncode(ctx, nil, text, false, newChunkCache(1<<20)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
