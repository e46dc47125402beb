package tokenize

import (
	"container/list"
	"sync"

	"github.com/zeebo/xxh3"
)

// chunkCache maps a text chunk (by its 128-bit hash and length) to its ids,
// least recently used first out, bounded by the bytes its ids take. It is
// safe for concurrent use; the slices it hands out must not be modified.
type chunkCache struct {
	mu       sync.Mutex
	maxBytes int
	bytes    int
	ll       *list.List
	items    map[chunkKey]*list.Element
	hits     uint64
	misses   uint64
}

type chunkKey struct {
	h   xxh3.Uint128
	len int
}

type chunkEntry struct {
	key chunkKey
	ids []uint32
}

// chunkEntryOverhead approximates an entry's bookkeeping bytes.
const chunkEntryOverhead = 128

func newChunkCache(maxBytes int) *chunkCache {
	return &chunkCache{maxBytes: maxBytes, ll: list.New(), items: map[chunkKey]*list.Element{}}
}

func (c *chunkCache) get(h xxh3.Uint128, n int) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[chunkKey{h, n}]
	if !ok {
		c.misses++
		return nil, false
	}
	c.hits++
	c.ll.MoveToFront(e)
	return e.Value.(*chunkEntry).ids, true
}

func (c *chunkCache) put(h xxh3.Uint128, n int, ids []uint32) {
	size := len(ids)*4 + chunkEntryOverhead
	if size > c.maxBytes {
		return
	}
	k := chunkKey{h, n}
	cp := append([]uint32(nil), ids...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[k]; ok {
		c.ll.MoveToFront(e)
		return
	}
	c.items[k] = c.ll.PushFront(&chunkEntry{key: k, ids: cp})
	c.bytes += size
	for c.bytes > c.maxBytes {
		last := c.ll.Back()
		ent := last.Value.(*chunkEntry)
		c.ll.Remove(last)
		delete(c.items, ent.key)
		c.bytes -= len(ent.ids)*4 + chunkEntryOverhead
	}
}

func (c *chunkCache) stats() (hits, misses uint64, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.bytes
}
