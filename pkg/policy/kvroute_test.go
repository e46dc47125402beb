package policy

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

func TestWeightedScores(t *testing.T) {
	w, err := NewWeighted(WeightedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	a := withReqs(cand("a", 8, 0, 0), 0, 4) // full match, longest queue
	a.Load.KVUsage = 0.5
	b := withReqs(cand("b", 2, 0, 0), 0, 0) // quarter match, empty queue
	b.Load.KVUsage = 0.9
	c := withReqs(cand("c", 0, 0, 0), 0, 2)
	c.Load.KVUsage = 0
	got := w.Scores(Request{PromptBlocks: 8}, []Candidate{a, b, c})
	// prefix*3 + queue*2 + (1-kv)*2, each scorer normalised to [0, 1].
	want := []float64{3*1 + 2*0 + 2*0.5, 3*0.25 + 2*1 + 2*0.1, 3*0 + 2*0.5 + 2*1}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Errorf("score[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	res := w.Pick(Request{PromptBlocks: 8}, []Candidate{a, b, c}, seeded(1))
	if res.Pick != 0 || res.Reason != ReasonScore || res.Costs[0] != -want[0] {
		t.Errorf("pick %+v, want 0 with the highest score", res)
	}
	// All queues equal: the queue scorer gives everyone 1 and no longer
	// separates them.
	eq := w.Scores(Request{PromptBlocks: 8}, []Candidate{withReqs(cand("a", 0, 0, 0), 0, 3), withReqs(cand("b", 0, 0, 0), 0, 3)})
	if eq[0] != 4 || eq[1] != 4 {
		t.Errorf("equal queues scored %v, want 2*1 + 2*1 each", eq)
	}
	// Weights are knobs.
	w2, _ := NewWeighted(WeightedConfig{PrefixWeight: Float(0), QueueWeight: Float(1), KVUtilizationWeight: Float(0)})
	if res := w2.Pick(Request{PromptBlocks: 8}, []Candidate{a, b, c}, seeded(1)); res.Pick != 1 {
		t.Errorf("queue-only pick %d, want the empty queue (1)", res.Pick)
	}
}

// blk and stp are the default pace of a request without a block size
// (16 tokens a block at 16,000 tokens/s, an 8 ms step): the seconds of one
// prefill block and of one decode step.
const (
	blk = 16 / DefaultKVRoutePrefillRate
	stp = DefaultKVRouteDecodeStep
)

// secs turns a prediction written in blocks (and Requests in steps) into
// seconds at the default pace, with the step that samples the first token.
func secs(p Prediction) Prediction {
	return Prediction{Wait: blk * p.Wait, Own: blk * p.Own, Move: blk * p.Move, Memory: blk * p.Memory,
		Decode: blk * p.Decode, Step: stp, Requests: stp * p.Requests}
}

func TestKVRoutePredict(t *testing.T) {
	k, err := NewKVRoute(KVRouteConfig{})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptBlocks: 10, ExpectedOutputBlocks: 4}
	idle := Fleet{HomeOwn: math.Inf(1)}
	tests := []struct {
		name string
		c    Candidate
		f    Fleet
		want Prediction // blocks; Requests in steps
	}{
		{"idle, cold", cand("a", 0, 0, 0), idle, Prediction{Own: 10}},
		{"idle, 6 matched", cand("a", 6, 0, 0), idle, Prediction{Own: 4}},
		{"half the backlog is still queued", cand("a", 10, 30, 0), idle, Prediction{Wait: 15}},
		{"a hit beyond the prompt is clamped", cand("a", 12, 0, 0), idle, Prediction{}},
		{"a step per waiting request, a sequence's share per running one", withReqs(cand("a", 0, 0, 0), 3, 1), idle, Prediction{Own: 10, Requests: 1 + 0.02*3}},
		{"a move costs the extra prefill times the pressure", cand("a", 0, 0, 0), Fleet{HomeOwn: 2, Pressure: 3}, Prediction{Own: 10, Move: 3 * 8}},
		{"no home: no move charge", cand("a", 0, 0, 0), Fleet{HomeOwn: math.Inf(1), Pressure: 3}, Prediction{Own: 10}},
		{"better cached than home: no move charge", cand("a", 9, 0, 0), Fleet{HomeOwn: 4, Pressure: 3}, Prediction{Own: 1}},
		{"resyncing replica hits nothing", func() Candidate { c := cand("a", 10, 0, 0); c.Trust = 0; return c }(), Fleet{HomeOwn: 0, Pressure: 1}, Prediction{Own: 10, Move: 10}},
		{"half trust halves the hit", func() Candidate { c := cand("a", 4, 0, 0); c.Trust = 0.5; return c }(), idle, Prediction{Own: 8}},
		{"CPU blocks at the host weight", func() Candidate { c := cand("a", 2, 0, 0); c.Matched[index.TierCPU] = 4; return c }(), idle, Prediction{Own: 10 - (2 + 3)}},
		{"decode footprint is free by default", cand("a", 0, 0, 1000), idle, Prediction{Own: 10}},
		{"no KV size known: no memory term", func() Candidate { c := cand("a", 0, 0, 0); c.Load.KVUsage = 1; return c }(), idle, Prediction{Own: 10}},
		{"headroom left: no memory term", withKV(cand("a", 0, 0, 0), 1000, 0.5), idle, Prediction{Own: 10}},
		{"overflow is charged a block's prefill a block", withKV(cand("a", 0, 0, 0), 1000, 0.95), idle, Prediction{Own: 10, Memory: 14}},
		// A prefix in flight is found whole, joining its step or not; its
		// own prefill, just sent, is waited for in full.
		{"in flight, nothing else queued: found, joining the prefix's step", pend(cand("a", 0, 10, 0), 10), idle, Prediction{Wait: 10}},
		{"in flight behind half a step: found", pend(cand("a", 0, 10+256, 0), 10), idle, Prediction{Wait: 0.5*256 + 10}},
		{"in flight behind a step: found", pend(cand("a", 0, 10+512, 0), 10), idle, Prediction{Wait: 0.5*512 + 10}},
		{"in flight beyond an indexed match, behind a step", pend(cand("a", 4, 6+600, 0), 6), idle, Prediction{Wait: 0.5*600 + 6}},
		{"the router's own footprint counts when larger", withKV(cand("a", 0, 0, 946), 1000, 0), idle, Prediction{Own: 10, Memory: 10}},
		// The footprint past the engine's report plus the prefill still to
		// be allocated is blocks held once for several requests or no longer
		// held: it is not counted as in use, and up to it the request's
		// cached prefix is not charged again.
		{"a footprint past report and prefill is capped there", withKV(cand("a", 0, 0, 1000), 1000, 0.9), idle, Prediction{Own: 10}},
		{"a cached prefix the footprint already counts is not charged twice", withKV(cand("a", 8, 40, 1000), 1000, 0.91), idle, Prediction{Wait: 20, Own: 2, Memory: (910 + 40 + 6 - 950)}},
		{"prefill still to be allocated is no excess", withKV(cand("a", 8, 40, 946), 1000, 0.91), idle, Prediction{Wait: 20, Own: 2, Memory: (946 + 14 - 950)}},
		{"no excess: a cached prefix still takes its blocks", withKV(cand("a", 8, 0, 0), 1000, 0.94), idle, Prediction{Own: 2, Memory: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := k.Predict(req, tt.c, k.HitBlocks(req, tt.c), tt.f), secs(tt.want)
			if math.Abs(got.Total()-want.Total()) > 1e-12 || math.Abs(got.Move-want.Move) > 1e-12 || math.Abs(got.Memory-want.Memory) > 1e-12 {
				t.Errorf("prediction %+v, want %+v", got, want)
			}
		})
	}
	k3, _ := NewKVRoute(KVRouteConfig{MemoryWeight: Float(2)})
	if c := withKV(cand("a", 0, 0, 0), 1000, 0.95); math.Abs(k3.Predict(req, c, 0, idle).Memory-blk*2*14) > 1e-12 {
		t.Errorf("memory_weight 2: memory charge %v, want twice 14 blocks' prefill", k3.Predict(req, c, 0, idle).Memory)
	}
	k2, _ := NewKVRoute(KVRouteConfig{BacklogWeight: Float(1), DecodeWeight: Float(0.1), RequestWeight: Float(3), MoveWeight: Float(0.5)})
	c := withReqs(cand("a", 8, 20, 100), 3, 1)
	if got, want := k2.Predict(req, c, k2.HitBlocks(req, c), Fleet{HomeOwn: 0, Pressure: 2}).Total(), blk*(20+2+0.5*2*2+0.1*100)+stp*(1+3*1+0.02*3); math.Abs(got-want) > 1e-12 {
		t.Errorf("knobbed cost %v, want %v", got, want)
	}
}

// The prediction runs on each replica's learned speeds: the same queue is
// twice as long on a replica prefilling at half the speed, a replica with
// slow steps pays more per request, and a replica with nothing learned
// takes the other candidates' mean, else the policy's defaults.
func TestKVRoutePredictLearnedRates(t *testing.T) {
	k, _ := NewKVRoute(KVRouteConfig{})
	req := Request{PromptBlocks: 10, BlockSize: 64}
	fast := withReqs(cand("fast", 0, 40, 0), 2, 0)
	fast.Load.PrefillRate, fast.Load.DecodeStep = 20000, 10*time.Millisecond
	slow := withReqs(cand("slow", 0, 40, 0), 2, 0)
	slow.Load.PrefillRate, slow.Load.DecodeStep = 10000, 30*time.Millisecond
	unknown := withReqs(cand("new", 0, 40, 0), 2, 0)
	cands := []Candidate{fast, slow, unknown}
	f := k.FleetOf(req, cands, nil)
	if f.PrefillRate != 15000 || math.Abs(f.DecodeStep-0.020) > 1e-12 || f.BlockTokens != 64 {
		t.Fatalf("fleet %+v, want the learned means 15000 tokens/s and 20 ms, 64-token blocks", f)
	}
	want := func(rate, step float64) float64 { return 64/rate*(0.5*40+10) + step*(1+0.02*2) }
	for i, w := range []float64{want(20000, 0.010), want(10000, 0.030), want(15000, 0.020)} {
		if got := k.Predict(req, cands[i], 0, f).Total(); math.Abs(got-w) > 1e-12 {
			t.Errorf("%s: cost %v, want %v", cands[i].Replica, got, w)
		}
	}
	if res := k.Pick(req, cands, seeded(1)); res.Pick != 0 {
		t.Errorf("picked %d, want the fast replica; costs %v", res.Pick, res.Costs)
	}
	// Nothing learned anywhere: the defaults, and the block size from the
	// prompt's tokens per block.
	f = k.FleetOf(Request{PromptBlocks: 10, PromptTokens: 650}, []Candidate{cand("a", 0, 0, 0)}, nil)
	if f.PrefillRate != DefaultKVRoutePrefillRate || f.DecodeStep != DefaultKVRouteDecodeStep || f.BlockTokens != 65 {
		t.Errorf("fleet without learned rates %+v, want the defaults and 65-token blocks", f)
	}
}

func TestKVRouteFleetPressure(t *testing.T) {
	k, _ := NewKVRoute(KVRouteConfig{})
	busy := func(c Candidate) Candidate { c.Load.ActivePrefillBlocks = 5; return c }
	waiting := func(c Candidate) Candidate { c.Load.WaitingRequests = 1; return c }
	req := Request{PromptBlocks: 10}
	tests := []struct {
		name  string
		cands []Candidate
		want  Fleet
	}{
		{"idle fleet", []Candidate{cand("a", 0, 0, 0), cand("b", 6, 0, 0)}, Fleet{HomeOwn: math.Inf(1), Pressure: 0}},
		{"the home's own prefill", []Candidate{cand("a", 8, 0, 0), func() Candidate { c := cand("b", 6, 0, 0); c.Home = true; return c }()}, Fleet{HomeOwn: 4, Pressure: 0}},
		{"an unhealthy home is no home", []Candidate{cand("a", 8, 0, 0), func() Candidate { c := unhealthy(cand("b", 6, 0, 0)); c.Home = true; return c }()}, Fleet{HomeOwn: math.Inf(1), Pressure: 0}},
		{"half busy", []Candidate{busy(cand("a", 0, 0, 0)), cand("b", 0, 0, 0)}, Fleet{HomeOwn: math.Inf(1), Pressure: 1}},
		{"waiting requests make a replica busy", []Candidate{waiting(cand("a", 0, 0, 0)), cand("b", 0, 0, 0), cand("c", 0, 0, 0), cand("d", 0, 0, 0)}, Fleet{HomeOwn: math.Inf(1), Pressure: 1.0 / 3}},
		{"all busy: the cap", []Candidate{busy(cand("a", 0, 0, 0)), busy(cand("b", 0, 0, 0))}, Fleet{HomeOwn: math.Inf(1), Pressure: DefaultKVRouteMovePressureMax}},
		{"7 of 8 busy", append([]Candidate{cand("h", 0, 0, 0)}, busy(cand("a", 0, 0, 0)), busy(cand("b", 0, 0, 0)), busy(cand("c", 0, 0, 0)), busy(cand("d", 0, 0, 0)), busy(cand("e", 0, 0, 0)), busy(cand("f", 0, 0, 0)), busy(cand("g", 0, 0, 0))), Fleet{HomeOwn: math.Inf(1), Pressure: 7}},
		{"15 of 16 busy: the cap", func() []Candidate {
			cs := []Candidate{cand("idle", 0, 0, 0)}
			for i := range 15 {
				cs = append(cs, busy(cand(fmt.Sprint("b", i), 0, 0, 0)))
			}
			return cs
		}(), Fleet{HomeOwn: math.Inf(1), Pressure: 12}},
		{"the unhealthy are not counted", []Candidate{unhealthy(busy(cand("a", 9, 0, 0))), cand("b", 0, 0, 0)}, Fleet{HomeOwn: math.Inf(1), Pressure: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := k.FleetOf(req, tt.cands, nil); !(got.HomeOwn == tt.want.HomeOwn || math.Abs(got.HomeOwn-tt.want.HomeOwn) <= 1e-9) || math.Abs(got.Pressure-tt.want.Pressure) > 1e-9 {
				t.Errorf("fleet %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A trajectory's next step on a saturated fleet stays with its history even
// when the holder's queue is longer than the history's prefill; on a fleet
// with idle replicas it moves as soon as the holder is slower.
func TestKVRouteTrajectoryStaysHome(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 200, ExpectedOutputBlocks: 32}
	fleet := func(otherBacklog float64) []Candidate {
		cs := []Candidate{withReqs(cand("home", 190, 500, 0), 4, 0)}
		cs[0].Home = true
		for i := range 7 {
			cs = append(cs, withReqs(cand(fmt.Sprint("r", i), 0, otherBacklog, 0), 4, 0))
		}
		return cs
	}
	if res := p.Pick(req, fleet(100), seeded(1)); res.Pick != 0 {
		t.Errorf("saturated fleet: picked %d (%s), want the home replica; costs %v", res.Pick, res.Reason, res.Costs)
	}
	if res := p.Pick(req, fleet(0), seeded(1)); res.Pick == 0 {
		t.Errorf("idle others: the trajectory stayed behind a 500-block queue; costs %v", res.Costs)
	}
}

// New groups spread: without a home there is no move charge, so siblings arriving together go by queued prefill and
// requests, never piling on one replica.
func TestKVRouteSpreadsNewGroup(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	cs := make([]Candidate, 4)
	for i := range cs {
		cs[i] = cand(fmt.Sprint("r", i), 0, 0, 0)
	}
	env := seeded(2)
	var placed [4]int
	for range 16 { // 16 siblings of one 128-block task prompt, none prefilled yet
		res := p.Pick(Request{PromptBlocks: 128}, cs, env)
		placed[res.Pick]++
		cs[res.Pick].Load.ActivePrefillBlocks += 128
		cs[res.Pick].Load.ActiveRequests++
	}
	if placed != [4]int{4, 4, 4, 4} {
		t.Errorf("placed %v, want 4 each", placed)
	}
}

// A replica whose KV cache is nearly full loses a request it would
// otherwise win on its cache hit: the placement would make the engine
// preempt.
func TestKVRouteAvoidsMemoryOverflow(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 100, ExpectedOutputBlocks: 64}
	full := withKV(withReqs(cand("full", 40, 0, 0), 2, 0), 2000, 0.97)
	roomy := withKV(withReqs(cand("roomy", 0, 0, 0), 2, 0), 2000, 0.3)
	if res := p.Pick(req, []Candidate{full, roomy}, seeded(1)); res.Pick != 1 {
		t.Errorf("picked %d, want the replica with headroom; costs %v", res.Pick, res.Costs)
	}
	full.Load.KVUsage = 0.5
	if res := p.Pick(req, []Candidate{full, roomy}, seeded(1)); res.Pick != 0 {
		t.Errorf("with headroom on both, picked %d, want the cache hit; costs %v", res.Pick, res.Costs)
	}
}

// MemoryWait walks the decodes' releases soonest first until they cover
// the blocks the replica is short; short of more than they hold, it is
// the last of them (at least that long).
func TestKVRouteMemoryWait(t *testing.T) {
	k := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{MemoryWait: Float(1)}}).(*KVRoute)
	rel := func() []load.Release {
		return []load.Release{
			{Blocks: 200, Output: 1000},                                    // ends in 10 s
			{Blocks: 100, Output: 1000, Decoding: 9900 * time.Millisecond}, // in 0.1 s
			{Blocks: 50, Output: 100},                                      // in 1 s
			{Blocks: 30, Output: 10, Decoding: 5 * time.Second},            // overdue: any moment
		}
	}
	for _, tc := range []struct {
		deficit, want float64
	}{
		{-5, 0}, {0, 0}, {30, 0}, {120, 0.1}, {131, 1}, {180, 1}, {181, 10}, {380, 10}, {1000, 10},
	} {
		if got := k.MemoryWait(rel(), tc.deficit, 0.01); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("deficit %v: %v s, want %v", tc.deficit, got, tc.want)
		}
	}
	if got := k.MemoryWait(nil, 100, 0.01); got != 0 {
		t.Errorf("no ledger: %v, want 0", got)
	}
}

// With memory_wait on, a session's turn whose replica's KV cache is full
// waits there until decodes end and free the blocks it needs. Where those
// decodes have just started, it goes where they end soonest and
// re-prefills its history there; where they end as soon, it stays home.
// Prefill queued a step deep turns the wait off: the queue is then what
// the request waits for.
func TestKVRouteWaitsForMemoryWhereDecodesEnd(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{MemoryWait: Float(1)}})
	k := p.(*KVRoute)
	if !k.WeighsReleases() || mustNew(t, NameKVRoute, Config{}).(*KVRoute).WeighsReleases() {
		t.Fatal("WeighsReleases: want true with memory_wait 1, false by default")
	}
	req := Request{PromptBlocks: 300, SessionKey: "traj-1", BlockSize: 16}
	decodes := func(decoding time.Duration) []load.Release {
		var r []load.Release
		for range 4 {
			r = append(r, load.Release{Blocks: 100, Output: 1000, Decoding: decoding})
		}
		return r
	}
	// Home holds 250 of the 300 blocks and has 1 of 1,000 free: 49 short.
	// The other has 200 free: 100 short of the whole prompt.
	home := withKV(withReqs(cand("home", 250, 0, 400), 4, 0), 1000, 0.999)
	home.Home = true
	other := withKV(withReqs(cand("other", 0, 0, 400), 4, 0), 1000, 0.8)
	for _, c := range []*Candidate{&home, &other} {
		c.Load.TokenInterval = 10 * time.Millisecond
	}
	home.Releases, other.Releases = decodes(0), decodes(9900*time.Millisecond)
	cands := []Candidate{home, other}
	res := p.Pick(req, cands, seeded(1))
	f := k.FleetOf(req, cands, nil)
	if m := k.Predict(req, home, k.HitBlocks(req, home), f).Memory; math.Abs(m-10) > 0.05 {
		t.Errorf("home's memory wait %v s, want about 10 (its decodes' 1,000 tokens at 10 ms)", m)
	}
	if res.Pick != 1 {
		t.Errorf("home's decodes just started: picked %d, want the replica whose decodes end in 0.1 s; costs %v", res.Pick, res.Costs)
	}
	if res := mustNew(t, NameKVRoute, Config{}).Pick(req, cands, seeded(1)); res.Pick != 0 {
		t.Errorf("memory_wait off (the default): picked %d, want home; costs %v", res.Pick, res.Costs)
	}
	home.Releases = decodes(9900 * time.Millisecond)
	if res := p.Pick(req, []Candidate{home, other}, seeded(1)); res.Pick != 0 {
		t.Errorf("both ending in 0.1 s: picked %d, want home; costs %v", res.Pick, res.Costs)
	}
	home.Releases = decodes(0)
	home.Queued, home.QueuedCharge = k.StepBlocks(req), k.StepBlocks(req)
	home.Load.ActivePrefillBlocks = k.StepBlocks(req)
	gated := k.Predict(req, home, k.HitBlocks(req, home), k.FleetOf(req, []Candidate{home, other}, nil)).Memory
	home.Releases = nil
	if plain := k.Predict(req, home, k.HitBlocks(req, home), k.FleetOf(req, []Candidate{home, other}, nil)).Memory; gated != plain {
		t.Errorf("a step of prefill queued: memory charge %v, want the overflow charge alone %v", gated, plain)
	}
}

