package tokenize

import (
	"math/rand/v2"
	"testing"
)

// TestMergeTableMatchesMap: the open-addressing table answers like a Go map
// for present and absent keys (key 0 and colliding keys included), and a
// repeated key keeps its last value.
func TestMergeTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[uint64]merge{}
	var keys []uint64
	for i := range 5000 {
		k := pairKey(rng.Uint32N(3000), rng.Uint32N(3000))
		if i == 0 {
			k = 0
		}
		keys = append(keys, k)
	}
	tab := newMergeTable(len(keys))
	for i, k := range keys {
		m := merge{rank: uint32(i), id: uint32(i * 7)}
		want[k] = m
		tab.set(k, m)
	}
	for range 20000 {
		k := pairKey(rng.Uint32N(3100), rng.Uint32N(3100))
		keys = append(keys, k)
	}
	for _, k := range keys {
		got, ok := tab.get(k)
		w, wok := want[k]
		if ok != wok || got != w {
			t.Fatalf("key %#x: table %v %v, map %v %v", k, got, ok, w, wok)
		}
	}
	if filled := len(want); 2*filled > len(tab.slots) {
		t.Fatalf("%d keys in %d slots: over half full", filled, len(tab.slots))
	}
}
