package index

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// model is the brute-force reference: per replica, engine hash -> (router
// key, tiers). Matching scans each replica independently, as the seed's
// brute_force_matched does.
type model struct {
	eng map[ReplicaID]map[uint64]modelEntry
}

type modelEntry struct {
	key   kvblock.Key
	tiers uint8
}

func newModel() *model { return &model{eng: map[ReplicaID]map[uint64]modelEntry{}} }

// keysOf computes the router keys of a stored event the way the index must:
// block i of an event with a parent is never chain position 0, so the cache
// salt never applies to it.
func keysOf(parent kvblock.Key, ev Stored) []kvblock.Key {
	out := make([]kvblock.Key, len(ev.Hashes))
	o := ev.Extras
	if ev.HasParent {
		o.CacheSalt = ""
	}
	for i := range ev.Hashes {
		parent = kvblock.Chain(parent, ev.Tokens[i*ev.BlockSize:(i+1)*ev.BlockSize], o.Extra(i))
		out[i] = parent
	}
	return out
}

func (m *model) stored(ev Stored) StoreResult {
	if ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
		return StoreResult{BadShape: true}
	}
	rs := m.eng[ev.Replica]
	parent := ev.Root
	if ev.HasParent {
		pe, ok := rs[ev.ParentHash]
		if !ok {
			// The blocks' keys are unknown: older mappings of their
			// hashes are forgotten.
			for _, h := range ev.Hashes {
				delete(rs, h)
			}
			return StoreResult{UnknownParent: true}
		}
		parent = pe.key
	}
	if rs == nil {
		rs = map[uint64]modelEntry{}
		m.eng[ev.Replica] = rs
	}
	for i, k := range keysOf(parent, ev) {
		h := ev.Hashes[i]
		e, had := rs[h]
		if had && e.key != k {
			e = modelEntry{}
		}
		e.key = k
		e.tiers |= 1 << ev.Tier
		rs[h] = e
	}
	return StoreResult{Blocks: len(ev.Hashes)}
}

func (m *model) removed(ev Removed) int {
	rs := m.eng[ev.Replica]
	n := 0
	for _, h := range ev.Hashes {
		e, ok := rs[h]
		if !ok || e.tiers&(1<<ev.Tier) == 0 {
			continue
		}
		e.tiers &^= 1 << ev.Tier
		if e.tiers == 0 {
			delete(rs, h)
		} else {
			rs[h] = e
		}
		n++
	}
	return n
}

func (m *model) cleared(r ReplicaID) { delete(m.eng, r) }

// match is brute_force_matched: per replica, count the leading keys it holds
// in any tier; each matched block is counted under the best tier holding it.
func (m *model) match(keys []kvblock.Key) []ReplicaMatch {
	var out []ReplicaMatch
	for r, rs := range m.eng {
		held := map[kvblock.Key]uint8{}
		for _, e := range rs {
			held[e.key] |= e.tiers
		}
		rm := ReplicaMatch{Replica: r}
		for _, k := range keys {
			tiers := held[k]
			if tiers == 0 {
				break
			}
			rm.Blocks++
			for t := range NumTiers {
				if tiers&(1<<t) != 0 {
					rm.ByTier[t]++
					break
				}
			}
		}
		if rm.Blocks > 0 {
			out = append(out, rm)
		}
	}
	return sortMatches(out)
}

// holders counts (key, replica) pairs, the unit of Stats.Holders.
func (m *model) holders() (keys, holders, engine int) {
	all := map[kvblock.Key]bool{}
	for _, rs := range m.eng {
		per := map[kvblock.Key]bool{}
		for _, e := range rs {
			per[e.key] = true
			all[e.key] = true
			engine++
		}
		holders += len(per)
	}
	return len(all), holders, engine
}

func sortMatches(ms []ReplicaMatch) []ReplicaMatch {
	slices.SortFunc(ms, func(a, b ReplicaMatch) int { return cmp.Compare(a.Replica, b.Replica) })
	return ms
}

func fmtMatches(ms []ReplicaMatch) string {
	s := ""
	for _, m := range ms {
		s += fmt.Sprintf("%s:%d%v ", m.Replica, m.Blocks, m.ByTier)
	}
	return s
}

// workload generates random but structured event sequences: conversations
// share prefixes, stores extend earlier chains through parent hashes, the
// engine hash of a block is a function of (replica, key) as in a real engine,
// with occasional second hashes for one key (hybrid groups) and reused hashes.
type workload struct {
	r        *rand.Rand
	replicas []ReplicaID
	roots    []kvblock.Key
	convs    []conv
	bs       int
	// maxRun is the longest stored event; storePct and removePct set the
	// operation mix (the rest are clears).
	maxRun, storePct, removePct int
	// evicting: the index may have evicted, so its direct results may fall
	// short of the model's (unknown parents, fewer removals).
	evicting bool
	// groups, when set, draws every block's engine hash group from
	// 0..groups-1: one replica then maps many engine hashes to one key on
	// one tier, which takes holder counts past what fits inline.
	groups int
}

