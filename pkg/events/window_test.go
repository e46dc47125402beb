package events

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

func TestWindowCut(t *testing.T) {
	// held blocks (x) among a full-attention hit's, a window of 4 blocks.
	cases := []struct {
		held string
		want int
	}{
		{"xxxxxxxx", 8},
		{"xxxx....", 4},
		{"xx......", 2}, // a run from block 0 shorter than the window is a hit
		{"..xxxx..", 6}, // the rightmost window-long run ends the hit
		{"..xxx.xx", 0}, // no run of 4, none from block 0
		{".xxxxxxx", 8},
		{"x.xxxx.x", 6},
		{"........", 0},
		{"xxx", 3},
		{"", 0},
	}
	for _, c := range cases {
		held := make([]bool, len(c.held))
		for i, ch := range c.held {
			held[i] = ch == 'x'
		}
		if got := windowCut(held, 4); got != c.want {
			t.Errorf("%q: %d, want %d", c.held, got, c.want)
		}
	}
}

// hybridWorld is a groupWorld whose Applier feeds a Windows view, with 10
// blocks stored by group 0 (full attention) and group 1 (sliding window of
// 13 tokens: a hit needs ceil(12/4) = 3 consecutive blocks).
func hybridWorld(t *testing.T) (*groupWorld, *Windows, Matcher) {
	w := newGroupWorld(t, 10)
	win := NewWindows()
	w.ap.SetWindows(win)
	st := w.apply(
		w.store(map[string]any{"group_idx": 0, "kv_cache_spec_kind": "full_attention"}),
		w.store(map[string]any{"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 13}),
	)
	if st.StoredBlocks != 10 || st.OtherGroup != 1 {
		t.Fatalf("apply: %+v", st)
	}
	return w, win, Matcher{Full: w.idx, Windows: win}
}

func hybridMatch(t *testing.T, m Matcher, w *groupWorld, blocks int) index.ReplicaMatch {
	t.Helper()
	for _, rm := range m.Match(w.keys[:blocks], nil) {
		if rm.Replica == w.tg.Replica {
			return rm
		}
	}
	return index.ReplicaMatch{Replica: w.tg.Replica}
}

func TestHybridMatchCutToTheWindow(t *testing.T) {
	w, win, m := hybridWorld(t)
	if need, ok := win.Need("r"); !ok || need != 3 {
		t.Fatalf("need %d %v, want 3 blocks", need, ok)
	}
	if rm := hybridMatch(t, m, w, 10); rm.Blocks != 10 || rm.ByTier[index.TierGPU] != 10 {
		t.Fatalf("everything held: %+v", rm)
	}
	// The sliding-window group evicts blocks 0-4 (the early ones a long
	// prefill releases first); the full-attention group keeps them all.
	hs := w.hs
	w.hs = hs[:5]
	st := w.apply(w.remove(map[string]any{"group_idx": 1}))
	w.hs = hs
	if st.RemovedBlocks != 0 || st.OtherGroup != 1 {
		t.Fatalf("sliding-window removal reached the index: %+v", st)
	}
	if rm := w.match(); rm.Blocks != 10 {
		t.Fatalf("full-attention index lost blocks: %+v", rm)
	}
	for _, c := range []struct{ prefix, want int }{
		{10, 10}, // blocks 7-9 held: the whole prefix is a hit
		{8, 8},   // blocks 5-7 held
		{7, 0},   // blocks 5-6 only: no window of 3 ends at 7 or before, no run from block 0
		{6, 0},
		{3, 0},
	} {
		if rm := hybridMatch(t, m, w, c.prefix); rm.Blocks != c.want || rm.ByTier[index.TierGPU] != c.want {
			t.Errorf("prefix of %d blocks: matched %+v, want %d", c.prefix, rm, c.want)
		}
	}
	// A store by the sliding-window group brings blocks back.
	w.hs = hs[:5]
	toks := w.toks
	w.toks = toks[:5*gbs]
	w.apply(w.store(map[string]any{"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 13}))
	w.hs, w.toks = hs, toks
	if rm := hybridMatch(t, m, w, 6); rm.Blocks != 6 {
		t.Errorf("after the window's blocks returned: %+v, want 6", rm)
	}
	// AllBlocksCleared clears the view with the index.
	w.apply(map[string]any{"type": "AllBlocksCleared"})
	if held := win.Index().Held("r", w.keys, nil); held[9] {
		t.Error("the sliding-window view kept blocks after AllBlocksCleared")
	}
}

func TestHybridMatchLeavesOthersAlone(t *testing.T) {
	w, _, m := hybridWorld(t)
	// A second replica with full attention only, same blocks.
	w.tg.Replica = "plain"
	w.apply(w.store(map[string]any{"group_idx": 0, "kv_cache_spec_kind": "full_attention"}))
	// The hybrid replica loses its window's blocks at the end.
	w.tg.Replica = "r"
	hs := w.hs
	w.hs = hs[7:]
	w.apply(w.remove(map[string]any{"group_idx": 1}))
	w.hs = hs
	got := map[index.ReplicaID]int{}
	for _, rm := range m.Match(w.keys, nil) {
		got[rm.Replica] = rm.Blocks
	}
	// r: blocks 0-6 held by the window group, the run 4-6 ends the hit at 7.
	if got["plain"] != 10 || got["r"] != 7 {
		t.Errorf("matches %v, want plain 10 and r 7", got)
	}
}

func TestHybridParentFromMainIndex(t *testing.T) {
	// The sliding-window group stores blocks 5-9 with parent block 4,
	// which it does not hold (evicted): the key chain is resumed from the
	// full-attention group's mapping of the same hash.
	w := newGroupWorld(t, 10)
	win := NewWindows()
	w.ap.SetWindows(win)
	w.apply(w.store(map[string]any{"group_idx": 0, "kv_cache_spec_kind": "full_attention"}))
	hs, toks := w.hs, w.toks
	w.hs, w.toks = hs[5:], toks[5*gbs:]
	w.apply(w.store(map[string]any{"parent_block_hash": hs[4], "group_idx": 1,
		"kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 13}))
	w.hs, w.toks = hs, toks
	held := win.Index().Held("r", w.keys, nil)
	for i, h := range held {
		if h != (i >= 5) {
			t.Fatalf("sliding-window view holds %v, want blocks 5-9", held)
		}
	}
	m := Matcher{Full: w.idx, Windows: win}
	if rm := hybridMatch(t, m, w, 10); rm.Blocks != 10 {
		t.Errorf("matched %+v, want 10", rm)
	}
}

// BenchmarkMatcher: the router's match of a 256-block prompt held by 8
// replicas, through the plain index and through the Matcher with every
// replica hybrid (its window's 4 blocks checked in the sliding-window
// view) or none.
func BenchmarkMatcher(b *testing.B) {
	const blocks, replicas = 256, 8
	toks := tokens(blocks*gbs, 3)
	hs := make([]uint64, blocks)
	for i := range hs {
		hs[i] = uint64(5000 + i)
	}
	keys := kvblock.Keys(nil, kvblock.Root("m", ""), toks, gbs, kvblock.Options{})
	for _, hybrid := range []bool{false, true} {
		idx := index.New(index.Config{})
		win := NewWindows()
		for r := range replicas {
			id := index.ReplicaID(fmt.Sprint("r", r))
			idx.Stored(index.Stored{Replica: id, Root: kvblock.Root("m", ""), Hashes: hs, Tokens: toks, BlockSize: gbs, Tier: index.TierGPU})
			if hybrid {
				win.Index().Stored(index.Stored{Replica: id, Root: kvblock.Root("m", ""), Hashes: hs, Tokens: toks, BlockSize: gbs, Tier: index.TierGPU})
				win.setWindow(id, 13, gbs)
			}
		}
		m := Matcher{Full: idx, Windows: win}
		dst := make([]index.ReplicaMatch, 0, replicas)
		name := "plain"
		if hybrid {
			name = "hybrid"
		}
		b.Run("index/"+name, func(b *testing.B) {
			for b.Loop() {
				dst = idx.Match(keys, dst[:0])
			}
		})
		b.Run("matcher/"+name, func(b *testing.B) {
			for b.Loop() {
				dst = m.Match(keys, dst[:0])
			}
			if dst[0].Blocks != blocks {
				b.Fatalf("matched %d", dst[0].Blocks)
			}
		})
	}
}
