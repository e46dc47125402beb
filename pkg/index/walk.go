package index

import (
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// walk is Match's descent through the key table: it looks keys up a batch
// of matchAhead at a time, with the next batch's home slots prefetched
// before the current batch is read, so that a batch's lookups find their
// slots (mostly) arrived. The caller holds the read lock.
type walk struct {
	t     *xtab
	keys  []kvblock.Key
	dir   unsafe.Pointer // &t.dir[0]; the directory has exactly 1<<gd entries
	shift uint           // 64 - t.gd
	pos   int            // the first key of the next batch
	// starts holds, for two batches, where each key's probe starts: no
	// pointers, so filling it costs no write barrier.
	starts [2][matchAhead]probe
	// unref lists the slots of the current batch's keys whose reference
	// bit was not set (bit j of unrefMask: key j of the batch); touch sets
	// the bits of the keys the match used.
	unref     [matchAhead]*slot
	unrefMask uint32
}

// probe is where a lookup starts: a directory index and the home position.
type probe struct{ di, i uint32 }

// matchAhead is the batch: how many home slots are fetched together (16
// beat 8 and 32 here, as for the benchmark's baseline table).
const matchAhead = 16

// init starts a walk over keys: the first batch's home slots are fetched.
func (w *walk) init(t *xtab, keys []kvblock.Key) {
	w.t, w.keys = t, keys
	w.dir, w.shift = unsafe.Pointer(unsafe.SliceData(t.dir)), 64-uint(t.gd)
	w.prefetch(0)
}

func (w *walk) ent(di uint32) *dirEnt {
	return (*dirEnt)(unsafe.Add(w.dir, uintptr(di)*unsafe.Sizeof(dirEnt{})))
}

// prefetch computes the probe starts of the batch from key base on and
// starts fetching their home slots.
func (w *walk) prefetch(base int) {
	if base >= len(w.keys) {
		return
	}
	st := &w.starts[base/matchAhead&1]
	// The addresses, to prefetch in one call (as integers: the slot
	// arrays are kept alive by the table, under the read lock).
	var at [matchAhead]uintptr
	keys := w.keys[base:min(len(w.keys), base+matchAhead)]
	for j, k := range keys {
		h := mix(uint64(k))
		di := uint32(h >> w.shift) // 0 when gd is 0: Go shifts by 64 give 0
		e := w.ent(di)
		i, _ := bits.Mul64(h<<e.ld, uint64(e.c))
		at[j&(matchAhead-1)] = uintptr(e.s) + uintptr(i)*slotBytes
		st[j&(matchAhead-1)] = probe{di, uint32(i)}
	}
	prefetchAll(&at[0], len(keys))
}

// batch looks up the next batch of keys and writes their key words to vs.
// It returns how many it found: fewer than a full batch when a key is
// missing (the walk is then over) or the keys run out. The caller then
// calls touch.
func (w *walk) batch(vs *[matchAhead]uint64) int {
	base := w.pos
	if base >= len(w.keys) {
		return 0
	}
	w.unrefMask = 0
	w.prefetch(base + matchAhead)
	st := &w.starts[base/matchAhead&1]
	keys := w.keys[base:min(len(w.keys), base+matchAhead)]
	for j, k := range keys {
		p := st[j&(matchAhead-1)]
		e := w.ent(p.di)
		i, c := uintptr(p.i), uintptr(e.c)
		q := uint64(k)
		for d := 0; ; d++ {
			s := (*slot)(unsafe.Add(e.s, i*slotBytes))
			v := atomic.LoadUint64(&s.v)
			if v == 0 {
				w.pos = len(w.keys)
				return j
			}
			if s.k == q {
				if v&refBit == 0 {
					w.unref[j&(matchAhead-1)] = s
					w.unrefMask |= 1 << j
				}
				vs[j&(matchAhead-1)] = v
				break
			}
			if d >= walkQuickProbes && w.t.disp(w.t.subs[p.di], int(i)) < d {
				w.pos = len(w.keys)
				return j
			}
			if i++; i == c {
				i = 0
			}
		}
	}
	w.pos = base + len(keys)
	return len(keys)
}

// touch sets the reference bits of the first n keys of the current batch,
// those the match used (a matcher holding the read lock may: the bit is set
// atomically). Only keys whose bit was clear are written, so a match
// dirties no cache line of keys already referenced.
func (w *walk) touch(n int) {
	for m := w.unrefMask & (1<<n - 1); m != 0; m &= m - 1 {
		atomic.OrUint64(&w.unref[bits.TrailingZeros32(m)].v, refBit)
	}
	w.unrefMask = 0
}

// walkQuickProbes is how many probes a walk's lookup makes before it starts
// testing displacements (which rehash the occupant): more than find's,
// because a walk's lookups are hits but for its last.
const walkQuickProbes = 8
