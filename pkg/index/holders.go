package index

import "math/bits"

// A holder word says that one replica holds one key: its slot (24 bits) and
// a reference count per tier (12 bits each: how many of the replica's engine
// hashes on that tier map to the key). A key's holder set is stored in the
// key table's v: up to two holders inline in a compact form (see inline), or
// spillBit plus the offset of a record in the holder arena whose holders are
// sorted by slot. refBit is the
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
// record is three header words followed by cap holder words (cap a power of
// two): n | cap<<32, then two masks over the slots below 64 (what Match's
// bitmask path reads instead of the holder words): recHeld, the slots that
// hold the key, and recLower, those of them whose GPU count is zero. Records live in chunks (the first ones small, then 512 KiB
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

// The header words of a record, and the index of its two slot masks.
const (
	recHdr   = 3
	recHeld  = 1
	recLower = 2
)

// note records holder word w (of slot s, not empty) in record r's masks.
func note(r []uint64, w uint64) {
	if s := hSlot(w); s < 64 {
		r[recHeld] |= 1 << s
		if hCount(w, TierGPU) == 0 {
			r[recLower] |= 1 << s
		} else {
			r[recLower] &^= 1 << s
		}
	}
}

// unnote removes slot s from record r's masks.
func unnote(r []uint64, s uint32) {
	if s < 64 {
		r[recHeld] &^= 1 << s
		r[recLower] &^= 1 << s
	}
}

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
	need := recHdr + capacity
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

// holders returns the holder words of key word v (its reference bit is
// ignored): the one or two inline holders, expanded into buf, or the arena
// record's live part.
func (a *arena) holders(v uint64, buf *[2]uint64) []uint64 {
	if v&spillBit == 0 {
		buf[0] = expand(v & inMask)
		if c := v >> inBits & inMask; c != 0 {
			buf[1] = expand(c)
			return buf[:2]
		}
		return buf[:1]
	}
	r := a.rec(uint32(v))
	return r[recHdr : recHdr+uint32(r[0])]
}

// Inline holders. A key held by one or two replicas keeps them in the key
// word itself, 31 bits each: a 22-bit slot and a 3-bit count per tier, the
// lower slot first (bits 0-30), the second holder (or zero) above it (bits
// 31-61). A holder set that does not fit (three or more holders, a slot of
// 2^22 or more, a count above 7) spills to an arena record of full holder
// words; a record is turned back inline as soon as its set fits again, so a
// key is spilled exactly when its holders do not fit inline.
const (
	inSlotBits = 22
	inCntBits  = 3
	inCntMax   = 1<<inCntBits - 1
	inBits     = inSlotBits + inCntBits*int(NumTiers)
	inMask     = uint64(1)<<inBits - 1
	// inPairSlots selects the slots of both inline holders.
	inPairSlots = (1<<inSlotBits - 1) * (1 | 1<<inBits)
)

// inSlot is the slot of inline holder c.
func inSlot(c uint64) uint32 { return uint32(c & (1<<inSlotBits - 1)) }

// inBest is the best tier of inline holder c (its lowest non-zero count).
func inBest(c uint64) Tier {
	x := c >> inSlotBits
	return Tier(bits.TrailingZeros64((x|x>>1|x>>2)&0b001001001) / inCntBits)
}

// inBestBit is 3 times the best tier of inline holder c, between 0 and 7.
func inBestBit(c uint64) uint {
	x := c >> inSlotBits
	return uint(bits.TrailingZeros64((x|x>>1|x>>2)&0b001001001)) & 7
}

// compact returns the inline form of full holder word w, if it has one.
func compact(w uint64) (uint64, bool) {
	c := uint64(hSlot(w))
	if c >= 1<<inSlotBits {
		return 0, false
	}
	for t := range NumTiers {
		n := hCount(w, t)
		if n > inCntMax {
			return 0, false
		}
		c |= n << (inSlotBits + inCntBits*uint(t))
	}
	return c, true
}

// expand is the full holder word of inline holder c.
func expand(c uint64) uint64 {
	w := c & (1<<inSlotBits - 1)
	for t := range NumTiers {
		w |= c >> (inSlotBits + inCntBits*uint(t)) & inCntMax << (slotBits + cntBits*uint(t))
	}
	return w
}