// The router's footprint counts a prefix shared by requests in flight once
// per request. Past the engine's report plus the prefill still to be
// allocated it is that over-count, not memory in use: a holder with
// headroom by its report keeps the request, however many requests sharing
// a prefix the router has in flight there. Prefill still queued there is
// memory the engine will need, and counts.
func TestKVRouteFootprintCappedByReport(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 100, ExpectedOutputBlocks: 64}
	// 2,500 blocks of footprint on 2,000: 25 requests of one 100-block
	// prefix, each counted whole; the engine reports half its cache used.
	holder := withKV(withReqs(cand("holder", 90, 0, 2500), 25, 0), 2000, 0.5)
	other := withKV(cand("other", 0, 0, 0), 2000, 0.3)
	kv := p.(*KVRoute)
	memory := func() float64 {
		return kv.Predict(req, holder, kv.HitBlocks(req, holder), kv.FleetOf(req, []Candidate{holder, other}, nil)).Memory
	}
	if m := memory(); m != 0 {
		t.Errorf("holder's memory charge %v, want 0 (1,000 reported, 74 needed, of 1,900 usable)", m)
	}
	if res := p.Pick(req, []Candidate{holder, other}, seeded(1)); res.Pick != 0 {
		t.Errorf("picked %d, want the holder; costs %v", res.Pick, res.Costs)
	}
	// 900 blocks of prefill queued there: 1,000 + 900 in use, and the
	// request's 10 uncached blocks and 64 of output 74 over the 1,900
	// usable (its 90 cached blocks are among the 600 of over-count).
	holder.Load.ActivePrefillBlocks = 900
	m := memory()
	if want := blk * 74; math.Abs(m-want) > 1e-12 {
		t.Fatalf("with prefill queued: memory charge %v, want %v (74 blocks over, a block's prefill each)", m, want)
	}
	// Before the engine reports usage the footprint stands alone.
	holder.Load.ActivePrefillBlocks, holder.Load.KVUsage = 0, 0
	if m0 := memory(); !(m0 > m) {
		t.Errorf("no report: memory charge %v, want the whole footprint's (more than %v)", m0, m)
	}
}

