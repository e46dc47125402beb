package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// memoryWaitPolicy is kvroute with its memory wait on: a policy that reads
// the decoding ledger.
func memoryWaitPolicy(t *testing.T) policy.Policy {
	t.Helper()
	p, err := policy.New(policy.NameKVRoute, policy.Config{KVRoute: policy.KVRouteConfig{MemoryWait: policy.Float(1)}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ledgerRig is one tracked replica, r0, routed by memoryWaitPolicy, its
// tracker on the rig's clock.
func ledgerRig(t *testing.T) *trackedRig {
	t.Helper()
	g := newTrackedRig(t, 1, memoryWaitPolicy(t))
	g.tr.SetClock(func() time.Time { return g.now })
	return g
}

// For a policy that reads the decoding ledger, a pick charged to the
// router's Tracker carries the request's max_tokens, nothing being learned
// of it yet, as its expected output: from its first token it is in the replica's ledger with its
// prompt and output blocks, until it is done.
func TestDecideHoldJoinsDecodingLedger(t *testing.T) {
	g := ledgerRig(t)
	d, err := g.rt.Decide(t.Context(), Request{Model: model, Tokens: seq(20*16, 1), MaxTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	if got := g.tr.Releases("r0", nil); len(got) != 0 {
		t.Fatalf("before its first token: %+v", got)
	}
	d.Hold.FirstToken()
	g.now = g.now.Add(time.Second)
	got := g.tr.Releases("r0", nil)
	want := load.Release{Blocks: 20 + 64.0/16, Output: 64, Decoding: time.Second}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("ledger %+v, want [%+v]", got, want)
	}
	d.Hold.Done()
	if got := g.tr.Releases("r0", nil); len(got) != 0 {
		t.Fatalf("after done: %+v", got)
	}
	// A policy that reads no ledger (kvroute's default) leaves it empty.
	off := newTrackedRig(t, 1, nil)
	d, err = off.rt.Decide(t.Context(), Request{Model: model, Tokens: seq(20*16, 1), MaxTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	d.Hold.FirstToken()
	if got := off.tr.Releases("r0", nil); len(got) != 0 {
		t.Errorf("memory_wait off: ledger %+v, want empty", got)
	}
	d.Hold.Done()
}

// A max_tokens many finished requests carried is a cap, not an output:
// once they have taught the router what such requests generate, a pick
// joins the ledger with that, and the decision keeps the max_tokens its
// response is learned against.
func TestDecideExpectsTheLearnedOutputOfACap(t *testing.T) {
	g := ledgerRig(t)
	for i := range OutputMinSamples {
		g.rt.Rates().Observe("r0", RateSample{TTFT: time.Second, E2E: 2 * time.Second, Output: 90 + 5*i, MaxTokens: 32000})
	}
	d, err := g.rt.Decide(t.Context(), Request{Model: model, Tokens: seq(20*16, 1), MaxTokens: 32000})
	if err != nil {
		t.Fatal(err)
	}
	if d.MaxTokens != 32000 || d.ExpectedOutputTokens != 108 {
		t.Errorf("decision's max_tokens %d, expected output %d: want 32000 and 108", d.MaxTokens, d.ExpectedOutputTokens)
	}
	d.Hold.FirstToken()
	got := g.tr.Releases("r0", nil)
	want := load.Release{Blocks: 20 + 108.0/16, Output: 108} // the mean of 90..125, rounded up
	if len(got) != 1 || got[0] != want {
		t.Fatalf("ledger %+v, want [%+v]", got, want)
	}
	d.Hold.Done()
}

type releaseMap map[string][]load.Release

func (m releaseMap) Releases(replica string, dst []load.Release) []load.Release {
	return append(dst, m[replica]...)
}

// Only a candidate whose free KV blocks may not hold the request (the
// engine's usage, the prefill charged there and the prompt over its
// blocks) gets its ledger; a replica of unknown size, or with room, none.
func TestFillReleasesWhereMemoryIsShort(t *testing.T) {
	src := releaseMap{
		"full":    {{Blocks: 10, Output: 5}, {Blocks: 20, Output: 6}},
		"queued":  {{Blocks: 30, Output: 7}},
		"roomy":   {{Blocks: 40, Output: 8}},
		"unsized": {{Blocks: 50, Output: 9}},
	}
	off := New(Options{State: fleet(1), Releases: src}) // kvroute's default: memory_wait 0
	sc0 := &scratch{cands: []policy.Candidate{{Replica: "full", Load: load.Load{KVBlocks: 1000, KVUsage: 0.99}}}}
	off.fillReleases(sc0, 50)
	if n := len(sc0.cands[0].Releases); n != 0 {
		t.Errorf("policy reads no releases: full got %d", n)
	}
	p := memoryWaitPolicy(t)
	r := New(Options{State: fleet(1), Releases: src, Policy: p})
	sc := &scratch{cands: []policy.Candidate{
		{Replica: "full", Load: load.Load{KVBlocks: 1000, KVUsage: 0.96}},
		{Replica: "queued", Load: load.Load{KVBlocks: 1000, KVUsage: 0.5, ActivePrefillBlocks: 460}},
		{Replica: "roomy", Load: load.Load{KVBlocks: 1000, KVUsage: 0.5}},
		{Replica: "unsized", Load: load.Load{KVUsage: 0.99}},
	}}
	r.fillReleases(sc, 50)
	want := map[index.ReplicaID]int{"full": 2, "queued": 1, "roomy": 0, "unsized": 0}
	for _, c := range sc.cands {
		if len(c.Releases) != want[c.Replica] {
			t.Errorf("%s: %d releases, want %d", c.Replica, len(c.Releases), want[c.Replica])
		}
		if len(c.Releases) > 0 && c.Releases[0] != src[string(c.Replica)][0] {
			t.Errorf("%s: releases %+v, want %+v", c.Replica, c.Releases, src[string(c.Replica)])
		}
	}
	// One candidate's releases cannot grow into the next one's.
	if full := sc.cands[0].Releases; cap(full) != len(full) {
		t.Errorf("full's releases have room to grow (%d of %d)", len(full), cap(full))
	}
	// A second decision starts afresh: the roomy replica stays without.
	sc.cands[0].Load.KVUsage = 0.1
	r.fillReleases(sc, 50)
	if n := len(sc.cands[0].Releases); n != 0 {
		t.Errorf("full, now roomy: %d releases, want 0", n)
	}
}
