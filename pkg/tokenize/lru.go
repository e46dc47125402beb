package tokenize

// lru is a map bounded by the bytes its entries take, least recently used
// out first. Each entry's size is given when it is stored. It is not safe
// for concurrent use: its owners (chunkCache, convMemo) lock around it and
// keep their own counters.
type lru[K comparable, V any] struct {
	maxBytes int
	bytes    int
	items    map[K]*lruEntry[K, V]
	root     lruEntry[K, V] // sentinel: root.next is the most recent
}

type lruEntry[K comparable, V any] struct {
	key        K
	val        V
	size       int
	prev, next *lruEntry[K, V]
}

func newLRU[K comparable, V any](maxBytes int) *lru[K, V] {
	c := &lru[K, V]{maxBytes: maxBytes, items: map[K]*lruEntry[K, V]{}}
	c.root.prev, c.root.next = &c.root, &c.root
	return c
}

// get returns k's value and makes it the most recent.
func (c *lru[K, V]) get(k K) (V, bool) {
	e, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.toFront(e)
	return e.val, true
}

// put stores v under k (replacing an older value), most recent first, and
// evicts the least recent entries until the bytes fit. A value larger
// than the whole bound is not stored (and an older value is kept).
func (c *lru[K, V]) put(k K, v V, size int) {
	if size > c.maxBytes {
		return
	}
	if e, ok := c.items[k]; ok {
		c.bytes += size - e.size
		e.val, e.size = v, size
		c.toFront(e)
	} else {
		e := &lruEntry[K, V]{key: k, val: v, size: size}
		c.items[k] = e
		c.bytes += size
		c.link(e)
	}
	for c.bytes > c.maxBytes {
		last := c.root.prev
		c.unlink(last)
		delete(c.items, last.key)
		c.bytes -= last.size
	}
}

// size is the bytes the entries take.
func (c *lru[K, V]) size() int { return c.bytes }

// len is the number of entries.
func (c *lru[K, V]) len() int { return len(c.items) }

func (c *lru[K, V]) toFront(e *lruEntry[K, V]) {
	if c.root.next == e {
		return
	}
	c.unlink(e)
	c.link(e)
}

func (c *lru[K, V]) link(e *lruEntry[K, V]) {
	e.prev, e.next = &c.root, c.root.next
	c.root.next.prev = e
	c.root.next = e
}

func (c *lru[K, V]) unlink(e *lruEntry[K, V]) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}
