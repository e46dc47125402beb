package index

import "math/bits"

// A holder word says that one replica holds one key: its slot (24 bits) and
// a reference count per tier (12 bits each: how many of the replica's engine
// hashes on that tier map to the key). A key's holder set is stored in the
// key table's v: a single holder inline, or spillBit plus the offset of a
// record in the holder arena whose holders are sorted by slot. refBit is the
// key's CLOCK reference bit, set by stores and matches.
const (
	slotBits = 24
	maxSlots = 1 << slotBits
	slotMask = maxSlots - 1
	cntBits  = 12
	cntMax   = 1<<cntBits - 1
	cntsMask = uint64(1)<<(cntBits*NumTiers) - 1
	refBit   = uint64(1) << 62
	spillBit = uint64(1) << 63
)

func hSlot(w uint64) uint32 { return uint32(w & slotMask) }

func hCount(w uint64, t Tier) uint64 { return w >> (slotBits + cntBits*uint(t)) & cntMax }

func hEmpty(w uint64) bool { return w>>slotBits&cntsMask == 0 }

// hBest is the best tier with a non-zero count.
func hBest(w uint64) Tier {
	for t := range NumTiers {
		if hCount(w, t) != 0 {
			return t
		}
	}
	return TierGPU
}

// hInc adds one to tier t's count. Counts saturate at cntMax: past that,
// removals may drop the holder before its last engine hash is gone, which
// loses affinity but never claims a block that is not held.
func hInc(w uint64, t Tier) uint64 {
	if hCount(w, t) < cntMax {
		w += 1 << (slotBits + cntBits*uint(t))
	}
	return w
}

func hDec(w uint64, t Tier) uint64 { return w - 1<<(slotBits+cntBits*uint(t)) }

// arena stores the holder records of keys with more than one holder. A
// record is a header word (n | cap<<32) followed by cap holder words; cap is
// a power of two. Records live in chunks (the first ones small, then 512 KiB
// each) and are reused through per-size free lists; chunks are never
// returned, so the arena is as large as its peak use. A record holds at most
// maxHolders holders: past that, further replicas are not recorded as
// holders of the key (affinity is lost, correctness is not).
type arena struct {
	chunks [][]uint64
	used   int // words used in the last chunk
	live   int // records in use
	free   [32][]uint32
	env    *env
}

const (
	chunkShift = 16
	chunkWords = 1 << chunkShift
	maxHolders = chunkWords / 2
	maxChunks  = 1 << (32 - chunkShift)
)

func (a *arena) rec(off uint32) []uint64 {
	return a.chunks[off>>chunkShift][off&(chunkWords-1):]
}

// alloc returns a record of the given capacity, or false when the arena is
// full (2^32 words).
func (a *arena) alloc(capacity int) (uint32, bool) {
	cls := bits.Len(uint(capacity)) - 1
	a.live++
	if fl := a.free[cls]; len(fl) > 0 {
		off := fl[len(fl)-1]
		a.free[cls] = fl[:len(fl)-1]
		return off, true
	}
	need := 1 + capacity
	if len(a.chunks) == 0 || a.used+need > len(a.chunks[len(a.chunks)-1]) {
		if len(a.chunks) == maxChunks {
			a.live--
			return 0, false
		}
		size := chunkWords
		if len(a.chunks) < chunkShift-8 {
			size = max(need, 256<<len(a.chunks))
		}
		a.chunks = append(a.chunks, make([]uint64, size))
		a.env.bytes += int64(size) * 8
		a.used = 0
	}
	off := uint32(len(a.chunks)-1)<<chunkShift | uint32(a.used)
	a.used += need
	return off, true
}

