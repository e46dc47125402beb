package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// hybridCfg: 16-token blocks, a 64-token window (a hit needs 4
// consecutive sliding-window blocks), one 16-token block prefilled per
// step, 75 blocks in the pool.
func hybridCfg() Config {
	return Config{SlidingWindow: 64, NumGPUBlocks: 75, MaxModelLen: 1024, MaxNumSeqs: 4, MaxNumBatchedTokens: 16}
}

func run1(t *testing.T, e *Engine, p []uint32, maxTokens int) (Finished, []Event) {
	t.Helper()
	id, err := e.Submit(0, Request{Prompt: p, MaxTokens: maxTokens})
	if err != nil {
		t.Fatal(err)
	}
	rs := drain(t, e)
	f, ok := finishedOf(rs)[id]
	if !ok {
		t.Fatal("request did not finish")
	}
	return f, eventsOf(rs)
}

func TestHybridStoresPublishBothGroups(t *testing.T) {
	cfg := hybridCfg()
	cfg.MaxNumBatchedTokens = 4096 // one prefill step
	e := mustNew(t, cfg, 1)
	p := prompt(100, 1)
	_, evs := run1(t, e, p, 1)
	want := e.BlockHashes(Request{Prompt: p})
	if len(want) != 6 {
		t.Fatalf("%d full blocks, want 6", len(want))
	}
	if len(evs) != 2 {
		t.Fatalf("%d events, want one BlockStored per group: %+v", len(evs), evs)
	}
	for g, ev := range evs {
		if ev.Kind != BlockStored || ev.Group != g || !slices.Equal(ev.Hashes, want) || ev.BlockSize != 16 ||
			ev.HasParent || !slices.Equal(ev.Tokens, p[:96]) {
			t.Errorf("event %d: %+v", g, ev)
		}
	}
	if evs[0].SpecKind != "" && evs[0].SpecKind != SpecFullAttention || evs[0].SlidingWindow != 0 {
		t.Errorf("group 0 labelled %q window %d", evs[0].SpecKind, evs[0].SlidingWindow)
	}
	if evs[1].SpecKind != SpecSlidingWindow || evs[1].SlidingWindow != 64 {
		t.Errorf("group 1 labelled %q window %d", evs[1].SpecKind, evs[1].SlidingWindow)
	}
	// Both groups' blocks are cached and the repeat hits every full block
	// (the window's blocks at the end of the prompt are held).
	if st := e.Stats(); st.CachedGPUBlocks != 12 {
		t.Errorf("%d cached blocks, want 6 per group", st.CachedGPUBlocks)
	}
	f, _ := run1(t, e, p, 1)
	if f.CachedTokens != 96 {
		t.Errorf("repeat cached %d tokens, want 96", f.CachedTokens)
	}
}

