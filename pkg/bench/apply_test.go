package bench

import (
	"context"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// naiveApply is the reference: every event in order, one index call each.
func naiveApply(idx *index.Index, model string, rid index.ReplicaID, evs []engine.Event) {
	for i := range evs {
		ev := &evs[i]
		tier, ok := index.ParseMedium(ev.Medium)
		if !ok {
			continue
		}
		switch ev.Kind {
		case engine.BlockStored:
			idx.Stored(index.Stored{
				Replica: rid, Root: kvblock.Root(model, ev.LoRAName),
				HasParent: ev.HasParent, ParentHash: ev.Parent,
				Hashes: ev.Hashes, Tokens: ev.Tokens, BlockSize: ev.BlockSize, Tier: tier,
			})
		case engine.BlockRemoved:
			idx.Removed(index.Removed{Replica: rid, Hashes: ev.Hashes, Tier: tier})
		case engine.AllBlocksCleared:
			idx.Cleared(rid)
		}
	}
}

// sameIndex compares two indexes through what the router reads (Match of
// every probe, per replica and tier) and their sizes.
func sameIndex(t *testing.T, where string, a, b *index.Index, probes [][]kvblock.Key) {
	t.Helper()
	sa, sb := a.Stats(), b.Stats()
	sa.Bytes, sb.Bytes = 0, 0
	if sa != sb {
		t.Fatalf("%s: stats differ:\nnaive   %+v\napplier %+v", where, sa, sb)
	}
	for i, keys := range probes {
		ma := a.Match(keys, nil)
		mb := b.Match(keys, nil)
		if len(ma) != len(mb) {
			t.Fatalf("%s: probe %d: %d matches vs %d", where, i, len(ma), len(mb))
		}
		for j := range ma {
			if ma[j] != mb[j] {
				t.Fatalf("%s: probe %d: match %+v vs %+v", where, i, ma[j], mb[j])
			}
		}
	}
}

const applyModel = "m"

func storedEv(tier string, parent uint64, hasParent bool, hashes ...uint64) engine.Event {
	toks := make([]uint32, 0, 4*len(hashes))
	for _, h := range hashes {
		for j := range 4 {
			toks = append(toks, uint32(h)*8+uint32(j))
		}
	}
	return engine.Event{Kind: engine.BlockStored, Hashes: hashes, Parent: parent, HasParent: hasParent,
		Tokens: toks, BlockSize: 4, Medium: tier}
}

func removedEv(tier string, hashes ...uint64) engine.Event {
	return engine.Event{Kind: engine.BlockRemoved, Hashes: hashes, Medium: tier}
}

// TestApplierHandCases covers the orders the applier must not change: a
// store after a removal of the same hash on the same tier, and a store whose
// parent was just removed (unknown parent in event order).
func TestApplierHandCases(t *testing.T) {
	g, c := engine.MediumGPU, engine.MediumCPU
	cases := map[string][][]engine.Event{
		"remove then store same tier": {
			{storedEv(g, 0, false, 1, 2, 3)},
			{removedEv(g, 3), storedEv(g, 2, true, 3)},
		},
		"parent removed before child stored": {
			{storedEv(g, 0, false, 1, 2)},
			{removedEv(g, 2), storedEv(c, 2, true, 3)},
		},
		"evict to cpu, child first": {
			{storedEv(g, 0, false, 1, 2, 3)},
			{removedEv(g, 3), storedEv(c, 2, true, 3), removedEv(g, 2), storedEv(c, 1, true, 2), removedEv(g, 1), storedEv(c, 0, false, 1)},
		},
		"cpu evicted then reloaded in one batch": {
			{storedEv(g, 0, false, 1, 2), storedEv(c, 0, false, 1)},
			{removedEv(c, 1), removedEv(g, 2), storedEv(c, 1, true, 2), storedEv(c, 0, false, 1)},
		},
		"cleared in the middle": {
			{storedEv(g, 0, false, 1, 2)},
			{removedEv(g, 2), {Kind: engine.AllBlocksCleared}, storedEv(g, 0, false, 1)},
		},
	}
	for name, batches := range cases {
		a, b := index.New(index.Config{}), index.New(index.Config{})
		ap := newApplier(b, applyModel)
		var probes [][]kvblock.Key
		for _, batch := range batches {
			for _, ev := range batch {
				if ev.Kind == engine.BlockStored && !ev.HasParent {
					probes = append(probes, kvblock.Keys(nil, kvblock.Root(applyModel, ""), ev.Tokens, 4, kvblock.Options{}))
				}
			}
		}
		for i, batch := range batches {
			naiveApply(a, applyModel, "r0", batch)
			ap.apply("r0", batch)
			sameIndex(t, name+" batch "+string(rune('0'+i)), a, b, probes)
		}
	}
}

// TestApplierMatchesInOrder runs engines with small GPU and CPU tiers under
// heavy churn (shared prefixes, preemption, offload, CPU eviction) and
// checks after every batch that the applier's index answers every prompt's
// match exactly as one fed event by event.
func TestApplierMatchesInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	prefixes := make([][]uint32, 6)
	for i := range prefixes {
		prefixes[i] = make([]uint32, 16*(4+rng.IntN(20)))
		for j := range prefixes[i] {
			prefixes[i][j] = rng.Uint32()
		}
	}
	var prompts [][]uint32
	var probes [][]kvblock.Key
	for range 300 {
		p := append([]uint32(nil), prefixes[rng.IntN(len(prefixes))]...)
		for range 16 * rng.IntN(12) {
			p = append(p, rng.Uint32()%50)
		}
		p = append(p, 7)
		prompts = append(prompts, p)
		probes = append(probes, kvblock.Keys(nil, kvblock.Root(applyModel, ""), p, 16, kvblock.Options{}))
	}
	for _, cpu := range []int{0, 40, 400} {
		a, b := index.New(index.Config{}), index.New(index.Config{})
		ap := newApplier(b, applyModel)
		engs := make([]*engine.Engine, 3)
		for i := range engs {
			e, err := engine.New(engine.Config{BlockSize: 16, NumGPUBlocks: 120, NumCPUBlocks: cpu, MaxNumBatchedTokens: 256, MaxModelLen: 1024, Model: applyModel}, 1)
			if err != nil {
				t.Fatal(err)
			}
			engs[i] = e
		}
		rids := []index.ReplicaID{"r0", "r1", "r2"}
		now := time.Duration(0)
		batches := 0
		for i, p := range prompts {
			if _, err := engs[i%3].Submit(now, engine.Request{Prompt: p, MaxTokens: 1 + rng.IntN(40)}); err != nil {
				t.Fatal(err)
			}
			for k := range engs {
				for range 1 + rng.IntN(3) {
					at, busy := engs[k].NextEventTime()
					if !busy {
						break
					}
					res := engs[k].Step(at)
					now = max(now, res.End)
					if len(res.Events) == 0 {
						continue
					}
					naiveApply(a, applyModel, rids[k], res.Events)
					ap.apply(rids[k], res.Events)
					batches++
					if batches%7 == 0 {
						sameIndex(t, "mid-run", a, b, probes)
					}
				}
			}
		}
		sameIndex(t, "end", a, b, probes)
		if st := a.Stats(); st.Engine == 0 || batches < 100 {
			t.Fatalf("cpu %d: the run indexed nothing (%+v, %d batches)", cpu, st, batches)
		}
	}
}

