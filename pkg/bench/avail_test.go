package bench

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"
)

// hashTable agrees with a map through growth, with hash 0 and with keys
// that share their home slot.
func TestHashTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab hashTable[int64]
	model := map[uint64]int64{}
	keys := []uint64{0}
	for range 20000 {
		var h uint64
		switch rng.IntN(4) {
		case 0:
			h = keys[rng.IntN(len(keys))]
		case 1:
			h = uint64(rng.IntN(64)) << 58 // same low bits: collide after the multiply's top bits vary little
		default:
			h = rng.Uint64()
			keys = append(keys, h)
		}
		v, added := tab.ref(h)
		if _, ok := model[h]; ok == added {
			t.Fatalf("ref(%x) added=%v, model has it %v", h, added, ok)
		}
		*v += 3
		model[h] += 3
	}
	if tab.n+1 != len(model) && tab.n != len(model) {
		t.Fatalf("%d entries (+ zero %v), model %d", tab.n, tab.hasZero, len(model))
	}
	for h, want := range model {
		if got, ok := tab.get(h); !ok || got != want {
			t.Fatalf("get(%x) = %d %v, want %d", h, got, ok, want)
		}
	}
	if _, ok := tab.get(12345); ok {
		if _, in := model[12345]; !in {
			t.Fatal("phantom key")
		}
	}
}

// A table large enough to live outside the Go heap (package hugemem) keeps
// its entries through growth, a clone is independent of its original, and
// free gives the memory back.
func TestHashTableOffHeapCloneFree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tab hashTable[int64]
	keys := make([]uint64, 300000)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
		v, _ := tab.ref(keys[i])
		*v = int64(i)
	}
	if runtime.GOOS == "linux" && tab.mem == nil {
		t.Fatalf("%d slots of %d bytes stayed on the heap", len(tab.slots), unsafe.Sizeof(tab.slots[0]))
	}
	c := tab.clone()
	for i, h := range keys {
		v, added := c.ref(h)
		if added || *v != int64(i) {
			t.Fatalf("clone: key %d reads %d (added %v)", i, *v, added)
		}
		*v = -1
	}
	tab.free()
	if _, ok := tab.get(keys[0]); ok || tab.n != 0 {
		t.Fatal("a freed table still holds entries")
	}
	for _, h := range keys {
		if v, ok := c.get(h); !ok || v != -1 {
			t.Fatalf("clone after the original's free: %d %v", v, ok)
		}
	}
	c.free()
	if c.mem != nil || c.slots != nil {
		t.Fatal("free kept the slot array")
	}
}
