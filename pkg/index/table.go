package index

import (
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"
)

// slot is one 16-byte table entry. What k and v hold, and which bits mark a
// slot as occupied, depends on the table (see tabKind).
type slot struct{ k, v uint64 }

const (
	slotBytes = 16
	// subBytes is the allocation of one sub struct (40 bytes, size class 48).
	subBytes = 48
	// minCap is the smallest sub-table.
	minCap = 8
	// splitCap: a full sub-table this large splits in two instead of
	// growing, which bounds every rehash to about a thousand entries.
	splitCap = 1024
)

// Load factors, in tenths: a sub-table grows when an insert would take it
// past 9/10. Normally it is rebuilt at 6/10 and shrinks below 1/4; under
// memory pressure it is rebuilt at 8/10 and compacted (to 17/20) below 7/10,
// so that evicted entries give their bytes back.
const (
	maxLoadNum, maxLoadDen = 9, 10
)

// env is what every table of one index shares: the byte count, the
// pressure flag and the pool of freed slot arrays.
type env struct {
	bytes    int64
	pressure bool
	// budget is the index's byte budget (0: none); it bounds the pool.
	budget int64
	// pool keeps freed slot arrays, by capacity, for the next table of
	// that size: a rebuild then reuses memory instead of leaving garbage
	// for the Go collector, whose lag would let the heap's peak run past
	// the budget. Pooled arrays count in bytes; pooled is their total.
	pool   map[int][][]slot
	pooled int64
	// goCap maps a slot class to the capacity Go gives an array of it.
	goCap map[int]int
	// slab holds the slot arrays of offheapMin bytes or more, outside the
	// Go heap (nil: all on the heap).
	slab *slab
	// peak is the highest bytes has been since a writer last reset it;
	// maxPeak the highest ever.
	peak, maxPeak int64
}

// poolMax bounds the pool: 1/32 of the budget, or of what the index holds
// when it has no budget, and at least 256 KiB.
func (e *env) poolMax() int64 {
	if e.budget > 0 {
		return e.budget / 8
	}
	return max(256<<10, e.bytes/32)
}

// slotClass rounds a capacity up to one of eight sizes per doubling, so
// that freed arrays fit later requests.
func slotClass(n int) int {
	if n <= 16 {
		return max(minCap, (n+7)&^7)
	}
	shift := bits.Len(uint(n-1)) - 4
	return ((n-1)>>shift + 1) << shift
}

// tabKind says how a table reads its slots: a slot is occupied when
// k&occK|v&occV != 0, and two entries are the same when their k&cmp agree.
type tabKind struct {
	occK, occV, cmp uint64
}

var (
	// Key table: k is the router key (all 64 bits), v the holder word, which
	// is never zero for a live key.
	keyKind = tabKind{occK: 0, occV: ^uint64(0), cmp: ^uint64(0)}
	// Engine table: k is the engine hash with its top 3 bits replaced by
	// the tier bits (never zero for a live entry), v the router key.
	engKind = tabKind{occK: tierMaskK, occV: 0, cmp: ^tierMaskK}
)

const tierMaskK = uint64(7) << 61

// sub is one open-addressing table with Robin Hood linear probing and
// backward-shift deletion (no tombstones). Positions are taken with a
// multiply-shift range reduction, so capacities need not be powers of two.
type sub struct {
	s   []slot
	n   int
	pre uint64 // the top ld hash bits all entries share
	ld  uint8  // local depth: how many top hash bits all entries share
}

// dirEnt is one directory entry: what a lookup needs of the sub-table (its
// slots' address, capacity and local depth), copied from it, so that a
// lookup reads one 16-byte entry of the small directory and then the slot.
// The sub-tables themselves are in the parallel slice subs.
type dirEnt struct {
	s  unsafe.Pointer // &sb.s[0]
	c  uint32
	ld uint8
}

// dirEntBytes is what one directory entry costs: a dirEnt and a *sub.
const dirEntBytes = 24