// The load bound never takes a session's credit at its home replica.
func TestKVRouteBoundSparesHome(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 105}
	holder := withReqs(cand("holder", 95, 0, 0), 6, 0)
	cs := []Candidate{withReqs(cand("a", 0, 0, 0), 0, 0), holder, withReqs(cand("b", 0, 0, 0), 1, 0), withReqs(cand("c", 0, 0, 0), 0, 0)}
	if res := p.Pick(req, cs, seeded(1)); res.Pick == 1 || res.Reason != ReasonLoadBound {
		t.Fatalf("not home: pick %d (%s), want the bound to move it", res.Pick, res.Reason)
	}
	cs[1].Home = true
	if res := p.Pick(req, cs, seeded(1)); res.Pick != 1 || res.Reason != ReasonCost {
		t.Errorf("home: pick %d (%s), want the holder; costs %v", res.Pick, res.Reason, res.Costs)
	}
}

func home(c Candidate) Candidate { c.Home = true; return c }

func pend(c Candidate, blocks int) Candidate { c.Pending = blocks; return c }

// A fan-out's siblings (one new 64-block prompt, sent together, without a
// session key) meet the first sibling's prefix in flight
// (Candidate.Pending). On an idle fleet they join the first: each waits
// there for the prompt's one prefill, as long as computing it elsewhere,
// and computing it elsewhere is work the fleet does twice (the move
// charge against the holder; the router charges a sibling there only its
// own prefill). Behind a queue the sibling joins the first where the
// prediction says so: waiting for the prefix's own prefill there beats
// prefilling it again behind a longer queue elsewhere.
func TestKVRoutePendingPrefix(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 64}
	cs := make([]Candidate, 4)
	for i := range cs {
		cs[i] = withReqs(cand(fmt.Sprint("r", i), 0, 0, 0), 1, 0)
	}
	env := seeded(3)
	var placed [4]int
	for range 4 {
		res := p.Pick(req, cs, env)
		placed[res.Pick]++
		if cs[res.Pick].Pending == 0 {
			cs[res.Pick].Load.ActivePrefillBlocks += 64
		}
		cs[res.Pick].Pending = 64 // the router remembers what it sent
		cs[res.Pick].Load.ActiveRequests++
	}
	if slices.Max(placed[:]) != 4 {
		t.Errorf("idle fleet: placed %v, want every sibling with the first", placed)
	}

	// The first sibling went to a, 150 other blocks charged there besides
	// its 64 (taken to be queued behind them), in 64-token blocks: more
	// than a step (8192 tokens, 128 blocks), so the engine computes the
	// prefix in an earlier step than the one admitting the request.
	req = Request{PromptBlocks: 64, BlockSize: 64}
	cs = []Candidate{withReqs(cand("a", 0, 150+64, 0), 2, 0), withReqs(cand("b", 0, 200, 0), 1, 0)}
	if res := p.Pick(req, cs, seeded(1)); res.Pick != 1 {
		t.Errorf("no in-flight prefix: picked %d, want the shorter queue; costs %v", res.Pick, res.Costs)
	}
	cs[0].Pending = 64
	res := p.Pick(req, cs, seeded(1))
	if res.Pick != 0 {
		t.Errorf("in flight behind a step: picked %d, want the holder; costs %v", res.Pick, res.Costs)
	}
	// 150/2 still queued ahead, the 64 in-flight blocks in full, no own
	// prefill, a sequence's share of a step for each of the 2 requests
	// running there and a step for itself.
	if want := 4*blk*(75+64) + stp*(1+0.02*2); math.Abs(res.Costs[0]-want) > 1e-12 {
		t.Errorf("holder's cost %v, want %v", res.Costs[0], want)
	}
	// In 16-token blocks the same 150 are 2,400 tokens, under a step
	// (512 blocks): the request may join the prefix's step, where the
	// engine shares the blocks it is computing. The whole prefix is
	// found; the holder stays the pick, whatever the step.
	req.BlockSize = 16
	if res := p.Pick(req, cs, seeded(1)); res.Pick != 0 {
		t.Errorf("in flight behind less than a step: picked %d, want the holder; costs %v", res.Pick, res.Costs)
	} else if want := blk*(75+64) + stp*(1+0.02*2); math.Abs(res.Costs[0]-want) > 1e-12 {
		t.Errorf("holder's cost %v, want %v", res.Costs[0], want)
	}
	// Other policies do not read Pending.
	bl := mustNew(t, NameBlended, Config{})
	if res := bl.Pick(req, cs, seeded(1)); res.Pick != 1 {
		t.Errorf("blended picked %d, want the shorter queue (it ignores in-flight prefixes)", res.Pick)
	}
}

func TestKVRoutePicks(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 10}
	tests := []struct {
		name   string
		cands  []Candidate
		pick   int
		reason string
	}{
		{"cache wins between idle replicas", []Candidate{cand("a", 0, 0, 0), cand("b", 8, 0, 0)}, 1, ReasonCost},
		{"cache wins over a small backlog", []Candidate{cand("a", 0, 0, 0), cand("b", 8, 10, 0)}, 1, ReasonCost},
		{"a backlog larger than the saving loses", []Candidate{cand("a", 0, 0, 0), cand("b", 8, 22, 0)}, 0, ReasonCost},
		{"at home, a backlog larger than the saving and the move loses", []Candidate{cand("a", 0, 0, 0), home(cand("b", 8, 40, 0))}, 0, ReasonCost},
		{"at home, a backlog smaller than the saving and the move wins", []Candidate{cand("a", 0, 0, 0), home(cand("b", 8, 30, 0))}, 1, ReasonCost},
		{"requests waiting there count", []Candidate{withReqs(cand("a", 0, 0, 0), 0, 5), withReqs(cand("b", 0, 4, 0), 0, 0)}, 1, ReasonColdIndex},
		{"requests running there cost a sequence's share", []Candidate{withReqs(cand("a", 0, 0, 0), 5, 0), withReqs(cand("b", 0, 4, 0), 0, 0)}, 0, ReasonColdIndex},
		{"cold index: least prefill backlog", []Candidate{cand("a", 0, 7, 0), cand("b", 0, 3, 50), cand("c", 0, 9, 0)}, 1, ReasonColdIndex},
		{"equal cost: fewer load blocks", []Candidate{cand("a", 0, 0, 40), cand("b", 0, 0, 10)}, 1, ReasonColdIndex},
		{"unhealthy best is skipped", []Candidate{unhealthy(cand("a", 10, 0, 0)), cand("b", 0, 4, 0)}, 1, ReasonColdIndex},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := p.Pick(req, tt.cands, seeded(3))
			if res.Pick != tt.pick || res.Reason != tt.reason {
				t.Fatalf("pick %d (%s), want %d (%s); costs %v", res.Pick, res.Reason, tt.pick, tt.reason, res.Costs)
			}
		})
	}
}

// The seed's herding batch: one replica holds the system prompt; kvroute
// spreads the batch instead of herding it, like blended.
func TestKVRouteNoHerding(t *testing.T) {
	cs := make([]Candidate, 4)
	for i := range cs {
		cs[i] = cand(fmt.Sprint("r", i), 0, 0, 0)
	}
	cs[0].Matched[index.TierGPU] = 4
	p := mustNew(t, NameKVRoute, Config{})
	env := seeded(8)
	var placed [4]int
	for range 40 {
		res := p.Pick(Request{PromptBlocks: 10}, cs, env)
		placed[res.Pick]++
		cs[res.Pick].Load.ActivePrefillBlocks += float64(10 - cs[res.Pick].Matched[0])
		cs[res.Pick].Load.ActiveRequests++
	}
	// The seed's bound: no replica takes 40% of the batch.
	for i, n := range placed {
		if n < 6 || n >= 16 {
			t.Errorf("kvroute placed %d of 40 on replica %d (%v), want a spread", n, i, placed)
		}
	}
}