func TestHybridWindowBlocksReleasedDuringPrefill(t *testing.T) {
	e := mustNew(t, hybridCfg(), 1)
	if _, err := e.Submit(0, Request{Prompt: prompt(320, 1), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	maxUsed := 0
	for {
		at, ok := e.NextEventTime()
		if !ok {
			break
		}
		e.Step(at)
		maxUsed = max(maxUsed, e.Stats().UsedGPUBlocks)
	}
	// 20 full-attention blocks, and at most the window (4 blocks) plus
	// the block being computed and the one the window's edge is in.
	if maxUsed < 20 || maxUsed > 20+6 {
		t.Errorf("at most %d blocks in use, want 20 full-attention blocks plus the window's", maxUsed)
	}
}

// hybridAfterPressure runs prompt a (10 blocks, prefilled a block per
// step, so its first 5 sliding-window blocks leave the window and are
// released during the prefill), then a disjoint prompt that allocates
// exactly the never-used blocks plus those 5: they are evicted, the rest
// of a's blocks stay cached. It returns the engine, a and the events of
// the second request.
func hybridAfterPressure(t *testing.T) (*Engine, []uint32, []Event) {
	e := mustNew(t, hybridCfg(), 1)
	a := prompt(160, 1)
	run1(t, e, a, 1)
	_, evs := run1(t, e, prompt(480, 2), 1) // 30 blocks per group = 55 never used + 5
	return e, a, evs
}

func TestHybridEvictsWindowBlocksFirst(t *testing.T) {
	e, a, evs := hybridAfterPressure(t)
	hs := e.BlockHashes(Request{Prompt: a})
	removed := map[int][]uint64{}
	for _, ev := range evs {
		if ev.Kind == BlockRemoved {
			removed[ev.Group] = append(removed[ev.Group], ev.Hashes...)
		}
	}
	if len(removed[GroupFullAttention]) != 0 {
		t.Errorf("full-attention blocks removed: %x", removed[GroupFullAttention])
	}
	if !slices.Equal(removed[GroupSlidingWindow], hs[:5]) {
		t.Errorf("sliding-window removals %x, want a's first 5 blocks %x", removed[GroupSlidingWindow], hs[:5])
	}
	if g, _ := e.CachedPrefix(Request{Prompt: a}); g != 10 {
		t.Errorf("full-attention group holds %d of a's blocks, want 10", g)
	}
}

func TestHybridHitNeedsTheWindow(t *testing.T) {
	// A prefix of a whose window blocks were evicted: the full-attention
	// group holds its 6 blocks, but the sliding-window group holds no 4
	// consecutive blocks ending at or before block 6 (blocks 0-4 are gone)
	// and no run from block 0: no hit at all, as vLLM's coordinator
	// decides.
	e, a, _ := hybridAfterPressure(t)
	b := append(slices.Clone(a[:96]), prompt(40, 3)...)
	if g, _ := e.CachedPrefix(Request{Prompt: b}); g != 6 {
		t.Fatalf("full-attention group holds %d of b's blocks, want 6", g)
	}
	if f, _ := run1(t, e, b, 1); f.CachedTokens != 0 {
		t.Errorf("prefix without its window: cached %d tokens, want 0", f.CachedTokens)
	}

	// a extended: the window before block 10 (blocks 6-9) is held, so
	// every full block of a is a hit.
	e, a, _ = hybridAfterPressure(t)
	c := append(slices.Clone(a), prompt(40, 4)...)
	if f, _ := run1(t, e, c, 1); f.CachedTokens != 160 {
		t.Errorf("extension: cached %d tokens, want 160", f.CachedTokens)
	}

	// Without the hybrid group the same prefix is a full hit.
	cfg := hybridCfg()
	cfg.SlidingWindow = 0
	e = mustNew(t, cfg, 1)
	run1(t, e, a, 1)
	run1(t, e, prompt(480, 2), 1)
	if f, _ := run1(t, e, b, 1); f.CachedTokens != 96 {
		t.Errorf("one-group engine: cached %d tokens, want 96", f.CachedTokens)
	}
}

func TestHybridHitStopsAtLastWindow(t *testing.T) {
	// Direct cases of the sliding-window cut: which sliding-window blocks
	// are cached (x) among the full-attention hit's blocks, and the hit.
	cases := []struct {
		held string
		want int
	}{
		{"xxxxxxxx", 8},
		{"xxxx....", 4}, // a run from block 0 shorter than the full hit
		{"xx......", 2}, // a run from 0 shorter than the window is a hit
		{"..xxxx..", 6}, // the rightmost window-long run ends the hit
		{"..xxx.xx", 0}, // no run of 4, none from block 0
		{".xxxxxxx", 8}, // the last 4 suffice
		{"x.xxxx.x", 6},
		{"........", 0},
	}
	for _, c := range cases {
		e := mustNew(t, hybridCfg(), 1)
		r := &request{req: Request{Prompt: prompt(8*16, 9)}, tokens: prompt(8*16, 9)}
		e.ensureHashes(r, 8)
		for i, ch := range c.held {
			if ch == 'x' {
				e.pool.cacheGroup(int32(i), r.hashes[i], GroupSlidingWindow, nil)
			}
		}
		if got := e.swHit(r, 8); got != c.want {
			t.Errorf("%s: hit %d blocks, want %d", c.held, got, c.want)
		}
	}
}

func TestHybridEventsReproduceCache(t *testing.T) {
	e := mustNew(t, Config{BlockSize: 8, NumGPUBlocks: 80, MaxModelLen: 256, MaxNumSeqs: 6,
		MaxNumBatchedTokens: 64, SlidingWindow: 24}, 5)
	type key struct {
		g int
		h uint64
	}
	held := map[key]bool{}
	apply := func(evs []Event) {
		for _, ev := range evs {
			for _, h := range ev.Hashes {
				k := key{ev.Group, h}
				switch ev.Kind {
				case BlockStored:
					if held[k] {
						t.Errorf("group %d stored %x twice", ev.Group, h)
					}
					if (ev.Group == GroupSlidingWindow) != (ev.SpecKind == SpecSlidingWindow) {
						t.Errorf("group %d labelled %q", ev.Group, ev.SpecKind)
					}
					held[k] = true
				case BlockRemoved:
					if !held[k] {
						t.Errorf("group %d removed %x, never stored", ev.Group, h)
					}
					delete(held, k)
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 3))
	bases := [][]uint32{prompt(120, 1), prompt(120, 2), prompt(120, 3)}
	now := time.Duration(0)
	var preempted, swRemoved int
	for i := range 300 {
		if i%2 == 0 {
			base := bases[rng.IntN(len(bases))]
			p := append(slices.Clone(base[:rng.IntN(len(base))+1]), prompt(rng.IntN(60), uint64(i+100))...)
			if _, err := e.Submit(now, Request{Prompt: p, MaxTokens: 1 + rng.IntN(30)}); err != nil {
				t.Fatal(err)
			}
		}
		if at, ok := e.NextEventTime(); ok {
			res := e.Step(at)
			now = res.End
			preempted += len(res.Preempted)
			for _, ev := range res.Events {
				if ev.Kind == BlockRemoved && ev.Group == GroupSlidingWindow {
					swRemoved++
				}
			}
			apply(res.Events)
		}
	}
	for _, r := range drain(t, e) {
		apply(r.Events)
	}
	if len(held) != e.pool.gpuLen() {
		t.Errorf("events hold %d (group, hash) pairs, engine %d", len(held), e.pool.gpuLen())
	}
	for k := range held {
		if w, _ := e.pool.loc.get(groupKey(k.h, uint8(k.g))); w.gpu < 0 {
			t.Errorf("group %d block %x phantom", k.g, k.h)
		}
	}
	if preempted == 0 || swRemoved == 0 {
		t.Errorf("workload: %d preemptions, %d sliding-window removals; the test needs both", preempted, swRemoved)
	}
	if st := e.Stats(); st.UsedGPUBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("leftover state %+v", st)
	}
}

func TestHybridConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{SlidingWindow: -1},
		{SlidingWindow: 64, NumCPUBlocks: 8},
		{SlidingWindow: 64, NumGPUBlocks: 256, MaxModelLen: 4096},
	} {
		if _, err := New(c, 1); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
}