// xtab is an extendible hash: a directory indexed by the top gd bits of the
// mixed hash points at sub-tables. A sub-table splits when it is large and
// full, so no single rebuild ever rehashes more than splitCap entries: a
// writer holding the index lock never stalls matchers behind a rehash of the
// whole table.
type xtab struct {
	dir  []dirEnt
	subs []*sub // parallel to dir
	gd   uint8
	n    int
	kind tabKind
	env  *env
	own  int64 // bytes this table holds
}

func newXtab(kind tabKind, e *env) xtab {
	t := xtab{kind: kind, env: e}
	sb := t.newSub(minCap, 0, 0, 0)
	t.dir, t.subs = t.allocDir(1)
	t.refresh(sb)
	return t
}

func (t *xtab) account(d int64) {
	t.own += d
	t.env.bytes += d
	if t.env.bytes > t.env.peak {
		t.env.peak = t.env.bytes
		t.env.maxPeak = max(t.env.maxPeak, t.env.bytes)
	}
}

func (t *xtab) allocDir(n int) ([]dirEnt, []*sub) {
	d := make([]dirEnt, n)
	t.account(int64(n) * dirEntBytes)
	return d, make([]*sub, n)
}

// refresh writes sb's directory entries (after its slots changed).
func (t *xtab) refresh(sb *sub) {
	first := int(sb.pre << (t.gd - sb.ld))
	e := dirEnt{s: unsafe.Pointer(unsafe.SliceData(sb.s)), c: uint32(len(sb.s)), ld: sb.ld}
	for i := range 1 << (t.gd - sb.ld) {
		t.dir[first+i] = e
		t.subs[first+i] = sb
	}
}

// allocSlots returns a zeroed slot array of about n slots for a table of
// entries entries. Arrays of offheapMin bytes or more are mapped outside
// the Go heap, in whole pages: the page count nearest to n, or more when
// that would leave the table loaded past about 0.85.
func (t *xtab) allocSlots(n, entries int) []slot {
	e := t.env
	if e.goCap == nil {
		e.goCap = map[int]int{}
		e.pool = map[int][][]slot{}
	}
	c, known := t.capFor(n, entries)
	r := slotClass(n)
	if known {
		if l := e.pool[c]; len(l) > 0 {
			s := l[len(l)-1]
			l[len(l)-1] = nil
			e.pool[c] = l[:len(l)-1]
			clear(s)
			e.pooled -= int64(c) * slotBytes
			t.own += int64(c) * slotBytes
			return s
		}
	}
	var s []slot
	if known && c%(pageSize/slotBytes) == 0 {
		s = e.slab.alloc(c) // whole pages, off the Go heap
	}
	if s == nil {
		s = slices.Grow([]slot(nil), r)
		s = s[:cap(s)] // use the whole size class that was allocated
		e.goCap[r] = len(s)
	}
	t.account(int64(len(s)) * slotBytes)
	return s
}

// capFor is the capacity allocSlots gives for n slots and entries entries,
// and whether it is known yet (a heap size class is learned on first use).
func (t *xtab) capFor(n, entries int) (int, bool) {
	e := t.env
	if e.slab != nil && offheapOK && n*slotBytes >= offheapMin {
		per := pageSize / slotBytes
		c := max(1, (n+per/2)/per) * per
		if need := entries*20/17 + 2; c < need {
			c = (need + per - 1) / per * per
		}
		return c, true
	}
	c, ok := e.goCap[slotClass(n)]
	return c, ok
}

