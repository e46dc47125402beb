package index

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// offheapMin is the smallest slot array (in bytes) kept outside the Go
// heap. Smaller arrays (young or small tables) stay on the heap: a page each
// would waste more than the garbage they leave. (A variable so that tests
// can map every array.)
var offheapMin = 4096

// slabMinBudget is the smallest budget under which an index keeps slot
// arrays off the heap. Mapped arrays come in whole pages, so a table under
// memory pressure gives bytes back a page at a time; with a small budget
// (a few tables) that makes eviction coarse: the CLOCK hand must empty much
// of a table before its bytes drop, and laps past the second chance of
// recently used keys. Smaller budgets keep the heap's finer size classes.
const slabMinBudget = 4 << 20

// slab tracks the slot arrays an index keeps outside the Go heap, in memory
// mapped from the OS (mapSlots) and unmapped as soon as the index frees them.
// Slot arrays hold no Go pointers, so the collector need not see them; what
// it gains is that a rebuild's freed array goes back to the OS at once
// instead of lying as garbage on the heap until the next collection (with
// the default GOGC, until the heap has doubled). A slab is its own heap
// object so that the cleanup registered on the Index can unmap what a
// dropped index still holds.
type slab struct {
	live   map[unsafe.Pointer]int // base address -> mapped bytes
	mapped int64                  // their total
}

// mappedTotal is what every index holds mapped, for tests and benchmarks.
var mappedTotal atomic.Int64

// newSlab returns the slab of owner and unmaps what it still holds once
// owner is unreachable.
func newSlab[T any](owner *T) *slab {
	sl := &slab{live: map[unsafe.Pointer]int{}}
	runtime.AddCleanup(owner, func(sl *slab) { sl.unmapAll() }, sl)
	return sl
}

// alloc returns an off-heap array of at least n slots (the whole mapped
// pages are used), or nil when the platform or the OS gives none.
func (sl *slab) alloc(n int) []slot {
	if sl == nil || !offheapOK || n*slotBytes < offheapMin {
		return nil
	}
	size := (n*slotBytes + pageSize - 1) &^ (pageSize - 1)
	p := mapSlots(size)
	if p == nil {
		return nil
	}
	sl.live[p] = size
	sl.mapped += int64(size)
	mappedTotal.Add(int64(size))
	return unsafe.Slice((*slot)(p), size/slotBytes)
}

// free unmaps s and reports true when s came from alloc; false leaves s to
// the Go collector.
func (sl *slab) free(s []slot) bool {
	if sl == nil || len(s) == 0 {
		return false
	}
	p := unsafe.Pointer(unsafe.SliceData(s))
	size, ok := sl.live[p]
	if !ok {
		return false
	}
	delete(sl.live, p)
	unmapSlots(p, size)
	sl.mapped -= int64(size)
	mappedTotal.Add(-int64(size))
	return true
}

func (sl *slab) unmapAll() {
	for p, size := range sl.live {
		unmapSlots(p, size)
		mappedTotal.Add(-int64(size))
	}
	clear(sl.live)
	sl.mapped = 0
}