func (a *arena) release(off uint32) {
	if a.live--; a.live == 0 {
		// Nothing in use: give every chunk back.
		for _, ch := range a.chunks {
			a.env.bytes -= int64(len(ch)) * 8
		}
		for i, fl := range a.free {
			a.env.bytes -= int64(cap(fl)) * 4
			a.free[i] = nil
		}
		a.chunks, a.used = nil, 0
		return
	}
	r := a.rec(off)
	cls := bits.Len(uint(r[0]>>32)) - 1
	before := cap(a.free[cls])
	a.free[cls] = append(a.free[cls], off)
	a.env.bytes += int64(cap(a.free[cls])-before) * 4
}

// holders returns the holder words of key word v: either v itself (one
// inline holder, written to one) or the arena record's live part.
func (a *arena) holders(v uint64, one *[1]uint64) []uint64 {
	if v&spillBit == 0 {
		one[0] = v
		return one[:]
	}
	r := a.rec(uint32(v))
	return r[1 : 1+uint32(r[0])]
}

// search returns the position of slot s in sorted holders hs, and whether
// it is there.
func search(hs []uint64, s uint32) (int, bool) {
	lo, hi := 0, len(hs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if hSlot(hs[m]) < s {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(hs) && hSlot(hs[lo]) == s
}

// hold counts one more engine hash of slot s on tier t for the key in ks and
// sets the key's reference bit. It reports whether s is a new holder.
func (a *arena) hold(ks *slot, s uint32, t Tier) bool {
	v := ks.v
	if v&spillBit == 0 {
		if hSlot(v) == s {
			ks.v = hInc(v, t) | refBit
			return false
		}
		off, ok := a.alloc(2)
		if !ok {
			return false
		}
		r := a.rec(off)
		lo, hi := hInc(uint64(s), t), v&^refBit
		if s > hSlot(v) {
			lo, hi = hi, lo
		}
		r[0], r[1], r[2] = 2|2<<32, lo, hi
		ks.v = spillBit | refBit | uint64(off)
		return true
	}
	off := uint32(v)
	r := a.rec(off)
	n, c := int(uint32(r[0])), int(r[0]>>32)
	i, found := search(r[1:1+n], s)
	if found {
		r[1+i] = hInc(r[1+i], t)
		ks.v = v | refBit
		return false
	}
	if n == c {
		if n == maxHolders {
			return false
		}
		noff, ok := a.alloc(2 * c)
		if !ok {
			return false
		}
		nr := a.rec(noff)
		copy(nr[1:1+n], r[1:1+n])
		a.release(off)
		off, r = noff, nr
		c *= 2
	}
	copy(r[2+i:2+n], r[1+i:1+n])
	r[1+i] = hInc(uint64(s), t)
	r[0] = uint64(n+1) | uint64(c)<<32
	ks.v = spillBit | refBit | uint64(off)
	return true
}

// unhold counts one engine hash of slot s on tier t less. It reports whether
// s stopped holding the key, and whether the key has no holder left (the
// caller then removes the key's slot).
func (a *arena) unhold(ks *slot, s uint32, t Tier) (gone, empty bool) {
	v := ks.v
	if v&spillBit == 0 {
		if hSlot(v) != s || hCount(v, t) == 0 {
			return false, false
		}
		v = hDec(v, t)
		if hEmpty(v) {
			return true, true
		}
		ks.v = v
		return false, false
	}
	off := uint32(v)
	r := a.rec(off)
	n, c := int(uint32(r[0])), int(r[0]>>32)
	i, found := search(r[1:1+n], s)
	if !found || hCount(r[1+i], t) == 0 {
		return false, false
	}
	r[1+i] = hDec(r[1+i], t)
	if !hEmpty(r[1+i]) {
		return false, false
	}
	copy(r[1+i:n], r[2+i:1+n])
	n--
	if n == 1 {
		ks.v = r[1] | v&refBit
		a.release(off)
		return true, false
	}
	r[0] = uint64(n) | uint64(c)<<32
	return true, false
}

// holdsSlot reports whether slot s holds the key with word v.
func (a *arena) holdsSlot(v uint64, s uint32) bool {
	var one [1]uint64
	_, found := search(a.holders(v, &one), s)
	return found
}