func TestKVRouteWeightedConfigErrors(t *testing.T) {
	bad := []struct {
		name  string
		cfg   Config
		field string
	}{
		{NameKVRoute, Config{KVRoute: KVRouteConfig{MoveWeight: Float(-1)}}, "kvroute.move_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{MovePressureMax: Float(math.Inf(1))}}, "kvroute.move_pressure_max"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{MemoryWeight: Float(math.NaN())}}, "kvroute.memory_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{MemoryReserve: Float(1)}}, "kvroute.memory_reserve"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{MemoryReserve: Float(-0.1)}}, "kvroute.memory_reserve"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{BacklogWeight: Float(math.NaN())}}, "kvroute.backlog_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{DecodeWeight: Float(math.Inf(1))}}, "kvroute.decode_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{RequestWeight: Float(-2)}}, "kvroute.request_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{HostCacheHitWeight: Float(2)}}, "kvroute.host_cache_hit_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{DiskCacheHitWeight: Float(-1)}}, "kvroute.disk_cache_hit_weight"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBound: Float(0.5)}}, "kvroute.load_bound"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBound: Float(-1)}}, "kvroute.load_bound"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBound: Float(math.NaN())}}, "kvroute.load_bound"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBound: Float(math.Inf(1))}}, "kvroute.load_bound"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBoundMin: Float(0)}}, "kvroute.load_bound_min"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBoundMin: Float(2.5)}}, "kvroute.load_bound_min"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{LoadBoundMin: Float(math.NaN())}}, "kvroute.load_bound_min"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{PrefixShareBound: Float(0.9)}}, "kvroute.prefix_share_bound"},
		{NameKVRoute, Config{KVRoute: KVRouteConfig{PrefixShareBound: Float(math.Inf(1))}}, "kvroute.prefix_share_bound"},
		{NameWeighted, Config{Weighted: WeightedConfig{PrefixWeight: Float(-1)}}, "weighted.prefix_weight"},
		{NameWeighted, Config{Weighted: WeightedConfig{QueueWeight: Float(math.NaN())}}, "weighted.queue_weight"},
		{NameWeighted, Config{Weighted: WeightedConfig{KVUtilizationWeight: Float(math.Inf(1))}}, "weighted.kv_utilization_weight"},
	}
	for _, tt := range bad {
		t.Run(tt.field, func(t *testing.T) {
			_, err := New(tt.name, tt.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("New: %v, want ErrConfig naming %s", err, tt.field)
			}
			if err := tt.cfg.Validate(); !errors.Is(err, ErrConfig) {
				t.Fatalf("Validate: %v, want ErrConfig", err)
			}
		})
	}
}

func TestKVRouteLoadBound(t *testing.T) {
	loads := func(reqs ...int) []Candidate {
		cs := make([]Candidate, len(reqs))
		for i, r := range reqs {
			cs[i] = withReqs(cand(fmt.Sprint("r", i), 0, 0, 0), r, 0)
		}
		return cs
	}
	tests := []struct {
		name  string
		c     float64
		min   *float64 // nil: the default floor (6)
		cands []Candidate
		want  float64
	}{
		{"idle fleet: the floor", 1.25, nil, loads(0, 0, 0, 0), 6},
		{"idle fleet, floor 1", 1.25, Float(1), loads(0, 0, 0, 0), 1},
		{"light load rounds up to one", 1.25, Float(1), loads(1, 0, 1, 0), 1},
		{"16 in flight on 4, including the newcomer", 1.25, Float(4), loads(15, 0, 0, 0), 5},
		{"the default floor holds there", 1.25, nil, loads(15, 0, 0, 0), 6},
		{"ceil, not round", 1.25, Float(1), loads(4, 4, 4, 4, 0, 0, 0, 0), 3},
		{"under the floor the floor holds", 1.25, Float(4), loads(4, 4, 4, 4, 0, 0, 0, 0), 4},
		{"c 1 is the mean, rounded up", 1, Float(1), loads(3, 3, 3, 2), 3},
		{"c 2 doubles it", 2, Float(1), loads(3, 3, 3, 2), 6},
		{"waiting requests count", 1.25, Float(4), []Candidate{withReqs(cand("a", 0, 0, 0), 2, 5), withReqs(cand("b", 0, 0, 0), 0, 0)}, 5},
		{"ineligible replicas count neither load nor share", 1.25, Float(4), []Candidate{withReqs(cand("a", 0, 0, 0), 3, 0), unhealthy(withReqs(cand("b", 0, 0, 0), 40, 0))}, 5},
		{"off", 0, nil, loads(15, 0, 0, 0), math.Inf(1)},
		{"none eligible", 1.25, nil, []Candidate{unhealthy(cand("a", 0, 0, 0))}, math.Inf(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := NewKVRoute(KVRouteConfig{LoadBound: Float(tt.c), LoadBoundMin: tt.min})
			if err != nil {
				t.Fatal(err)
			}
			if got := k.LoadBound(tt.cands); got != tt.want {
				t.Errorf("bound %v, want %v", got, tt.want)
			}
		})
	}
}

func TestKVRouteLoadBoundPicks(t *testing.T) {
	req := Request{PromptBlocks: 105}
	holder := func(reqs int) Candidate { return withReqs(cand("holder", 95, 0, 0), reqs, 0) }
	idle := func(id string, reqs int) Candidate { return withReqs(cand(id, 0, 0, 0), reqs, 0) }
	floor1 := KVRouteConfig{LoadBound: Float(1.25), LoadBoundMin: Float(1)}
	tests := []struct {
		name   string
		cfg    KVRouteConfig
		cands  []Candidate
		pick   int
		reason string
	}{
		{"idle holder keeps its session", KVRouteConfig{}, []Candidate{idle("a", 0), holder(0), idle("b", 0)}, 1, ReasonCost},
		{"holder under the bound keeps its session", KVRouteConfig{}, []Candidate{idle("a", 1), holder(1), idle("b", 1), idle("c", 1), idle("d", 1), idle("e", 1), idle("f", 1), idle("g", 1)}, 1, ReasonCost},
		{"under the floor the holder keeps its session", KVRouteConfig{}, []Candidate{idle("a", 0), holder(5), idle("b", 0), idle("c", 0)}, 1, ReasonCost},
		{"holder at the bound loses its credit", KVRouteConfig{}, []Candidate{idle("a", 0), holder(6), idle("b", 1), idle("c", 0)}, 0, ReasonLoadBound},
		{"without the bound the holder wins", KVRouteConfig{LoadBound: Float(0)}, []Candidate{idle("a", 0), holder(6), idle("b", 1), idle("c", 0)}, 1, ReasonCost},
		{"floor 1: one request is at a light fleet's bound", floor1, []Candidate{idle("a", 0), holder(1), idle("b", 0), idle("c", 0)}, 0, ReasonLoadBound},
		{"floor 1: an idle holder keeps its session", floor1, []Candidate{idle("a", 1), holder(0), idle("b", 1), idle("c", 0)}, 1, ReasonCost},
		{"an over-bound holder still wins on load", KVRouteConfig{}, []Candidate{withReqs(cand("a", 0, 300, 0), 1, 0), holder(8)}, 1, ReasonCost},
		{"cold index reason wins over the bound", KVRouteConfig{}, []Candidate{idle("a", 4), idle("b", 0)}, 1, ReasonColdIndex},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, NameKVRoute, Config{KVRoute: tt.cfg})
			res := p.Pick(req, tt.cands, seeded(5))
			if res.Pick != tt.pick || res.Reason != tt.reason {
				t.Fatalf("pick %d (%s), want %d (%s); costs %v", res.Pick, res.Reason, tt.pick, tt.reason, res.Costs)
			}
		})
	}
}

// burst places 64 requests of prompt blocks from 16 concurrent workers on
// 4 replicas, replica 2 holding shared blocks of each prompt (the other
// replicas never learn them: the harshest case). Prefill is taken as
// instant (no backlog builds up): only the per-request charge and the
// bounds can spread the burst. With shares, the requests carry the
// router's prefix memory as route feeds it (Request.PrefixPlacements and
// Candidate.PrefixShare; the whole burst within its half-life). It returns
// the placements and the most requests the holder had in flight.
func burst(t *testing.T, cfg KVRouteConfig, prompt, shared int, shares bool) (placed [4]int, peak int) {
	t.Helper()
	p := mustNew(t, NameKVRoute, Config{KVRoute: cfg})
	cs := make([]Candidate, 4)
	for i := range cs {
		cs[i] = cand(fmt.Sprint("r", i), 0, 0, 0)
	}
	cs[2].Matched[index.TierGPU] = shared
	env := seeded(11)
	var inflight []int // FIFO of picks; the oldest finishes first
	for n := range 64 {
		if len(inflight) == 16 {
			cs[inflight[0]].Load.ActiveRequests--
			inflight = inflight[1:]
		}
		req := Request{PromptBlocks: prompt}
		if shares && n > 0 {
			req.PrefixPlacements = float64(n)
			for i := range cs {
				cs[i].PrefixShare = float64(placed[i]) / float64(n)
			}
		}
		res := p.Pick(req, cs, env)
		if res.Pick < 0 {
			t.Fatalf("no pick: %+v", res)
		}
		placed[res.Pick]++
		cs[res.Pick].Load.ActiveRequests++
		peak = max(peak, cs[2].Load.ActiveRequests)
		inflight = append(inflight, res.Pick)
	}
	return placed, peak
}

// The e2e herding burst at the policy level (a 16-block system prompt, a
// 2-block question each). The holder is faster for every request (a
// running sequence costs a new request a small share of a step, and
// prefill is instant here), so the prediction alone sends it the whole
// burst; the prefix share bound spreads it, with or without the load
// bound: no replica takes more than 40%, the holder at least its share.
func TestKVRouteLightBurstSpreads(t *testing.T) {
	if placed, _ := burst(t, KVRouteConfig{LoadBound: Float(0), PrefixShareBound: Float(0)}, 18, 16, false); placed[2] < 60 {
		t.Fatalf("no bounds: holder took %d of 64 (%v); the burst no longer needs them", placed[2], placed)
	}
	for _, cfg := range []KVRouteConfig{{LoadBound: Float(0)}, {}} {
		placed, _ := burst(t, cfg, 18, 16, true)
		for i, n := range placed {
			if n*10 > 64*4 {
				t.Errorf("bound %v: replica %d took %d of 64 (> 40%%): %v", cfg.LoadBound, i, n, placed)
			}
		}
		if placed[2] < 16 {
			t.Errorf("bound %v: holder took %d of 64, want at least its share: %v", cfg.LoadBound, placed[2], placed)
		}
	}
}