type conv struct {
	root   kvblock.Key
	salt   string
	tokens []uint32
	keys   []kvblock.Key
}

func newWorkload(seed uint64, nReplicas, nConvs, maxBlocks, bs int) *workload {
	w := &workload{r: rand.New(rand.NewPCG(seed, 7)), bs: bs, maxRun: 6, storePct: 60, removePct: 37}
	for i := range nReplicas {
		w.replicas = append(w.replicas, ReplicaID(fmt.Sprintf("r%02d", i)))
	}
	w.roots = []kvblock.Key{kvblock.Root("m", ""), kvblock.Root("m", "lora")}
	shared := make([]uint32, 3*w.bs)
	for i := range shared {
		shared[i] = uint32(w.r.IntN(1000))
	}
	for range nConvs {
		var toks []uint32
		if w.r.IntN(3) > 0 {
			toks = append(toks, shared[:w.bs*(1+w.r.IntN(3))]...)
		}
		for len(toks) < maxBlocks*w.bs {
			toks = append(toks, uint32(w.r.IntN(4)))
		}
		c := conv{root: w.roots[w.r.IntN(len(w.roots))], tokens: toks}
		if w.r.IntN(5) == 0 {
			c.salt = "tenant"
		}
		c.keys = kvblock.Keys(nil, c.root, toks, w.bs, kvblock.Options{CacheSalt: c.salt})
		w.convs = append(w.convs, c)
	}
	return w
}

