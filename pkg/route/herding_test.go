package route

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// herdingBurst replays the e2e herding burst (TestSharedSystemPromptDoesNotHerd)
// on a router with a tracker-backed fleet of 4: a long system prompt held by
// r0, then 64 requests sharing it in four waves of 16 (one per client of a
// closed loop). Wave 1 arrives while only r0 holds the prompt; the others
// prefill it for their first requests, so r0's requests finish first and
// wave 2 finds the others still busy; waves 3 and 4 find every replica
// holding the prompt and idle. It returns the requests r0 took.
func herdingBurst(t *testing.T, cfg policy.KVRouteConfig) int {
	t.Helper()
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &trackerState{fakeState: fleet(4), t: tr}
	ix := index.New(index.Config{})
	sys := seq(213*16, 7)
	store(t, ix, "r0", model, sys, 16)
	p, err := policy.NewKVRoute(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt := New(Options{Matcher: ix, State: st, Policy: p, Seed: 1, Tracker: tr})
	holder, i := 0, 0
	wave := func() []Decision {
		var out []Decision
		for range 16 {
			i++
			tokens := append(append([]uint32(nil), sys...), seq(16*16, uint32(1000000+1000*i))...)
			d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: tokens})
			if err != nil {
				t.Fatal(err)
			}
			if d.Replica == "r0" {
				holder++
			}
			out = append(out, d)
		}
		return out
	}
	first := wave()
	for _, d := range first { // r0's hits finish first; the others still prefill
		if d.Replica == "r0" {
			d.Hold.Done()
		}
	}
	for _, r := range []index.ReplicaID{"r1", "r2", "r3"} {
		store(t, ix, r, model, sys, 16) // their first requests computed the prompt
	}
	second := wave()
	for _, d := range append(first, second...) {
		d.Hold.Done()
	}
	for range 2 {
		for _, d := range wave() {
			d.Hold.Done()
		}
	}
	return holder
}

// The burst on a prefix one replica holds spreads: no replica takes more
// than 40% of it (the e2e test's bound). Without the prefix share bound
// the prediction, rightly per request, keeps choosing the holder (its
// hits are faster than a cold replica's prefill of the prompt) and it
// takes more.
func TestSharedPrefixBurstDoesNotHerd(t *testing.T) {
	got := herdingBurst(t, policy.KVRouteConfig{})
	t.Logf("holder took %d of 64 with the default prefix share bound", got)
	if got*10 > 64*4 {
		t.Errorf("the prefix holder took %d of 64 requests (> 40%%)", got)
	}
	off := 0.0
	without := herdingBurst(t, policy.KVRouteConfig{PrefixShareBound: &off})
	t.Logf("holder took %d of 64 without it", without)
	if without*10 <= 64*4 {
		t.Errorf("without the prefix share bound the holder took only %d of 64: the test no longer reproduces the herding it guards against", without)
	}
}
