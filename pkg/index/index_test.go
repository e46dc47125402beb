package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// checkInvariants walks every internal structure: each occupied slot is
// findable, counts and byte accounting add up, holder records are sorted,
// and (when nothing was evicted) every holder count equals the number of
// engine entries behind it.
func checkInvariants(t testing.TB, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	tabBytes := func(name string, tab *xtab) int64 {
		var b int64 = int64(len(tab.dir)) * dirEntBytes
		n := 0
		for di, sb := range tab.subs {
			if di&(1<<(tab.gd-sb.ld)-1) != 0 {
				continue
			}
			b += subBytes + int64(len(sb.s))*slotBytes
			occ := 0
			for i := range sb.s {
				s := &sb.s[i]
				if !tab.occupied(s, s.v) {
					continue
				}
				occ++
				if f := tab.find(s.k); f != s {
					t.Fatalf("%s: entry %x at %d is not findable", name, s.k, i)
				}
			}
			if occ != sb.n {
				t.Fatalf("%s: sub has %d entries, counts %d", name, occ, sb.n)
			}
			if occ*maxLoadDen > len(sb.s)*maxLoadNum {
				t.Fatalf("%s: sub over max load: %d/%d", name, occ, len(sb.s))
			}
			n += occ
		}
		if n != tab.n {
			t.Fatalf("%s: %d entries, counts %d", name, n, tab.n)
		}
		if b != tab.own {
			t.Fatalf("%s: holds %d bytes, accounts %d", name, b, tab.own)
		}
		return b
	}
	total := tabBytes("keys", &ix.keys)
	type hk struct {
		key  uint64
		slot uint32
	}
	counts := map[hk][NumTiers]uint64{}
	engine := 0
	for s, rs := range ix.bySlot {
		if rs == nil {
			continue
		}
		if rs.slot != uint32(s) || ix.byID[rs.id] != rs {
			t.Fatalf("replica %q: slot tables disagree", rs.id)
		}
		total += tabBytes(string(rs.id), &rs.eng) + replicaBytes + int64(len(rs.id))
		engine += rs.eng.n
	}
	for _, rs := range ix.bySlot {
		if rs == nil {
			continue
		}
		for di, sb := range rs.eng.subs {
			if di&(1<<(rs.eng.gd-sb.ld)-1) != 0 {
				continue
			}
			for i := range sb.s {
				e := &sb.s[i]
				if !rs.eng.occupied(e, e.v) {
					continue
				}
				c := counts[hk{e.v, rs.slot}]
				for tr := range NumTiers {
					if e.k&(1<<(61+uint(tr))) != 0 {
						c[tr]++
					}
				}
				counts[hk{e.v, rs.slot}] = c
			}
		}
	}
	if engine != ix.engine {
		t.Fatalf("engine entries %d, counted %d", engine, ix.engine)
	}
	for _, ch := range ix.arena.chunks {
		total += int64(len(ch)) * 8
	}
	for _, fl := range ix.arena.free {
		total += int64(cap(fl)) * 4
	}
	var pooled int64
	for c, l := range ix.env.pool {
		for _, s := range l {
			if len(s) != c {
				t.Fatalf("pooled array of %d slots in the list of %d", len(s), c)
			}
			pooled += int64(c) * slotBytes
		}
	}
	if pooled != ix.env.pooled {
		t.Fatalf("pool holds %d bytes, accounts %d", pooled, ix.env.pooled)
	}
	checkSlab(t, ix)
	total += pooled
	if total != ix.env.bytes {
		t.Fatalf("bytes: structures hold %d, accounted %d", total, ix.env.bytes)
	}
	holders := 0
	var two [2]uint64
	for di, sb := range ix.keys.subs {
		if di&(1<<(ix.keys.gd-sb.ld)-1) != 0 {
			continue
		}
		for i := range sb.s {
			ks := &sb.s[i]
			if ks.v == 0 {
				continue
			}
			hs := ix.arena.holders(ks.v, &two)
			if _, fits := inline(hs); ks.v&spillBit != 0 && fits {
				t.Fatalf("key %x: spilled record of %d holders that fit inline", ks.k, len(hs))
			}
			if ks.v&spillBit != 0 {
				var held, lower uint64
				for _, w := range hs {
					if hSlot(w) < 64 {
						held |= 1 << hSlot(w)
						if hCount(w, TierGPU) == 0 {
							lower |= 1 << hSlot(w)
						}
					}
				}
				r := ix.arena.rec(uint32(ks.v))
				if r[recHeld] != held || r[recLower] != lower {
					t.Fatalf("key %x: record masks %x/%x, holders %x/%x", ks.k, r[recHeld], r[recLower], held, lower)
				}
			}
			for j, w := range hs {
				if j > 0 && hSlot(hs[j-1]) >= hSlot(w) {
					t.Fatalf("key %x: holders not sorted", ks.k)
				}
				if hEmpty(w) {
					t.Fatalf("key %x: empty holder", ks.k)
				}
				if int(hSlot(w)) >= len(ix.bySlot) || ix.bySlot[hSlot(w)] == nil {
					t.Fatalf("key %x: holder slot %d has no replica", ks.k, hSlot(w))
				}
				if ix.evicted == 0 {
					want := counts[hk{ks.k, hSlot(w)}]
					for tr := range NumTiers {
						if hCount(w, tr) != want[tr] {
							t.Fatalf("key %x slot %d tier %d: count %d, engine entries %d", ks.k, hSlot(w), tr, hCount(w, tr), want[tr])
						}
					}
					delete(counts, hk{ks.k, hSlot(w)})
				}
				holders++
			}
		}
	}
	if holders != ix.holders {
		t.Fatalf("holders %d, counted %d", holders, ix.holders)
	}
	if ix.evicted == 0 && len(counts) != 0 {
		t.Fatalf("%d engine entries point at keys that do not list their replica", len(counts))
	}
}