// A long shared prefix (300 blocks) with instant prefill is the case the
// prediction herds on (the holder is faster for every request); the load bound is
// the safety net: the holder never holds more than the bound,
// max(6, ceil(3*(16+1)/4)) = 13 of the 16 in flight, while without it the
// holder takes nearly all.
func TestKVRouteLoadBoundCapsLongSharedPrefix(t *testing.T) {
	off, offPeak := burst(t, KVRouteConfig{LoadBound: Float(0)}, 305, 300, false)
	if offPeak < 15 {
		t.Fatalf("bound off: holder peaked at %d in flight (%v); the case no longer needs the net", offPeak, off)
	}
	on, peak := burst(t, KVRouteConfig{}, 305, 300, false)
	if peak > 13 {
		t.Errorf("holder peaked at %d in flight, want at most the bound 13: %v", peak, on)
	}
	if on[2] >= off[2] {
		t.Errorf("holder took %d with the bound, %d without: the bound spread nothing", on[2], off[2])
	}
}

// A chat fleet: one replica holds the shared system prompt (30 blocks of
// 64 tokens) and serves five sessions, the others one each; a new session (no home) goes to
// the holder while its queued prefill is small, and to a cold replica
// once the holder's queue outweighs prefilling the prompt there.
func TestKVRouteNewSessionJoinsPromptHolder(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 33, BlockSize: 64}
	fleet := func(holderQueue float64, holderReqs int) []Candidate {
		cs := []Candidate{withReqs(cand("holder", 30, holderQueue, 200), holderReqs, 0)}
		for i := range 7 {
			cs = append(cs, withReqs(cand(fmt.Sprint("r", i), 0, 0, 0), 1, 0))
		}
		return cs
	}
	if res := p.Pick(req, fleet(6, 5), seeded(1)); res.Pick != 0 {
		t.Errorf("small queue on the holder: picked %d (%s), want the holder; costs %v", res.Pick, res.Reason, res.Costs)
	}
	if res := p.Pick(req, fleet(80, 5), seeded(1)); res.Pick == 0 {
		t.Errorf("80 blocks queued on the holder: the new session still waits there; costs %v", res.Costs)
	}
}

// A session stays at its home replica, even far over the load bound,
// while the prediction says home is faster; it moves when home is slower.
func TestKVRouteSessionStaysHomeUnlessSlower(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	req := Request{PromptBlocks: 60, BlockSize: 64}
	fleet := func(homeQueue float64) []Candidate {
		cs := []Candidate{home(withReqs(cand("home", 58, homeQueue, 400), 20, 0))}
		for i := range 3 {
			cs = append(cs, withReqs(cand(fmt.Sprint("r", i), 0, 0, 0), 1, 0))
		}
		return cs
	}
	if res := p.Pick(req, fleet(10), seeded(1)); res.Pick != 0 || res.Reason != ReasonCost {
		t.Errorf("20 requests at home (bound 18), little queued: picked %d (%s), want home; costs %v", res.Pick, res.Reason, res.Costs)
	}
	if res := p.Pick(req, fleet(300), seeded(1)); res.Pick == 0 {
		t.Errorf("300 blocks queued at home on an idle fleet: stayed home; costs %v", res.Costs)
	}
}

// The prefix share bound: a prefix that drew at least N recent placements
// (N candidates), most of them to its holder, has the holder passed over
// for the next request it draws, though the holder is the cheapest; not
// below N placements, not at the session's home, not with the bound off,
// and not when every candidate herds.
func TestKVRoutePrefixShareBound(t *testing.T) {
	req := Request{PromptBlocks: 229, BlockSize: 16, PrefixPlacements: 8}
	fleet := func(holderShare float64) []Candidate {
		cs := []Candidate{withReqs(cand("holder", 213, 34, 460), 2, 0)}
		cs[0].PrefixShare = holderShare
		for i := range 3 {
			c := withReqs(cand(fmt.Sprint("r", i), 0, 0, 0), 0, 0)
			c.PrefixShare = (1 - holderShare) / 3
			cs = append(cs, c)
		}
		return cs
	}
	p := mustNew(t, NameKVRoute, Config{})
	if res := p.Pick(req, fleet(0.30), seeded(1)); res.Pick != 0 || res.Reason != ReasonCost {
		t.Errorf("holder at 30%% (< 1.25/4): picked %d (%s), want the holder", res.Pick, res.Reason)
	}
	res := p.Pick(req, fleet(0.32), seeded(1))
	if res.Pick == 0 || res.Reason != ReasonPrefixShare {
		t.Errorf("holder at 32%% of 8 placements: picked %d (%s), want it passed over", res.Pick, res.Reason)
	}
	if !(res.Costs[0] < res.Costs[res.Pick]) {
		t.Errorf("the holder should still be the cheapest: costs %v", res.Costs)
	}
	few := req
	few.PrefixPlacements = 3
	if res := p.Pick(few, fleet(1), seeded(1)); res.Pick != 0 {
		t.Errorf("3 placements (< 4 candidates): picked %d (%s), want the holder", res.Pick, res.Reason)
	}
	cs := fleet(0.9)
	cs[0].Home = true
	if res := p.Pick(req, cs, seeded(1)); res.Pick != 0 {
		t.Errorf("the session's home: picked %d (%s), want home", res.Pick, res.Reason)
	}
	all := fleet(0.25)
	for i := range all {
		all[i].PrefixShare = 0.5 // impossible shares: every candidate herds
	}
	if res := p.Pick(req, all, seeded(1)); res.Pick != 0 {
		t.Errorf("every candidate over: picked %d (%s), want the cheapest", res.Pick, res.Reason)
	}
	off := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{PrefixShareBound: Float(0)}})
	if res := off.Pick(req, fleet(0.9), seeded(1)); res.Pick != 0 {
		t.Errorf("bound off: picked %d (%s), want the holder", res.Pick, res.Reason)
	}
	// A fair share is a share of the fleet's prefill speed: a holder twice
	// as fast as the other three does 2/5 of the fleet's prefill, so its
	// bound is 1.25*2/5 = 50% of the placements, not 1.25/4.
	speeds := func(holderShare float64) []Candidate {
		cs := fleet(holderShare)
		for i := range cs {
			cs[i].Load.PrefillRate = 16000
		}
		cs[0].Load.PrefillRate = 32000
		return cs
	}
	if res := p.Pick(req, speeds(0.45), seeded(1)); res.Pick != 0 || res.Reason != ReasonCost {
		t.Errorf("a holder twice as fast at 45%% (< 1.25*2/5): picked %d (%s), want the holder", res.Pick, res.Reason)
	}
	if res := p.Pick(req, speeds(0.51), seeded(1)); res.Pick == 0 || res.Reason != ReasonPrefixShare {
		t.Errorf("a holder twice as fast at 51%%: picked %d (%s), want it passed over", res.Pick, res.Reason)
	}
	slow := fleet(0.24)
	for i := range slow {
		slow[i].Load.PrefillRate = 16000
	}
	slow[0].Load.PrefillRate = 8000 // half as fast: 1.25*1/7 = 17.9%
	if res := p.Pick(req, slow, seeded(1)); res.Pick == 0 || res.Reason != ReasonPrefixShare {
		t.Errorf("a holder half as fast at 24%%: picked %d (%s), want it passed over", res.Pick, res.Reason)
	}
	learned := fleet(0.24) // only the holder has learned its speed: the others take the mean
	learned[0].Load.PrefillRate = 8000
	if res := p.Pick(req, learned, seeded(1)); res.Pick != 0 || res.Reason != ReasonCost {
		t.Errorf("the only learned speed is every candidate's: picked %d (%s), want the holder", res.Pick, res.Reason)
	}
	// Herding read with a Fleet that carries no speed (a caller that did
	// not build it with FleetOf) and candidates that learned none prices
	// every speed at prefill_rate, as Pace does: the bound still holds.
	kv := p.(*KVRoute)
	herding := kv.Herding(req, fleet(0.32), Fleet{})
	if cs := fleet(0.32); !herding(cs[0]) || herding(cs[1]) {
		t.Errorf("no speed anywhere: holder at 32%% herding %v, another at 23%% %v; want true, false", herding(cs[0]), herding(cs[1]))
	}
}

// The future charge: a new session whose later turns are predicted
// (Request.Future) pays, on each candidate, the waiting those turns add
// there (FutureWait: the Pollaczek-Khinchine wait of the sessions living
// there, Candidate.Sessions), against the least committed candidate. It
// leaves the holder of its shared prompt when enough sessions live there
// to outweigh the prompt's one-off prefill, never for a request with a
// home or without predicted turns, and not with future_weight 0.
func TestKVRouteFutureCharge(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{}).(*KVRoute)
	// 64-token blocks at 16,000 tokens/s: 4 ms a block. A 96-block prompt
	// held by r0; the session's turns bring 64 blocks (0.256 s) each.
	req := Request{PromptBlocks: 104, BlockSize: 64, Future: Future{Turns: 14, Blocks: 64, BlocksSq: 64 * 64}}
	living := func(n int) SessionLoad { // n sessions, a turn every 4 s each
		r := float64(n) / 4
		return SessionLoad{Rate: r, Blocks: 64 * r, BlocksSq: 64 * 64 * r, Sessions: n}
	}
	fleet := func(onHolder int) []Candidate {
		cs := []Candidate{cand("holder", 96, 0, 0)}
		cs[0].Sessions = living(onHolder)
		for i := range 3 {
			c := cand(fmt.Sprint("r", i), 0, 0, 0)
			c.Sessions = living(1)
			cs = append(cs, c)
		}
		return cs
	}
	// By hand: b = 0.004 s, s1 = 0.256, s2 = 0.065536; with n sessions,
	// B = n/4, U = n*0.064, A = B*s2.
	want := func(n int) float64 {
		s1, s2 := 64*0.004, math.Pow(64*0.004, 2)
		B := float64(n) / 4
		U, A := B*s1, B*s2
		return 14 * ((A+B*s2)/(2*(1-U)) + B*A*s1/(2*(1-U)*(1-U)))
	}
	cs := fleet(5)
	f := p.FleetOf(req, cs, nil)
	if got := p.FutureWait(req, cs[0], f); math.Abs(got-want(5)) > 1e-9 {
		t.Errorf("FutureWait with 5 sessions = %v, want %v", got, want(5))
	}
	if got := p.Predict(req, cs[1], 0, f).Future; got != 0 {
		t.Errorf("the least committed candidate pays %v, want 0", got)
	}
	if got := p.Predict(req, cs[0], 96, f).Future; math.Abs(got-(want(5)-want(1))) > 1e-9 {
		t.Errorf("the holder pays %v, want %v", got, want(5)-want(1))
	}
	if res := p.Pick(req, fleet(1), seeded(1)); res.Pick != 0 {
		t.Errorf("as committed as the others: picked %d, want the holder; costs %v", res.Pick, res.Costs)
	}
	if res := p.Pick(req, fleet(5), seeded(1)); res.Pick == 0 {
		t.Errorf("5 sessions living on the holder against 1 elsewhere: the new session still joins them; costs %v", res.Costs)
	}
	oneShot := req
	oneShot.Future = Future{}
	if res := p.Pick(oneShot, fleet(5), seeded(1)); res.Pick != 0 {
		t.Errorf("a request without predicted turns left the holder; costs %v", res.Costs)
	}
	homed := fleet(5)
	homed[0].Home = true
	if res := p.Pick(Request{PromptBlocks: 104, BlockSize: 64}, homed, seeded(1)); res.Pick != 0 {
		t.Errorf("a session left its home; costs %v", res.Costs)
	}
	off := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{FutureWeight: Float(0)}})
	if res := off.Pick(req, fleet(5), seeded(1)); res.Pick != 0 {
		t.Errorf("future_weight 0 still charged the future; costs %v", res.Costs)
	}
	if _, err := NewKVRoute(KVRouteConfig{FutureWeight: Float(-1)}); err == nil || !strings.Contains(err.Error(), "kvroute.future_weight") {
		t.Errorf("future_weight -1: error %v, want one naming kvroute.future_weight", err)
	}
}

