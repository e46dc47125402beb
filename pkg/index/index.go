package index

import (
	"math/bits"
	"slices"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// chunkBlocks is how many blocks a writer applies per lock hold. A matcher
// waits at most for one chunk (plus, rarely, one bounded sub-table rebuild).
const chunkBlocks = 32

// stepPrior is what the index assumes one writer chunk may grow by until it
// has seen more: a split of a full key and engine sub-table, with a
// directory doubling.
const stepPrior = 128 << 10

// replicaBytes estimates a replica's fixed cost besides its engine table:
// the replica struct, the id-map entry and the slot-table entry.
const replicaBytes = 160

// Index is the router's prefix index. It is safe for concurrent use by many
// matchers and writers.
type Index struct {
	cfg Config

	mu       sync.RWMutex
	env      env
	keys     xtab // router key -> holder word
	arena    arena
	byID     map[ReplicaID]*replica
	bySlot   []*replica // nil: free slot
	freeSlot []uint32
	holders  int
	engine   int
	hand     hand
	// step is the most the index's bytes have grown within one writer
	// chunk: under a budget, writers evict to leave that much room.
	step int64

	unknownParent int64
	badShape      int64
	evicted       int64
	noSlot        int64
}

type replica struct {
	id   ReplicaID
	slot uint32
	eng  xtab // engine hash (top 3 bits: tiers) -> router key
}

// New returns an empty index. It starts no goroutine.
func New(cfg Config) *Index {
	ix := &Index{cfg: cfg, byID: make(map[ReplicaID]*replica)}
	ix.env.budget = cfg.MaxBytes
	if cfg.MaxBytes == 0 || cfg.MaxBytes >= slabMinBudget {
		ix.env.slab = newSlab(ix)
	}
	ix.step = stepPrior
	ix.keys = newXtab(keyKind, &ix.env)
	ix.arena.env = &ix.env
	return ix
}

// replicaFor returns r's state, creating it when create is set. Slots of
// cleared replicas are reused.
func (ix *Index) replicaFor(r ReplicaID, create bool) *replica {
	rs := ix.byID[r]
	if rs != nil || !create {
		return rs
	}
	var s uint32
	if n := len(ix.freeSlot); n > 0 {
		s = ix.freeSlot[n-1]
		ix.freeSlot = ix.freeSlot[:n-1]
	} else {
		if len(ix.bySlot) >= maxSlots {
			return nil
		}
		s = uint32(len(ix.bySlot))
		ix.bySlot = append(ix.bySlot, nil)
	}
	rs = &replica{id: ReplicaID(strings.Clone(string(r))), slot: s, eng: newXtab(engKind, &ix.env)}
	ix.bySlot[s] = rs
	ix.byID[rs.id] = rs
	ix.env.bytes += replicaBytes + int64(len(r))
	return rs
}

// releaseReplica forgets an empty replica and frees its slot. No key holds
// the slot any more: every holder count comes from one of its engine entries.
func (ix *Index) releaseReplica(rs *replica) {
	rs.eng.release()
	delete(ix.byID, rs.id)
	ix.bySlot[rs.slot] = nil
	ix.freeSlot = append(ix.freeSlot, rs.slot)
	ix.env.bytes -= replicaBytes + int64(len(rs.id))
}

func (ix *Index) updatePressure() {
	ix.env.pressure = ix.cfg.MaxBytes > 0 && ix.env.bytes*20 >= ix.cfg.MaxBytes*19
}

// Stored applies a BlockStored event. Its blocks are applied in chunks of
// chunkBlocks, each under one hold of the write lock.
func (ix *Index) Stored(ev Stored) StoreResult {
	if ev.BlockSize <= 0 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
		ix.mu.Lock()
		ix.badShape++
		ix.mu.Unlock()
		return StoreResult{BadShape: true}
	}
	parent := ev.Root
	ix.mu.Lock()
	if ev.HasParent {
		var pe *slot
		if rs := ix.replicaFor(ev.Replica, false); rs != nil {
			pe = rs.eng.find(ev.ParentHash)
		}
		if pe == nil {
			ix.unknownParent++
			ix.mu.Unlock()
			ix.forget(ev.Replica, ev.Hashes)
			return StoreResult{UnknownParent: true}
		}
		parent = kvblock.Key(pe.v)
	}
	ix.mu.Unlock()

	// Block i of the event sits at chain position offset+i; only position 0
	// carries the salt, and an event with a parent never starts at block 0.
	opts := ev.Extras
	if ev.HasParent {
		opts.CacheSalt = ""
	}
	plain := opts.CacheSalt == "" && len(opts.Extras) == 0
	var keys [chunkBlocks]kvblock.Key
	for start := 0; start < len(ev.Hashes); start += chunkBlocks {
		end := min(start+chunkBlocks, len(ev.Hashes))
		for i := start; i < end; i++ {
			blk := ev.Tokens[i*ev.BlockSize : (i+1)*ev.BlockSize]
			if plain {
				parent = kvblock.Chain(parent, blk, nil)
			} else {
				parent = kvblock.Chain(parent, blk, opts.Extra(i))
			}
			keys[i-start] = parent
		}
		if ix.cfg.MaxBytes > 0 {
			// Make room for this chunk's growth first, so that the
			// index stays within its budget at its peak too.
			ix.enforceBudget()
		}
		ix.mu.Lock()
		rs := ix.replicaFor(ev.Replica, true)
		if rs == nil {
			ix.noSlot++
			ix.mu.Unlock()
			return StoreResult{Blocks: start, NoSlot: true}
		}
		before := ix.env.bytes
		ix.env.peak = before
		// Each hash is mixed once: for the prefetch, the find and the insert.
		var eh, kh [chunkBlocks]uint64
		for i := start; i < end; i++ {
			eh[i-start] = mix(ev.Hashes[i] & engKind.cmp)
			kh[i-start] = mix(uint64(keys[i-start]))
			rs.eng.prefetchHashed(eh[i-start])
			ix.keys.prefetchHashed(kh[i-start])
		}
		for i := start; i < end; i++ {
			ix.storeBlock(rs, ev.Hashes[i], keys[i-start], ev.Tier, eh[i-start], kh[i-start])
		}
		ix.step = max(ix.step, ix.env.peak-before)
		ix.updatePressure()
		ix.mu.Unlock()
	}
	return StoreResult{Blocks: len(ev.Hashes)}
}