// TestOracleInvariants repeats an oracle run checking internal invariants.
func TestOracleInvariants(t *testing.T) {
	w := newWorkload(11, 9, 40, 20, 4)
	ix := New(Config{})
	m := newModel()
	for op := range 4000 {
		w.step(t, ix, m)
		if op%50 == 0 {
			checkInvariants(t, ix)
			checkMatch(t, ix, m, w.query(), op)
		}
	}
	checkInvariants(t, ix)
}

func tokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(50000))
	}
	return out
}

// storeChain stores a whole token sequence for replica r, one engine hash
// per block derived from its router key.
func storeChain(t testing.TB, ix *Index, r ReplicaID, root kvblock.Key, toks []uint32, bs int, tier Tier) []kvblock.Key {
	t.Helper()
	n := len(toks) / bs
	keys := kvblock.Keys(nil, root, toks, bs, kvblock.Options{})
	hs := make([]uint64, n)
	for i, k := range keys {
		hs[i] = engineHash(r, k, 0)
	}
	res := ix.Stored(Stored{Replica: r, Root: root, Hashes: hs, Tokens: toks[:n*bs], BlockSize: bs, Tier: tier})
	if res.Blocks != n || res.UnknownParent || res.BadShape {
		t.Fatalf("store %s: %+v", r, res)
	}
	return keys
}

func depthOf(ms []ReplicaMatch, r ReplicaID) int {
	for _, m := range ms {
		if m.Replica == r {
			return m.Blocks
		}
	}
	return 0
}

// TestSeedCorpus replays the seed's index section: 24 requests with a shared
// 4-block system prompt, 16 of them warmed round-robin on 4 replicas; every
// request checked against the brute-force model; a probe sharing only the
// system prompt matches 4 blocks everywhere; a hole at block 5 truncates.
func TestSeedCorpus(t *testing.T) {
	const bs = 16
	r := rand.New(rand.NewPCG(20260826, 0))
	root := kvblock.Root("m", "")
	sys := tokens(r, 4*bs)
	var corpus [][]uint32
	for range 24 {
		corpus = append(corpus, append(slices.Clone(sys), tokens(r, (2+r.IntN(7))*bs+7)...))
	}
	ix, m := New(Config{}), newModel()
	reps := []ReplicaID{"r0", "r1", "r2", "r3"}
	for i, toks := range corpus[:16] {
		n := len(toks) / bs
		keys := kvblock.Keys(nil, root, toks, bs, kvblock.Options{})
		hs := make([]uint64, n)
		for j, k := range keys {
			hs[j] = engineHash(reps[i%4], k, 0)
		}
		ev := Stored{Replica: reps[i%4], Root: root, Hashes: hs, Tokens: toks[:n*bs], BlockSize: bs}
		if got, want := ix.Stored(ev), m.stored(ev); got != want {
			t.Fatalf("store %d: %+v vs %+v", i, got, want)
		}
	}
	for i, toks := range corpus {
		checkMatch(t, ix, m, kvblock.Keys(nil, root, toks, bs, kvblock.Options{}), i)
	}
	probe := append(slices.Clone(sys), tokens(r, 3*bs)...)
	got := ix.Match(kvblock.Keys(nil, root, probe, bs, kvblock.Options{}), nil)
	if len(got) != 4 {
		t.Fatalf("probe matched %d replicas, want 4", len(got))
	}
	for _, g := range got {
		if g.Blocks != 4 || g.ByTier != [NumTiers]int{4, 0, 0} {
			t.Errorf("probe on %s: %+v, want 4 GPU blocks", g.Replica, g)
		}
	}
	victim := kvblock.Keys(nil, root, corpus[2], bs, kvblock.Options{})
	if depthOf(ix.Match(victim, nil), "r2") != len(victim) {
		t.Fatal("r2 does not hold its whole request before the hole")
	}
	ev := Removed{Replica: "r2", Hashes: []uint64{engineHash("r2", victim[5], 0)}}
	if n, want := ix.Removed(ev), m.removed(ev); n != 1 || want != 1 {
		t.Fatalf("removed %d (model %d), want 1", n, want)
	}
	if d := depthOf(ix.Match(victim, nil), "r2"); d != 5 {
		t.Fatalf("hole at block 5: matched %d, want 5", d)
	}
	checkMatch(t, ix, m, victim, 0)

	// Block boundaries: one prompt of 9 full blocks plus a tail.
	solo := New(Config{})
	base := append(slices.Clone(sys), tokens(r, 5*bs+9)...)
	storeChain(t, solo, "s", root, base, bs, TierGPU)
	flip := func(i int) []uint32 {
		c := slices.Clone(base)
		c[i] = (c[i] + 1) % 50000
		return c
	}
	for _, tc := range []struct {
		name string
		toks []uint32
		want int
	}{
		{"whole", base, 9},
		{"last token of block 3", flip(4*bs - 1), 3},
		{"first token of block 4", flip(4 * bs), 4},
		{"inside the tail", flip(9*bs + 3), 9},
		{"one token prepended", append([]uint32{7}, base...), 0},
		{"shorter than a block", base[:bs-1], 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := depthOf(solo.Match(kvblock.Keys(nil, root, tc.toks, bs, kvblock.Options{}), nil), "s"); d != tc.want {
				t.Errorf("matched %d, want %d", d, tc.want)
			}
		})
	}
}