// engineHash is what replica r's engine calls block key k (group g).
func engineHash(r ReplicaID, k kvblock.Key, g int) uint64 {
	h := uint64(k) ^ uint64(g)*0x9e3779b97f4a7c15
	for _, c := range []byte(r) {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	return h
}

func (w *workload) tier() Tier {
	switch w.r.IntN(5) {
	case 0:
		return TierCPU
	case 1:
		return TierDisk
	}
	return TierGPU
}

func (w *workload) stored() Stored {
	c := w.convs[w.r.IntN(len(w.convs))]
	n := len(c.keys)
	start := 0
	if w.r.IntN(2) == 0 {
		start = w.r.IntN(n)
	}
	end := min(n, start+1+w.r.IntN(w.maxRun))
	ev := Stored{
		Replica:   w.replicas[w.r.IntN(len(w.replicas))],
		Root:      c.root,
		Tokens:    c.tokens[start*w.bs : end*w.bs],
		BlockSize: w.bs,
		Tier:      w.tier(),
		Extras:    kvblock.Options{CacheSalt: c.salt},
	}
	if start > 0 {
		ev.HasParent = true
		ev.ParentHash = engineHash(ev.Replica, c.keys[start-1], 0)
		if w.r.IntN(20) == 0 {
			ev.ParentHash = engineHash(ev.Replica, c.keys[start-1], 1)
		}
	}
	for i := start; i < end; i++ {
		g := 0
		switch w.r.IntN(40) {
		case 0:
			g = 1 // a second engine hash for the same key
		case 1:
			g = 2
		}
		if w.groups > 0 {
			g = w.r.IntN(w.groups)
		}
		h := engineHash(ev.Replica, c.keys[i], g)
		if w.r.IntN(200) == 0 {
			// The engine reuses a hash for other content.
			h = engineHash(ev.Replica, w.convs[w.r.IntN(len(w.convs))].keys[0], 0)
		}
		ev.Hashes = append(ev.Hashes, h)
	}
	return ev
}

func (w *workload) removed(m *model) Removed {
	ev := Removed{Replica: w.replicas[w.r.IntN(len(w.replicas))], Tier: w.tier()}
	rs := m.eng[ev.Replica]
	hs := make([]uint64, 0, len(rs))
	for h := range rs {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	for range 1 + w.r.IntN(4) {
		if len(hs) == 0 || w.r.IntN(8) == 0 {
			ev.Hashes = append(ev.Hashes, w.r.Uint64()) // unknown
			continue
		}
		h := hs[w.r.IntN(len(hs))]
		if w.r.IntN(2) == 0 {
			ev.Tier = Tier(bitsLow(rs[h].tiers))
		}
		ev.Hashes = append(ev.Hashes, h)
	}
	return ev
}

func bitsLow(t uint8) int {
	for i := range 8 {
		if t&(1<<i) != 0 {
			return i
		}
	}
	return 0
}

// query returns a query chain: a conversation's keys, sometimes cut short or
// diverging part-way.
func (w *workload) query() []kvblock.Key {
	c := w.convs[w.r.IntN(len(w.convs))]
	keys := slices.Clone(c.keys)
	if w.r.IntN(4) == 0 {
		keys = keys[:w.r.IntN(len(keys)+1)]
	}
	if len(keys) > 0 && w.r.IntN(6) == 0 {
		keys[w.r.IntN(len(keys))] = kvblock.Key(w.r.Uint64())
	}
	return keys
}

// step applies one random operation to both the index and the model and
// checks their direct results.
func (w *workload) step(t testing.TB, ix *Index, m *model) string {
	t.Helper()
	switch p := w.r.IntN(100); {
	case p < w.storePct:
		ev := w.stored()
		got, want := ix.Stored(ev), m.stored(ev)
		if got != want && !(w.evicting && got.UnknownParent) {
			t.Fatalf("stored %+v: got %+v, want %+v", ev, got, want)
		}
		return "stored"
	case p < w.storePct+w.removePct:
		ev := w.removed(m)
		if got, want := ix.Removed(ev), m.removed(ev); got != want && !(w.evicting && got < want) {
			t.Fatalf("removed %+v: got %d, want %d", ev, got, want)
		}
		return "removed"
	default:
		r := w.replicas[w.r.IntN(len(w.replicas))]
		ix.Cleared(r)
		m.cleared(r)
		return "cleared"
	}
}

// checkMatch compares one match with the model and returns the matched
// blocks summed over replicas.
func checkMatch(t testing.TB, ix *Index, m *model, keys []kvblock.Key, op int) int {
	t.Helper()
	got := sortMatches(ix.Match(keys, nil))
	want := m.match(keys)
	if !slices.Equal(got, want) {
		t.Fatalf("op %d: match of %d keys:\n got  %s\n want %s", op, len(keys), fmtMatches(got), fmtMatches(want))
	}
	n := 0
	for _, g := range got {
		n += g.Blocks
	}
	return n
}

func checkStats(t testing.TB, ix *Index, m *model, op int) {
	t.Helper()
	keys, holders, engine := m.holders()
	s := ix.Stats()
	if s.Keys != keys || s.Holders != holders || s.Engine != engine {
		t.Fatalf("op %d: stats keys/holders/engine = %d/%d/%d, model %d/%d/%d", op, s.Keys, s.Holders, s.Engine, keys, holders, engine)
	}
}

// TestOracle drives random event sequences through the index and the
// brute-force model and compares every match.
func TestOracle(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		seed                    uint64
		replicas, convs, blocks int
		ops                     int
		groups                  int
	}{
		{"small-dense", 1, 8, 12, 10, 12000, 0},
		{"many-convs", 2, 10, 60, 24, 12000, 0},
		{"many-replicas", 3, 40, 30, 16, 12000, 0},
		// Counts past 7 spill inline holders to arena records and back.
		{"many-groups", 4, 6, 8, 10, 12000, 12},
		// Every slot array mapped off the Go heap (offheapMin lowered).
		{"off-heap", 5, 10, 60, 24, 12000, 0},
		// Slots past 64: matches whose first block such a replica holds
		// take the list path (matchWide), the others the bitmask path.
		{"wide", 6, 90, 40, 16, 12000, 0},
		// Every match through the list path (smallSlots lowered).
		{"list-path", 7, 10, 60, 24, 12000, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorkload(tc.seed, tc.replicas, tc.convs, tc.blocks, 4)
			w.groups = tc.groups
			if tc.name == "off-heap" {
				defer func(m int) { offheapMin = m }(offheapMin)
				offheapMin = 0
			}
			if tc.name == "list-path" {
				defer func(s uint32) { smallSlots = s }(smallSlots)
				smallSlots = 0
			}
			ix := New(Config{})
			m := newModel()
			counts := map[string]int{}
			for op := range tc.ops {
				counts[w.step(t, ix, m)]++
				if op%5 == 4 {
					for range 3 {
						if checkMatch(t, ix, m, w.query(), op) > 1 {
							counts["deep matches"]++
						}
					}
				}
				if op%500 == 499 {
					checkStats(t, ix, m, op)
					checkInvariants(t, ix)
					counts["spilled keys"] += spilledKeys(ix)
					if ix.env.slab.mapped > 0 {
						counts["off-heap checks"]++
					}
				}
			}
			for _, c := range w.convs {
				checkMatch(t, ix, m, c.keys, tc.ops)
			}
			checkStats(t, ix, m, tc.ops)
			if counts["stored"] < tc.ops/2 || counts["removed"] < tc.ops/4 || counts["cleared"] == 0 || counts["deep matches"] < tc.ops/10 || tc.groups > 0 && counts["spilled keys"] == 0 || tc.name == "off-heap" && counts["off-heap checks"] == 0 {
				t.Fatalf("workload mix is off: %v", counts)
			}
		})
	}
}

// spilledKeys counts the keys whose holders are in arena records.
func spilledKeys(ix *Index) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := 0
	for di, sb := range ix.keys.subs {
		if di&(1<<(ix.keys.gd-sb.ld)-1) != 0 {
			continue
		}
		for _, ks := range sb.s {
			if ks.v&spillBit != 0 {
				n++
			}
		}
	}
	return n
}