// Prefetch starts loading the engine entries of replica r for hashes: a
// writer about to apply a batch of events calls it with the engine hashes
// the batch will look up first (stored events' parents and blocks), so that
// their cache misses overlap instead of following one another. It is only a
// hint: the index is left as it was, and an unknown replica or hash costs
// a probe.
func (ix *Index) Prefetch(r ReplicaID, hashes []uint64) {
	ix.mu.RLock()
	if rs := ix.byID[r]; rs != nil {
		for _, h := range hashes {
			rs.eng.prefetchDir(mix(h & engKind.cmp))
		}
	}
	ix.mu.RUnlock()
}

// storeBlock applies one stored block: engine hash h (mixed: eh) whose
// router key is k (mixed: kh).
func (ix *Index) storeBlock(rs *replica, h uint64, k kvblock.Key, t Tier, eh, kh uint64) {
	bit := uint64(1) << (61 + uint(t))
	es := rs.eng.findHashed(h&engKind.cmp, eh)
	if es != nil && kvblock.Key(es.v) != k {
		// The engine reused a hash for other content: drop the old mapping.
		ix.dropEngine(rs, es)
		es = nil
	}
	ks := ix.keys.findHashed(uint64(k), kh)
	if es != nil && es.k&bit != 0 {
		// Already stored on this tier. Repair the holder if eviction
		// dropped the key meanwhile.
		if ks != nil && ix.arena.holdsSlot(ks.v, rs.slot) {
			ks.v |= refBit
			return
		}
	} else if es != nil {
		es.k |= bit
	} else {
		rs.eng.insertHashed(h&^tierMaskK|bit, uint64(k), eh)
		ix.engine++
	}
	if ks == nil {
		w := hInc(uint64(rs.slot), t)
		if v, ok := inline([]uint64{w}); ok {
			ix.keys.insertHashed(uint64(k), v|refBit, kh)
		} else if !ix.arena.set(ix.keys.insert(uint64(k), refBit), []uint64{w}, refBit) {
			// The arena is full: the key is not recorded.
			ix.keys.remove(ix.keys.find(uint64(k)), false)
			return
		}
		ix.holders++
		return
	}
	if ix.arena.hold(ks, rs.slot, t) {
		ix.holders++
	}
}