func TestUnknownParentAndSalt(t *testing.T) {
	root := kvblock.Root("m", "")
	toks := tokens(rand.New(rand.NewPCG(1, 2)), 8*4)
	salted := kvblock.Options{CacheSalt: "tenant"}
	keys := kvblock.Keys(nil, root, toks, 4, salted)
	ix := New(Config{})
	h := func(i int) uint64 { return uint64(1000 + i) }

	// Blocks 0-3 with the salt, from the root.
	res := ix.Stored(Stored{Replica: "a", Root: root, Hashes: []uint64{h(0), h(1), h(2), h(3)}, Tokens: toks[:16], BlockSize: 4, Extras: salted})
	if res.Blocks != 4 {
		t.Fatalf("root event: %+v", res)
	}
	// Blocks 4-5 continue the chain; the event still carries the request's
	// salt, which must not apply: block 4 is not chain position 0.
	res = ix.Stored(Stored{Replica: "a", Root: root, HasParent: true, ParentHash: h(3), Hashes: []uint64{h(4), h(5)}, Tokens: toks[16:24], BlockSize: 4, Extras: salted})
	if res.Blocks != 2 {
		t.Fatalf("child event: %+v", res)
	}
	if d := depthOf(ix.Match(keys, nil), "a"); d != 6 {
		t.Fatalf("salted chain matched %d, want 6", d)
	}
	// Unsalted keys share nothing with the salted chain.
	if d := depthOf(ix.Match(kvblock.Keys(nil, root, toks, 4, kvblock.Options{}), nil), "a"); d != 0 {
		t.Fatalf("unsalted query matched %d, want 0", d)
	}

	// A parent the replica never reported: counted, nothing indexed; its
	// descendants are unknown too.
	before := ix.Stats()
	res = ix.Stored(Stored{Replica: "a", Root: root, HasParent: true, ParentHash: 999, Hashes: []uint64{h(7)}, Tokens: toks[28:32], BlockSize: 4})
	if !res.UnknownParent || res.Blocks != 0 {
		t.Fatalf("unknown parent: %+v", res)
	}
	res = ix.Stored(Stored{Replica: "a", Root: root, HasParent: true, ParentHash: h(7), Hashes: []uint64{h(8)}, Tokens: toks[28:32], BlockSize: 4})
	if !res.UnknownParent {
		t.Fatalf("descendant of an unknown parent: %+v", res)
	}
	// The parent is known on another replica only: still unknown for b.
	res = ix.Stored(Stored{Replica: "b", Root: root, HasParent: true, ParentHash: h(3), Hashes: []uint64{h(4)}, Tokens: toks[16:20], BlockSize: 4})
	if !res.UnknownParent {
		t.Fatalf("parent of another replica: %+v", res)
	}
	after := ix.Stats()
	if after.UnknownParent-before.UnknownParent != 3 || after.Keys != before.Keys || after.Engine != before.Engine {
		t.Fatalf("stats before %+v after %+v", before, after)
	}
	checkInvariants(t, ix)
}