// inline returns the inline key word (without flags) for holders hs, sorted
// by slot, if they fit.
func inline(hs []uint64) (uint64, bool) {
	if len(hs) == 0 || len(hs) > 2 {
		return 0, false
	}
	v, ok := compact(hs[0])
	if !ok {
		return 0, false
	}
	if len(hs) == 2 {
		c, ok := compact(hs[1])
		if !ok {
			return 0, false
		}
		v |= c << inBits
	}
	return v, true
}

// set stores holders hs (sorted, non-empty) as the key word of ks, inline if
// they fit, else in a new arena record, with reference bit ref. It reports
// false, leaving ks as it was, when the arena is full.
func (a *arena) set(ks *slot, hs []uint64, ref uint64) bool {
	if v, ok := inline(hs); ok {
		ks.v = v | ref
		return true
	}
	c := max(2, 1<<bits.Len(uint(len(hs)-1)))
	off, ok := a.alloc(c)
	if !ok {
		return false
	}
	r := a.rec(off)
	r[0] = uint64(len(hs)) | uint64(c)<<32
	r[recHeld], r[recLower] = 0, 0
	for _, w := range hs {
		note(r, w)
	}
	copy(r[recHdr:], hs)
	ks.v = spillBit | ref | uint64(off)
	return true
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
		var buf [2]uint64
		hs := a.holders(v, &buf)
		var all [3]uint64
		n := copy(all[:], hs)
		i, found := search(hs, s)
		if found {
			all[i] = hInc(all[i], t)
		} else {
			copy(all[i+1:n+1], all[i:n])
			all[i] = hInc(uint64(s), t)
			n++
		}
		if !a.set(ks, all[:n], refBit) {
			return false
		}
		return !found
	}
	off := uint32(v)
	r := a.rec(off)
	n, c := int(uint32(r[0])), int(r[0]>>32)
	h := r[recHdr : recHdr+n]
	i, found := search(h, s)
	if found {
		h[i] = hInc(h[i], t)
		note(r, h[i])
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
		copy(nr[1:recHdr+n], r[1:recHdr+n])
		a.release(off)
		off, r = noff, nr
		c *= 2
	}
	h = r[recHdr : recHdr+n+1]
	copy(h[i+1:], h[i:n])
	h[i] = hInc(uint64(s), t)
	note(r, h[i])
	r[0] = uint64(n+1) | uint64(c)<<32
	ks.v = spillBit | refBit | uint64(off)
	return true
}

// unhold counts one engine hash of slot s on tier t less. It reports whether
// s stopped holding the key, and whether the key has no holder left (the
// caller then removes the key's slot).
func (a *arena) unhold(ks *slot, s uint32, t Tier) (gone, empty bool) {
	v := ks.v
	ref := v & refBit
	if v&spillBit == 0 {
		var buf [2]uint64
		hs := a.holders(v, &buf)
		i, found := search(hs, s)
		if !found || hCount(hs[i], t) == 0 {
			return false, false
		}
		hs[i] = hDec(hs[i], t)
		if hEmpty(hs[i]) {
			gone = true
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				return true, true
			}
		}
		a.set(ks, hs, ref) // fewer or smaller holders always fit inline
		return gone, false
	}
	off := uint32(v)
	r := a.rec(off)
	n, c := int(uint32(r[0])), int(r[0]>>32)
	h := r[recHdr : recHdr+n]
	i, found := search(h, s)
	if !found || hCount(h[i], t) == 0 {
		return false, false
	}
	h[i] = hDec(h[i], t)
	if hEmpty(h[i]) {
		gone = true
		unnote(r, s)
		copy(h[i:], h[i+1:])
		n--
		if n == 0 {
			a.release(off)
			return true, true
		}
		r[0] = uint64(n) | uint64(c)<<32
	} else {
		note(r, h[i])
	}
	if in, ok := inline(r[recHdr : recHdr+n]); ok {
		ks.v = in | ref
		a.release(off)
	}
	return gone, false
}

// holdsSlot reports whether slot s holds the key with word v.
func (a *arena) holdsSlot(v uint64, s uint32) bool {
	var buf [2]uint64
	_, found := search(a.holders(v, &buf), s)
	return found
}
