package tokenize

import (
	"sync"

	"github.com/zeebo/xxh3"
)

// chunkCache maps a text chunk (by its 128-bit hash and length) to its ids,
// least recently used first out, bounded by the bytes its ids take. It is
// safe for concurrent use; the slices it hands out must not be modified.
type chunkCache struct {
	mu     sync.Mutex
	lru    *lru[chunkKey, []uint32]
	hits   uint64
	misses uint64
}

type chunkKey struct {
	h   xxh3.Uint128
	len int
}

// chunkEntryOverhead approximates an entry's bookkeeping bytes.
const chunkEntryOverhead = 128

func newChunkCache(maxBytes int) *chunkCache {
	return &chunkCache{lru: newLRU[chunkKey, []uint32](maxBytes)}
}

func (c *chunkCache) get(h xxh3.Uint128, n int) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, ok := c.lru.get(chunkKey{h, n})
	if !ok {
		c.misses++
		return nil, false
	}
	c.hits++
	return ids, true
}

// put stores a copy of ids; a chunk already held keeps its ids (they are
// the same) and becomes the most recent.
func (c *chunkCache) put(h xxh3.Uint128, n int, ids []uint32) {
	size := len(ids)*4 + chunkEntryOverhead
	if size > c.lru.maxBytes {
		return
	}
	k := chunkKey{h, n}
	cp := append([]uint32(nil), ids...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.lru.get(k); ok {
		return
	}
	c.lru.put(k, cp, size)
}

func (c *chunkCache) stats() (hits, misses uint64, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.lru.size()
}
