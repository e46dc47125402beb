package bench

import "time"

// availTable maps an engine block hash to the simulated time a replica
// first computed the block: the ceiling's infinite cache. Every replica
// shares one engine seed, so equal blocks have equal hashes fleet-wide.
// Open addressing with linear probing over uniform hashes; it only grows
// (a run never forgets a block).
type availTable struct {
	slots   []availSlot
	n       int
	shift   uint
	zero    time.Duration // hash 0's entry when hasZero
	hasZero bool
}

type availSlot struct {
	h  uint64 // 0: empty
	at time.Duration
}

func (t *availTable) home(h uint64) int { return int((h * 0x9e3779b97f4a7c15) >> t.shift) }

func (t *availTable) get(h uint64) (time.Duration, bool) {
	if h == 0 {
		return t.zero, t.hasZero
	}
	if t.n == 0 {
		return 0, false
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.h == h {
			return sl.at, true
		}
		if sl.h == 0 {
			return 0, false
		}
	}
}

// setMin records at for h unless h has an earlier time.
func (t *availTable) setMin(h uint64, at time.Duration) {
	if h == 0 {
		if !t.hasZero || at < t.zero {
			t.zero, t.hasZero = at, true
		}
		return
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.h == h {
			sl.at = min(sl.at, at)
			return
		}
		if sl.h == 0 {
			sl.h, sl.at = h, at
			t.n++
			return
		}
	}
}

func (t *availTable) grow() {
	old := t.slots
	size := max(1<<16, 2*len(old))
	t.slots = make([]availSlot, size)
	t.shift = 64
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
	t.n = 0
	for _, sl := range old {
		if sl.h != 0 {
			t.setMin(sl.h, sl.at)
		}
	}
}