// freeSlots gives back a slot array the table no longer uses: to the pool
// while it has room, else to the Go collector.
func (t *xtab) freeSlots(s []slot) {
	e := t.env
	size := int64(len(s)) * slotBytes
	for e.pool != nil && e.pooled+size > e.poolMax() && e.pooled > 0 {
		// Full: the arrays of the most stocked size make way.
		big, most := 0, int64(0)
		for c, l := range e.pool {
			if b := int64(len(l)*c) * slotBytes; b > most {
				big, most = c, b
			}
		}
		if big == len(s) {
			break
		}
		l := e.pool[big]
		e.slab.free(l[len(l)-1])
		l[len(l)-1] = nil
		e.pool[big] = l[:len(l)-1]
		b := int64(big) * slotBytes
		e.pooled -= b
		e.bytes -= b
	}
	if e.pool != nil && e.pooled+size <= e.poolMax() {
		e.pool[len(s)] = append(e.pool[len(s)], s)
		e.pooled += size
		t.own -= size
		return
	}
	e.slab.free(s)
	t.account(-size)
}

func (t *xtab) newSub(capacity, entries int, ld uint8, pre uint64) *sub {
	t.account(subBytes)
	return &sub{s: t.allocSlots(capacity, entries), ld: ld, pre: pre}
}

// release gives back everything the table holds (the table is dropped).
func (t *xtab) release() {
	for di, sb := range t.subs {
		if di&(1<<(t.gd-sb.ld)-1) == 0 {
			t.freeSlots(sb.s)
		}
	}
	t.env.bytes -= t.own
	t.own = 0
	t.dir, t.subs = nil, nil
	t.n = 0
}

// mix spreads a 64-bit value; engine hashes may be small integers.
func mix(x uint64) uint64 {
	x ^= x >> 32
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	return x
}

func home(h uint64, ld uint8, c int) int {
	hi, _ := bits.Mul64(h<<ld, uint64(c))
	return int(hi)
}

func (t *xtab) occupied(s *slot, v uint64) bool {
	return s.k&t.kind.occK|v&t.kind.occV != 0
}

// subOf returns the sub-table for hash h and its directory index.
func (t *xtab) subOf(h uint64) (*sub, int) {
	di := int(h >> (64 - uint(t.gd))) // 0 when gd is 0: Go shifts by 64 give 0
	return t.subs[di], di
}

// find returns the slot holding q, or nil. It may run under the read lock:
// v is loaded atomically because matchers set the reference bit in place.
func (t *xtab) find(q uint64) *slot {
	q &= t.kind.cmp
	return t.findHashed(q, mix(q))
}

// findHashed is find for q (already masked with kind.cmp) and h = mix(q).
func (t *xtab) findHashed(q, h uint64) *slot {
	sb, _ := t.subOf(h)
	c := len(sb.s)
	i := home(h, sb.ld, c)
	for d := 0; ; d++ {
		s := &sb.s[i]
		v := atomic.LoadUint64(&s.v)
		if !t.occupied(s, v) {
			return nil
		}
		if s.k&t.kind.cmp == q {
			return s
		}
		// Every slot from q's home to q's slot is occupied, so probing on
		// to the next empty slot is always correct; the displacement test
		// (which rehashes the occupant) only cuts a miss short, and is
		// left out of the first probes, where hits end.
		if d >= findQuickProbes && t.disp(sb, i) < d {
			return nil
		}
		if i++; i == c {
			i = 0
		}
	}
}

// findQuickProbes is how many probes find makes before it starts testing
// displacements.
const findQuickProbes = 4

// prefetch starts fetching the home slot of q, so that a later find of q
// hits the cache.
func (t *xtab) prefetch(q uint64) {
	t.prefetchHashed(mix(q & t.kind.cmp))
}

// prefetchHashed is prefetch for the hash h = mix(q&kind.cmp).
func (t *xtab) prefetchHashed(h uint64) {
	sb, _ := t.subOf(h)
	prefetch(unsafe.Pointer(&sb.s[home(h, sb.ld, len(sb.s))]))
}

// prefetchDir is prefetch for the hash h = mix(q&kind.cmp), reading the
// slot's address from the directory entry alone: a batch of prefetches
// then waits on no sub struct (those are scattered on the heap and rarely
// cached), only on the small directory.
func (t *xtab) prefetchDir(h uint64) {
	d := &t.dir[int(h>>(64-uint(t.gd)))] // 0 when gd is 0
	prefetch(unsafe.Add(d.s, uintptr(home(h, d.ld, int(d.c)))*slotBytes))
}

