package policy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

func seeded(seed uint64) Env { return Env{Rand: rand.New(rand.NewPCG(seed, 1))} }

// cand builds a healthy candidate with GPU matches and block loads.
func cand(id string, gpu int, prefill, decode float64) Candidate {
	return Candidate{
		Replica: index.ReplicaID(id),
		Matched: [index.NumTiers]int{gpu, 0, 0},
		Trust:   1,
		Load:    load.Load{ActivePrefillBlocks: prefill, ActiveDecodeBlocks: decode, Healthy: true},
	}
}

func withReqs(c Candidate, running, waiting int) Candidate {
	c.Load.ActiveRequests, c.Load.WaitingRequests = running, waiting
	return c
}

// withKV gives c an engine with blocks KV blocks reporting usage of them
// in use.
func withKV(c Candidate, blocks, usage float64) Candidate {
	c.Load.KVBlocks, c.Load.KVUsage = blocks, usage
	return c
}

func unhealthy(c Candidate) Candidate { c.Load.Healthy = false; return c }

func mustNew(t *testing.T, name string, cfg Config) Policy {
	t.Helper()
	p, err := New(name, cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return p
}

func mustBlended(t *testing.T, cfg BlendedConfig) *Blended {
	t.Helper()
	b, err := NewBlended(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The seed's decay example: replica 1 carries 8 blocks of excess prefill on
// an 8-block request, so at decay 1 its 6 matched blocks are credited as 3.
func TestBlendedSeedDecayExample(t *testing.T) {
	req := Request{PromptBlocks: 8}
	cands := []Candidate{cand("a", 6, 0, 0), cand("b", 6, 8, 0)}
	plain := mustBlended(t, BlendedConfig{}).Pick(req, cands, seeded(1))
	decayed := mustBlended(t, BlendedConfig{OverlapScoreCreditDecay: 1}).Pick(req, cands, seeded(1))

	if got := 8 + 8 - plain.Costs[1]; got != 6 {
		t.Errorf("plain credit = %v, want 6", got)
	}
	if got := 8 + 8 - decayed.Costs[1]; got != 3 {
		t.Errorf("decayed credit = %v, want 3", got)
	}
	if plain.Costs[0] != decayed.Costs[0] {
		t.Errorf("least-loaded candidate decayed: %v -> %v", plain.Costs[0], decayed.Costs[0])
	}
	b := mustBlended(t, BlendedConfig{OverlapScoreCreditDecay: 1})
	if got := b.CreditBlocks(req, cands[0], 0); got != 6 {
		t.Errorf("least-loaded CreditBlocks = %v, want 6", got)
	}

	// incoming_active_blocks shifts every cost alike and never changes the pick.
	shifted := mustBlended(t, BlendedConfig{}).Pick(Request{PromptBlocks: 8, ExpectedOutputBlocks: 4}, cands, seeded(1))
	for i := range cands {
		if d := shifted.Costs[i] - plain.Costs[i]; d != 4 {
			t.Errorf("candidate %d shifted by %v, want 4", i, d)
		}
	}
	if shifted.Pick != plain.Pick {
		t.Errorf("pick changed with incoming blocks: %d -> %d", plain.Pick, shifted.Pick)
	}
}

func TestBlendedCost(t *testing.T) {
	tiers := func(g, c, d int) Candidate {
		x := cand("x", 0, 0, 0)
		x.Matched = [index.NumTiers]int{g, c, d}
		return x
	}
	tests := []struct {
		name string
		cfg  BlendedConfig
		req  Request
		c    Candidate
		want float64
	}{
		{"gpu credit", BlendedConfig{}, Request{PromptBlocks: 10}, tiers(4, 0, 0), 6},
		{"cpu at 0.75", BlendedConfig{}, Request{PromptBlocks: 10}, tiers(0, 4, 0), 7},
		{"disk at 0.25", BlendedConfig{}, Request{PromptBlocks: 10}, tiers(0, 0, 4), 9},
		{"tiers add", BlendedConfig{}, Request{PromptBlocks: 10}, tiers(2, 4, 4), 10 - 2 - 3 - 1},
		{"custom tier weights", BlendedConfig{HostCacheHitWeight: Float(0.5), DiskCacheHitWeight: Float(0)}, Request{PromptBlocks: 10}, tiers(0, 4, 4), 8},
		{"clamped at zero", BlendedConfig{OverlapScoreCredit: Float(4)}, Request{PromptBlocks: 4}, tiers(4, 0, 0), 0},
		{"credit scales", BlendedConfig{OverlapScoreCredit: Float(0.5)}, Request{PromptBlocks: 10}, tiers(4, 0, 0), 8},
		{"credit 0 is load only", BlendedConfig{OverlapScoreCredit: Float(0)}, Request{PromptBlocks: 10}, tiers(4, 0, 0), 10},
		{"candidate trust 0", BlendedConfig{}, Request{PromptBlocks: 10}, func() Candidate { c := tiers(4, 4, 0); c.Trust = 0; return c }(), 10},
		{"candidate trust 0.5", BlendedConfig{}, Request{PromptBlocks: 10}, func() Candidate { c := tiers(4, 0, 0); c.Trust = 0.5; return c }(), 8},
		{"candidate trust NaN", BlendedConfig{}, Request{PromptBlocks: 10}, func() Candidate { c := tiers(4, 0, 0); c.Trust = math.NaN(); return c }(), 10},
		{"candidate trust above 1 clamped", BlendedConfig{}, Request{PromptBlocks: 10}, func() Candidate { c := tiers(4, 0, 0); c.Trust = 3; return c }(), 6},
		{"decode and incoming", BlendedConfig{}, Request{PromptBlocks: 10, ExpectedOutputBlocks: 3}, func() Candidate { c := tiers(0, 0, 0); c.Load.ActiveDecodeBlocks = 5; return c }(), 18},
		{"prefill scale", BlendedConfig{PrefillLoadScale: Float(2)}, Request{PromptBlocks: 10}, func() Candidate { c := tiers(4, 0, 0); c.Load.ActivePrefillBlocks = 2; return c }(), 16},
		{"request weight", BlendedConfig{DecodeActiveRequestWeight: 1.5}, Request{PromptBlocks: 10}, func() Candidate { c := tiers(0, 0, 0); c.Load.ActiveRequests = 4; c.Load.WaitingRequests = 9; return c }(), 16},
		{"decay ignores host tier", BlendedConfig{OverlapScoreCreditDecay: 1}, Request{PromptBlocks: 8}, func() Candidate { c := tiers(0, 4, 0); c.Load.ActivePrefillBlocks = 8; return c }(), 8 + 8 - 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustBlended(t, tt.cfg)
			if got := b.Cost(tt.req, tt.c, 0); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Cost = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBlendedPicks(t *testing.T) {
	tests := []struct {
		name   string
		cands  []Candidate
		want   int
		reason string
	}{
		{"overlap wins at equal load", []Candidate{cand("a", 0, 0, 0), cand("b", 5, 0, 0), cand("c", 2, 0, 0)}, 1, ReasonCost},
		{"load beats overlap", []Candidate{cand("a", 0, 0, 0), cand("b", 5, 20, 0)}, 0, ReasonCost},
		{"equal cost goes to lower load", []Candidate{cand("a", 5, 0, 5), cand("b", 0, 0, 0), cand("c", 5, 0, 5)}, 1, ReasonCost},
		{"equal cost and blocks: fewer requests", []Candidate{withReqs(cand("a", 0, 2, 0), 3, 0), cand("b", 2, 0, 2), withReqs(cand("c", 2, 0, 2), 0, 1)}, 1, ReasonCost},
		{"unhealthy best skipped", []Candidate{unhealthy(cand("a", 9, 0, 0)), cand("b", 1, 0, 0)}, 1, ReasonCost},
		{"resyncing replica gets no credit", []Candidate{func() Candidate { c := cand("a", 8, 0, 0); c.Trust = 0; return c }(), cand("b", 1, 0, 0)}, 1, ReasonCost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := mustBlended(t, BlendedConfig{}).Pick(Request{PromptBlocks: 10}, tt.cands, seeded(3))
			if res.Pick != tt.want || res.Reason != tt.reason {
				t.Fatalf("Pick = %d (%s), want %d (%s); costs %v", res.Pick, res.Reason, tt.want, tt.reason, res.Costs)
			}
			for i, c := range tt.cands {
				if !c.Load.Healthy && !math.IsNaN(res.Costs[i]) {
					t.Errorf("ineligible candidate %d has cost %v, want NaN", i, res.Costs[i])
				}
			}
		})
	}
}

// allPolicies builds every policy with defaults.
func allPolicies(t *testing.T) []Policy {
	t.Helper()
	var ps []Policy
	for _, n := range Names() {
		ps = append(ps, mustNew(t, n, Config{}))
	}
	return ps
}

func TestNoneEligible(t *testing.T) {
	cands := []Candidate{unhealthy(cand("a", 4, 0, 0)), unhealthy(cand("b", 0, 0, 0))}
	for _, p := range allPolicies(t) {
		for _, cs := range [][]Candidate{nil, cands} {
			res := p.Pick(Request{PromptBlocks: 4, SessionKey: "s"}, cs, seeded(1))
			if res.Pick != -1 {
				t.Errorf("%s with %d unhealthy candidates picked %d, want -1", p.Name(), len(cs), res.Pick)
			}
		}
	}
}

// Across random fleets, no policy ever picks an unhealthy candidate, even
// when the unhealthy one is the best on every criterion.
func TestUnhealthyNeverPicked(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, p := range allPolicies(t) {
		t.Run(p.Name(), func(t *testing.T) {
			env := seeded(5)
			for trial := range 500 {
				n := 1 + r.IntN(6)
				cands := make([]Candidate, n)
				for i := range cands {
					c := cand(fmt.Sprint("r", i), r.IntN(10), float64(r.IntN(20)), float64(r.IntN(20)))
					c.Load.KVUsage = r.Float64()
					c = withReqs(c, r.IntN(100), r.IntN(100))
					if r.IntN(3) == 0 {
						c = unhealthy(c)
						c.Matched[index.TierGPU] = 10 // the best match, no load
						c.Load = load.Load{}
					}
					cands[i] = c
				}
				res := p.Pick(Request{PromptBlocks: 10, SessionKey: fmt.Sprint("s", trial%7)}, cands, env)
				if !anyEligible(cands) {
					if res.Pick != -1 {
						t.Fatalf("trial %d: picked %d with none eligible", trial, res.Pick)
					}
					continue
				}
				if res.Pick < 0 || res.Pick >= n || !cands[res.Pick].Load.Healthy {
					t.Fatalf("trial %d: picked %d (%s) among %+v", trial, res.Pick, res.Reason, cands)
				}
			}
		})
	}
}

func TestColdIndexLeastLoaded(t *testing.T) {
	creditless := func(c Candidate) Candidate { c.Trust = 0; return c }
	fleets := map[string][]Candidate{
		"no matches": {
			cand("a", 0, 4, 0), cand("b", 0, 1, 0), cand("c", 0, 9, 0), cand("d", 0, 3, 0),
		},
		"matches only on resyncing replicas": {
			creditless(cand("a", 5, 4, 0)), cand("b", 0, 1, 0), creditless(cand("c", 5, 9, 0)), cand("d", 0, 3, 0),
		},
		"matches only on unhealthy replicas": {
			unhealthy(cand("a", 5, 0, 0)), cand("b", 0, 1, 0), cand("c", 0, 9, 0), cand("d", 0, 3, 0),
		},
	}
	for _, name := range []string{NameBlended, NameHardSwitch, NamePrefixAffinity, NameLeastLoad, NamePureAffinity} {
		for fname, cands := range fleets {
			t.Run(name+"/"+fname, func(t *testing.T) {
				cfg := Config{Blended: BlendedConfig{PrefillLoadScale: Float(3)}}
				res := mustNew(t, name, cfg).Pick(Request{PromptBlocks: 9, ExpectedOutputBlocks: 4.5}, cands, seeded(2))
				if res.Pick != 1 || res.Reason != ReasonColdIndex {
					t.Fatalf("Pick = %d (%s), want 1 (%s)", res.Pick, res.Reason, ReasonColdIndex)
				}
			})
		}
	}
}

// Ties are broken at random, not by index: over many picks among identical
// candidates every index wins about equally often (fixed seed, so the test
// is deterministic; bounds are ~7 standard deviations wide).
func TestTieBreakNotIndexBiased(t *testing.T) {
	const n, picks = 4, 4000
	tied := func(gpu int) []Candidate {
		cs := make([]Candidate, n)
		for i := range cs {
			cs[i] = withReqs(cand(fmt.Sprint("r", i), gpu, 2, 2), 1, 0)
		}
		return cs
	}
	tests := []struct {
		policy string
		cands  []Candidate
		reason string
	}{
		{NameBlended, tied(3), ReasonCost},
		{NameBlended, tied(0), ReasonColdIndex},
		{NameLeastLoad, tied(3), ReasonLeastLoad},
		{NameHardSwitch, tied(5), ReasonMatch},
		{NameHardSwitch, tied(1), ReasonLowMatch},
		{NamePrefixAffinity, tied(5), ReasonMatch},
		{NamePrefixAffinity, tied(0), ReasonColdIndex},
		{NameRandom, tied(5), ReasonRandom},
		{NameSession, tied(5), ReasonNoSessionKey},
	}
	for _, tt := range tests {
		t.Run(tt.policy+"/"+tt.reason, func(t *testing.T) {
			p := mustNew(t, tt.policy, Config{})
			env := seeded(42)
			var counts [n]int
			for range picks {
				res := p.Pick(Request{PromptBlocks: 10}, tt.cands, env)
				if res.Reason != tt.reason {
					t.Fatalf("reason %q, want %q", res.Reason, tt.reason)
				}
				counts[res.Pick]++
			}
			for i, c := range counts {
				if c < 800 || c > 1200 {
					t.Errorf("index %d won %d of %d ties (counts %v), want ~%d", i, c, picks, counts, picks/n)
				}
			}
		})
	}
}

func TestHardSwitch(t *testing.T) {
	// loads are running+waiting request counts
	fleet := func(gpus []int, reqs []int) []Candidate {
		cs := make([]Candidate, len(gpus))
		for i := range cs {
			cs[i] = withReqs(cand(fmt.Sprint("r", i), gpus[i], 0, 0), reqs[i], 0)
		}
		return cs
	}
	tests := []struct {
		name   string
		cands  []Candidate
		want   int
		reason string
	}{
		{"balanced, match above threshold", fleet([]int{0, 5, 2}, []int{10, 12, 11}), 1, ReasonMatch},
		{"match exactly at threshold", fleet([]int{0, 3, 2}, []int{1, 3, 2}), 1, ReasonMatch},
		{"match below threshold goes least loaded", fleet([]int{0, 2, 1}, []int{10, 5, 12}), 1, ReasonLowMatch},
		{"imbalanced: both conditions", fleet([]int{9, 0, 0}, []int{200, 100, 120}), 1, ReasonImbalanced},
		{"abs exceeded but not rel stays balanced", fleet([]int{9, 0, 0}, []int{200, 140, 150}), 0, ReasonMatch},
		{"rel exceeded but not abs stays balanced", fleet([]int{9, 0, 0}, []int{60, 1, 2}), 0, ReasonMatch},
		{"abs boundary is strict", fleet([]int{9, 0, 0}, []int{64, 0, 10}), 0, ReasonMatch},
		{"waiting counts as load", []Candidate{withReqs(cand("a", 9, 0, 0), 10, 190), withReqs(cand("b", 0, 0, 0), 100, 0)}, 1, ReasonImbalanced},
		{"unhealthy loads do not trip imbalance", []Candidate{withReqs(cand("a", 9, 0, 0), 10, 0), unhealthy(withReqs(cand("b", 0, 0, 0), 500, 0))}, 0, ReasonMatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := mustNew(t, NameHardSwitch, Config{}).Pick(Request{PromptBlocks: 10}, tt.cands, seeded(1))
			if res.Pick != tt.want || res.Reason != tt.reason {
				t.Fatalf("Pick = %d (%s), want %d (%s)", res.Pick, res.Reason, tt.want, tt.reason)
			}
		})
	}
	t.Run("custom thresholds", func(t *testing.T) {
		p := mustNew(t, NameHardSwitch, Config{HardSwitch: HardSwitchConfig{
			CacheThreshold: Float(0.8), BalanceAbsThreshold: Float(2), BalanceRelThreshold: Float(1),
		}})
		cs := fleet([]int{5, 0}, []int{3, 1})
		// 3-1 = 2 is not > 2: balanced; rate 0.5 < 0.8: the least loaded, 1
		if res := p.Pick(Request{PromptBlocks: 10}, cs, seeded(1)); res.Pick != 1 || res.Reason != ReasonLowMatch {
			t.Fatalf("Pick = %d (%s), want 1 (%s)", res.Pick, res.Reason, ReasonLowMatch)
		}
		cs = fleet([]int{5, 0}, []int{4, 1})
		if res := p.Pick(Request{PromptBlocks: 10}, cs, seeded(1)); res.Pick != 1 || res.Reason != ReasonImbalanced {
			t.Fatalf("Pick = %d (%s), want 1 (%s)", res.Pick, res.Reason, ReasonImbalanced)
		}
	})
}

func TestPrefixAffinity(t *testing.T) {
	fleet := func(gpus []int, reqs []int, kv []float64) []Candidate {
		cs := make([]Candidate, len(gpus))
		for i := range cs {
			cs[i] = withReqs(cand(fmt.Sprint("r", i), gpus[i], 0, 0), reqs[i], 0)
			cs[i].Load.KVUsage = kv[i]
		}
		return cs
	}
	tests := []struct {
		name   string
		cfg    PrefixAffinityConfig
		cands  []Candidate
		want   []int // acceptable picks
		reason string
	}{
		{"default never imbalanced", PrefixAffinityConfig{}, fleet([]int{5, 0, 0}, []int{1000, 0, 0}, []float64{0.5, 0.1, 0.2}), []int{0}, ReasonMatch},
		{"imbalanced: power of two among the rest", PrefixAffinityConfig{ImbalancedThreshold: Float(10)},
			fleet([]int{5, 0, 0}, []int{100, 0, 0}, []float64{0.5, 0.1, 0.2}), []int{1, 2}, ReasonImbalanced},
		{"match rate at threshold", PrefixAffinityConfig{}, fleet([]int{1, 0, 0}, []int{0, 0, 0}, []float64{0.5, 0.1, 0.2}), []int{0}, ReasonMatch},
		{"low match: smallest kv usage", PrefixAffinityConfig{MatchRateThreshold: Float(0.5)}, fleet([]int{1, 0, 0}, []int{0, 0, 0}, []float64{0.5, 0.3, 0.2}), []int{2}, ReasonLowMatch},
		{"low match: footprint preferred over kv usage", PrefixAffinityConfig{MatchRateThreshold: Float(0.5)},
			func() []Candidate {
				cs := fleet([]int{1, 0, 0}, []int{0, 0, 0}, []float64{0.5, 0.3, 0.2})
				cs[0].Footprint, cs[1].Footprint, cs[2].Footprint = 50, 10, 70
				return cs
			}(), []int{1}, ReasonLowMatch},
		{"low match, no footprint data: power of two", PrefixAffinityConfig{MatchRateThreshold: Float(0.5)},
			fleet([]int{1, 0}, []int{9, 0}, []float64{0, 0}), []int{1}, ReasonNoPrefixData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, NamePrefixAffinity, Config{PrefixAffinity: tt.cfg})
			env := seeded(9)
			for range 50 {
				res := p.Pick(Request{PromptBlocks: 10}, tt.cands, env)
				if res.Reason != tt.reason || !contains(tt.want, res.Pick) {
					t.Fatalf("Pick = %d (%s), want one of %v (%s)", res.Pick, res.Reason, tt.want, tt.reason)
				}
			}
		})
	}
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// Power of two choices picks the less loaded of two distinct random
// candidates: over many draws every candidate but the most loaded wins
// sometimes, and the most loaded never does.
func TestPowerOfTwo(t *testing.T) {
	cs := make([]Candidate, 4)
	for i := range cs {
		cs[i] = withReqs(cand(fmt.Sprint("r", i), 0, 0, 0), 10*i, 0)
	}
	env := seeded(4)
	var counts [4]int
	for range 2000 {
		counts[powerOfTwo(cs, env)]++
	}
	if counts[3] != 0 || counts[0] == 0 || counts[1] == 0 || counts[2] == 0 {
		t.Fatalf("counts %v: want the most loaded never and every other sometimes", counts)
	}
	// With two distinct draws, the least loaded wins exactly when drawn: 1/2 of the time.
	if counts[0] < 850 || counts[0] > 1150 {
		t.Errorf("least loaded won %d of 2000, want ~1000", counts[0])
	}
}

func TestSession(t *testing.T) {
	fleet := func(n int) []Candidate {
		cs := make([]Candidate, n)
		for i := range cs {
			cs[i] = cand(fmt.Sprint("replica-", i), 0, 0, 0)
		}
		return cs
	}
	p, err := NewSession(SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cs := fleet(4)
	env := seeded(1)
	owner := map[string]index.ReplicaID{}
	var counts [4]int
	for k := range 4000 {
		key := fmt.Sprint("session-", k)
		res := p.Pick(Request{SessionKey: key}, cs, env)
		if res.Reason != ReasonSession {
			t.Fatalf("reason %q", res.Reason)
		}
		owner[key] = cs[res.Pick].Replica
		counts[res.Pick]++
	}
	t.Run("balanced with virtual nodes", func(t *testing.T) {
		for i, c := range counts {
			if c < 750 || c > 1250 {
				t.Errorf("replica %d owns %d of 4000 sessions (%v)", i, c, counts)
			}
		}
	})
	t.Run("stable and order independent", func(t *testing.T) {
		rev := []Candidate{cs[3], cs[2], cs[1], cs[0]}
		for key, want := range owner {
			res := p.Pick(Request{SessionKey: key}, rev, env)
			if rev[res.Pick].Replica != want {
				t.Fatalf("%s moved %s -> %s when the candidate order changed", key, want, rev[res.Pick].Replica)
			}
		}
	})
	t.Run("removing a replica moves only its sessions", func(t *testing.T) {
		three := cs[:3]
		moved := 0
		for key, want := range owner {
			got := three[p.Pick(Request{SessionKey: key}, three, env).Pick].Replica
			if want != "replica-3" && got != want {
				t.Fatalf("%s moved %s -> %s though its owner stayed", key, want, got)
			}
			if want == "replica-3" {
				moved++
			}
		}
		if moved == 0 {
			t.Fatal("replica-3 owned nothing")
		}
	})
	t.Run("unhealthy owner: successor, then back", func(t *testing.T) {
		sick := append([]Candidate(nil), cs...)
		sick[2] = unhealthy(sick[2])
		for key, want := range owner {
			got := sick[p.Pick(Request{SessionKey: key}, sick, env).Pick].Replica
			if got == "replica-2" {
				t.Fatalf("%s went to the unhealthy replica", key)
			}
			if want != "replica-2" && got != want {
				t.Fatalf("%s moved %s -> %s", key, want, got)
			}
		}
		for key, want := range owner {
			if got := cs[p.Pick(Request{SessionKey: key}, cs, env).Pick].Replica; got != want {
				t.Fatalf("%s did not return: %s, want %s", key, got, want)
			}
		}
	})
	t.Run("cold index keeps affinity", func(t *testing.T) {
		// every candidate has zero matches: still the ring owner
		loaded := append([]Candidate(nil), cs...)
		for i := range loaded {
			loaded[i].Load.ActivePrefillBlocks = float64(100 * i)
		}
		for key, want := range owner {
			if got := loaded[p.Pick(Request{SessionKey: key}, loaded, env).Pick].Replica; got != want {
				t.Fatalf("%s: %s, want %s", key, got, want)
			}
		}
	})
	t.Run("no key: least loaded", func(t *testing.T) {
		ls := fleet(3)
		ls[0].Load.ActivePrefillBlocks, ls[1].Load.ActivePrefillBlocks, ls[2].Load.ActivePrefillBlocks = 5, 1, 3
		res := p.Pick(Request{}, ls, env)
		if res.Pick != 1 || res.Reason != ReasonNoSessionKey {
			t.Fatalf("Pick = %d (%s)", res.Pick, res.Reason)
		}
	})
	t.Run("bounded load spills to the ring successor", func(t *testing.T) {
		b, err := NewSession(SessionConfig{BoundedLoadFactor: 1.25})
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range owner {
			hot := append([]Candidate(nil), cs...)
			for i := range hot {
				if hot[i].Replica == want {
					hot[i] = withReqs(hot[i], 10, 0) // mean 2.5, bound 3.125
				}
			}
			res := b.Pick(Request{SessionKey: key}, hot, env)
			if hot[res.Pick].Replica == want {
				t.Fatalf("%s stayed on its overloaded owner", key)
			}
			// the same load without bounding stays put
			if got := hot[p.Pick(Request{SessionKey: key}, hot, env).Pick].Replica; got != want {
				t.Fatalf("unbounded %s moved to %s", key, got)
			}
			// the spill target is the next eligible replica on the ring: rank 1 unbounded
			if r := p.Pick(Request{SessionKey: key}, hot, env); r.Costs[res.Pick] != 1 {
				t.Fatalf("%s spilled to ring rank %v, want 1", key, r.Costs[res.Pick])
			}
		}
	})
	t.Run("ring cached until the set changes", func(t *testing.T) {
		s, _ := NewSession(SessionConfig{VirtualNodes: 8})
		s.Pick(Request{SessionKey: "k"}, cs, env)
		r1 := s.ring(cs)
		if r2 := s.ring(cs); r1 != r2 {
			t.Fatal("ring rebuilt for an unchanged set")
		}
		if r3 := s.ring(cs[:3]); r3 == r1 || len(r3.points) != 3*8 {
			t.Fatalf("ring not rebuilt for a new set (%d points)", len(r3.points))
		}
	})
}

func TestSessionConcurrent(t *testing.T) {
	p, _ := NewSession(SessionConfig{})
	sets := [][]Candidate{{cand("a", 0, 0, 0), cand("b", 0, 0, 0)}, {cand("c", 0, 0, 0), cand("d", 0, 0, 0), cand("e", 0, 0, 0)}}
	want := make([]index.ReplicaID, 2)
	for i, s := range sets {
		want[i] = s[p.Pick(Request{SessionKey: "key"}, s, Env{}).Pick].Replica
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				s := sets[(g+i)%2]
				if got := s[p.Pick(Request{SessionKey: "key"}, s, Env{}).Pick].Replica; got != want[(g+i)%2] {
					t.Errorf("concurrent pick %s, want %s", got, want[(g+i)%2])
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestRoundRobin(t *testing.T) {
	p := mustNew(t, NameRoundRobin, Config{})
	cs := []Candidate{cand("a", 0, 0, 0), unhealthy(cand("b", 0, 0, 0)), cand("c", 9, 0, 0), cand("d", 0, 50, 0)}
	var got []int
	for range 6 {
		got = append(got, p.Pick(Request{}, cs, Env{}).Pick)
	}
	if fmt.Sprint(got) != "[0 2 3 0 2 3]" {
		t.Fatalf("picks %v, want [0 2 3 0 2 3]", got)
	}
	// concurrent use: every pick is eligible and the counter advances once per pick
	rr := &RoundRobin{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				if res := rr.Pick(Request{}, cs, Env{}); res.Pick == 1 || res.Pick < 0 {
					t.Errorf("picked %d", res.Pick)
				}
			}
		})
	}
	wg.Wait()
	if n := rr.next.Load(); n != 400 {
		t.Fatalf("counter %d, want 400", n)
	}
}

func TestPureAffinity(t *testing.T) {
	p := mustNew(t, NamePureAffinity, Config{})
	cs := []Candidate{cand("a", 2, 0, 0), cand("b", 6, 500, 500), cand("c", 6, 0, 0)}
	for range 20 {
		res := p.Pick(Request{PromptBlocks: 8}, cs, seeded(1))
		if res.Pick != 1 || res.Reason != ReasonAffinity {
			t.Fatalf("Pick = %d (%s), want 1: max match, lowest index on ties, load ignored", res.Pick, res.Reason)
		}
	}
}

// Herding: replica 0 holds the shared system prompt. Pure affinity sends it
// every request however loaded it gets; blended spreads them.
func TestHerding(t *testing.T) {
	run := func(p Policy) [4]int {
		cs := make([]Candidate, 4)
		for i := range cs {
			cs[i] = cand(fmt.Sprint("r", i), 0, 0, 0)
		}
		cs[0].Matched[index.TierGPU] = 4
		env := seeded(8)
		var placed [4]int
		for range 40 {
			req := Request{PromptBlocks: 10, ExpectedOutputBlocks: 5}
			res := p.Pick(req, cs, env)
			placed[res.Pick]++
			cs[res.Pick].Load.ActivePrefillBlocks += float64(10 - cs[res.Pick].Matched[0])
			cs[res.Pick].Load.ActiveDecodeBlocks += 5
		}
		return placed
	}
	if got := run(mustNew(t, NamePureAffinity, Config{})); got != [4]int{40, 0, 0, 0} {
		t.Errorf("pure affinity placement %v, want all on replica 0", got)
	}
	got := run(mustNew(t, NameBlended, Config{}))
	for i, n := range got {
		if n < 7 || n > 13 {
			t.Errorf("blended placed %d of 40 on replica %d (%v), want a spread", n, i, got)
		}
	}
}

func TestNewAndConfig(t *testing.T) {
	for _, n := range Names() {
		p := mustNew(t, n, Config{})
		if p.Name() != n {
			t.Errorf("New(%q).Name() = %q", n, p.Name())
		}
	}
	b := mustBlended(t, BlendedConfig{})
	if b.credit != 1 || b.decay != 0 || b.scale != 1 || b.reqWeight != 0 || b.tierWeight != [index.NumTiers]float64{1, 0.75, 0.25} {
		t.Errorf("blended defaults %+v", b)
	}
	h, _ := NewHardSwitch(HardSwitchConfig{})
	if h.cacheThreshold != 0.3 || h.absThreshold != 64 || h.relThreshold != 1.5 {
		t.Errorf("hardswitch defaults %+v", h)
	}
	pa, _ := NewPrefixAffinity(PrefixAffinityConfig{})
	if !math.IsInf(pa.imbalanced, 1) || pa.matchRate != 0.1 {
		t.Errorf("prefixaffinity defaults %+v", pa)
	}
	s, _ := NewSession(SessionConfig{})
	if s.vnodes != 160 || s.bound != 0 {
		t.Errorf("session defaults vnodes=%d bound=%v", s.vnodes, s.bound)
	}

	bad := []struct {
		name  string
		cfg   Config
		field string
	}{
		{NameBlended, Config{Blended: BlendedConfig{OverlapScoreCredit: Float(-1)}}, "blended.overlap_score_credit"},
		{NameBlended, Config{Blended: BlendedConfig{OverlapScoreCreditDecay: math.NaN()}}, "blended.overlap_score_credit_decay"},
		{NameBlended, Config{Blended: BlendedConfig{PrefillLoadScale: Float(math.Inf(1))}}, "blended.prefill_load_scale"},
		{NameBlended, Config{Blended: BlendedConfig{DecodeActiveRequestWeight: -0.1}}, "blended.decode_active_request_weight"},
		{NameBlended, Config{Blended: BlendedConfig{HostCacheHitWeight: Float(1.5)}}, "blended.host_cache_hit_weight"},
		{NameBlended, Config{Blended: BlendedConfig{DiskCacheHitWeight: Float(-0.5)}}, "blended.disk_cache_hit_weight"},
		{NameHardSwitch, Config{HardSwitch: HardSwitchConfig{CacheThreshold: Float(2)}}, "hardswitch.cache_threshold"},
		{NameHardSwitch, Config{HardSwitch: HardSwitchConfig{BalanceAbsThreshold: Float(-1)}}, "hardswitch.balance_abs_threshold"},
		{NameHardSwitch, Config{HardSwitch: HardSwitchConfig{BalanceRelThreshold: Float(math.NaN())}}, "hardswitch.balance_rel_threshold"},
		{NamePrefixAffinity, Config{PrefixAffinity: PrefixAffinityConfig{ImbalancedThreshold: Float(-3)}}, "prefixaffinity.imbalanced_threshold"},
		{NamePrefixAffinity, Config{PrefixAffinity: PrefixAffinityConfig{MatchRateThreshold: Float(1.1)}}, "prefixaffinity.match_rate_threshold"},
		{NameSession, Config{Session: SessionConfig{VirtualNodes: -1}}, "session.virtual_nodes"},
		{NameSession, Config{Session: SessionConfig{BoundedLoadFactor: 0.5}}, "session.bounded_load_factor"},
		{"dynamo", Config{}, `"dynamo"`},
	}
	for _, tt := range bad {
		t.Run(tt.field, func(t *testing.T) {
			_, err := New(tt.name, tt.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("New: %v, want ErrConfig naming %s", err, tt.field)
			}
			if tt.name != "dynamo" {
				if err := tt.cfg.Validate(); !errors.Is(err, ErrConfig) {
					t.Fatalf("Validate: %v", err)
				}
			}
		})
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestConfigYAML(t *testing.T) {
	src := `
blended:
  overlap_score_credit: 0
  overlap_score_credit_decay: 1
hardswitch:
  balance_abs_threshold: 32
prefixaffinity:
  imbalanced_threshold: .inf
session:
  bounded_load_factor: 1.25
`
	var cfg Config
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	b := mustBlended(t, cfg.Blended)
	if b.credit != 0 || b.decay != 1 || b.scale != 1 || b.tierWeight[index.TierCPU] != 0.75 {
		t.Errorf("blended from yaml %+v: explicit 0 must survive, absent keys default", b)
	}
	h, _ := NewHardSwitch(cfg.HardSwitch)
	if h.absThreshold != 32 || h.relThreshold != 1.5 {
		t.Errorf("hardswitch from yaml %+v", h)
	}
	pa, _ := NewPrefixAffinity(cfg.PrefixAffinity)
	if !math.IsInf(pa.imbalanced, 1) {
		t.Errorf("imbalanced_threshold %v", pa.imbalanced)
	}
	if cfg.Session.BoundedLoadFactor != 1.25 {
		t.Errorf("session %+v", cfg.Session)
	}
	var strict Config
	dec = yaml.NewDecoder(strings.NewReader("blended:\n  overlap_score_weight: 2\n"))
	dec.KnownFields(true)
	if err := dec.Decode(&strict); err == nil {
		t.Fatal("unknown knob accepted")
	}
}
