package bench

import (
	"unsafe"

	"github.com/kvroute/kvroute/pkg/engine/hugemem"
)

// hashTable maps 64-bit block hashes (uniform already) to values: open
// addressing with linear probing and Fibonacci hashing, growing at 3/4
// load, never deleting. The simulator keeps a few with millions of entries
// (a Go map of that size costs several times more per lookup). Its slot
// array is mapped outside the Go heap on huge pages where it is large
// (package hugemem): nearly every probe misses the caches, and with 4 KiB
// pages the TLB too. V must hold no Go pointers.
type hashTable[V any] struct {
	slots   []hashEntry[V]
	mem     *hugemem.Region // holds slots (nil: on the Go heap)
	n       int
	shift   uint
	zero    V // hash 0's value when hasZero (0 marks an empty slot)
	hasZero bool
}

type hashEntry[V any] struct {
	h uint64
	v V
}

func (t *hashTable[V]) home(h uint64) int { return int((h * 0x9e3779b97f4a7c15) >> t.shift) }

// get returns h's value, or false.
func (t *hashTable[V]) get(h uint64) (V, bool) {
	var none V
	if h == 0 {
		return t.zero, t.hasZero
	}
	if t.n == 0 {
		return none, false
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.h == h {
			return e.v, true
		}
		if e.h == 0 {
			return none, false
		}
	}
}

// prefetch starts loading h's home slot (see hugemem.Prefetch): a caller
// about to look up several hashes prefetches them all first, so that their
// cache misses overlap.
func (t *hashTable[V]) prefetch(h uint64) {
	if t.n > 0 {
		hugemem.Prefetch(unsafe.Pointer(&t.slots[t.home(h)]))
	}
}

// probeAhead is how far ahead of its look-ups a walk over many hashes
// prefetches (hashTable.prefetch): enough misses in flight to cover a
// memory access, few enough to stay in the first-level cache.
const probeAhead = 16

// ref returns a pointer to h's value, inserting the zero value first when
// h is absent (added reports that). The pointer is valid until the next
// ref.
func (t *hashTable[V]) ref(h uint64) (v *V, added bool) {
	if h == 0 {
		added = !t.hasZero
		t.hasZero = true
		return &t.zero, added
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.h == h {
			return &e.v, false
		}
		if e.h == 0 {
			e.h = h
			t.n++
			return &e.v, true
		}
	}
}

// clone returns a copy of t.
func (t *hashTable[V]) clone() hashTable[V] {
	c := *t
	c.slots, c.mem = hugemem.Make[hashEntry[V]](len(t.slots))
	copy(c.slots, t.slots)
	return c
}

// free releases t's slot array at once (t is empty afterwards) instead of
// when t becomes unreachable.
func (t *hashTable[V]) free() {
	t.mem.Free()
	*t = hashTable[V]{}
}

func (t *hashTable[V]) grow() {
	old, oldMem := t.slots, t.mem
	defer oldMem.Free()
	size := max(1<<12, 2*len(old))
	t.slots, t.mem = hugemem.Make[hashEntry[V]](size)
	t.shift = 64
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
	mask := size - 1
	for _, e := range old {
		if e.h == 0 {
			continue
		}
		i := t.home(e.h)
		for t.slots[i].h != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = e
	}
}