// disp is the probe distance of the entry at position i.
func (t *xtab) disp(sb *sub, i int) int {
	c := len(sb.s)
	h := home(mix(sb.s[i].k&t.kind.cmp), sb.ld, c)
	if h <= i {
		return i - h
	}
	return i + c - h
}

// insert adds an entry that is not in the table and returns its slot. The
// pointer is valid until the next insert or delete.
func (t *xtab) insert(k, v uint64) *slot {
	return t.insertHashed(k, v, mix(k&t.kind.cmp))
}

// insertHashed is insert for the hash h = mix(k&kind.cmp).
func (t *xtab) insertHashed(k, v, h uint64) *slot {
	sb, di := t.subOf(h)
	if (sb.n+1)*maxLoadDen > len(sb.s)*maxLoadNum {
		t.grow(sb, di)
		sb, _ = t.subOf(h)
	}
	t.n++
	return t.place(sb, slot{k, v}, h)
}

// place inserts e (hash h) into sb, which has room. It finds where Robin
// Hood insertion would put e (the first slot that is empty or whose entry
// sits nearer its home than e would there), then shifts the run from that
// slot to the next empty one up one place: the same table as the swap
// chain gives (entries keep their order by home), without rehashing every
// entry it passes.
func (t *xtab) place(sb *sub, e slot, h uint64) *slot {
	c := len(sb.s)
	i := home(h, sb.ld, c)
	for d := 0; ; d++ {
		s := &sb.s[i]
		if !t.occupied(s, s.v) {
			*s = e
			sb.n++
			return s
		}
		if t.disp(sb, i) < d {
			break
		}
		if i++; i == c {
			i = 0
		}
	}
	j := i // the next empty slot after i
	for {
		if j++; j == c {
			j = 0
		}
		if s := &sb.s[j]; !t.occupied(s, s.v) {
			break
		}
	}
	if j > i {
		copy(sb.s[i+1:j+1], sb.s[i:j])
	} else {
		copy(sb.s[1:j+1], sb.s[:j])
		sb.s[0] = sb.s[c-1]
		copy(sb.s[i+1:], sb.s[i:c-1])
	}
	sb.s[i] = e
	sb.n++
	return &sb.s[i]
}

// inHomeOrder calls fn for every entry of the slot array ss with its hash,
// starting after an empty slot: in a Robin Hood table that visits entries
// in order of their home, but for the cluster that wraps past the end.
func (t *xtab) inHomeOrder(ss []slot, fn func(e slot, h uint64)) {
	start := 0
	for i := range ss {
		if !t.occupied(&ss[i], ss[i].v) {
			start = i + 1
			break
		}
	}
	for j := range ss {
		i := start + j
		if i >= len(ss) {
			i -= len(ss)
		}
		s := &ss[i]
		if t.occupied(s, s.v) {
			fn(*s, mix(s.k&t.kind.cmp))
		}
	}
}

// filler fills an empty sub-table. Entries that come in order of their
// home are put at their home or just after the last one placed, with no
// Robin Hood displacement tests (the cluster stays sorted by home); once
// one comes out of order or would wrap past the end, the rest go through
// place.
type filler struct {
	t          *xtab
	sb         *sub
	next, last int
	slow       bool
}

func (f *filler) add(e slot, h uint64) {
	sb := f.sb
	if !f.slow {
		c := len(sb.s)
		hm := home(h, sb.ld, c)
		if hm >= f.last {
			if pos := max(hm, f.next); pos < c {
				sb.s[pos] = e
				sb.n++
				f.next, f.last = pos+1, hm
				return
			}
		}
		f.slow = true
	}
	f.t.place(sb, e, h)
}

