package tokenize

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// byteLevelAlphabet is GPT-2's bytes_to_unicode table: each byte maps to a
// printable rune, which is how byte-level vocabularies spell raw bytes.
var byteLevelAlphabet = func() (t [256]rune) {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = 256 + n
			n++
		}
	}
	return t
}()

// byteLevelInverse maps a byte-level rune back to its byte; ok is false for a
// rune outside the alphabet.
func byteLevelInverse() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteLevelAlphabet {
		m[r] = byte(b)
	}
	return m
}

// merge is one BPE merge rule's outcome: its rank and the merged token.
type merge struct {
	rank uint32
	id   uint32
}

// bpe is a byte-level BPE model over raw bytes: the vocabulary and the merges
// are keyed by the bytes a token stands for, not by their byte-level
// spelling. It is immutable after construction except for the word cache,
// which is safe for concurrent use.
type bpe struct {
	vocab map[string]uint32
	// vocabFilter is a Bloom filter of vocab's keys (two bits of
	// wordFilterBits per key, by wordHash) and maxVocabLen their longest,
	// for ignoreMerges models: a word that is no token (most words of a
	// cold prompt) is told without probing the map of 128k strings,
	// whose cache misses were 13% of a cold Llama-3.1 chat's CPU
	// (profile of BenchmarkChat100k cold).
	vocabFilter  []uint64
	maxVocabLen  int
	tokenBytes   [][]byte // id -> bytes (nil for ids the model lacks)
	byteID       [256]uint32
	hasByte      [256]bool
	merges       mergeTable // (left<<32 | right) -> merge
	ignoreMerges bool
	cache        *wordCache
	char         *charModel // character-level with byte fallback (bpe_char.go); nil for byte-level
	// bytePairs[a<<8|b] is the merge of the single-byte tokens of bytes a
	// and b (rank noRank: none), for byte-level models: a word's first
	// lookups, one per adjacent pair of its bytes, index this 512 KB
	// array instead of probing the merge table.
	bytePairs []merge
}

