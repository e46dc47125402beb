package bench

import (
	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// applier feeds one published batch of engine events to the index with
// fewer, longer calls and the same resulting index: a removal is held back
// past later stores and applied with its neighbours in one Removed per tier
// (so the index overlaps their memory accesses), unless a later store
// depends on it. A store depends on a held removal when it stores the same
// hash on the same tier (store after remove leaves the block present) or
// names the removed hash as its parent (the removal may have dropped the
// parent, making the store's parent unknown); the held removals are applied
// first then. Everything else commutes: removals and stores of different
// (hash, tier) pairs touch different engine entries and holder counts, and
// a removal of hash h on one tier and a store of h on another leave the
// same entry in either order (the store recomputes h's key from its parent
// either way).
type applier struct {
	idx   *index.Index
	model string
	roots map[string]kvblock.Key
	// held removals, by tier, in event order; heldSet indexes them.
	held    [index.NumTiers][]uint64
	nheld   int
	heldSet hashSet
	// needed, when set, says which blocks the index must hear about (see
	// relevance): the stored blocks of an event up to the first one not
	// needed (the rest of its chain is not needed either), the removed
	// blocks that are needed.
	needed func(h uint64) bool
	// prefetch, when set with needed, starts loading what needed(h) will
	// read: apply issues it for a batch's removed hashes before testing
	// any, so that their cache misses overlap. An evicted block's entry is
	// rarely in the cache; a stored block's is: a GPU store's was just
	// touched by the simulator's ceiling bookkeeping, and an offload to
	// the CPU tier follows its block's GPU removal in the batch.
	prefetch func(h uint64)
	// keep and ahead are apply's scratch: per event, how many of its
	// stored blocks the index must hear about; the engine hashes to
	// prefetch in the index.
	keep  []int
	ahead []uint64
}

func newApplier(idx *index.Index, model string) *applier {
	return &applier{idx: idx, model: model, roots: map[string]kvblock.Key{}}
}

func (a *applier) root(lora string) kvblock.Key {
	k, ok := a.roots[lora]
	if !ok {
		k = kvblock.Root(a.model, lora)
		a.roots[lora] = k
	}
	return k
}

// apply applies evs for replica rid.
func (a *applier) apply(rid index.ReplicaID, evs []engine.Event) {
	// First pass: which stored blocks the index must hear about (needed
	// reads counts that apply does not change, so testing them before
	// applying anything gives the same answers), and what the index's
	// first look-ups will be: each needed store's parent and blocks. Their
	// loads are then started together (the relevance counts of removed
	// hashes too) instead of missing the caches one after another.
	a.keep = a.keep[:0]
	a.ahead = a.ahead[:0]
	for i := range evs {
		ev := &evs[i]
		n := len(ev.Hashes)
		switch ev.Kind {
		case engine.BlockRemoved:
			if a.needed != nil && a.prefetch != nil {
				for _, h := range ev.Hashes {
					a.prefetch(h)
				}
			}
		case engine.BlockStored:
			if a.needed != nil {
				n = 0
				for n < len(ev.Hashes) && a.needed(ev.Hashes[n]) {
					n++
				}
			}
			if n > 0 {
				if ev.HasParent {
					a.ahead = append(a.ahead, ev.Parent)
				}
				a.ahead = append(a.ahead, ev.Hashes[:min(n, chunkAhead)]...)
			}
		}
		a.keep = append(a.keep, n)
	}
	if len(a.ahead) > 0 {
		a.idx.Prefetch(rid, a.ahead)
	}
	for i := range evs {
		ev := &evs[i]
		tier, ok := index.ParseMedium(ev.Medium)
		if !ok {
			continue
		}
		switch ev.Kind {
		case engine.BlockStored:
			hashes, tokens := ev.Hashes, ev.Tokens
			if a.needed != nil {
				n := a.keep[i]
				if n == 0 {
					continue
				}
				if n < len(hashes) && len(tokens) == len(hashes)*ev.BlockSize {
					hashes, tokens = hashes[:n], tokens[:n*ev.BlockSize]
				}
			}
			if a.nheld > 0 && a.conflicts(ev.HasParent, ev.Parent, hashes, tier) {
				a.flush(rid)
			}
			a.idx.Stored(index.Stored{
				Replica: rid, Root: a.root(ev.LoRAName),
				HasParent: ev.HasParent, ParentHash: ev.Parent,
				Hashes: hashes, Tokens: tokens, BlockSize: ev.BlockSize, Tier: tier,
			})
		case engine.BlockRemoved:
			for _, h := range ev.Hashes {
				if a.needed != nil && (!a.needed(h)) {
					continue
				}
				a.held[tier] = append(a.held[tier], h)
				a.heldSet.add(h, tier)
				a.nheld++
			}
		case engine.AllBlocksCleared:
			a.flush(rid)
			a.idx.Cleared(rid)
		}
	}
	a.flush(rid)
}

// chunkAhead is how many of a stored event's first blocks apply prefetches
// (the index prefetches the rest of a long event itself, chunk by chunk).
const chunkAhead = 4

// conflicts reports whether a stored event (its parent, its hashes, its
// tier) depends on a held removal.
func (a *applier) conflicts(hasParent bool, parent uint64, hashes []uint64, tier index.Tier) bool {
	if hasParent && a.heldSet.tiers(parent) != 0 {
		return true
	}
	for _, h := range hashes {
		if a.heldSet.tiers(h)&(1<<tier) != 0 {
			return true
		}
	}
	return false
}

// flush applies the held removals, one Removed per tier.
func (a *applier) flush(rid index.ReplicaID) {
	if a.nheld == 0 {
		return
	}
	for t := range a.held {
		if len(a.held[t]) > 0 {
			a.idx.Removed(index.Removed{Replica: rid, Hashes: a.held[t], Tier: index.Tier(t)})
			a.held[t] = a.held[t][:0]
		}
	}
	a.nheld = 0
	a.heldSet.reset()
}

// hashSet is a small open-addressing set of hashes with the tiers each was
// added under; reset is O(1) (a generation count).
type hashSet struct {
	slots []hashSlot
	n     int
	gen   uint32
}

type hashSlot struct {
	h     uint64
	gen   uint32
	tiers uint8
}

func (s *hashSet) reset() {
	s.n = 0
	s.gen++
	if s.gen == 0 { // wrapped: old generations could look current
		clear(s.slots)
		s.gen = 1
	}
}

func (s *hashSet) slot(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> 32)
}

