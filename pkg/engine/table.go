package engine

import (
	"unsafe"

	"github.com/kvroute/kvroute/pkg/engine/hugemem"
)

// where is a block hash's place on each tier: its GPU block id and its CPU
// slot, -1 when the tier does not hold it.
type where struct{ gpu, cpu int32 }

// locSlot is one entry of the location table; key 0 marks an empty slot
// (hash 0 is kept aside in the table's zero field).
type locSlot struct {
	key uint64
	at  where
}

// locTable maps a block hash to its place on both tiers: one open-addressing
// table with linear probing and backward-shift deletion, sized for every
// block both tiers can hold at a load of at most 3/4, so it never grows.
// One lookup answers "on the GPU? on the CPU?" (the prefix-cache walk, an
// eviction and its offload each touch one slot instead of two Go maps).
//
// The slot array is mapped outside the Go heap on huge pages (package
// hugemem): probes land at random over megabytes, and with 4 KiB pages
// nearly each one misses the TLB as well as the caches.
type locTable struct {
	slots []locSlot
	mem   *hugemem.Region // holds slots (nil: on the Go heap)
	shift uint
	n     int // entries, hash 0 included
	zero  where
	// hasZero is set when hash 0 has an entry (zero holds it).
	hasZero bool
	ngpu    int // hashes with a GPU block
	ncpu    int // hashes with a CPU slot
}

func newLocTable(capacity int) locTable {
	size := 8
	for size*3 < capacity*4+4 {
		size *= 2
	}
	shift := uint(64)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	t := locTable{shift: shift}
	t.slots, t.mem = hugemem.Make[locSlot](size)
	return t
}

// home is the first slot probed for h (Fibonacci hashing: block hashes are
// already uniform, the multiply guards against structured ones).
func (t *locTable) home(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> t.shift)
}

// get returns where h is, or false.
func (t *locTable) get(h uint64) (where, bool) {
	if h == 0 {
		if !t.hasZero {
			return where{-1, -1}, false
		}
		return t.zero, true
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == h {
			return s.at, true
		}
		if s.key == 0 {
			return where{-1, -1}, false
		}
	}
}

// prefetch starts loading h's home slot (see hugemem.Prefetch), so that a
// later get or ref of h finds it in the cache.
func (t *locTable) prefetch(h uint64) {
	hugemem.Prefetch(unsafe.Pointer(&t.slots[t.home(h)]))
}

// ref returns h's entry, inserting an empty one (both tiers -1) when absent.
// The pointer is valid until the next insert or delete.
func (t *locTable) ref(h uint64) *where {
	if h == 0 {
		if !t.hasZero {
			t.hasZero, t.zero = true, where{-1, -1}
			t.n++
		}
		return &t.zero
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == h {
			return &s.at
		}
		if s.key == 0 {
			s.key, s.at = h, where{-1, -1}
			t.n++
			return &s.at
		}
	}
}

// setGPU and setCPU record (id >= 0) or drop (-1) h's block on a tier; an
// entry left on neither tier is deleted.
func (t *locTable) setGPU(h uint64, id int32) {
	w := t.ref(h)
	switch {
	case w.gpu < 0 && id >= 0:
		t.ngpu++
	case w.gpu >= 0 && id < 0:
		t.ngpu--
	}
	w.gpu = id
	if w.gpu < 0 && w.cpu < 0 {
		t.del(h)
	}
}

func (t *locTable) setCPU(h uint64, slot int32) {
	w := t.ref(h)
	switch {
	case w.cpu < 0 && slot >= 0:
		t.ncpu++
	case w.cpu >= 0 && slot < 0:
		t.ncpu--
	}
	w.cpu = slot
	if w.gpu < 0 && w.cpu < 0 {
		t.del(h)
	}
}

// del removes h's entry, shifting later entries of its probe run back so
// that no lookup needs tombstones.
func (t *locTable) del(h uint64) {
	if h == 0 {
		if t.hasZero {
			t.hasZero = false
			t.n--
		}
		return
	}
	mask := len(t.slots) - 1
	i := t.home(h)
	for ; t.slots[i].key != h; i = (i + 1) & mask {
		if t.slots[i].key == 0 {
			return
		}
	}
	t.n--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		k := t.slots[j].key
		if k == 0 {
			break
		}
		// Move j into the hole at i when its home is not in (i, j]
		// (cyclically): then i lies on its probe path.
		hj := t.home(k)
		if (j > i && (hj <= i || hj > j)) || (j < i && hj <= i && hj > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = locSlot{}
}

// reset forgets every entry.
func (t *locTable) reset() {
	clear(t.slots)
	t.n, t.ngpu, t.ncpu, t.hasZero = 0, 0, 0, false
}

// each calls fn for every entry (in no particular order).
func (t *locTable) each(fn func(h uint64, w where)) {
	if t.hasZero {
		fn(0, t.zero)
	}
	for i := range t.slots {
		if s := &t.slots[i]; s.key != 0 {
			fn(s.key, s.at)
		}
	}
}