// forget drops the replica's mappings of hashes, every tier. It applies to
// the blocks of a stored event whose parent is unknown: their keys cannot be
// computed, so an older mapping of the same hashes can no longer be trusted.
func (ix *Index) forget(r ReplicaID, hashes []uint64) {
	for start := 0; start < len(hashes); start += chunkBlocks {
		ix.mu.Lock()
		rs := ix.replicaFor(r, false)
		if rs == nil {
			ix.mu.Unlock()
			return
		}
		for _, h := range hashes[start:min(start+chunkBlocks, len(hashes))] {
			if es := rs.eng.find(h); es != nil {
				ix.dropEngine(rs, es)
			}
		}
		ix.mu.Unlock()
	}
}

// dropEngine removes every tier of one engine entry.
func (ix *Index) dropEngine(rs *replica, es *slot) {
	k, tiers := es.v, es.k>>61
	rs.eng.remove(es, false)
	ix.engine--
	for t := range NumTiers {
		if tiers&(1<<t) != 0 {
			ix.unhold(rs.slot, k, t)
		}
	}
}

func (ix *Index) unhold(s uint32, k uint64, t Tier) {
	ks := ix.keys.find(k)
	if ks == nil {
		return
	}
	gone, empty := ix.arena.unhold(ks, s, t)
	if gone {
		ix.holders--
	}
	if empty {
		ix.keys.remove(ks, false)
	}
}

// Removed applies a BlockRemoved event. Unknown hashes, and hashes not stored
// on the event's tier, are ignored.
func (ix *Index) Removed(ev Removed) (removed int) {
	bit := uint64(1) << (61 + uint(ev.Tier))
	for start := 0; start < len(ev.Hashes); start += chunkBlocks {
		end := min(start+chunkBlocks, len(ev.Hashes))
		ix.mu.Lock()
		rs := ix.replicaFor(ev.Replica, false)
		if rs == nil {
			ix.mu.Unlock()
			return removed
		}
		var eh [chunkBlocks]uint64
		for i, h := range ev.Hashes[start:end] {
			eh[i] = mix(h & engKind.cmp)
			rs.eng.prefetchHashed(eh[i])
		}
		for i, h := range ev.Hashes[start:end] {
			if es := rs.eng.findHashed(h&engKind.cmp, eh[i]); es != nil {
				ix.keys.prefetch(es.v)
			}
		}
		for i, h := range ev.Hashes[start:end] {
			es := rs.eng.findHashed(h&engKind.cmp, eh[i])
			if es == nil || es.k&bit == 0 {
				continue
			}
			k := es.v
			if es.k&tierMaskK == bit {
				rs.eng.remove(es, false)
				ix.engine--
			} else {
				es.k &^= bit
			}
			ix.unhold(rs.slot, k, ev.Tier)
			removed++
		}
		ix.updatePressure()
		ix.mu.Unlock()
	}
	return removed
}

// Cleared forgets everything the replica holds (AllBlocksCleared, a restart,
// a resync, or the replica leaving the set). The replica's engine table is
// detached at once; its keys are released in chunks. A replica left with no
// entries gives its slot back.
func (ix *Index) Cleared(r ReplicaID) {
	ix.mu.Lock()
	rs := ix.replicaFor(r, false)
	if rs == nil {
		ix.mu.Unlock()
		return
	}
	old := rs.eng
	rs.eng = newXtab(engKind, &ix.env)
	ix.engine -= old.n
	ix.mu.Unlock()

	work := 0
	ix.mu.Lock()
	for di, sb := range old.subs {
		if di&(1<<(old.gd-sb.ld)-1) != 0 {
			continue
		}
		for i := range sb.s {
			s := &sb.s[i]
			if !old.occupied(s, s.v) {
				continue
			}
			for t := range NumTiers {
				if s.k&(1<<(61+uint(t))) != 0 {
					ix.unhold(rs.slot, s.v, t)
				}
			}
			if work++; work%256 == 0 {
				ix.updatePressure()
				ix.mu.Unlock()
				ix.mu.Lock()
			}
		}
	}
	old.release()
	if ix.byID[r] == rs && rs.eng.n == 0 {
		ix.releaseReplica(rs)
	}
	ix.updatePressure()
	ix.mu.Unlock()
}

