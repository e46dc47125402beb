package route

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/policy"
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
		n, _ := p.get(k, at, func(r index.ReplicaID, share float64) { got[r] = share })
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
	if n, peak := p.get(kvblock.Key(9), t0, func(index.ReplicaID, float64) { t.Error("an unknown prefix has no shares") }); n != 0 || peak != 0 {
		t.Errorf("unknown prefix: %v placements, peak %v", n, peak)
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

// A prefix's peak is the largest count its placements reached, remembered
// after the burst is over and halved per PrefixBurstHalfLife; a smaller
// burst later does not lower it, a larger one raises it.
func TestPrefixSharesRememberTheLargestBurst(t *testing.T) {
	p := newPrefixShares(16)
	k := kvblock.Key(7)
	t0 := time.Unix(1000, 0)
	peakAt := func(at time.Time) (float64, float64) {
		t.Helper()
		return p.get(k, at, func(index.ReplicaID, float64) {})
	}
	for range 12 {
		p.record(k, "r0", 10, t0)
	}
	if n, peak := peakAt(t0); n != 12 || peak != 12 {
		t.Errorf("during the burst: %v placements, peak %v; want 12, 12", n, peak)
	}
	// Thirty seconds on, the count is all but gone; the peak is not.
	t1 := t0.Add(30 * time.Second)
	wantPeak := 12 * math.Exp2(-30/PrefixBurstHalfLife.Seconds())
	if n, peak := peakAt(t1); n > 1e-6 || math.Abs(peak-wantPeak) > 1e-9 {
		t.Errorf("after the burst: %v placements, peak %v; want about 0, %v", n, peak, wantPeak)
	}
	// The next burst's first placement reads the last burst's size.
	p.record(k, "r1", 10, t1)
	if n, peak := peakAt(t1); math.Abs(n-1) > 1e-6 || math.Abs(peak-wantPeak) > 1e-9 {
		t.Errorf("a new burst's first placement: %v placements, peak %v; want 1, %v", n, peak, wantPeak)
	}
	for range 19 {
		p.record(k, "r1", 10, t1)
	}
	if _, peak := peakAt(t1); math.Abs(peak-20) > 1e-6 {
		t.Errorf("a larger burst: peak %v, want 20", peak)
	}
	if _, peak := peakAt(t1.Add(PrefixBurstHalfLife)); math.Abs(peak-10) > 1e-6 {
		t.Errorf("a half-life on: peak %v, want 10", peak)
	}
}

// Decide reads the prefix's last burst to the policy: the first request
// of a prefix's next burst sees the count near zero and the last burst's
// size as Request.PrefixBurst; Explain records no placement.
func TestDecideReadsThePrefixsLastBurst(t *testing.T) {
	ix := index.New(index.Config{})
	sys := seq(8*16, 1)
	for _, r := range []index.ReplicaID{"r0", "r1", "r2"} {
		store(t, ix, r, model, sys, 16)
	}
	now := time.Unix(1000, 0)
	rp := &recordingPolicy{pick: 1}
	rt := New(Options{Matcher: ix, State: fleet(3), Policy: rp, Seed: 1, Now: func() time.Time { return now }})
	ask := func(i int, decide bool) policy.Request {
		t.Helper()
		req := Request{Model: model, Tokens: extend(sys, 64, uint32(100000+1000*i))}
		var err error
		if decide {
			_, err = rt.Decide(t.Context(), req)
		} else {
			_, err = rt.Explain(t.Context(), req)
		}
		if err != nil {
			t.Fatal(err)
		}
		return rp.req
	}
	for i := range 10 {
		if got := ask(i, true); got.PrefixPlacements != float64(i) || got.PrefixBurst != float64(i) {
			t.Fatalf("request %d of the burst: placements %v, burst %v; want %d, %d", i, got.PrefixPlacements, got.PrefixBurst, i, i)
		}
	}
	now = now.Add(30 * time.Second)
	want := 10 * math.Exp2(-30/PrefixBurstHalfLife.Seconds())
	// Explain, then Decide, see the count near zero; an Explain after
	// the Decide sees its placement.
	for i, step := range []struct {
		decide bool
		count  float64
	}{{false, 0}, {true, 0}, {false, 1}} {
		got := ask(20, step.decide)
		if math.Abs(got.PrefixPlacements-step.count) > 1e-3 || math.Abs(got.PrefixBurst-want) > 1e-6 {
			t.Errorf("step %d: placements %v, burst %v; want %v, %v", i, got.PrefixPlacements, got.PrefixBurst, step.count, want)
		}
	}
}
