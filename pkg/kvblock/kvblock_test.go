package kvblock

import (
	"math/rand/v2"
	"testing"
)

func seq(n int, seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(50000))
	}
	return out
}

func matched(a, b []Key) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestKeysFullBlocksOnly(t *testing.T) {
	root := Root("m", "")
	for _, tc := range []struct{ tokens, want int }{{0, 0}, {15, 0}, {16, 1}, {31, 1}, {32, 2}, {16*9 + 7, 9}} {
		got := Keys(nil, root, seq(tc.tokens, 1), 16, Options{})
		if len(got) != tc.want {
			t.Errorf("%d tokens: %d keys, want %d", tc.tokens, len(got), tc.want)
		}
	}
	if got := Keys(nil, root, seq(64, 1), 0, Options{}); len(got) != 0 {
		t.Errorf("block size 0 gave %d keys", len(got))
	}
}

// The seed's block-boundary table: a difference destroys its block and every
// later one; the trailing partial block never matters; prepending one token
// shifts every boundary.
func TestBoundary(t *testing.T) {
	root := Root("m", "")
	base := seq(16*9+9, 2)
	keys := Keys(nil, root, base, 16, Options{})
	flip := func(i int) []Key {
		c := append([]uint32(nil), base...)
		c[i] = (c[i] + 1) % 50000
		return Keys(nil, root, c, 16, Options{})
	}
	cases := map[string]struct {
		got  []Key
		want int
	}{
		"last of block 3":  {flip(4*16 - 1), 3},
		"first of block 4": {flip(4 * 16), 4},
		"tail":             {flip(9*16 + 3), 9},
		"prepend one":      {Keys(nil, root, append([]uint32{7}, base...), 16, Options{}), 0},
	}
	for name, c := range cases {
		if m := matched(keys, c.got); m != c.want {
			t.Errorf("%s: matched %d, want %d", name, m, c.want)
		}
	}
}

func TestRootsSaltAndExtras(t *testing.T) {
	toks := seq(64, 3)
	plain := Keys(nil, Root("m", ""), toks, 16, Options{})
	if again := Keys(nil, Root("m", ""), toks, 16, Options{}); matched(plain, again) != 4 {
		t.Fatal("keys are not deterministic")
	}
	for name, other := range map[string][]Key{
		"other model": Keys(nil, Root("m2", ""), toks, 16, Options{}),
		"lora":        Keys(nil, Root("m", "adapter"), toks, 16, Options{}),
		"other lora":  Keys(nil, Root("m", "adapter2"), toks, 16, Options{}),
		"salt":        Keys(nil, Root("m", ""), toks, 16, Options{CacheSalt: "tenant-a"}),
		"extra on 0":  Keys(nil, Root("m", ""), toks, 16, Options{Extras: [][]byte{[]byte("img")}}),
	} {
		for i := range other {
			if other[i] == plain[i] {
				t.Errorf("%s: key %d equals the plain key", name, i)
			}
		}
	}
	// Two adapters never share a key.
	if matched(Keys(nil, Root("m", "adapter"), toks, 16, Options{}), Keys(nil, Root("m", "adapter2"), toks, 16, Options{})) != 0 {
		t.Error("two adapters share keys")
	}
	// A LoRA adapter's keys do not depend on the base model name.
	if matched(Keys(nil, Root("m", "a"), toks, 16, Options{}), Keys(nil, Root("other", "a"), toks, 16, Options{})) != 4 {
		t.Error("adapter keys depend on the base model")
	}
	// An extra on block 2 leaves blocks 0 and 1 alone.
	mm := Keys(nil, Root("m", ""), toks, 16, Options{Extras: [][]byte{nil, nil, []byte("img")}})
	if m := matched(plain, mm); m != 2 {
		t.Errorf("extra on block 2: matched %d, want 2", m)
	}
	// Salt and extras are length-prefixed: moving bytes between them changes the key.
	a := Options{CacheSalt: "ab", Extras: [][]byte{[]byte("c")}}
	b := Options{CacheSalt: "a", Extras: [][]byte{[]byte("bc")}}
	if Chain(0, toks[:16], a.Extra(0)) == Chain(0, toks[:16], b.Extra(0)) {
		t.Error("salt/extra boundary is ambiguous")
	}
}

func TestChainMatchesKeys(t *testing.T) {
	toks := seq(48, 4)
	root := Root("m", "")
	keys := Keys(nil, root, toks, 16, Options{CacheSalt: "s"})
	o := Options{CacheSalt: "s"}
	parent := root
	for i := range 3 {
		parent = Chain(parent, toks[i*16:(i+1)*16], o.Extra(i))
		if parent != keys[i] {
			t.Fatalf("block %d: Chain differs from Keys", i)
		}
	}
	// Appending to a non-empty dst keeps what was there.
	dst := Keys([]Key{42}, root, toks, 16, Options{})
	if len(dst) != 4 || dst[0] != 42 {
		t.Fatalf("dst not preserved: %v", dst)
	}
}

