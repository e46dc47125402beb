package index

import (
	"fmt"
	"math/bits"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// limitTable is the yardstick for Match: the simplest table that answers the
// same question at the memory system's speed. One flat open-addressing
// array of 16-byte slots (key, bitmask of the replicas holding it; at most
// 64 replicas), linear probing, lookups issued a batch at a time with every
// home slot prefetched before the first is read. It does no tiers, no
// reference bits, no locking and no eviction: what kvroute's Match does on
// top of it is the overhead the benchmark tracks.
type limitTable struct {
	s []limitSlot
}

type limitSlot struct{ k, mask uint64 }

// limitLoad is the table's load: the same as kvroute's key table averages
// (its sub-tables run between 0.6 and 0.9).
const limitLoad = 0.75

func newLimitTable(n int) *limitTable {
	return &limitTable{s: make([]limitSlot, int(float64(n)/limitLoad)+1)}
}

func (t *limitTable) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(t.s)))
	return int(hi)
}

func (t *limitTable) add(k uint64, replica int) {
	i := t.home(mix(k))
	for {
		s := &t.s[i]
		if s.mask == 0 {
			*s = limitSlot{k, 1 << replica}
			return
		}
		if s.k == k {
			s.mask |= 1 << replica
			return
		}
		if i++; i == len(t.s) {
			i = 0
		}
	}
}

func (t *limitTable) get(k uint64, h uint64) uint64 {
	i := t.home(h)
	for {
		s := &t.s[i]
		if s.mask == 0 || s.k == k {
			return s.mask
		}
		if i++; i == len(t.s) {
			i = 0
		}
	}
}

// limitBatch is the baseline's batch: the best of 8, 16, 32 and 64 on the
// development machine (see docs/benchmarks.md).
const limitBatch = 16

// match writes every replica's matched depth to depth (indexed by replica)
// and returns the deepest. Keys are looked up limitBatch at a time: the next
// batch's home slots are prefetched before the current batch is read.
func (t *limitTable) match(keys []kvblock.Key, depth *[64]int32) int {
	var hs [2][limitBatch]uint64
	pre := func(base int) {
		h := &hs[base/limitBatch&1]
		for i, k := range keys[base:min(len(keys), base+limitBatch)] {
			h[i] = mix(uint64(k))
			prefetch(unsafe.Pointer(&t.s[t.home(h[i])]))
		}
	}
	alive := ^uint64(0)
	pre(0)
	for base := 0; base < len(keys); base += limitBatch {
		if base+limitBatch < len(keys) {
			pre(base + limitBatch)
		}
		h := &hs[base/limitBatch&1]
		for i, k := range keys[base:min(len(keys), base+limitBatch)] {
			m := t.get(uint64(k), h[i])
			dropped := alive &^ m
			for dropped != 0 {
				r := bits.TrailingZeros64(dropped)
				depth[r] = int32(base + i)
				dropped &= dropped - 1
			}
			alive &= m
			if alive == 0 {
				return base + i
			}
		}
	}
	for alive != 0 {
		r := bits.TrailingZeros64(alive)
		depth[r] = int32(len(keys))
		alive &= alive - 1
	}
	return len(keys)
}

// limitFromIndex builds the baseline table from the index's current
// content: for every key, the replicas holding it (by slot).
func limitFromIndex(ix *Index) *limitTable {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	t := newLimitTable(ix.keys.n)
	ix.eachKey(func(k uint64, slots []uint32) {
		for _, s := range slots {
			t.add(k, int(s))
		}
	})
	return t
}

// BenchmarkMatchVsLimit times kvroute's Match and the in-benchmark
// baseline (limitTable) on the same fixture as BenchmarkMatch, alternating
// call by call in one process, so that the ratio to the limit is measured on
// whatever machine runs it. Both answers are checked against each other
// first. Metrics: p50/p99 of each in thread CPU time (cpu-) and wall time,
// and the ratios kvroute/limit.
func BenchmarkMatchVsLimit(b *testing.B) {
	for _, blocks := range []int{256, 8192} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			f := getFixture(blocks, 1_000_000, 16)
			lt := limitFromIndex(f.ix)
			slotOf := map[ReplicaID]int{}
			for s, rs := range f.ix.bySlot {
				if rs != nil {
					slotOf[rs.id] = s
				}
			}
			var depth [64]int32
			for _, q := range f.prompts {
				depth = [64]int32{}
				lt.match(q, &depth)
				got := f.ix.Match(q, nil)
				n := 0
				for _, d := range depth {
					if d > 0 {
						n++
					}
				}
				if len(got) != n {
					b.Fatalf("kvroute matched %d replicas, baseline %d", len(got), n)
				}
				for _, m := range got {
					if int32(m.Blocks) != depth[slotOf[m.Replica]] {
						b.Fatalf("%s: kvroute %d blocks, baseline %d", m.Replica, m.Blocks, depth[slotOf[m.Replica]])
					}
				}
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var kw, kc, lw, lc []time.Duration
			dst := make([]ReplicaMatch, 0, 64)
			sink := 0
			i := 0
			b.ResetTimer()
			for b.Loop() {
				q := f.prompts[i%len(f.prompts)]
				i++
				c0, t0 := threadCPU(), time.Now()
				dst = f.ix.Match(q, dst[:0])
				kw = append(kw, time.Since(t0))
				c1, t1 := threadCPU(), time.Now()
				kc = append(kc, c1-c0)
				sink += lt.match(q, &depth)
				lw = append(lw, time.Since(t1))
				lc = append(lc, threadCPU()-c1)
				sink += len(dst)
			}
			b.StopTimer()
			if sink == 0 {
				b.Fatal("nothing matched")
			}
			report := func(name string, k, l []time.Duration) {
				k50, k99, l50, l99 := pct(k, 50), pct(k, 99), pct(l, 50), pct(l, 99)
				b.ReportMetric(k50, name+"p50-ns")
				b.ReportMetric(k99, name+"p99-ns")
				b.ReportMetric(l50, name+"limit-p50-ns")
				b.ReportMetric(l99, name+"limit-p99-ns")
				b.ReportMetric(k50/l50, name+"p50-ratio")
				b.ReportMetric(k99/l99, name+"p99-ratio")
			}
			report("cpu-", kc, lc)
			report("", kw, lw)
		})
	}
}

// eachKey calls fn for every key with the slots of its holders. The caller
// holds the lock.
func (ix *Index) eachKey(fn func(k uint64, slots []uint32)) {
	var two [2]uint64
	var slots []uint32
	for di, sb := range ix.keys.subs {
		if di&(1<<(ix.keys.gd-sb.ld)-1) != 0 {
			continue
		}
		for i := range sb.s {
			ks := &sb.s[i]
			if ks.v == 0 {
				continue
			}
			slots = slots[:0]
			for _, w := range ix.arena.holders(ks.v, &two) {
				slots = append(slots, hSlot(w))
			}
			fn(ks.k, slots)
		}
	}
}