// Match returns, appended to dst, every replica whose cache holds at least
// the first block of keys, with its longest matched prefix, in slot order. It
// makes one descent: a replica drops out at its first missing block, and the
// descent stops at the first block nobody still alive holds. It holds the
// read lock for the whole descent, so it sees the index between two writer
// chunks, and allocates nothing when dst has room and either every holder of
// the first block has a slot below 64 or at most 32 replicas hold it.
func (ix *Index) Match(keys []kvblock.Key, dst []ReplicaMatch) []ReplicaMatch {
	if len(keys) == 0 {
		return dst
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var w walk
	w.init(&ix.keys, keys)
	var vs [matchAhead]uint64
	n := w.batch(&vs)
	if n == 0 {
		return dst
	}
	var two [2]uint64
	hs := ix.arena.holders(vs[0], &two)
	if hSlot(hs[len(hs)-1]) >= smallSlots {
		return ix.matchWide(&w, &vs, n, hs, dst)
	}
	return ix.matchSmall(&w, &vs, n, hs, dst)
}

// smallSlots bounds the slots Match tracks in a bitmask (matchSmall); a
// variable so that tests can send every match through matchWide.
var smallSlots uint32 = 64

// matchSmall is Match when every holder of the first key (hs, sorted by
// slot) has a slot below 64: the replicas still matching are a bitmask, a
// replica's entry in dst is its rank among the first key's holders, and the
// common step (the one or two replicas left are the key's inline holders,
// on the GPU) is one masked compare of the key word. vs holds the first
// batch's n key words.
func (ix *Index) matchSmall(w *walk, vs *[matchAhead]uint64, n int, hs []uint64, dst []ReplicaMatch) []ReplicaMatch {
	base := len(dst)
	dst = slices.Grow(dst, len(hs))[:base+len(hs)]
	out := dst[base:]
	var first uint64 // the slots holding key 0
	for k, h := range hs {
		first |= 1 << hSlot(h)
		out[k] = ReplicaMatch{Replica: ix.bySlot[hSlot(h)].id}
		if hCount(h, TierGPU) == 0 {
			out[k].ByTier[hBest(h)]++
		}
	}
	alive := first
	fm, fw := fastMask(alive)
	at, b := 0, 1 // key at+b is next
walk:
	for {
		for {
			// Skip the keys that both (or the one) live replicas hold
			// on the GPU.
			if b += sameRun(vs[b:n], fm, fw); b == n {
				break
			}
			if v := vs[b]; v&spillBit != 0 {
				// Held by every live replica, on the GPU: the record's
				// masks say so (the shared-prefix keys).
				if r := ix.arena.rec(uint32(v)); r[recHeld]&alive == alive && r[recLower]&alive == 0 {
					b++
					continue
				}
			}
			if alive = ix.smallStep(vs[b], alive, first, out, at+b); alive == 0 {
				w.touch(b + 1)
				break walk
			}
			fm, fw = fastMask(alive)
			b++
		}
		w.touch(n)
		at += n
		if n < matchAhead {
			break
		}
		n, b = w.batch(vs), 0
	}
	for a := alive; a != 0; a &= a - 1 {
		out[bits.OnesCount64(first&(1<<bits.TrailingZeros64(a)-1))].Blocks = at
	}
	for k := range out {
		m := &out[k]
		m.ByTier[TierGPU] = m.Blocks - m.ByTier[TierCPU] - m.ByTier[TierDisk]
	}
	return dst
}

// sameRun is how many words of vs, from the first, have value fw under
// mask fm.
func sameRun(vs []uint64, fm, fw uint64) int {
	for j, v := range vs {
		if v&fm != fw {
			return j
		}
	}
	return len(vs)
}

// Inline holder bits of the lower tiers' counts, for both inline holders.
const inLowerCnts = (uint64(1)<<(inCntBits*(int(NumTiers)-1)) - 1) << (inSlotBits + inCntBits) * (1 | 1<<inBits)

// fastMask returns the mask and value a key word has when the live
// replicas alive (one or two) are among its inline holders, on the GPU
// only; a mask that nothing matches for other live sets.
func fastMask(alive uint64) (mask, want uint64) {
	switch bits.OnesCount64(alive) {
	case 2:
		lo := uint64(bits.TrailingZeros64(alive))
		hi := uint64(63 - bits.LeadingZeros64(alive))
		return spillBit | inPairSlots | inLowerCnts, lo | hi<<inBits
	case 1:
		// Held by the one replica as the first inline holder (the only
		// check here: as the second, smallStep handles it).
		s := uint64(bits.TrailingZeros64(alive))
		return spillBit | inMask&(inSlotMask|inLowerCnts), s
	}
	return 0, 1
}

const inSlotMask = 1<<inSlotBits - 1

// smallStep applies key i, with key word v, to the live replicas alive:
// those that do not hold it stop at depth i, those that hold it on a lower
// tier count it there. It returns the replicas still alive.
func (ix *Index) smallStep(v, alive, first uint64, out []ReplicaMatch, i int) uint64 {
	var held uint64
	if v&spillBit == 0 {
		for c := v & (1<<(2*inBits) - 1); c != 0; c >>= inBits {
			s := inSlot(c)
			if s >= 64 {
				continue
			}
			held |= 1 << s
			if b := inBest(c); b != TierGPU && alive&(1<<s) != 0 {
				out[bits.OnesCount64(first&(1<<s-1))].ByTier[b]++
			}
		}
	} else {
		// The record's masks: no holder word is read unless a live
		// replica holds the key on a lower tier only.
		r := ix.arena.rec(uint32(v))
		held = r[recHeld]
		for l := r[recLower] & alive; l != 0; l &= l - 1 {
			s := uint32(bits.TrailingZeros64(l))
			hs := r[recHdr : recHdr+uint32(r[0])]
			j, _ := search(hs, s)
			out[bits.OnesCount64(first&(1<<s-1))].ByTier[hBest(hs[j])]++
		}
	}
	for d := alive &^ held; d != 0; d &= d - 1 {
		out[bits.OnesCount64(first&(1<<bits.TrailingZeros64(d)-1))].Blocks = i
	}
	return alive & held
}

// matchWide is Match when a holder of the first key (hs, sorted by slot)
// has a slot of 64 or more: the live replicas are a list in slot order.
func (ix *Index) matchWide(w *walk, vs *[matchAhead]uint64, n int, hs []uint64, dst []ReplicaMatch) []ReplicaMatch {
	type live struct {
		slot   uint32
		at     int32  // index in dst
		blocks int    // matched blocks
		lower  uint64 // of them, best on the CPU tier (low half), on disk (high half)
	}
	var buf [32]live
	alive := buf[:0]
	var two [2]uint64
	for _, w := range hs {
		a := live{slot: hSlot(w), at: int32(len(dst)), blocks: 1, lower: tierInc[hBest(w)*inCntBits]}
		alive = append(alive, a)
		dst = append(dst, ReplicaMatch{Replica: ix.bySlot[hSlot(w)].id})
	}
	// flush writes a replica's counts to its dst entry.
	flush := func(a *live) {
		m := &dst[a.at]
		cpu, disk := int(uint32(a.lower)), int(a.lower>>32)
		m.Blocks = a.blocks
		m.ByTier = [NumTiers]int{a.blocks - cpu - disk, cpu, disk}
	}
	for b := 1; ; b = 0 {
		for j, v := range vs[b:n] {
			kept := 0
			if v&spillBit == 0 {
				// One or two inline holders: keep the live replicas
				// that are one of them.
				c0, c1 := v&inMask, v>>inBits&inMask
				for k := range alive {
					a := &alive[k]
					c := c0
					if inSlot(c0) != a.slot {
						if c1 == 0 || inSlot(c1) != a.slot {
							flush(a)
							continue
						}
						c = c1
					}
					a.blocks++
					a.lower += tierInc[inBestBit(c)]
					if kept != k {
						alive[kept] = *a
					}
					kept++
				}
			} else {
				hs := ix.arena.holders(v, &two)
				j := 0
				for k := range alive {
					a := &alive[k]
					for j < len(hs) && hSlot(hs[j]) < a.slot {
						j++
					}
					if j == len(hs) || hSlot(hs[j]) != a.slot {
						flush(a)
						continue
					}
					a.blocks++
					a.lower += tierInc[hBest(hs[j])*inCntBits]
					if kept != k {
						alive[kept] = *a
					}
					kept++
				}
			}
			alive = alive[:kept]
			if kept == 0 {
				w.touch(b + j + 1)
				return dst
			}
		}
		w.touch(n)
		if n < matchAhead {
			break
		}
		n = w.batch(vs)
	}
	for k := range alive {
		flush(&alive[k])
	}
	return dst
}

// tierInc, indexed by a best tier times 3 (inBestBit), is what a block
// adds to a live replica's lower-tier counts.
var tierInc = [8]uint64{inCntBits * int(TierCPU): 1, inCntBits * int(TierDisk): 1 << 32}

// Stats reports the index's size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := Stats{
		Keys:          ix.keys.n,
		Holders:       ix.holders,
		Engine:        ix.engine,
		Bytes:         ix.totalBytes(),
		Budget:        ix.cfg.MaxBytes,
		Evicted:       ix.evicted,
		UnknownParent: ix.unknownParent,
		BadShape:      ix.badShape,
		NoSlot:        ix.noSlot,
	}
	for _, rs := range ix.bySlot {
		if rs != nil && rs.eng.n > 0 {
			s.Replicas++
		}
	}
	return s
}