// A fan-out's second sibling (a parallel request whose whole 87-block
// prompt is in flight at its home, behind 58 blocks of an earlier burst's
// prefill that the other seven replicas also still have charged) has six
// more siblings expected. Every replica has prefill queued, so the fleet
// pressure is at its cap and the move charge holds the sibling home, where
// the engine would admit it into the step computing the prompt and it
// would compute the prompt again. Below spread_util (2/3) the fleet
// absorbs the burst's spread: the sibling goes where it starts first, on
// the router's fluid queues (20 blocks left of the 58 charged, against the
// home's 107), and the burst is marked spread. Above it, with the regime
// off, or on a fleet too small for the burst, it stays home.
func TestKVRouteSpreadsBurstBelowSpreadUtil(t *testing.T) {
	fleet := func(n int, others float64) []Candidate {
		h := pend(home(withReqs(cand("h", 0, 58+87, 0), 2, 0)), 87)
		h.Queued, h.QueuedCharge = 20+87, 58+87
		cs := []Candidate{h}
		for i := range n - 1 {
			c := withReqs(cand(fmt.Sprint("r", i), 0, 58, 0), 1, 0)
			c.Queued, c.QueuedCharge = others, 58
			cs = append(cs, c)
		}
		return cs
	}
	sib := Request{PromptBlocks: 87, SessionKey: "fan-1", Parallel: true, Siblings: 6, BurstPlaced: 1, SpreadUtil: 0.5}
	p := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{SpreadUtil: Float(2.0 / 3)}})
	if res := p.Pick(sib, fleet(8, 20), seeded(1)); res.Pick == 0 || !res.Spread {
		t.Errorf("utilization 0.5: picked %d (spread %v), want another replica and the burst spread; costs %v", res.Pick, res.Spread, res.Costs)
	}
	hold := func(name string, p Policy, req Request, cs []Candidate) {
		t.Helper()
		if res := p.Pick(req, cs, seeded(1)); res.Pick != 0 || res.Spread {
			t.Errorf("%s: picked %d (spread %v), want the home; costs %v", name, res.Pick, res.Spread, res.Costs)
		}
	}
	at := func(u float64) Request { r := sib; r.SpreadUtil = u; return r }
	// Held, the sibling is predicted: with a step of 58 blocks (928
	// tokens), the 58 blocks charged at home beside the prompt hold it
	// past the prompt's step there, and it finds the prompt computed.
	step := Float(58 * 16)
	ps := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{SpreadUtil: Float(2.0 / 3), StepTokens: step}})
	hold("utilization 0.8", ps, at(0.8), fleet(8, 20))
	hold("no utilization known", ps, at(0), fleet(8, 20))
	off := 0.0
	hold("spread_util 0", mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{SpreadUtil: &off, StepTokens: step}}), sib, fleet(8, 20))
	hold("the default (off)", mustNew(t, NameKVRoute, Config{}), sib, fleet(8, 20))
	hold("4 replicas for 7 siblings", ps, sib, fleet(4, 20))
	// Every other replica would start it only after the home has computed
	// the prompt: a sibling there would have found it computed at home.
	if res := p.Pick(sib, fleet(8, 120), seeded(1)); res.Pick != 0 {
		t.Errorf("others' queues past the home's: picked %d, want the home; costs %v", res.Pick, res.Costs)
	}
	// A later request of the burst holds unless the burst was spread.
	later := sib
	later.BurstPlaced, later.Siblings = 3, 4
	hold("third request of a held burst", ps, later, fleet(8, 20))
	later.BurstSpread = true
	if res := p.Pick(later, fleet(8, 20), seeded(1)); res.Pick == 0 {
		t.Errorf("third request of a spread burst joined the home; costs %v", res.Costs)
	}
	// Without a session key the holder of the prompt stands for the home;
	// n samples of one prompt with a session key each are other sessions'
	// first turns and keep the prediction.
	anon := func() []Candidate {
		cs := fleet(8, 20)
		cs[0].Home = false
		return cs
	}
	if res := p.Pick(Request{PromptBlocks: 87, Siblings: 6, SpreadUtil: 0.5}, anon(), seeded(1)); res.Pick == 0 || !res.Spread {
		t.Errorf("keyless sibling: picked %d (spread %v), want another replica; costs %v", res.Pick, res.Spread, res.Costs)
	}
	if res := p.Pick(Request{PromptBlocks: 87, SessionKey: "rl-2", SpreadUtil: 0.5}, anon(), seeded(1)); res.Spread {
		t.Errorf("another session's first turn spread as a sibling; costs %v", res.Costs)
	}
}

// Below spread_util the first request of an expected burst (its prompt
// held nowhere, seven siblings expected) is charged its wait on the
// router's fluid queues, so that it starts as early as its siblings will: a replica whose 60 charged blocks
// are all but 5 computed since they were sent wins over one with 30
// charged and 25 still queued. Above spread_util, or with no sibling
// expected, the charge decides. A charge the fluid queue does not account
// for (another router's requests) counts as before, at backlog_weight.
func TestKVRouteColdRequestWaitsOnFluidQueue(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{SpreadUtil: Float(2.0 / 3)}})
	a, b := cand("a", 0, 30, 0), cand("b", 0, 60, 0)
	a.Queued, a.QueuedCharge = 25, 30
	b.Queued, b.QueuedCharge = 5, 60
	cs := []Candidate{a, b}
	first := func(u, sibs float64) Request { return Request{PromptBlocks: 30, SpreadUtil: u, Siblings: sibs} }
	if res := p.Pick(first(0.5, 7), cs, seeded(1)); res.Pick != 1 {
		t.Errorf("utilization 0.5: picked %d, want the replica with the shorter fluid queue; costs %v", res.Pick, res.Costs)
	}
	if res := p.Pick(first(0.8, 7), cs, seeded(1)); res.Pick != 0 {
		t.Errorf("utilization 0.8: picked %d, want the replica with less charged prefill; costs %v", res.Pick, res.Costs)
	}
	if res := p.Pick(first(0.5, 0), cs, seeded(1)); res.Pick != 0 {
		t.Errorf("no sibling expected: picked %d, want the replica with less charged prefill; costs %v", res.Pick, res.Costs)
	}
	cs[1].Queued, cs[1].QueuedCharge = 0, 0 // b's 60 blocks are not the router's own
	if res := p.Pick(first(0.5, 7), cs, seeded(1)); res.Pick != 0 {
		t.Errorf("unaccounted charge: picked %d, want the replica with less charged prefill; costs %v", res.Pick, res.Costs)
	}
	for _, v := range []float64{-0.1, 1, math.NaN()} {
		if _, err := New(NameKVRoute, Config{KVRoute: KVRouteConfig{SpreadUtil: &v}}); err == nil || !strings.Contains(err.Error(), "kvroute.spread_util") {
			t.Errorf("spread_util %v: error %v, want one naming kvroute.spread_util", v, err)
		}
	}
}

// A prefix every candidate holds keeps the request on none of them, so
// there the wait is the fresh queue's, as on a candidate holding none of
// the prompt: with a 32-block system prompt cached on both, a replica
// charged 60 blocks of which 55 were sent a moment ago is further off
// than one charged 70 whose queue is all but drained (backlog_weight of
// the charge says the opposite, 30 blocks against 35). A replica holding
// more of the prompt than the others keeps the discount: the request
// would leave that cache behind.
func TestKVRouteFleetWidePrefixWaitsOnFreshQueue(t *testing.T) {
	p := mustNew(t, NameKVRoute, Config{})
	fresh, drained := cand("fresh", 32, 60, 0), cand("drained", 32, 70, 0)
	fresh.Queued, fresh.QueuedCharge = 55, 60
	drained.Queued, drained.QueuedCharge = 10, 70
	req := Request{PromptBlocks: 100, SessionKey: "herd-1"}
	if res := p.Pick(req, []Candidate{fresh, drained}, seeded(1)); res.Pick != 1 {
		t.Errorf("prompt held on both: picked %d, want the drained queue 1; costs %v", res.Pick, res.Costs)
	}
	fresh.Matched[index.TierGPU] = 40
	if res := p.Pick(req, []Candidate{fresh, drained}, seeded(1)); res.Pick != 0 {
		t.Errorf("8 more blocks held on the fresh queue's replica: picked %d, want that holder 0 (its charge discounted); costs %v", res.Pick, res.Costs)
	}
}

// PrefillRates is the speed Pace prices each candidate at: its learned
// one, else the mean of the eligible candidates' learned ones (an
// ineligible candidate's does not count), else prefill_rate.
func TestKVRoutePrefillRatesArePace(t *testing.T) {
	rate := 4000.0
	k, _ := NewKVRoute(KVRouteConfig{PrefillRate: &rate})
	a, b, c, down := cand("a", 0, 0, 0), cand("b", 0, 0, 0), cand("c", 0, 0, 0), cand("down", 0, 0, 0)
	a.Load.PrefillRate, b.Load.PrefillRate = 10000, 20000
	down.Load.Healthy, down.Load.PrefillRate = false, 90000
	cands := []Candidate{a, b, c, down}
	got := k.PrefillRates(nil, cands)
	f := k.FleetOf(Request{PromptBlocks: 1, BlockSize: 16}, cands, nil)
	for i, want := range []float64{10000, 20000, 15000, 90000} {
		if got[i] != want {
			t.Errorf("%s: %v tokens/s, want %v", cands[i].Replica, got[i], want)
		}
		if pace := 16 / k.Pace(cands[i], f).BlockSecs; math.Abs(pace-got[i]) > 1e-6 {
			t.Errorf("%s: Pace prices %v tokens/s, PrefillRates %v", cands[i].Replica, pace, got[i])
		}
	}
	if got := k.PrefillRates(got, []Candidate{c}); len(got) != 1 || got[0] != 4000 {
		t.Errorf("nothing learned: %v, want [4000] (prefill_rate)", got)
	}
}