func TestBadShape(t *testing.T) {
	toks := make([]uint32, 8)
	for _, tc := range []struct {
		name string
		ev   Stored
	}{
		{"zero block size", Stored{Replica: "a", Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: 0}},
		{"negative block size", Stored{Replica: "a", Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: -4}},
		{"too few tokens", Stored{Replica: "a", Hashes: []uint64{1, 2, 3}, Tokens: toks, BlockSize: 4}},
		{"too many tokens", Stored{Replica: "a", Hashes: []uint64{1}, Tokens: toks, BlockSize: 4}},
		{"tokens without hashes", Stored{Replica: "a", Tokens: toks, BlockSize: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Config{})
			if res := ix.Stored(tc.ev); !res.BadShape || res.Blocks != 0 {
				t.Fatalf("got %+v, want BadShape", res)
			}
			if s := ix.Stats(); s.BadShape != 1 || s.Keys != 0 || s.Engine != 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
	// The good shape next to them is accepted.
	ix := New(Config{})
	if res := ix.Stored(Stored{Replica: "a", Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: 4}); res.Blocks != 2 || res.BadShape {
		t.Fatalf("good event: %+v", res)
	}
}

func TestRemovedUnknown(t *testing.T) {
	root := kvblock.Root("m", "")
	toks := tokens(rand.New(rand.NewPCG(3, 3)), 16)
	ix := New(Config{})
	keys := storeChain(t, ix, "a", root, toks, 4, TierGPU)
	for _, tc := range []struct {
		name string
		ev   Removed
	}{
		{"unknown replica", Removed{Replica: "zz", Hashes: []uint64{engineHash("a", keys[0], 0)}}},
		{"unknown hash", Removed{Replica: "a", Hashes: []uint64{42, 43}}},
		{"other tier", Removed{Replica: "a", Hashes: []uint64{engineHash("a", keys[0], 0)}, Tier: TierCPU}},
		{"empty", Removed{Replica: "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n := ix.Removed(tc.ev); n != 0 {
				t.Fatalf("removed %d, want 0", n)
			}
			if d := depthOf(ix.Match(keys, nil), "a"); d != 4 {
				t.Fatalf("match %d after a no-op removal, want 4", d)
			}
		})
	}
	if s := ix.Stats(); s.Replicas != 1 || s.Keys != 4 {
		t.Fatalf("unknown replica was registered or keys lost: %+v", s)
	}
}

// TestPrefetchChangesNothing: Prefetch of known and unknown hashes, of a
// known and an unknown replica, leaves the index as it was.
func TestPrefetchChangesNothing(t *testing.T) {
	root := kvblock.Root("m", "")
	toks := tokens(rand.New(rand.NewPCG(5, 5)), 16)
	ix := New(Config{})
	keys := storeChain(t, ix, "a", root, toks, 4, TierGPU)
	before := ix.Stats()
	known := []uint64{engineHash("a", keys[0], 0), engineHash("a", keys[3], 0)}
	for _, tc := range []struct {
		r      ReplicaID
		hashes []uint64
	}{{"a", known}, {"a", []uint64{0, 42, 1 << 63}}, {"zz", known}, {"a", nil}} {
		ix.Prefetch(tc.r, tc.hashes)
	}
	if after := ix.Stats(); after != before {
		t.Fatalf("stats changed: %+v -> %+v", before, after)
	}
	if d := depthOf(ix.Match(keys, nil), "a"); d != 4 {
		t.Fatalf("match %d after prefetches, want 4", d)
	}
	if n := ix.Removed(Removed{Replica: "a", Hashes: known}); n != 2 {
		t.Fatalf("removed %d of the 2 prefetched entries", n)
	}
	checkInvariants(t, ix)
}

// TestTiersAndRefcounts: one engine hash on two tiers; two engine hashes
// for one key (hybrid groups) counted per tier.
func TestTiersAndRefcounts(t *testing.T) {
	root := kvblock.Root("m", "")
	toks := tokens(rand.New(rand.NewPCG(4, 4)), 12)
	keys := kvblock.Keys(nil, root, toks, 4, kvblock.Options{})
	st := func(ix *Index, hs []uint64, tier Tier) {
		t.Helper()
		if res := ix.Stored(Stored{Replica: "a", Root: root, Hashes: hs, Tokens: toks, BlockSize: 4, Tier: tier}); res.Blocks != 3 {
			t.Fatalf("store: %+v", res)
		}
	}
	rm := func(ix *Index, h uint64, tier Tier, want int) {
		t.Helper()
		if n := ix.Removed(Removed{Replica: "a", Hashes: []uint64{h}, Tier: tier}); n != want {
			t.Fatalf("removed %d, want %d", n, want)
		}
	}
	tiersOf := func(ix *Index) (int, [NumTiers]int) {
		ms := ix.Match(keys, nil)
		if len(ms) == 0 {
			return 0, [NumTiers]int{}
		}
		return ms[0].Blocks, ms[0].ByTier
	}
	g1 := []uint64{11, 12, 13}
	g2 := []uint64{21, 22, 23}

	t.Run("one hash on two tiers", func(t *testing.T) {
		ix := New(Config{})
		st(ix, g1, TierCPU)
		if b, bt := tiersOf(ix); b != 3 || bt != [NumTiers]int{0, 3, 0} {
			t.Fatalf("cpu only: %d %v", b, bt)
		}
		st(ix, g1, TierGPU)
		if b, bt := tiersOf(ix); b != 3 || bt != [NumTiers]int{3, 0, 0} {
			t.Fatalf("gpu+cpu: %d %v", b, bt)
		}
		rm(ix, 12, TierGPU, 1)
		if b, bt := tiersOf(ix); b != 3 || bt != [NumTiers]int{2, 1, 0} {
			t.Fatalf("block 1 gpu removed: %d %v", b, bt)
		}
		rm(ix, 12, TierGPU, 0) // twice: nothing left on that tier
		rm(ix, 12, TierCPU, 1)
		if b, _ := tiersOf(ix); b != 1 {
			t.Fatalf("block 1 gone: matched %d, want 1", b)
		}
		checkInvariants(t, ix)
	})
	t.Run("duplicate store is idempotent", func(t *testing.T) {
		ix := New(Config{})
		st(ix, g1, TierGPU)
		st(ix, g1, TierGPU)
		rm(ix, 11, TierGPU, 1)
		if b, _ := tiersOf(ix); b != 0 {
			t.Fatalf("matched %d after removing the only copy of block 0", b)
		}
	})
	t.Run("two hashes for one key", func(t *testing.T) {
		ix := New(Config{})
		st(ix, g1, TierGPU)
		st(ix, g2, TierGPU)
		if s := ix.Stats(); s.Keys != 3 || s.Holders != 3 || s.Engine != 6 {
			t.Fatalf("stats %+v", s)
		}
		rm(ix, 11, TierGPU, 1)
		if b, _ := tiersOf(ix); b != 3 {
			t.Fatalf("one group removed: matched %d, want 3", b)
		}
		rm(ix, 21, TierGPU, 1)
		if b, _ := tiersOf(ix); b != 0 {
			t.Fatalf("both groups removed: matched %d, want 0", b)
		}
		checkInvariants(t, ix)
	})
	t.Run("two hashes on different tiers", func(t *testing.T) {
		ix := New(Config{})
		st(ix, g1, TierGPU)
		st(ix, g2, TierDisk)
		rm(ix, 11, TierDisk, 0) // g1 was never on disk
		if b, bt := tiersOf(ix); b != 3 || bt != [NumTiers]int{3, 0, 0} {
			t.Fatalf("%d %v", b, bt)
		}
		rm(ix, 11, TierGPU, 1)
		if b, bt := tiersOf(ix); b != 3 || bt != [NumTiers]int{2, 0, 1} {
			t.Fatalf("block 0 only on disk: %d %v", b, bt)
		}
		checkInvariants(t, ix)
	})
	t.Run("hash reused for other content", func(t *testing.T) {
		ix := New(Config{})
		st(ix, g1, TierGPU)
		other := tokens(rand.New(rand.NewPCG(5, 5)), 4)
		if res := ix.Stored(Stored{Replica: "a", Root: root, Hashes: []uint64{11}, Tokens: other, BlockSize: 4}); res.Blocks != 1 {
			t.Fatalf("%+v", res)
		}
		if b, _ := tiersOf(ix); b != 0 {
			t.Fatalf("block 0's hash now names other content: matched %d, want 0", b)
		}
		checkInvariants(t, ix)
	})
}

// TestCountSaturation: past 4095 engine hashes for one (key, replica, tier)
// the count saturates; removals then drop the holder early, never late.
func TestCountSaturation(t *testing.T) {
	root := kvblock.Root("m", "")
	toks := tokens(rand.New(rand.NewPCG(6, 6)), 4)
	keys := kvblock.Keys(nil, root, toks, 4, kvblock.Options{})
	ix := New(Config{})
	const n = cntMax + 5
	for i := range n {
		ix.Stored(Stored{Replica: "a", Root: root, Hashes: []uint64{uint64(i + 1)}, Tokens: toks, BlockSize: 4})
	}
	for i := range n {
		ix.Removed(Removed{Replica: "a", Hashes: []uint64{uint64(i + 1)}})
		held := depthOf(ix.Match(keys, nil), "a") == 1
		if held && i >= cntMax-1 {
			t.Fatalf("still held after %d of %d removals", i+1, n)
		}
		if !held && i < cntMax-1 {
			t.Fatalf("dropped after %d of %d removals", i+1, n)
		}
	}
	if s := ix.Stats(); s.Keys != 0 || s.Holders != 0 || s.Engine != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCleared(t *testing.T) {
	root := kvblock.Root("m", "")
	r := rand.New(rand.NewPCG(7, 7))
	shared := tokens(r, 40*4)
	ix := New(Config{})
	var keys []kvblock.Key
	for _, rep := range []ReplicaID{"a", "b", "c"} {
		keys = storeChain(t, ix, rep, root, shared, 4, TierGPU)
	}
	ix.Cleared("b")
	ix.Cleared("nobody")
	ms := ix.Match(keys, nil)
	if len(ms) != 2 || depthOf(ms, "a") != 40 || depthOf(ms, "c") != 40 {
		t.Fatalf("after clearing b: %s", fmtMatches(ms))
	}
	if s := ix.Stats(); s.Replicas != 2 || s.Holders != 80 || s.Engine != 80 || s.Keys != 40 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, ix)
	// b's slot is reused by a newcomer, which must not inherit anything.
	storeChain(t, ix, "d", root, shared[:8], 4, TierCPU)
	ms = ix.Match(keys, nil)
	if depthOf(ms, "b") != 0 || depthOf(ms, "d") != 2 {
		t.Fatalf("after d joined: %s", fmtMatches(ms))
	}
	// b comes back and relearns.
	storeChain(t, ix, "b", root, shared, 4, TierGPU)
	if d := depthOf(ix.Match(keys, nil), "b"); d != 40 {
		t.Fatalf("b relearned %d, want 40", d)
	}
	for _, rep := range []ReplicaID{"a", "b", "c", "d"} {
		ix.Cleared(rep)
	}
	s := ix.Stats()
	if s.Keys != 0 || s.Holders != 0 || s.Engine != 0 || s.Replicas != 0 {
		t.Fatalf("everything cleared: %+v", s)
	}
	// Besides the pool of freed slot arrays kept for reuse (bounded),
	// the cleared index is as small as an empty one.
	empty := New(Config{}).Stats()
	if s.Bytes-ix.env.pooled > empty.Bytes+4096 || ix.env.pooled > ix.env.poolMax() {
		t.Fatalf("cleared index holds %d bytes (%d pooled), an empty one %d", s.Bytes, ix.env.pooled, empty.Bytes)
	}
	checkInvariants(t, ix)
}

// TestManyReplicas: thousands of replicas on one shared prefix, each with a
// private continuation.
func TestManyReplicas(t *testing.T) {
	root := kvblock.Root("m", "")
	r := rand.New(rand.NewPCG(8, 8))
	sys := tokens(r, 8*4)
	ix := New(Config{})
	const n = 3000
	var probe []kvblock.Key
	for i := range n {
		rep := ReplicaID(fmt.Sprintf("replica-%04d", i))
		toks := append(slices.Clone(sys), tokens(r, (i%5)*4)...)
		keys := storeChain(t, ix, rep, root, toks, 4, Tier(i%3))
		if i == 1234 {
			probe = keys
		}
	}
	ms := ix.Match(probe, nil)
	if len(ms) != n {
		t.Fatalf("%d replicas matched, want %d", len(ms), n)
	}
	for _, m := range ms {
		want := 8
		if m.Replica == "replica-1234" {
			want = len(probe)
		}
		if m.Blocks != want {
			t.Fatalf("%s matched %d, want %d", m.Replica, m.Blocks, want)
		}
	}
	checkInvariants(t, ix)
}

// TestBudget runs the oracle workload under small byte budgets: the index
// stays within 5% of its budget, evicts, and never matches more than the
// truth.
func TestBudget(t *testing.T) {
	for _, budget := range []int64{96 << 10, 256 << 10} {
		t.Run(fmt.Sprint(budget), func(t *testing.T) {
			w := newWorkload(21, 10, 400, 40, 2)
			w.maxRun, w.storePct, w.removePct, w.evicting = 40, 85, 14, true
			ix := New(Config{MaxBytes: budget})
			m := newModel()
			shorter := 0
			for op := range 8000 {
				w.step(t, ix, m)
				if s := ix.Stats(); s.Bytes > budget+budget/20 {
					t.Fatalf("op %d: %d bytes over a budget of %d", op, s.Bytes, budget)
				}
				if op%7 != 0 {
					continue
				}
				if op%70 == 0 {
					checkInvariants(t, ix)
				}
				q := w.query()
				got, want := ix.Match(q, nil), m.match(q)
				for _, g := range got {
					d := depthOf(want, g.Replica)
					if g.Blocks > d {
						rs := ix.byID[g.Replica]
						for _, sb := range rs.eng.subs {
							for i := range sb.s {
								e := sb.s[i]
								if e.k>>61 != 0 && kvblock.Key(e.v) == q[0] {
									t.Logf("index entry %x tiers %b", e.k&^tierMaskK, e.k>>61)
								}
							}
						}
						for h, e := range m.eng[g.Replica] {
							if e.key == q[0] {
								t.Logf("model entry %x tiers %b", h, e.tiers)
							}
						}
						t.Fatalf("op %d: %s matched %d, truth %d", op, g.Replica, g.Blocks, d)
					}
					if g.Blocks < d {
						shorter++
					}
				}
			}
			s := ix.Stats()
			if s.Evicted == 0 || shorter == 0 {
				t.Fatalf("budget never bit: %+v, %d shorter matches", s, shorter)
			}
			checkInvariants(t, ix)
		})
	}
}

// TestBudgetPeak: under a budget large enough for the index's growth steps
// to be small beside it (an eighth at most), the bytes the index holds
// never pass the budget, inside writer steps included: tables and the arena
// grow only into room that eviction made first.
func TestBudgetPeak(t *testing.T) {
	t.Run("heap", func(t *testing.T) { testBudgetPeak(t, false) })
	// Under this small budget the index keeps its slot arrays on the heap
	// (slabMinBudget); forcing them off it checks the mapped path under
	// eviction and compaction.
	t.Run("off-heap", func(t *testing.T) { testBudgetPeak(t, true) })
}

func testBudgetPeak(t *testing.T, offHeap bool) {
	const budget = 512 << 10
	w := newWorkload(22, 12, 3000, 60, 2)
	w.maxRun, w.storePct, w.removePct, w.evicting = 60, 90, 9, true
	ix := New(Config{MaxBytes: budget})
	if ix.env.slab != nil {
		t.Fatal("a 512 KiB budget got a slab")
	}
	mapped := false
	if offHeap {
		ix.env.slab = newSlab(ix)
	}
	m := newModel()
	var most int64
	for op := range 20000 {
		w.step(t, ix, m)
		most = max(most, ix.totalBytes())
		if p := ix.env.maxPeak + ix.totalBytes() - ix.env.bytes; p > budget {
			t.Fatalf("op %d: peaked at %d bytes, over a budget of %d (largest step %d)", op, p, budget, ix.step)
		}
		if op%100 == 0 && ix.env.slab != nil && ix.env.slab.mapped > 0 {
			mapped = true
			checkInvariants(t, ix)
		}
	}
	if offHeap != mapped {
		t.Fatalf("off-heap %v, but slot arrays mapped: %v", offHeap, mapped)
	}
	// The index filled to near its budget before evicting: the bytes it
	// held at its fullest, not at the last op, which may follow a
	// compaction (390,028 of 524,288 bytes were seen there once).
	if s := ix.Stats(); s.Evicted == 0 || most < budget*3/4 {
		t.Fatalf("budget never bit: %+v, at most %d bytes held", s, most)
	}
	checkInvariants(t, ix)
}

// TestEvictionKeepsRecent: keys matched since the eviction hand last passed
// survive a wave of new stores that push the index over budget.
func TestEvictionKeepsRecent(t *testing.T) {
	root := kvblock.Root("m", "")
	r := rand.New(rand.NewPCG(9, 9))
	ix := New(Config{MaxBytes: 100 << 10})
	hot := storeChain(t, ix, "a", root, tokens(r, 64*4), 4, TierGPU)
	var cold [][]kvblock.Key
	for range 8 {
		cold = append(cold, storeChain(t, ix, "a", root, tokens(r, 64*4), 4, TierGPU))
	}
	for round := range 60 {
		ix.Match(hot, nil)
		storeChain(t, ix, "a", root, tokens(r, 64*4), 4, TierGPU)
		if round == 59 && ix.Stats().Evicted == 0 {
			t.Fatal("nothing was evicted")
		}
	}
	if d := depthOf(ix.Match(hot, nil), "a"); d != 64 {
		t.Fatalf("hot chain kept %d of 64 blocks", d)
	}
	lost := 0
	for _, c := range cold {
		lost += 64 - depthOf(ix.Match(c, nil), "a")
	}
	if lost == 0 {
		t.Fatal("no cold block was evicted")
	}
}

// TestConcurrent runs matchers against writers. A pinned replica's chain is
// never touched, so every concurrent match must report it whole; at the end
// the index equals the model fed the same per-replica event sequences.
func TestConcurrent(t *testing.T) {
	root := kvblock.Root("m", "")
	pinned := tokens(rand.New(rand.NewPCG(10, 10)), 300*4)
	ix := New(Config{})
	pinnedKeys := storeChain(t, ix, "pinned", root, pinned, 4, TierGPU)
	const writers = 4
	streams := make([][]func(*Index, *model), writers)
	var ws []*workload
	for wi := range writers {
		w := newWorkload(uint64(100+wi), 3, 20, 300, 4)
		for i := range w.replicas {
			w.replicas[i] = ReplicaID(fmt.Sprintf("w%d-%s", wi, w.replicas[i]))
		}
		ws = append(ws, w)
	}
	// Generate each writer's ops against a private model first.
	for wi, w := range ws {
		pm := newModel()
		for range 1500 {
			var op func(*Index, *model)
			switch p := w.r.IntN(100); {
			case p < 65:
				ev := w.stored()
				op = func(ix *Index, m *model) {
					if ix != nil {
						ix.Stored(ev)
					}
					if m != nil {
						m.stored(ev)
					}
				}
			case p < 98:
				ev := w.removed(pm)
				op = func(ix *Index, m *model) {
					if ix != nil {
						ix.Removed(ev)
					}
					if m != nil {
						m.removed(ev)
					}
				}
			default:
				r := w.replicas[w.r.IntN(len(w.replicas))]
				op = func(ix *Index, m *model) {
					if ix != nil {
						ix.Cleared(r)
					}
					if m != nil {
						m.cleared(r)
					}
				}
			}
			op(nil, pm)
			streams[wi] = append(streams[wi], op)
		}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan string, 16)
	for wi := range writers {
		wg.Go(func() {
			for _, op := range streams[wi] {
				op(ix, nil)
			}
		})
	}
	var mg sync.WaitGroup
	for mi := range 3 {
		mg.Go(func() {
			var dst []ReplicaMatch
			q := append(slices.Clone(pinnedKeys), ws[mi].convs[0].keys...)
			for n := 0; ; n++ {
				select {
				case <-done:
					if n >= 20 {
						return
					}
				default:
				}
				dst = ix.Match(q, dst[:0])
				if d := depthOf(dst, "pinned"); d != len(pinnedKeys) {
					select {
					case errs <- fmt.Sprintf("pinned matched %d, want %d", d, len(pinnedKeys)):
					default:
					}
					return
				}
				_ = ix.Stats()
				runtime.Gosched() // let the writers run on a small machine
			}
		})
	}
	wg.Wait()
	close(done)
	mg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	m := newModel()
	m.stored(Stored{Replica: "pinned", Root: root, Tokens: pinned, BlockSize: 4, Hashes: func() []uint64 {
		hs := make([]uint64, len(pinnedKeys))
		for i, k := range pinnedKeys {
			hs[i] = engineHash("pinned", k, 0)
		}
		return hs
	}()})
	for wi := range writers {
		for _, op := range streams[wi] {
			op(nil, m)
		}
	}
	for _, w := range ws {
		for _, c := range w.convs {
			checkMatch(t, ix, m, c.keys, 0)
		}
	}
	checkStats(t, ix, m, 0)
	checkInvariants(t, ix)
}

// TestArenaChunks allocates millions of small holder records: chunks stay
// full-sized and the offsets stay distinct.
func TestArenaChunks(t *testing.T) {
	var e env
	a := arena{env: &e}
	const n = 1 << 21
	seen := make(map[uint32]bool, n)
	for range n {
		off, ok := a.alloc(2)
		if !ok || seen[off] {
			t.Fatalf("alloc: %d ok=%v dup=%v", off, ok, seen[off])
		}
		seen[off] = true
	}
	words := n * (recHdr + 2)
	if maxChunks := words/chunkWords + chunkShift; len(a.chunks) > maxChunks {
		t.Fatalf("%d chunks for %d words", len(a.chunks), words)
	}
	if e.bytes < int64(words)*8 || e.bytes > int64(words)*8+2*chunkWords*8 {
		t.Fatalf("arena accounts %d bytes for %d words", e.bytes, words)
	}
}

// TestHoldersInlineSpill drives one key's holder set through hold and
// unhold against a map: slots past what fits inline, counts past 7, more
// than two holders. After every step the holders match the map, the key is
// spilled exactly when its holders do not fit inline, and records are
// released when the set empties.
func TestHoldersInlineSpill(t *testing.T) {
	var e env
	a := arena{env: &e}
	r := rand.New(rand.NewPCG(16, 16))
	slots := []uint32{0, 1, 7, 1<<inSlotBits - 1, 1 << inSlotBits, 1<<slotBits - 1}
	want := map[uint32][NumTiers]uint64{}
	var ks slot
	spills, unspills := 0, 0
	for op := range 20000 {
		s := slots[r.IntN(len(slots))]
		tr := Tier(r.IntN(int(NumTiers)))
		wasSpilled := ks.v&spillBit != 0
		c := want[s]
		if r.IntN(10) < 6-len(want) || len(want) == 0 {
			var isNew bool
			if len(want) == 0 {
				w := hInc(uint64(s), tr)
				if !a.set(&ks, []uint64{w}, refBit) {
					t.Fatal("arena full")
				}
				isNew = true
			} else {
				isNew = a.hold(&ks, s, tr)
			}
			if isNew != (c == [NumTiers]uint64{}) {
				t.Fatalf("op %d: hold reported new=%v", op, isNew)
			}
			c[tr]++
			want[s] = c
		} else {
			if len(want) == 0 {
				continue
			}
			_, heldBefore := want[s]
			gone, empty := a.unhold(&ks, s, tr)
			if c[tr] > 0 {
				c[tr]--
			}
			if c == [NumTiers]uint64{} {
				delete(want, s)
			} else {
				want[s] = c
			}
			if _, held := want[s]; gone != (heldBefore && !held) {
				t.Fatalf("op %d: unhold gone=%v, held before=%v after=%v", op, gone, heldBefore, held)
			}
			if empty != (len(want) == 0) {
				t.Fatalf("op %d: unhold empty=%v with %d holders left", op, empty, len(want))
			}
			if empty {
				ks = slot{}
				if a.live != 0 {
					t.Fatalf("op %d: %d arena records live after the key emptied", op, a.live)
				}
				continue
			}
		}
		var buf [2]uint64
		hs := a.holders(ks.v, &buf)
		if len(hs) != len(want) {
			t.Fatalf("op %d: %d holders, want %d", op, len(hs), len(want))
		}
		for i, w := range hs {
			if i > 0 && hSlot(hs[i-1]) >= hSlot(w) {
				t.Fatalf("op %d: holders not sorted", op)
			}
			c := want[hSlot(w)]
			for tr := range NumTiers {
				if hCount(w, tr) != c[tr] {
					t.Fatalf("op %d: slot %d tier %d count %d, want %d", op, hSlot(w), tr, hCount(w, tr), c[tr])
				}
			}
		}
		_, fits := inline(hs)
		spilled := ks.v&spillBit != 0
		if spilled == fits {
			t.Fatalf("op %d: spilled=%v for holders that fit=%v", op, spilled, fits)
		}
		if spilled && !wasSpilled {
			spills++
		}
		if !spilled && wasSpilled {
			unspills++
		}
	}
	if spills == 0 || unspills == 0 {
		t.Fatalf("spilled %d times, back inline %d times", spills, unspills)
	}
}

// checkSlab: every mapped slot array is in a table or the pool, once, and
// the slab's total is theirs (nothing mapped is lost or counted twice).
func checkSlab(t testing.TB, ix *Index) {
	t.Helper()
	sl := ix.env.slab
	if sl == nil {
		return
	}
	seen := map[unsafe.Pointer]bool{}
	var mapped int64
	note := func(s []slot) {
		p := unsafe.Pointer(unsafe.SliceData(s))
		size, ok := sl.live[p]
		if !ok {
			return
		}
		if seen[p] {
			t.Fatalf("mapped array %p used twice", p)
		}
		if size != len(s)*slotBytes {
			t.Fatalf("mapped array of %d bytes used as %d slots", size, len(s))
		}
		seen[p] = true
		mapped += int64(size)
	}
	tabs := []*xtab{&ix.keys}
	for _, rs := range ix.bySlot {
		if rs != nil {
			tabs = append(tabs, &rs.eng)
		}
	}
	for _, tab := range tabs {
		for di, sb := range tab.subs {
			if di&(1<<(tab.gd-sb.ld)-1) == 0 {
				note(sb.s)
			}
		}
	}
	for _, l := range ix.env.pool {
		for _, s := range l {
			note(s)
		}
	}
	if mapped != sl.mapped || len(seen) != len(sl.live) {
		t.Fatalf("slab maps %d arrays (%d bytes); tables and pool use %d (%d bytes)", len(sl.live), sl.mapped, len(seen), mapped)
	}
}
