package engine

import (
	"unsafe"

	"github.com/kvroute/kvroute/pkg/engine/hugemem"
)

// blockMeta is what a cached block's events need: its place in its chain,
// its tokens and its extra keys. It is immutable once built.
type blockMeta struct {
	parent    uint64
	hasParent bool
	tokens    []uint32
	extra     []string
	loraID    int
	loraName  string
}

type gpuBlock struct {
	ref        int32
	prev, next int32 // free-list links, -1 at the ends
	inFree     bool
	cached     bool
	group      uint8 // KV-cache group of the cached hash (hybrid engines)
	hash       uint64
	meta       *blockMeta
}

// groupKey is the prefix-cache map key of hash h in KV-cache group g: h
// itself for group 0, so a one-group engine's map is keyed by its hashes,
// and a mix of h and g for the others (vLLM keys its map by hash and
// group id, so each group caches the same hash once).
func groupKey(h uint64, g uint8) uint64 {
	if g == 0 {
		return h
	}
	return (h ^ uint64(g)*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
}

// pool is the GPU block pool with its prefix-cache map, free list and the
// optional CPU tier. Evictions and offloads append events to *events.
type pool struct {
	blockSize  int
	blocks     []gpuBlock
	head, tail int32 // free list: allocation evicts at head, frees append at tail
	nfree      int
	// loc maps a cached hash to its GPU block and CPU slot (the prefix-cache
	// map of both tiers).
	loc locTable

	// The CPU tier: an LRU list threaded through cpu's slots (head = most
	// recently used), indexed by loc; freed slots are reused. The links
	// live outside the Go heap on huge pages (cpuMem: the list is walked
	// at random), each slot's metadata in cpuMeta (same index).
	cpuCap           int
	cpu              []cpuEntry
	cpuMem           *hugemem.Region
	cpuMeta          []*blockMeta
	cpuFree          []int32
	cpuHead, cpuTail int32

	events *[]Event
	// hashes and extras hand out the one-element slices of single-block
	// events from shared backing arrays (capacity 1 each, so a consumer's
	// append copies), saving two allocations per evicted block.
	hashes slab[uint64]
	extras slab[[]string]
}

type cpuEntry struct {
	hash       uint64
	prev, next int32
}

// slab hands out one-element slices of a shared backing array.
type slab[T any] struct{ buf []T }

func (s *slab[T]) one(v T) []T {
	if len(s.buf) == cap(s.buf) {
		s.buf = make([]T, 0, 512)
	}
	s.buf = append(s.buf, v)
	n := len(s.buf)
	return s.buf[n-1 : n : n]
}

func newPool(numBlocks, cpuBlocks, blockSize int, events *[]Event) *pool {
	cpu, cpuMem := hugemem.Make[cpuEntry](cpuBlocks)
	p := &pool{
		blockSize: blockSize,
		cpu:       cpu[:0], // appended to up to cpuBlocks, in place
		cpuMem:    cpuMem,
		blocks:    make([]gpuBlock, numBlocks),
		head:      -1,
		tail:      -1,
		loc:       newLocTable(numBlocks + cpuBlocks),
		cpuCap:    cpuBlocks,
		cpuHead:   -1,
		cpuTail:   -1,
		events:    events,
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = -1, -1
		p.pushTail(int32(i))
	}
	return p
}

func (p *pool) pushTail(id int32) {
	b := &p.blocks[id]
	b.inFree = true
	b.prev, b.next = p.tail, -1
	if p.tail >= 0 {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.nfree++
}

func (p *pool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFree = -1, -1, false
	p.nfree--
}

// used is the number of blocks held by requests.
func (p *pool) used() int { return len(p.blocks) - p.nfree }

// touch takes a reference on a block, taking it off the free list.
func (p *pool) touch(id int32) {
	b := &p.blocks[id]
	if b.inFree {
		p.unlink(id)
	}
	b.ref++
}

// alloc pops the free-list head, evicting its cached hash if it has one. The
// caller has checked nfree.
func (p *pool) alloc() int32 {
	id := p.head
	p.unlink(id)
	b := &p.blocks[id]
	if b.cached {
		p.evict(id)
	}
	b.ref = 1
	return id
}

// prefetchAlloc starts loading what the next n allocs (at most
// maxPrefetch) will probe at random: the location-table slots of the
// hashes they evict and those hashes' metadata (an offload's event reads
// it) and, with a full CPU tier, the slots of the hashes the offloads push
// out of it (the tier's least recently used blocks). Allocating n blocks
// then overlaps their cache misses instead of taking them one after
// another. It returns where it stopped, for prefetchNext; it changes
// nothing.
func (p *pool) prefetchAlloc(n int) ahead {
	a := ahead{gpu: p.head, cpu: -1}
	if !prefetching {
		a.gpu = -1
		return a
	}
	if p.cpuCap > 0 && p.loc.ncpu >= p.cpuCap {
		a.cpu = p.cpuTail
	}
	for range min(n, maxPrefetch) {
		p.prefetchNext(&a)
	}
	return a
}

// ahead is how far prefetchAlloc has prefetched: the next free GPU block
// and the next CPU slot (from the tier's tail) to prefetch, -1 for none.
type ahead struct{ gpu, cpu int32 }

// prefetchNext prefetches one more allocation's probes and moves a on. The
// allocations in between move blocks around, so a may point at a block
// that is no longer next: then it prefetches lines that go unused, which
// is harmless.
func (p *pool) prefetchNext(a *ahead) {
	if a.gpu >= 0 {
		b := &p.blocks[a.gpu]
		if b.cached {
			p.loc.prefetch(groupKey(b.hash, b.group))
			if b.meta != nil {
				hugemem.Prefetch(unsafe.Pointer(b.meta))
			}
		}
		a.gpu = b.next
	}
	if a.cpu >= 0 {
		p.loc.prefetch(p.cpu[a.cpu].hash)
		a.cpu = p.cpu[a.cpu].prev
	}
}

// maxPrefetch bounds how far ahead prefetchAlloc and the prefix-cache walk
// prefetch: further ahead, lines would be evicted before their use.
const maxPrefetch = 32

// prefetching turns the prefetches on (a test compares runs without them).
var prefetching = true

// evict drops a GPU block's hash from the prefix cache (BlockRemoved GPU)
// and offloads it to the CPU tier when there is one.
func (p *pool) evict(id int32) {
	b := &p.blocks[id]
	h, meta, g := b.hash, b.meta, b.group
	b.cached, b.hash, b.meta, b.group = false, 0, nil, 0
	*p.events = append(*p.events, Event{Kind: BlockRemoved, Hashes: p.hashes.one(h), Medium: MediumGPU, Group: int(g)})
	if g != 0 {
		// A hybrid engine's other group (no CPU tier in that mode).
		p.loc.setGPU(groupKey(h, g), -1)
		return
	}
	if p.cpuCap == 0 {
		p.loc.setGPU(h, -1)
		return
	}
	w := p.loc.ref(h)
	w.gpu = -1
	p.loc.ngpu--
	if w.cpu >= 0 {
		p.cpuUnlink(w.cpu)
		p.cpuPushFront(w.cpu)
		return
	}
	p.offload(h, meta)
}

// offload copies block h, on neither tier now (its entry in loc is kept
// meanwhile), to the CPU tier, evicting the tier's least recently used
// block when it is full.
func (p *pool) offload(h uint64, meta *blockMeta) {
	var i int32
	switch {
	case p.loc.ncpu >= p.cpuCap:
		i = p.cpuTail
		old := p.cpu[i].hash
		p.cpuUnlink(i)
		p.loc.setCPU(old, -1)
		*p.events = append(*p.events, Event{Kind: BlockRemoved, Hashes: p.hashes.one(old), Medium: MediumCPU})
	case len(p.cpuFree) > 0:
		i = p.cpuFree[len(p.cpuFree)-1]
		p.cpuFree = p.cpuFree[:len(p.cpuFree)-1]
	default:
		p.cpu = append(p.cpu, cpuEntry{})
		p.cpuMeta = append(p.cpuMeta, nil)
		i = int32(len(p.cpu) - 1)
	}
	p.cpu[i].hash, p.cpuMeta[i] = h, meta
	p.cpuPushFront(i)
	p.loc.setCPU(h, i)
	*p.events = append(*p.events, p.storedEvent(h, meta, MediumCPU))
}

func (p *pool) cpuUnlink(i int32) {
	e := &p.cpu[i]
	if e.prev >= 0 {
		p.cpu[e.prev].next = e.next
	} else {
		p.cpuHead = e.next
	}
	if e.next >= 0 {
		p.cpu[e.next].prev = e.prev
	} else {
		p.cpuTail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (p *pool) cpuPushFront(i int32) {
	e := &p.cpu[i]
	e.prev, e.next = -1, p.cpuHead
	if p.cpuHead >= 0 {
		p.cpu[p.cpuHead].prev = i
	} else {
		p.cpuTail = i
	}
	p.cpuHead = i
}

// cpuLen is the number of blocks on the CPU tier.
func (p *pool) cpuLen() int { return p.loc.ncpu }

// gpuLen is the number of hashes cached on the GPU.
func (p *pool) gpuLen() int { return p.loc.ngpu }

// cpuGet returns a CPU-tier block's metadata and marks it recently used.
func (p *pool) cpuGet(h uint64) (*blockMeta, bool) {
	w, _ := p.loc.get(h)
	i := w.cpu
	if i < 0 {
		return nil, false
	}
	p.cpuUnlink(i)
	p.cpuPushFront(i)
	return p.cpuMeta[i], true
}

func (p *pool) cpuHas(h uint64) bool { w, _ := p.loc.get(h); return w.cpu >= 0 }

func (p *pool) hasGPU(h uint64) bool { w, _ := p.loc.get(h); return w.gpu >= 0 }

// cache publishes block id under hash h. The caller emits the event.
func (p *pool) cache(id int32, h uint64, meta *blockMeta) {
	b := &p.blocks[id]
	b.cached, b.hash, b.meta = true, h, meta
	p.loc.setGPU(h, id)
}

// cacheGroup publishes block id under hash h in KV-cache group g.
func (p *pool) cacheGroup(id int32, h uint64, g uint8, meta *blockMeta) {
	b := &p.blocks[id]
	b.cached, b.hash, b.meta, b.group = true, h, meta, g
	p.loc.setGPU(groupKey(h, g), id)
}

// release drops one reference on each block, last block first, so that a
// request's later blocks are evicted before its earlier ones.
func (p *pool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		b := &p.blocks[ids[i]]
		b.ref--
		if b.ref == 0 {
			p.pushTail(ids[i])
		}
	}
}

// clear forgets every cached hash on both tiers; the caller checked that no
// block is in use.
func (p *pool) clear() {
	for i := range p.blocks {
		b := &p.blocks[i]
		b.cached, b.hash, b.meta, b.group = false, 0, nil, 0
	}
	p.loc.reset()
	clear(p.cpuMeta)
	p.cpu, p.cpuMeta, p.cpuFree = p.cpu[:0], p.cpuMeta[:0], p.cpuFree[:0]
	p.cpuHead, p.cpuTail = -1, -1
}

// storedEvent is the BlockStored event of one block (Tokens shared with
// the block's metadata).
func (p *pool) storedEvent(h uint64, m *blockMeta, medium string) Event {
	return Event{
		Kind:      BlockStored,
		Hashes:    p.hashes.one(h),
		Parent:    m.parent,
		HasParent: m.hasParent,
		Tokens:    m.tokens,
		BlockSize: p.blockSize,
		LoRAID:    m.loraID,
		LoRAName:  m.loraName,
		Medium:    medium,
		ExtraKeys: p.extras.one(m.extra),
	}
}