// The in-flight credit is the whole prefix in flight (engines share it
// while it is computed), up to the block holding the prompt's last token,
// which the engine always computes: a sibling of a block-aligned prompt
// recomputes its last block, one of a prompt ending mid-block only the
// tail. Nothing is credited without a pending prefix.
func TestInFlightCredit(t *testing.T) {
	k, _ := NewKVRoute(KVRouteConfig{})
	c := cand("h", 0, 300, 0)
	for _, tt := range []struct {
		name             string
		tokens, matched  int
		pending          int
		credit, hit, own float64
	}{
		{"aligned, all in flight", 53 * 64, 0, 53, 52, 52, 1},
		{"mid-block tail", 53*64 + 10, 0, 53, 53, 53, 0},
		{"indexed head", 53 * 64, 16, 37, 36, 52, 1},
		{"part in flight", 53*64 + 10, 16, 20, 20, 36, 17},
		{"none in flight", 53*64 + 10, 16, 0, 0, 16, 37},
	} {
		c.Pending = tt.pending
		c.Matched = [index.NumTiers]int{tt.matched}
		req := Request{PromptBlocks: (tt.tokens) / 64, PromptTokens: tt.tokens, BlockSize: 64}
		if got := InFlightCredit(req, c); got != tt.credit {
			t.Errorf("%s: credit %v, want %v", tt.name, got, tt.credit)
		}
		hit := k.HitBlocks(req, c)
		if hit != tt.hit {
			t.Errorf("%s: hit %v, want %v", tt.name, hit, tt.hit)
		}
		if o := k.Predict(req, c, hit, k.FleetOf(req, []Candidate{c}, nil)).Own / k.Pace(c, k.FleetOf(req, []Candidate{c}, nil)).BlockSecs; math.Abs(o-tt.own) > 1e-9 {
			t.Errorf("%s: own prefill %v blocks, want %v", tt.name, o, tt.own)
		}
	}
	// A request fully indexed is still one block short when aligned.
	c.Pending, c.Matched = 0, [index.NumTiers]int{53}
	if hit := k.HitBlocks(Request{PromptBlocks: 53, PromptTokens: 53 * 64, BlockSize: 64}, c); hit != 52 {
		t.Errorf("aligned prompt fully indexed: hit %v, want 52", hit)
	}
}

// step_tokens is the engines' per-step token budget: 8192 by default,
// turned into the request's blocks.
func TestKVRouteStepTokens(t *testing.T) {
	k, err := NewKVRoute(KVRouteConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := k.StepBlocks(Request{PromptBlocks: 10, BlockSize: 64}); got != 128 {
		t.Errorf("default step in 64-token blocks: %v, want 128", got)
	}
	if got := k.StepBlocks(Request{PromptBlocks: 10, PromptTokens: 330}); got != 8192/33.0 {
		t.Errorf("default step, block size from the prompt: %v, want %v", got, 8192/33.0)
	}
	k, _ = NewKVRoute(KVRouteConfig{StepTokens: Float(2048)})
	if got := k.StepBlocks(Request{PromptBlocks: 10}); got != 128 {
		t.Errorf("step_tokens 2048 in 16-token blocks: %v, want 128", got)
	}
	for _, v := range []float64{0, -8192, 0.5, 8192.5, 1 << 25, math.NaN(), math.Inf(1)} {
		cfg := Config{KVRoute: KVRouteConfig{StepTokens: Float(v)}}
		if _, err := New(NameKVRoute, cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "kvroute.step_tokens") {
			t.Errorf("step_tokens %v: error %v, want ErrConfig naming kvroute.step_tokens", v, err)
		}
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("step_tokens %v: Validate %v, want ErrConfig", v, err)
		}
	}
	for _, v := range []float64{1, 2048, 1 << 24} {
		if _, err := New(NameKVRoute, Config{KVRoute: KVRouteConfig{StepTokens: Float(v)}}); err != nil {
			t.Errorf("step_tokens %v: %v", v, err)
		}
	}
}

// A burst that fills the fleet is held where its prompt is in flight: a
// GRPO sample (53 blocks of 64 tokens: a 16-block environment prompt
// indexed on the other replicas and a 37-block task; h, which took the
// group's first sample, has all 53 in flight) meets every other replica
// with more than a step (128 blocks) of prefill queued. The prediction
// prefers another replica (22 blocks' wait less there, where it would
// compute the task again); held, it goes to h, which starts it before the
// other would have finished it. With the environment prompt indexed on h
// too (held fleet-wide), the others' fresh queues are waited for in full
// and the prediction itself picks h.
func TestKVRouteHoldsBurstThatFillsFleet(t *testing.T) {
	fleet := func(others float64) []Candidate {
		h := pend(withReqs(cand("h", 0, 53+150, 0), 4, 0), 53)
		h.Queued, h.QueuedCharge = 170, 203
		cs := []Candidate{h}
		for i := range 3 {
			c := withReqs(cand(fmt.Sprint("r", i), 16, 140, 0), 4, 0)
			c.Queued, c.QueuedCharge = others, 140
			cs = append(cs, c)
		}
		return cs
	}
	req := Request{PromptBlocks: 53, BlockSize: 64, SessionKey: "grpo-7", SpreadUtil: 0.1}
	p := mustNew(t, NameKVRoute, Config{})
	res := p.Pick(req, fleet(140), seeded(1))
	if res.Pick != 0 || res.Reason != ReasonHeld {
		t.Fatalf("fleet filled: picked %d (%s), want the holder, held; costs %v", res.Pick, res.Reason, res.Costs)
	}
	if !(res.Costs[1] < res.Costs[0]) {
		t.Errorf("costs %v: want another replica cheaper than the holder by the prediction", res.Costs)
	}
	// The environment prompt indexed on h as well: every replica holds
	// it, no replica's queue is discounted for it.
	cs := fleet(140)
	cs[0] = pend(withReqs(cand("h", 16, 37+150, 0), 4, 0), 37)
	cs[0].Queued, cs[0].QueuedCharge = 170, 187
	if res := p.Pick(req, cs, seeded(1)); res.Pick != 0 || !(res.Costs[0] < res.Costs[1]) {
		t.Errorf("environment prompt held fleet-wide: picked %d (%s), want the holder, cheapest by the prediction; costs %v", res.Pick, res.Reason, res.Costs)
	}
	// A replica with less than a step queued starts the sample in the
	// engine's next step: no hold, the prediction decides.
	if res := p.Pick(req, fleet(100), seeded(1)); res.Pick == 0 || res.Reason != ReasonCost {
		t.Errorf("a replica with room in its next step: picked %d (%s), want another by cost; costs %v", res.Pick, res.Reason, res.Costs)
	}
	// With engines taking 16384 tokens a step, 140 blocks are not a step.
	big := mustNew(t, NameKVRoute, Config{KVRoute: KVRouteConfig{StepTokens: Float(16384)}})
	if res := big.Pick(req, fleet(140), seeded(1)); res.Pick == 0 {
		t.Errorf("step_tokens 16384: picked the holder; costs %v", res.Costs)
	}
	// The holder would start it after the others would have finished it
	// (140 + 37 blocks): no hold.
	cs = fleet(140)
	cs[0].Queued = 180
	if res := p.Pick(req, cs, seeded(1)); res.Pick == 0 {
		t.Errorf("holder behind the others' finish: picked the holder; costs %v", res.Costs)
	}
	// A replica with only part of the prompt in flight is not a holder.
	cs = fleet(140)
	cs[0].Pending = 20
	if res := p.Pick(req, cs, seeded(1)); res.Reason == ReasonHeld {
		t.Errorf("part of the prompt in flight: held on %d; costs %v", res.Pick, res.Costs)
	}
	// An unhealthy holder holds nothing.
	cs = fleet(140)
	cs[0] = unhealthy(cs[0])
	if res := p.Pick(req, cs, seeded(1)); res.Pick == 0 || res.Reason == ReasonHeld {
		t.Errorf("unhealthy holder: picked %d (%s)", res.Pick, res.Reason)
	}
}

func TestKVRoutePricesFutureFollowsFutureWeight(t *testing.T) {
	for _, tt := range []struct {
		w    *float64
		want bool
	}{{nil, true}, {Float(0), false}, {Float(2), true}} {
		k, err := NewKVRoute(KVRouteConfig{FutureWeight: tt.w})
		if err != nil {
			t.Fatal(err)
		}
		if got := k.PricesFuture(); got != tt.want {
			t.Errorf("future_weight %v: PricesFuture %v, want %v", tt.w, got, tt.want)
		}
	}
}