func TestExpandTrace(t *testing.T) {
	a := ExpandTrace([]int64{0, 1, 2}, 1200, 512)
	b := ExpandTrace([]int64{0, 1, 9}, 1536, 512)
	if len(a) != 1200 || len(b) != 1536 {
		t.Fatalf("lengths %d %d", len(a), len(b))
	}
	ka := Keys(nil, Root("m", ""), a, 16, Options{})
	kb := Keys(nil, Root("m", ""), b, 16, Options{})
	if m := matched(ka, kb); m != 64 {
		t.Errorf("shared two trace blocks = 64 router blocks, matched %d", m)
	}
	if got := ExpandTrace([]int64{5}, 10000, 512); len(got) != 512 {
		t.Errorf("capped at ids: %d", len(got))
	}
	c := ExpandTrace([]int64{3}, 512, 512)
	d := ExpandTrace([]int64{4}, 512, 512)
	if matched(Keys(nil, 0, c, 16, Options{}), Keys(nil, 0, d, 16, Options{})) != 0 {
		t.Error("different ids share a block")
	}
}

// TestExpandTraceTokens pins ExpandTrace to its definition: token i is
// traceToken(ids[i/traceBlock], i%traceBlock), for block sizes that do and
// do not divide the length.
func TestExpandTraceTokens(t *testing.T) {
	ids := []int64{7, -3, 1 << 40, 0, 12345}
	for _, tb := range []int{1, 3, 16, 512} {
		for _, n := range []int{0, 1, tb - 1, tb, tb + 1, 3*tb + 2, 5 * tb, 9 * tb} {
			got := ExpandTrace(ids, n, tb)
			want := min(max(n, 0), len(ids)*tb)
			if len(got) != want {
				t.Fatalf("block %d, len %d: got %d tokens, want %d", tb, n, len(got), want)
			}
			for i, tok := range got {
				if w := traceToken(uint64(ids[i/tb]), uint64(i%tb)); tok != w {
					t.Fatalf("block %d, len %d: token %d = %d, want %d", tb, n, i, tok, w)
				}
			}
		}
	}
	// A fixed value, so that the token function itself cannot drift (every
	// simulated trace result depends on it).
	if got := ExpandTrace([]int64{42}, 3, 512); got[0] != traceTokenRef(42, 0) || got[2] != traceTokenRef(42, 2) {
		t.Fatalf("tokens %v differ from SplitMix64", got)
	}
}

// traceTokenRef is SplitMix64 written out once more, independently of
// traceToken.
func traceTokenRef(id, off uint64) uint32 {
	z := id*0x9e3779b97f4a7c15 + off + 0x632be59bd9b4e019
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return uint32((z ^ z>>31) & (1<<17 - 1))
}

func BenchmarkExpandTrace(b *testing.B) {
	ids := make([]int64, 40)
	for i := range ids {
		ids[i] = int64(i * 7919)
	}
	b.SetBytes(40 * 512 * 4)
	for b.Loop() {
		_ = ExpandTrace(ids, 40*512, 512)
	}
}

func BenchmarkKeys8192(b *testing.B) {
	toks := seq(8192*16, 5)
	dst := make([]Key, 0, 8192)
	root := Root("m", "")
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		dst = Keys(dst[:0], root, toks, 16, Options{})
	}
}

func TestWithLookahead(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	o := Options{CacheSalt: "s", Extras: [][]byte{{'x'}}}
	if got, n := o.WithLookahead(toks, 4, 0); n != len(toks) || len(got.Extras) != 1 {
		t.Fatalf("n=0 changed the options: %v %d", got, n)
	}
	got, n := o.WithLookahead(toks, 4, 2)
	// Blocks 0 and 1 have two tokens after them (5,6 and 9,10); no third block.
	if n != 8 || len(got.Extras) != 2 || got.CacheSalt != "s" {
		t.Fatalf("n=%d extras=%d salt=%q", n, len(got.Extras), got.CacheSalt)
	}
	if want := AppendLookahead([]byte{'x'}, []uint32{5, 6}); string(got.Extras[0]) != string(want) {
		t.Fatalf("block 0 extras %x, want %x", got.Extras[0], want)
	}
	if want := AppendLookahead(nil, []uint32{9, 10}); string(got.Extras[1]) != string(want) {
		t.Fatalf("block 1 extras %x, want %x", got.Extras[1], want)
	}
	if o.Extras[0][0] != 'x' || len(o.Extras[0]) != 1 {
		t.Fatal("the caller's extras were modified")
	}
	// Lookahead tokens change every key from their block on.
	a := Keys(nil, Root("m", ""), toks[:n], 4, got)
	other := append([]uint32(nil), toks...)
	other[9] = 99
	got2, _ := o.WithLookahead(other, 4, 2)
	b := Keys(nil, Root("m", ""), other[:n], 4, got2)
	if a[0] != b[0] || a[1] == b[1] {
		t.Fatalf("keys %v vs %v", a, b)
	}
	if _, n := o.WithLookahead(toks[:1], 4, 2); n != 0 {
		t.Fatalf("too short: %d", n)
	}
}