// The relevance filter changes no decision: whole runs with and without it
// are identical, for every generator, a trace, a stale index (delay, loss),
// a small memory (preemption, CPU tier churn) and truncated prompts.
func TestRelevanceFilterChangesNothing(t *testing.T) {
	type tc struct {
		name     string
		w        *Workload
		fleet    FleetConfig
		policies []string
	}
	one, two := []string{"kvroute"}, []string{"roundrobin", "kvroute"}
	var cases []tc
	for _, g := range Generators() {
		size := 0.04
		if g == GenGRPO {
			size = 0.005 // 727 requests at 0.04
		}
		cases = append(cases, tc{g, mustGen(t, g, size), smallFleet(), one})
	}
	tight := smallFleet()
	tight.Engine.NumGPUBlocks = 1200
	tight.Engine.NumCPUBlocks = 600
	tight.Engine.MaxModelLen = 12000
	tight.EventDelay = 30 * time.Millisecond
	tight.EventLoss = 0.05
	cases = append(cases, tc{"agents-tight", mustGen(t, GenAgents, 0.05), tight, two}, tc{"rl-tight", mustGen(t, GenRL, 0.05), tight, two})
	tr, err := ReadTraceFile(traceForTest(t), TraceOptions{Limit: 200, RateScale: 4})
	if err == nil {
		cases = append(cases, tc{"trace", tr, tight, two})
	}
	defer func() { filterIrrelevant = true }()
	for _, c := range cases {
		start := time.Now()
		for _, pol := range c.policies {
			filterIrrelevant = false
			a, err := Simulate(context.Background(), c.w, mustPolicy(t, pol), c.fleet)
			if err != nil {
				t.Fatal(err)
			}
			filterIrrelevant = true
			b, err := Simulate(context.Background(), c.w, mustPolicy(t, pol), c.fleet)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s/%s: the filtered run differs", c.name, pol)
			}
		}
		t.Logf("%s: %d requests, %v", c.name, c.w.Requests(), time.Since(start).Round(time.Millisecond))
	}
}

// traceForTest is the Mooncake trace's path (it may be absent: callers
// then get a read error and leave the trace out).
func traceForTest(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return DefaultTracePath(RepoRoot(wd))
}