// A GRPO sample in a burst (the environment prompt that draws it had 15
// placements in the last second on 4 replicas) whose whole prompt, its
// task included, is in flight on one replica: copying the task prompt to
// another replica is work the burst's later samples wait for there, so
// the sample pays the move charge everywhere but on the holder and goes
// to the holder, even where the prefix share bound would pass the holder
// over. While the fleet's next steps have room for the copy it is charged
// nothing, but held on the holder; outside a burst the prediction alone
// spreads it, as before, unless its prefix drew a burst of 2N before
// (Request.PrefixBurst).
func TestKVRouteSiblingInBurstStaysWithItsPrompt(t *testing.T) {
	fleet := func() []Candidate {
		cs := []Candidate{
			withReqs(cand("r0", 16, 51, 0), 9, 0),
			withReqs(cand("r1", 16, 51, 0), 10, 0),
			pend(withReqs(cand("r2", 16, 91, 0), 10, 0), 40),
			withReqs(cand("r3", 16, 85, 0), 29, 0),
		}
		// The router's fluid queues: 270 blocks, more than half a
		// 128-block engine step on each of the 4 replicas; r0's is all
		// but drained.
		for i, q := range []float64{20, 60, 100, 90} {
			cs[i].PrefixShare = 0.25
			cs[i].Queued, cs[i].QueuedCharge = q, cs[i].Load.ActivePrefillBlocks
		}
		cs[2].PrefixShare = 0.4 // over prefix_share_bound/N = 0.3125
		return cs
	}
	k, err := NewKVRoute(KVRouteConfig{})
	if err != nil {
		t.Fatal(err)
	}
	burst := Request{PromptBlocks: 56, BlockSize: 64, SessionKey: "grpo-66", PrefixPlacements: 15}
	cs := fleet()
	f := k.FleetOf(burst, cs, nil)
	if !f.Sibling || f.HomeOwn != 0 {
		t.Fatalf("burst sibling: Fleet.Sibling %v, HomeOwn %v; want true, 0 (the holder holds it all)", f.Sibling, f.HomeOwn)
	}
	for i, c := range cs {
		m := k.Predict(burst, c, k.HitBlocks(burst, c), f).Move
		if holder := i == 2; holder != (m == 0) {
			t.Errorf("candidate %d (holder %v): move charge %v", i, holder, m)
		}
	}
	res := k.Pick(burst, cs, seeded(1))
	if res.Pick != 2 {
		t.Errorf("burst sibling: picked %d (%s), want the holder 2; costs %v", res.Pick, res.Reason, res.Costs)
	}

	// The same sample outside a burst: no move charge, the prediction
	// alone prefers a replica with a shorter queue.
	alone := burst
	alone.PrefixPlacements = 3
	if f := k.FleetOf(alone, fleet(), nil); f.Sibling || !math.IsInf(f.HomeOwn, 1) {
		t.Errorf("outside a burst: Fleet.Sibling %v, HomeOwn %v; want false, +Inf", f.Sibling, f.HomeOwn)
	}
	if res := k.Pick(alone, fleet(), seeded(1)); res.Pick == 2 {
		t.Errorf("outside a burst: picked the holder; costs %v", res.Costs)
	}

	// While the fleet's queues come to less than half a step a replica,
	// a copy is charged nothing, and the prediction alone prefers r0; but
	// the sample is held on the holder all the same (Held): the burst's
	// later samples take the room a copy would use. The holder is over
	// the prefix share bound, and is not passed over for it.
	cs = fleet()
	for i := range cs {
		cs[i].Queued = 20
	}
	if f := k.FleetOf(burst, cs, nil); f.Sibling {
		t.Errorf("fleet with room: Fleet.Sibling set")
	}
	if res := k.Pick(burst, cs, seeded(1)); res.Pick != 2 || res.Reason != ReasonHeld || !(res.Costs[0] < res.Costs[2]) {
		t.Errorf("fleet with room: picked %d (%s), want the holder 2, held over a cheaper r0; costs %v", res.Pick, res.Reason, res.Costs)
	}
	// Outside a burst, or for a session with a home, nothing is held
	// while the fleet has room: the prediction decides.
	if res := k.Pick(alone, cs, seeded(1)); res.Pick == 2 {
		t.Errorf("fleet with room, outside a burst: picked the holder; costs %v", res.Costs)
	}
	// A burst's first samples, before its count reaches 2N, on a prefix
	// whose last burst drew 2N or more: held as in a burst. A smaller
	// last burst holds nothing.
	next := alone
	next.PrefixBurst = 8
	if res := k.Pick(next, cs, seeded(1)); res.Pick != 2 || res.Reason != ReasonHeld {
		t.Errorf("fleet with room, a prefix that drew a burst before: picked %d (%s), want the holder 2, held; costs %v", res.Pick, res.Reason, res.Costs)
	}
	next.PrefixBurst = 7
	if res := k.Pick(next, cs, seeded(1)); res.Pick == 2 {
		t.Errorf("fleet with room, a prefix whose last burst was under 2N: picked the holder; costs %v", res.Costs)
	}
	homed := fleet()
	for i := range homed {
		homed[i].Queued = 20
	}
	homed[0].Home = true
	if h := k.Held(burst, homed, k.FleetOf(burst, homed, nil), nil); h != nil {
		t.Errorf("fleet with room, a session with a home: held")
	}

	// A replica holding only part of the prompt in flight is no holder.
	cs = fleet()
	cs[2].Pending = 20
	if f := k.FleetOf(burst, cs, nil); f.Sibling {
		t.Errorf("part of the prompt in flight: Fleet.Sibling set")
	}

	// A session's home keeps the move charge its own: a parallel request
	// with a home is charged against the home, not a holder.
	cs = fleet()
	cs[0].Home = true
	if f := k.FleetOf(burst, cs, nil); f.Sibling || f.HomeOwn != 40 {
		t.Errorf("with a home: Fleet.Sibling %v, HomeOwn %v; want false, 40", f.Sibling, f.HomeOwn)
	}
}

// A request without a home whose prompt one replica alone holds nearly
// whole is a conversation's next turn under a new key: it pays the move
// charge away from that holder, as a session leaving its home does, and
// stays there behind a queue it would otherwise leave. A prompt two
// replicas hold half of (a shared system prompt), a holder of less than
// nine tenths, a holder of the whole prompt in flight (a burst's sibling)
// and a holder without cache credit make no continuation.
func TestKVRouteContinuationPaysMoveCharge(t *testing.T) {
	k, err := NewKVRoute(KVRouteConfig{})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptBlocks: 600, BlockSize: 64, SessionKey: "conv:new"}
	fleet := func(holder int, second int) []Candidate {
		return []Candidate{
			cand("holder", holder, 1400, 0),
			cand("second", second, 1400, 0),
			cand("busy", 0, 400, 0),
			cand("idle", 0, 0, 0),
		}
	}
	tests := []struct {
		name      string
		cands     []Candidate
		credited  func(Candidate) bool
		continued bool
		homeOwn   float64
		pick      int
	}{
		{"one holder of 590 of 600 blocks", fleet(590, 0), nil, true, 10, 0},
		{"a second replica holds half: a shared prefix", fleet(590, 300), nil, false, math.Inf(1), 3},
		{"the holder has 80 %", fleet(480, 0), nil, false, math.Inf(1), 3},
		{"the holder without cache credit", fleet(590, 0), func(c Candidate) bool { return c.Replica != "holder" }, false, math.Inf(1), -1},
		{"the whole prompt in flight at the holder: a sibling's", func() []Candidate { cs := fleet(590, 0); cs[0] = pend(cs[0], 9); return cs }(), nil, false, math.Inf(1), -1},
		{"a home is a home", func() []Candidate { cs := fleet(590, 0); cs[2] = home(cs[2]); return cs }(), nil, false, 600, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := k.FleetOf(req, tt.cands, tt.credited)
			if _, continued := k.Continuation(req, tt.cands, tt.credited); continued != tt.continued || !(f.HomeOwn == tt.homeOwn || math.Abs(f.HomeOwn-tt.homeOwn) < 1e-9) {
				t.Errorf("continuation %v HomeOwn %v, want %v %v", continued, f.HomeOwn, tt.continued, tt.homeOwn)
			}
			if tt.pick < 0 {
				return
			}
			if res := k.Pick(req, tt.cands, seeded(1)); res.Pick != tt.pick {
				t.Errorf("picked %d (%s), want %d; costs %v", res.Pick, res.Reason, tt.pick, res.Costs)
			}
		})
	}
}

// With move_fill 1, a move onto a candidate whose KV cache is fuller than
// the fleet's emptiest is charged at that excess over the room it has
// left, (u-min)/(1-u), when the fleet's pressure is lower: a move into a
// full cache while another replica has room. With every cache as full,
// or with move_fill off (the default), the fleet's pressure prices it.
func TestKVRouteMovePressureOfAFullCache(t *testing.T) {
	k, err := NewKVRoute(KVRouteConfig{MoveFill: Float(1)})
	if err != nil {
		t.Fatal(err)
	}
	withFill := func(name string, u float64) Candidate {
		c := cand(name, 0, 0, 0)
		c.Load.KVUsage, c.Load.KVBlocks = u, 1000
		return c
	}
	for _, tt := range []struct {
		name           string
		c              Candidate
		fleet, minFill float64
		want           float64
	}{
		{"full while another has room", withFill("full", 0.9), 0, 0.1, 8},
		{"the emptiest itself", withFill("empty", 0.1), 0, 0.1, 0},
		{"the fleet's pressure is higher", withFill("full", 0.9), 12, 0.1, 12},
		{"completely full: the cap", withFill("overfull", 1), 0, 0.1, DefaultKVRouteMovePressureMax},
		{"every cache as full: the fleet's", withFill("full", 0.92), 0.5, 0.9, 0.5},
		{"no report: the fleet's", cand("none", 0, 0, 0), 0.5, 0, 0.5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := k.MovePressure(tt.c, Fleet{Pressure: tt.fleet, MinFill: tt.minFill}); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("MovePressure = %v, want %v", got, tt.want)
			}
		})
	}
	half, err := NewKVRoute(KVRouteConfig{MoveFill: Float(0.5)})
	if err != nil {
		t.Fatal(err)
	}
	if got := half.MovePressure(withFill("full", 0.9), Fleet{MinFill: 0.1}); math.Abs(got-4) > 1e-9 {
		t.Errorf("move_fill 0.5: MovePressure = %v, want 4", got)
	}
	if got := half.MovePressure(withFill("overfull", 1), Fleet{MinFill: 0.1}); got != DefaultKVRouteMovePressureMax {
		t.Errorf("move_fill 0.5, a full cache: MovePressure = %v, want the cap", got)
	}
	off, _ := NewKVRoute(KVRouteConfig{})
	if got := off.MovePressure(withFill("full", 0.9), Fleet{Pressure: 0.5, MinFill: 0.1}); got != 0.5 {
		t.Errorf("move_fill off (the default): MovePressure = %v, want the fleet's 0.5", got)
	}
	// In the cost: a session's next turn whose home is busy and full is
	// priced away from a replica as full as its home, not from one with
	// room; an unhealthy replica's empty cache is no room.
	req := Request{PromptBlocks: 200, ExpectedOutputBlocks: 8}
	home := withReqs(withFill("home", 0.97), 4, 0)
	home.Home, home.Matched[index.TierGPU], home.Load.ActivePrefillBlocks = true, 190, 40
	full, empty := withFill("full", 0.9), withFill("empty", 0.1)
	f := k.FleetOf(req, []Candidate{home, full, empty, unhealthy(withFill("down", 0))}, nil)
	if math.Abs(f.Pressure-0.5) > 1e-9 || f.MinFill != 0.1 {
		t.Fatalf("fleet pressure %v, least fill %v: want 0.5 (one of three busy) and 0.1", f.Pressure, f.MinFill)
	}
	hf, he := k.Predict(req, full, 0, f), k.Predict(req, empty, 0, f)
	if he.Move <= 0 || math.Abs(hf.Move/he.Move-8/0.5) > 1e-9 {
		t.Fatalf("move charge onto a 90 %% full cache %v, onto a 10 %% full one %v: want 8 against the fleet's 0.5", hf.Move, he.Move)
	}
	if !(hf.Total() > he.Total()) {
		t.Fatalf("the full cache costs %v, the one with room %v", hf.Total(), he.Total())
	}
}
