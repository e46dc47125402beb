package route

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// A replica's share of a prefix's placements is its share of their prompt
// blocks: one 1,200-block document outweighs nine 40-block chats spread
// over three others, while the placements are counted one each and halve
// per PrefixShareHalfLife; the shares, a ratio, do not decay.
func TestPrefixSharesWeighPrompts(t *testing.T) {
	p := newPrefixShares(16)
	k := kvblock.Key(7)
	t0 := time.Unix(1000, 0)
	p.record(k, "r0", 1200, t0)
	for i := range 9 {
		p.record(k, index.ReplicaID([]string{"r1", "r2", "r3"}[i%3]), 40, t0)
	}
	p.record(kvblock.Key(8), "r1", 1, t0) // another prefix
	check := func(at time.Time, wantCount float64) {
		t.Helper()
		got := map[index.ReplicaID]float64{}
		n := p.get(k, at, func(r index.ReplicaID, share float64) { got[r] = share })
		if math.Abs(n-wantCount) > 1e-9 {
			t.Errorf("placements %v, want %v", n, wantCount)
		}
		want := map[index.ReplicaID]float64{"r0": 1200.0 / 1560, "r1": 120.0 / 1560, "r2": 120.0 / 1560, "r3": 120.0 / 1560}
		for r, w := range want {
			if math.Abs(got[r]-w) > 1e-9 {
				t.Errorf("%s share %v, want %v", r, got[r], w)
			}
		}
	}
	check(t0, 10)
	check(t0.Add(PrefixShareHalfLife), 5)
	if n := p.get(kvblock.Key(9), t0, func(index.ReplicaID, float64) { t.Error("an unknown prefix has no shares") }); n != 0 {
		t.Errorf("unknown prefix: %v placements", n)
	}
	// A placement of no blocks still counts, as one block.
	p.record(k, "r3", 0, t0)
	got := 0.0
	p.get(k, t0, func(r index.ReplicaID, share float64) {
		if r == "r3" {
			got = share
		}
	})
	if want := 121.0 / 1561; math.Abs(got-want) > 1e-9 {
		t.Errorf("r3 after an empty prompt: share %v, want %v", got, want)
	}
}
