package tokenize

import (
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// order lists c's keys, most recent first, checking the links both ways
// and the byte count.
func lruOrder[K comparable, V any](t *testing.T, c *lru[K, V]) []K {
	t.Helper()
	var keys []K
	bytes := 0
	for e := c.root.next; e != &c.root; e = e.next {
		if e.next.prev != e {
			t.Fatalf("broken back link at %v", e.key)
		}
		if c.items[e.key] != e {
			t.Fatalf("entry %v not in the map", e.key)
		}
		keys = append(keys, e.key)
		bytes += e.size
	}
	if len(keys) != c.len() || bytes != c.size() {
		t.Fatalf("list holds %d entries, %d bytes; map %d, count %d", len(keys), bytes, c.len(), c.size())
	}
	return keys
}

func TestLRUEvictsLeastRecentByBytes(t *testing.T) {
	c := newLRU[string, int](10)
	c.put("a", 1, 4)
	c.put("b", 2, 4)
	if got := lruOrder(t, c); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("order %v", got)
	}
	if v, ok := c.get("a"); !ok || v != 1 {
		t.Fatalf("get a = %v, %v", v, ok)
	}
	c.put("c", 3, 4) // 12 bytes: b, the least recent, goes
	if got := lruOrder(t, c); !slices.Equal(got, []string{"c", "a"}) {
		t.Fatalf("order %v", got)
	}
	if _, ok := c.get("b"); ok {
		t.Fatal("b survived eviction")
	}
	// Replacing a value re-counts its size and may evict others.
	c.put("a", 10, 9)
	if got := lruOrder(t, c); !slices.Equal(got, []string{"a"}) || c.size() != 9 {
		t.Fatalf("order %v, %d bytes", got, c.size())
	}
	if v, _ := c.get("a"); v != 10 {
		t.Fatalf("a = %d after replacement", v)
	}
	// A value over the whole bound is refused; the older one stays.
	c.put("a", 11, 11)
	c.put("d", 4, 11)
	if v, _ := c.get("a"); v != 10 || c.len() != 1 {
		t.Fatalf("a = %d, %d entries after oversized puts", v, c.len())
	}
	// Shrinking a value frees room.
	c.put("a", 12, 1)
	c.put("e", 5, 9)
	if got := lruOrder(t, c); !slices.Equal(got, []string{"e", "a"}) || c.size() != 10 {
		t.Fatalf("order %v, %d bytes", got, c.size())
	}
}

func TestLRUCountBound(t *testing.T) {
	c := newIDsCache(3)
	for i := range 5 {
		c.put(hashKey(i), []uint32{uint32(i)})
	}
	for i := range 5 {
		ids, ok := c.get(hashKey(i))
		if want := i >= 2; ok != want || ok && ids[0] != uint32(i) {
			t.Fatalf("entry %d: %v, %v", i, ids, ok)
		}
	}
}

func hashKey(i int) xxh3.Uint128 { return xxh3.Uint128{Lo: uint64(i)} }