// grow makes room in sb (found at directory index di): split it when it is
// large, rebuild it larger otherwise.
func (t *xtab) grow(sb *sub, di int) {
	target := 6 // tenths
	if t.env.pressure {
		target = 8
	}
	if len(sb.s) < splitCap || sb.ld >= 40 {
		t.rebuild(sb, max(minCap, (sb.n+1)*10/target+1))
		return
	}
	// Split on hash bit 63-ld.
	if sb.ld == t.gd {
		nd, ns := t.allocDir(2 * len(t.dir))
		for i := range nd {
			nd[i] = t.dir[i>>1]
			ns[i] = t.subs[i>>1]
		}
		t.account(-int64(len(t.dir)) * dirEntBytes)
		t.dir, t.subs = nd, ns
		t.gd++
		di <<= 1
	}
	var cnt [2]int
	bit := uint(63 - sb.ld)
	for i := range sb.s {
		s := &sb.s[i]
		if t.occupied(s, s.v) {
			cnt[mix(s.k&t.kind.cmp)>>bit&1]++
		}
	}
	var halves [2]*sub
	for j := range halves {
		halves[j] = t.newSub(max(minCap, cnt[j]*10/target+1), cnt[j], sb.ld+1, sb.pre<<1|uint64(j))
	}
	fills := [2]filler{{t: t, sb: halves[0]}, {t: t, sb: halves[1]}}
	t.inHomeOrder(sb.s, func(e slot, h uint64) { fills[h>>bit&1].add(e, h) })
	t.refresh(halves[0])
	t.refresh(halves[1])
	t.freeSlots(sb.s)
	t.account(-subBytes)
	sb.s = nil
}

// rebuild rehashes sb into capacity c.
func (t *xtab) rebuild(sb *sub, c int) {
	old := sb.s
	sb.s = t.allocSlots(c, sb.n)
	sb.n = 0
	f := filler{t: t, sb: sb}
	t.inHomeOrder(old, f.add)
	t.refresh(sb)
	t.freeSlots(old)
}

// remove deletes the entry in slot s (a pointer returned by find or
// insert). It shrinks the sub-table when it has become sparse, unless
// keepShape is set (the eviction hand is walking it).
func (t *xtab) remove(s *slot, keepShape bool) {
	h := mix(s.k & t.kind.cmp)
	sb, _ := t.subOf(h)
	c := len(sb.s)
	i := int((uintptr(unsafe.Pointer(s)) - uintptr(unsafe.Pointer(unsafe.SliceData(sb.s)))) / slotBytes)
	t.removeAt(sb, i)
	if !keepShape && c > minCap {
		t.maybeShrink(sb)
	}
}

// removeAt deletes the entry at position i of sb by shifting its probe
// successors back one place.
func (t *xtab) removeAt(sb *sub, i int) {
	c := len(sb.s)
	for {
		j := i + 1
		if j == c {
			j = 0
		}
		nx := &sb.s[j]
		if !t.occupied(nx, nx.v) || t.disp(sb, j) == 0 {
			sb.s[i] = slot{}
			break
		}
		sb.s[i] = *nx
		i = j
	}
	sb.n--
	t.n--
}

// maybeShrink rebuilds a sparse sub-table smaller: below 1/4 load normally,
// below 7/10 under memory pressure (compaction gives evicted bytes back).
func (t *xtab) maybeShrink(sb *sub) {
	c := len(sb.s)
	if c <= minCap {
		return
	}
	switch {
	case t.env.pressure && sb.n*10 < c*7:
		nc := max(minCap, sb.n*20/17+1)
		if ac, ok := t.capFor(nc, sb.n); nc < c && (!ok || ac < c) {
			t.rebuild(sb, nc)
		}
	case sb.n*4 < c:
		nc := max(minCap, sb.n*10/6+1)
		if ac, ok := t.capFor(nc, sb.n); nc < c && (!ok || ac < c) {
			t.rebuild(sb, nc)
		}
	}
}
