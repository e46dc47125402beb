package index

// hand is the eviction CLOCK's position: a replica slot, a directory index
// of that replica's engine table and a position in that sub-table.
type hand struct {
	slot int
	di   int
	pos  int
}

// totalBytes is Stats.Bytes.
func (ix *Index) totalBytes() int64 {
	return ix.env.bytes + int64(cap(ix.bySlot))*8 + int64(cap(ix.freeSlot))*4 + int64(len(ix.arena.chunks))*24
}

// overBudget reports whether the index holds more than its budget less the
// room one writer chunk may need (ix.step, at most an eighth of the budget):
// evicting down to that keeps the peak, growth included, within the budget.
func (ix *Index) overBudget() bool {
	return ix.cfg.MaxBytes > 0 && ix.totalBytes()+min(ix.step, ix.cfg.MaxBytes/8) > ix.cfg.MaxBytes
}

// evictStep bounds the work of one eviction lock hold.
const evictStep = 512

// enforceBudget evicts until the index is within its budget, taking the
// write lock for bounded steps.
func (ix *Index) enforceBudget() {
	for {
		ix.mu.Lock()
		if !ix.overBudget() {
			ix.mu.Unlock()
			return
		}
		ix.env.pressure = true
		progress := ix.evictSome(evictStep)
		ix.mu.Unlock()
		if !progress {
			return
		}
	}
}

// evictSome advances the CLOCK hand over the replicas' engine entries. An
// entry whose key was stored or matched since the hand last passed (the
// key's reference bit is set) gets a second chance and the bit is cleared;
// any other entry is evicted: its holds are released and it is removed.
// Entries whose key no longer lists the replica (dropped earlier) go first.
// The hand walks one sub-table at a time and compacts it when it leaves, so
// evictions give their bytes back. It reports whether it made progress.
func (ix *Index) evictSome(limit int) bool {
	h := &ix.hand
	examined, scanned := 0, 0
	for examined < limit && scanned < 16*limit {
		if ix.engine == 0 {
			return examined > 0
		}
		if h.slot >= len(ix.bySlot) {
			*h = hand{}
		}
		rs := ix.bySlot[h.slot]
		if rs == nil || rs.eng.n == 0 || h.di >= len(rs.eng.dir) {
			*h = hand{slot: h.slot + 1}
			scanned++
			continue
		}
		tab := &rs.eng
		sb := tab.subs[h.di]
		if h.di&(1<<(tab.gd-sb.ld)-1) != 0 {
			h.di++
			h.pos = 0
			continue
		}
		if h.pos >= len(sb.s) {
			tab.maybeShrink(sb)
			h.di++
			h.pos = 0
			if !ix.overBudget() {
				return true
			}
			continue
		}
		s := &sb.s[h.pos]
		scanned++
		if !tab.occupied(s, s.v) {
			h.pos++
			continue
		}
		examined++
		k, tiers := s.v, s.k>>61
		if ks := ix.keys.find(k); ks != nil && ks.v&refBit != 0 && ix.arena.holdsSlot(ks.v, rs.slot) {
			ks.v &^= refBit
			h.pos++
			continue
		}
		tab.removeAt(sb, h.pos) // the next entry may shift into h.pos
		ix.engine--
		ix.evicted++
		for t := range NumTiers {
			if tiers&(1<<t) != 0 {
				ix.unhold(rs.slot, k, t)
			}
		}
	}
	return examined > 0 || scanned > 0
}