func (s *hashSet) add(h uint64, t index.Tier) {
	if s.gen == 0 {
		s.gen = 1
	}
	if (s.n+1)*2 > len(s.slots) {
		s.grow()
	}
	mask := len(s.slots) - 1
	for i := s.slot(h) & mask; ; i = (i + 1) & mask {
		sl := &s.slots[i]
		if sl.gen != s.gen {
			*sl = hashSlot{h: h, gen: s.gen, tiers: 1 << t}
			s.n++
			return
		}
		if sl.h == h {
			sl.tiers |= 1 << t
			return
		}
	}
}

func (s *hashSet) tiers(h uint64) uint8 {
	if s.n == 0 {
		return 0
	}
	mask := len(s.slots) - 1
	for i := s.slot(h) & mask; ; i = (i + 1) & mask {
		sl := &s.slots[i]
		if sl.gen != s.gen {
			return 0
		}
		if sl.h == h {
			return sl.tiers
		}
	}
}

func (s *hashSet) grow() {
	old, gen := s.slots, s.gen
	s.slots = make([]hashSlot, max(64, 2*len(old)))
	s.n = 0
	for _, sl := range old {
		if sl.gen == gen {
			for t := range index.NumTiers {
				if sl.tiers&(1<<t) != 0 {
					s.add(sl.h, t)
				}
			}
		}
	}
}
