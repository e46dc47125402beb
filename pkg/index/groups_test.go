package index

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

func TestHeldAndEngineKey(t *testing.T) {
	ix := New(Config{})
	root := kvblock.Root("m", "")
	toks := make([]uint32, 4*4)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	keys := kvblock.Keys(nil, root, toks, 4, kvblock.Options{})
	if r := ix.Stored(Stored{Replica: "a", Root: root, Hashes: []uint64{11, 12, 13, 14}, Tokens: toks, BlockSize: 4, Tier: TierGPU}); r.Blocks != 4 {
		t.Fatalf("stored %+v", r)
	}
	ix.Removed(Removed{Replica: "a", Hashes: []uint64{12}, Tier: TierGPU})
	got := ix.Held("a", keys, nil)
	if want := []bool{true, false, true, true}; len(got) != 4 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("held %v, want %v", got, want)
	}
	if got := ix.Held("b", keys[:2], nil); got[0] || got[1] {
		t.Errorf("unknown replica holds %v", got)
	}
	if k, ok := ix.EngineKey("a", 13); !ok || k != keys[2] {
		t.Errorf("EngineKey(13) = %v %v, want %v", k, ok, keys[2])
	}
	if _, ok := ix.EngineKey("a", 12); ok {
		t.Error("a removed hash still maps to a key")
	}
	if _, ok := ix.EngineKey("b", 13); ok {
		t.Error("an unknown replica maps a hash")
	}
}