// fillBytePairs builds bytePairs from the merge table.
func (m *bpe) fillBytePairs() {
	m.bytePairs = make([]merge, 1<<16)
	for a := range 256 {
		for b := range 256 {
			mg := merge{rank: noRank}
			if m.hasByte[a] && m.hasByte[b] {
				if got, ok := m.merges.get(pairKey(m.byteID[a], m.byteID[b])); ok {
					mg = got
				}
			}
			m.bytePairs[a<<8|b] = mg
		}
	}
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// buildVocabFilter fills vocabFilter and maxVocabLen from vocab.
func (m *bpe) buildVocabFilter() {
	bits := 64
	for bits < len(m.vocab)*wordFilterBits {
		bits <<= 1
	}
	m.vocabFilter = make([]uint64, bits/64)
	for w := range m.vocab {
		m.maxVocabLen = max(m.maxVocabLen, len(w))
		a, b := filterBits(wordHash(w), len(m.vocabFilter))
		m.vocabFilter[a>>6] |= 1 << (a & 63)
		m.vocabFilter[b>>6] |= 1 << (b & 63)
	}
}

// inVocab looks word (of hash h, wordHash) up in vocab, through
// vocabFilter when there is one.
func (m *bpe) inVocab(h uint64, word string) (uint32, bool) {
	if f := m.vocabFilter; f != nil {
		if len(word) > m.maxVocabLen {
			return 0, false
		}
		a, b := filterBits(h, len(f))
		if f[a>>6]&(1<<(a&63)) == 0 || f[b>>6]&(1<<(b&63)) == 0 {
			return 0, false
		}
	}
	id, ok := m.vocab[word]
	return id, ok
}

// encodeWord appends the ids of one pre-token (raw bytes) to dst.
func (m *bpe) encodeWord(dst []uint32, word string) ([]uint32, error) {
	cacheable := len(word) <= maxCachedWord
	var h uint64
	if cacheable || m.ignoreMerges {
		h = wordHash(word)
	}
	if m.ignoreMerges {
		if id, ok := m.inVocab(h, word); ok {
			return append(dst, id), nil
		}
	}
	if len(word) == 1 && m.char == nil {
		if !m.hasByte[word[0]] {
			return dst, errByteMissing(word[0])
		}
		return append(dst, m.byteID[word[0]]), nil
	}
	if cacheable {
		if ids, ok := m.cache.lookup(h, word); ok {
			return append(dst, ids...), nil
		}
	}
	start := len(dst)
	var err error
	dst, err = m.mergeWord(dst, word)
	if err != nil {
		return dst[:start], err
	}
	if cacheable {
		m.cache.store(h, word, dst[start:])
	}
	return dst, nil
}

// symbol is one node of the doubly linked list a word is merged on.
type symbol struct {
	id         uint32
	prev, next int32 // -1 at the ends
	size       int32 // bytes covered; 0 once merged into its left neighbour
}

type mergeScratch struct {
	syms []symbol
	res  []uint32
	tree []uint64
}

var scratchPool = sync.Pool{New: func() any { return &mergeScratch{} }}

// mergeWord runs the BPE merges over word's bytes: short byte-level words
// by mergeShort, the rest by mergeLong.
func (m *bpe) mergeWord(dst []uint32, word string) ([]uint32, error) {
	if m.char == nil && len(word) <= maxShortWord {
		return m.mergeShort(dst, word)
	}
	return m.mergeLong(dst, word)
}

// maxShortWord bounds the words mergeShort takes.
const maxShortWord = 24

// noRank marks a pair without a merge rule.
const noRank = ^uint32(0)

// mergeShort is mergeLong for a short byte-level word, without a tree:
// the symbols, each adjacent pair's merge rank and result sit in small
// arrays; each step picks the lowest rank (the leftmost among equals, the
// tree's order) by a scan, merges the pair, closes the gap, and looks up
// only the two pairs the merge changed. For the few symbols of a typical
// word this costs less than the heap's pushes and pops, whose
// unpredictable branches were a quarter of cold encoding (profile of
// BenchmarkChat100k cold).
func (m *bpe) mergeShort(dst []uint32, word string) ([]uint32, error) {
	var ids, ranks, res [maxShortWord]uint32
	n := len(word)
	if n == 0 {
		return dst, nil
	}
	for i := 0; i < n; i++ {
		b := word[i]
		if !m.hasByte[b] {
			return dst, errByteMissing(b)
		}
		ids[i] = m.byteID[b]
	}
	pair := func(i int) {
		if mg, ok := m.merges.get(pairKey(ids[i], ids[i+1])); ok {
			ranks[i], res[i] = mg.rank, mg.id
		} else {
			ranks[i] = noRank
		}
	}
	for i := 0; i+1 < n; i++ {
		mg := m.bytePairs[uint16(word[i])<<8|uint16(word[i+1])]
		ranks[i], res[i] = mg.rank, mg.id
	}
	for n > 1 {
		best, r := 0, ranks[0]
		for i := 1; i < n-1; i++ {
			if ranks[i] < r {
				best, r = i, ranks[i]
			}
		}
		if r == noRank {
			break
		}
		ids[best] = res[best]
		copy(ids[best+1:n-1], ids[best+2:n])
		if best+2 < n-1 { // pairs right of the merged one move left
			copy(ranks[best+1:n-2], ranks[best+2:n-1])
			copy(res[best+1:n-2], res[best+2:n-1])
		}
		n--
		if best > 0 {
			pair(best - 1)
		}
		if best+1 < n {
			pair(best)
		}
	}
	return append(dst, ids[:n]...), nil
}

// mergeLong runs the BPE merges over word's bytes (or, for a
// character-level model, its characters) on a tournament tree.
//
// The symbols are a doubly linked list over the word's initial symbols;
// each live symbol with a right neighbour has one pair, whose order key is
// its merge's rank in the high half and its position in the low half
// (noPair without a merge rule). The tree's leaves are those keys by
// position, and every inner node holds the least key below it, so the
// root is the pair to merge: the lowest rank, leftmost among equals, as
// HuggingFace's Word::merge_all picks with its heap. A merge changes three
// leaves (the merged pair, the absorbed symbol's, the left neighbour's)
// and each change is one walk up the tree taking the least of two
// children, without branches on the keys. A binary heap instead popped a
// stale entry for about every valid one and its sift-down branches were
// unpredictable: it was the largest single cost of a cold prompt's long
// pieces (CJK and symbol runs of hundreds of bytes, which the word cache
// does not keep).
func (m *bpe) mergeLong(dst []uint32, word string) ([]uint32, error) {
	sc := scratchPool.Get().(*mergeScratch)
	defer scratchPool.Put(sc)
	syms := sc.syms[:0]
	if m.char != nil {
		var err error
		if syms, err = m.charSymbols(syms, word); err != nil {
			return dst, err
		}
	} else {
		for i := 0; i < len(word); i++ {
			b := word[i]
			if !m.hasByte[b] {
				return dst, errByteMissing(b)
			}
			syms = append(syms, symbol{id: m.byteID[b], prev: int32(i) - 1, next: int32(i) + 1, size: 1})
		}
	}
	sc.syms = syms
	n := len(syms)
	if n == 0 {
		return dst, nil
	}
	syms[n-1].next = -1
	leaves := 1
	for leaves < n {
		leaves <<= 1
	}
	if cap(sc.tree) < 2*leaves {
		sc.tree = make([]uint64, 2*leaves)
	}
	if cap(sc.res) < n {
		sc.res = make([]uint32, n)
	}
	tree, res := sc.tree[:2*leaves], sc.res[:n]
	leaf := tree[leaves:]
	if m.char == nil { // byte-level: every symbol is a byte
		for i := 0; i+1 < n; i++ {
			mg := m.bytePairs[uint16(word[i])<<8|uint16(word[i+1])]
			leaf[i] = pairOrder(mg.rank, int32(i))
			res[i] = mg.id
		}
	} else {
		for i := 0; i+1 < n; i++ {
			mg, ok := m.merges.get(pairKey(syms[i].id, syms[i+1].id))
			if !ok {
				mg.rank = noRank
			}
			leaf[i] = pairOrder(mg.rank, int32(i))
			res[i] = mg.id
		}
	}
	for i := n - 1; i < leaves; i++ {
		leaf[i] = noPair
	}
	for j := leaves - 1; j > 0; j-- {
		tree[j] = min(tree[2*j], tree[2*j+1])
	}
	// set changes leaf i's key and the least keys above it. The new least
	// is carried up in a register (each node: the least of the carried
	// key and its sibling's), so no level waits on the store of the one
	// below it.
	set := func(i int32, k uint64) {
		j := leaves + int(i)
		tree[j] = k
		for j > 1 {
			k = min(k, tree[j^1])
			j >>= 1
			tree[j] = k
		}
	}
	// pair looks up the merge of l with its right neighbour r.
	pair := func(l int32, r int32) uint64 {
		mg, ok := m.merges.get(pairKey(syms[l].id, syms[r].id))
		if !ok {
			return noPair
		}
		res[l] = mg.id
		return pairOrder(mg.rank, l)
	}
	for tree[1] != noPair {
		pos := int32(uint32(tree[1]))
		l := &syms[pos]
		ri := l.next
		r := &syms[ri]
		l.id = res[pos]
		l.size += r.size
		r.size = 0
		l.next = r.next
		// Both lookups before the tree changes: their cache misses in
		// the merge table overlap.
		right, left := noPair, noPair
		if l.next >= 0 {
			syms[l.next].prev = pos
			right = pair(pos, l.next)
		}
		if l.prev >= 0 {
			left = pair(l.prev, pos)
		}
		set(ri, noPair)
		set(pos, right)
		if l.prev >= 0 {
			set(l.prev, left)
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst, nil
}

// noPair is the order key of a symbol without a pair to merge: above every
// pairOrder.
const noPair = ^uint64(0)

// pairOrder is a pair's order key: rank, then position (noPair when the
// rank is noRank).
func pairOrder(rank uint32, pos int32) uint64 {
	if rank == noRank {
		return noPair
	}
	return uint64(rank)<<32 | uint64(uint32(pos))
}

// wordCacheEntries bounds the word cache of each model.
const wordCacheEntries = 1 << 16

// maxCachedWord bounds the pre-tokens the word cache keeps: long pieces (runs
// of white space or symbols) are rare and would crowd out common words.
const maxCachedWord = 256

// wordCache is a bounded, sharded map from pre-token to ids. A full shard is
// emptied rather than evicted piecemeal: the cache only saves time, and
// common words come straight back.
//
// Each shard's map is allocated at its full size once (it never grows,
// so it never rehashes), and the keys' bytes and the ids are copied into
// blocks the shard appends to, not one allocation each (a cold prompt
// puts thousands of words). A block is only ever appended to: a slice a
// reader got stays valid, and a full block or an emptied shard starts a
// new one (the old one lives on while a slice of it is in use).
//
// Each shard also keeps a Bloom filter of the words put since it was last
// emptied (two bits of wordFilterBits per word, read and set atomically):
// a word whose bits are not both set was never put, and its lookup ends
// there, without the shard's lock or map. On a prompt of novel words (a
// cold prompt) that was most of the cache's cost: a lookup that missed
// took the read lock, hashed the word again and probed a map of
// megabytes, ≈ 14% of the CPU of a cold 100k-token chat (profile of
// BenchmarkChat100k cold). A full shard's filter answers "maybe" for
// 1–2% of novel words (which then look in the map, as before). The
// filter only ever says "maybe" wrongly, never "no", except while a put
// or an emptying is under way, when either answer is right: a missed
// word is merged again, to the same ids.
type wordCache struct {
	shards   [16]cacheShard
	perShard int
}

type cacheShard struct {
	mu     sync.RWMutex
	m      map[string][]uint32
	ids    []uint32 // the current block of ids
	text   []byte   // the current block of key bytes
	filter []atomic.Uint64
}

// Block sizes of the word cache's shards.
const (
	wordCacheIDBlock   = 2048
	wordCacheTextBlock = 8192
)

// wordFilterBits is the size of a shard's Bloom filter per word it holds
// (16 bits a word, two of them set: 1.4% false "maybe" when full).
const wordFilterBits = 16

func newWordCache(capacity int) *wordCache {
	c := &wordCache{perShard: max(capacity/16, 1)}
	bits := 64
	for bits < c.perShard*wordFilterBits {
		bits <<= 1
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32, c.perShard)
		c.shards[i].filter = make([]atomic.Uint64, bits/64)
	}
	return c
}

// wordHash is FNV-1a (64 bits) of w: its low 4 bits pick the shard, bits
// above them the filter's two bits.
func wordHash(w string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(w); i++ {
		h = (h ^ uint64(w[i])) * 1099511628211
	}
	return h
}

// filterBits are the positions of the two filter bits of a word of hash h
// in a filter of n words (n a power of two).
func filterBits(h uint64, n int) (uint64, uint64) {
	mask := uint64(n*64 - 1)
	return (h >> 4) & mask, (h >> 34) & mask
}

func (c *wordCache) get(w string) ([]uint32, bool) { return c.lookup(wordHash(w), w) }

func (c *wordCache) put(w string, ids []uint32) { c.store(wordHash(w), w, ids) }

// lookup is get for a word of hash h (wordHash).
func (c *wordCache) lookup(h uint64, w string) ([]uint32, bool) {
	s := &c.shards[h&15]
	a, b := filterBits(h, len(s.filter))
	if s.filter[a>>6].Load()&(1<<(a&63)) == 0 || s.filter[b>>6].Load()&(1<<(b&63)) == 0 {
		return nil, false
	}
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

// store is put for a word of hash h (wordHash): it stores copies of w
// (which may point into a large prompt) and ids.
func (c *wordCache) store(h uint64, w string, ids []uint32) {
	if w == "" {
		return
	}
	s := &c.shards[h&15]
	s.mu.Lock()
	if len(s.m) >= c.perShard {
		clear(s.m)
		s.ids, s.text = nil, nil
		for i := range s.filter {
			s.filter[i].Store(0)
		}
	}
	if cap(s.ids)-len(s.ids) < len(ids) {
		s.ids = make([]uint32, 0, max(wordCacheIDBlock, len(ids)))
	}
	if cap(s.text)-len(s.text) < len(w) {
		s.text = make([]byte, 0, max(wordCacheTextBlock, len(w)))
	}
	i, t := len(s.ids), len(s.text)
	s.ids = append(s.ids, ids...)
	s.text = append(s.text, w...)
	s.m[unsafe.String(&s.text[t], len(w))] = s.ids[i:len(s.ids):len(s.ids)]
	a, b := filterBits(h, len(s.filter))
	s.filter[a>>6].Or(1 << (a & 63))
	s.filter[b>>6].Or(1 << (b & 63))
	s.mu.Unlock()
}

// mergeTable maps a pair key (pairKey) to its merge: open addressing with
// linear probing over one array of 16-byte slots, at most half full, so a
// lookup is a multiply, a shift and usually one cache line. It replaces a
// Go map, whose lookups were a fifth of cold encoding's time (profile of
// Benchmark100kTokenPrompt cold). Immutable after construction.
type mergeTable struct {
	slots []mergeSlot
	shift uint
}

type mergeSlot struct {
	key uint64 // emptyPair when free
	merge
}

// emptyPair is no pair's key: ids are below 2^32-1.
const emptyPair = ^uint64(0)

func newMergeTable(n int) mergeTable {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	t := mergeTable{slots: make([]mergeSlot, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	for i := range t.slots {
		t.slots[i].key = emptyPair
	}
	return t
}

func (t *mergeTable) slot(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> t.shift) }

// set adds or replaces k's merge (a repeated pair keeps its last rank).
func (t *mergeTable) set(k uint64, m merge) {
	mask := len(t.slots) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == k || s.key == emptyPair {
			s.key, s.merge = k, m
			return
		}
	}
}

func (t *mergeTable) get(k uint64) (merge, bool) {
	mask := len(t.slots) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == k {
			return s.merge, true
		}
		if s.key == emptyPair {
			return merge{}, false
		}
	}
}
