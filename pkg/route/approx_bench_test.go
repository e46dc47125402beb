package route

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/policy"
)

// approxPrompts returns n prompts of blocks keys each, sharing their first
// shared blocks.
func approxPrompts(n, blocks, shared int) [][]kvblock.Key {
	out := make([][]kvblock.Key, n)
	for i := range out {
		toks := seq(blocks*16, 0)
		for j := shared * 16; j < len(toks); j++ {
			toks[j] += uint32(i+1) << 20
		}
		out[i] = kvblock.Keys(nil, approxRoot(model, "", false), toks, 16, kvblock.Options{})
	}
	return out
}

// BenchmarkApproxIndex: a full index (MaxEntries 1<<18) over 8 replicas,
// 128-block prompts sharing a 32-block head.
func BenchmarkApproxIndex(b *testing.B) {
	prompts := approxPrompts(4096, 128, 32)
	x := NewApproxIndex(ApproxConfig{MaxEntries: 1 << 18})
	for i, p := range prompts {
		x.Record(p, index.ReplicaID(fmt.Sprint("r", i%8)), t0)
	}
	b.Run("Match", func(b *testing.B) {
		var dst []index.ReplicaMatch
		i := 0
		for b.Loop() {
			dst = x.Match(prompts[i%len(prompts)], t0, dst[:0])
			i++
		}
	})
	b.Run("Record", func(b *testing.B) {
		i := 0
		for b.Loop() {
			x.Record(prompts[i%len(prompts)], index.ReplicaID(fmt.Sprint("r", i%8)), t0.Add(time.Duration(i)))
			i++
		}
	})
}

// BenchmarkApproxIndexBytes reports the heap an index of 1<<18 entries
// holds, per entry (one replica per key).
func BenchmarkApproxIndexBytes(b *testing.B) {
	prompts := approxPrompts(2048, 128, 0)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		x := NewApproxIndex(ApproxConfig{MaxEntries: 1 << 18})
		for i, p := range prompts {
			x.Record(p, index.ReplicaID(fmt.Sprint("r", i%8)), t0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(x.Stats().Entries), "bytes/entry")
		runtime.KeepAlive(x)
	}
}

// BenchmarkApproxIndexGC is one forced garbage collection with a full
// index of 1<<18 entries live (8 replicas, 128-block prompts): what the
// collector spends marking the index, which the router's Pending is at
// under large prompts. Compare with the same collection without the index
// (the empty case).
func BenchmarkApproxIndexGC(b *testing.B) {
	prompts := approxPrompts(2048, 128, 0)
	for _, full := range []bool{false, true} {
		name := "empty"
		if full {
			name = "full"
		}
		b.Run(name, func(b *testing.B) {
			x := NewApproxIndex(ApproxConfig{MaxEntries: 1 << 18})
			if full {
				for i, p := range prompts {
					x.Record(p, index.ReplicaID(fmt.Sprint("r", i%8)), t0)
				}
			}
			runtime.GC()
			for b.Loop() {
				runtime.GC()
			}
			runtime.KeepAlive(x)
		})
	}
}

func BenchmarkDecideApproximateLong(b *testing.B) {
	prompts := make([][]uint32, 64)
	for i := range prompts {
		prompts[i] = seq(3500*16, uint32(i)<<22)
	}
	st := fedState{fleet(8), map[index.ReplicaID]bool{}}
	p, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ax := NewApproxIndex(ApproxConfig{})
	rt := New(Options{Matcher: index.New(index.Config{}), State: st, Policy: p, Seed: 1, Approx: ax})
	i := 0
	for b.Loop() {
		if _, err := rt.Decide(b.Context(), Request{Model: model, Tokens: prompts[i%len(prompts)]}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
