package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/kvblock"
	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time. The box the benchmarks run on
// is shared: wall-clock figures include time the thread spent descheduled,
// CPU-time figures do not.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

func pct(lat []time.Duration, p int) float64 {
	slices.Sort(lat)
	return float64(lat[len(lat)*p/100].Nanoseconds())
}

const benchBS = 16

// fixture is an index of about nKeys keys: conversations of promptBlocks
// blocks sharing a 16-block system prompt, each stored on two of the
// replicas in events of at most 1024 blocks chained by parent hashes.
type fixture struct {
	ix      *Index
	prompts [][]kvblock.Key
}

var (
	fixMu    sync.Mutex
	fixtures = map[string]*fixture{}
)

func getFixture(promptBlocks, nKeys, replicas int) *fixture {
	fixMu.Lock()
	defer fixMu.Unlock()
	name := fmt.Sprint(promptBlocks, nKeys, replicas)
	if f := fixtures[name]; f != nil {
		return f
	}
	f := &fixture{ix: New(Config{})}
	fill(f, f.ix, promptBlocks, nKeys, replicas, 2, 1000)
	fixtures[name] = f
	return f
}

// fillHook, when set, is called before every conversation fill stores.
var fillHook func()

// fill stores conversations until the index has nKeys distinct keys, each on
// `copies` replicas, or until it has stored 4*nKeys blocks (an index under a
// budget never gets there); it keeps up to keep prompts for queries.
func fill(f *fixture, ix *Index, promptBlocks, nKeys, replicas, copies, keep int) {
	r := rand.New(rand.NewPCG(uint64(promptBlocks), uint64(nKeys)))
	root := kvblock.Root("bench-model", "")
	sys := tokens(r, 16*benchBS)
	reps := make([]ReplicaID, replicas)
	for i := range reps {
		reps[i] = ReplicaID(fmt.Sprintf("replica-%02d", i))
	}
	toks := make([]uint32, promptBlocks*benchBS)
	keys := make([]kvblock.Key, 0, promptBlocks)
	hs := make([]uint64, promptBlocks)
	stored := 0
	for c := 0; ix.Stats().Keys < nKeys && stored < 4*nKeys; c++ {
		if fillHook != nil {
			fillHook()
		}
		copy(toks, sys)
		for i := len(sys); i < len(toks); i++ {
			toks[i] = uint32(r.IntN(50000))
		}
		keys = kvblock.Keys(keys[:0], root, toks, benchBS, kvblock.Options{})
		if len(f.prompts) < keep {
			f.prompts = append(f.prompts, slices.Clone(keys))
		}
		for k := range copies {
			rep := reps[(c*(k+1)+k*5)%replicas]
			for i, key := range keys {
				hs[i] = engineHash(rep, key, 0)
			}
			for start := 0; start < promptBlocks; start += 1024 {
				end := min(promptBlocks, start+1024)
				ev := Stored{Replica: rep, Root: root, Hashes: hs[start:end], Tokens: toks[start*benchBS : end*benchBS], BlockSize: benchBS}
				if start > 0 {
					ev.HasParent, ev.ParentHash = true, hs[start-1]
				}
				ix.Stored(ev)
			}
			stored += promptBlocks
		}
	}
}

// timeMatches times every call, in wall-clock and in thread CPU time, and
// reports p50 and p99 of both in ns.
func timeMatches(b *testing.B, ix *Index, prompts [][]kvblock.Key) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	wall := make([]time.Duration, 0, 1<<16)
	cpu := make([]time.Duration, 0, 1<<16)
	dst := make([]ReplicaMatch, 0, 64)
	matched := 0
	i := 0
	b.ResetTimer()
	for b.Loop() {
		q := prompts[i%len(prompts)]
		i++
		c0, t0 := threadCPU(), time.Now()
		dst = ix.Match(q, dst[:0])
		wall = append(wall, time.Since(t0))
		cpu = append(cpu, threadCPU()-c0)
		for _, m := range dst {
			matched = max(matched, m.Blocks)
		}
	}
	b.StopTimer()
	if matched != len(prompts[0]) {
		b.Fatalf("deepest match %d, want %d", matched, len(prompts[0]))
	}
	b.ReportMetric(pct(wall, 50), "p50-ns")
	b.ReportMetric(pct(wall, 99), "p99-ns")
	b.ReportMetric(pct(cpu, 50), "cpu-p50-ns")
	b.ReportMetric(pct(cpu, 99), "cpu-p99-ns")
}

// BenchmarkMatch: 16 replicas, about 1M keys, 1000 distinct prompts queried
// in turn.
func BenchmarkMatch(b *testing.B) {
	for _, blocks := range []int{256, 8192} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			f := getFixture(blocks, 1_000_000, 16)
			b.ReportMetric(float64(f.ix.Stats().Keys), "keys")
			timeMatches(b, f.ix, f.prompts)
		})
	}
}

// BenchmarkMatchDuringWrites: as BenchmarkMatch with 256-block prompts,
// while one writer goroutine applies 10,000-block stored events (and removes
// them again) as fast as it can.
func BenchmarkMatchDuringWrites(b *testing.B) {
	f := getFixture(256, 1_000_000, 16)
	r := rand.New(rand.NewPCG(99, 99))
	root := kvblock.Root("bench-model", "")
	const n = 10_000
	toks := tokens(r, n*benchBS)
	keys := kvblock.Keys(nil, root, toks, benchBS, kvblock.Options{})
	hs := make([]uint64, n)
	for i, k := range keys {
		hs[i] = engineHash("writer", k, 0)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	events := 0
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			f.ix.Stored(Stored{Replica: "writer", Root: root, Hashes: hs, Tokens: toks, BlockSize: benchBS})
			f.ix.Removed(Removed{Replica: "writer", Hashes: hs})
			events += 2
		}
	})
	timeMatches(b, f.ix, f.prompts)
	close(stop)
	wg.Wait()
	f.ix.Cleared("writer")
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "writer-events/s")
}

// BenchmarkApply measures stored+removed block events per second on one
// goroutine: 16 replicas, 64-block conversations stored as four 16-block
// events chained by parents, removed again once 1M entries are live. The
// timed loop runs at 1M live entries; filling the index to that from empty
// (its tables growing all the way) is reported apart, as
// fill-cpu-block-events/s.
func BenchmarkApply(b *testing.B) {
	const convBlocks, evBlocks, live = 64, 16, 1_000_000
	r := rand.New(rand.NewPCG(7, 7))
	root := kvblock.Root("bench-model", "")
	sys := tokens(r, 16*benchBS)
	// A pool of conversations, reused with a fresh tail token so that keys
	// keep changing without generating tokens in the timed loop.
	const pool = 256
	convToks := make([][]uint32, pool)
	for i := range convToks {
		convToks[i] = append(slices.Clone(sys), tokens(r, (convBlocks-16)*benchBS)...)
	}
	ix := New(Config{})
	reps := make([]ReplicaID, 16)
	for i := range reps {
		reps[i] = ReplicaID(fmt.Sprintf("replica-%02d", i))
	}
	type conv struct {
		rep ReplicaID
		hs  []uint64
	}
	var ring []conv
	// step applies conversation i (and, once live entries are held, the
	// removal of the oldest) and returns the block events it applied.
	step := func(i int) int {
		toks := convToks[i%pool]
		toks[len(toks)-1] = uint32(i) // a new last block: a new conversation end
		toks[16*benchBS] = uint32(i)  // and new keys after the system prompt
		rep := reps[i%16]
		// The engine's own hashes: any well-mixed values, one per block
		// (the shared system prompt keeps its hashes).
		hs := make([]uint64, convBlocks)
		for j := range hs {
			if j < 16 {
				hs[j] = mix(uint64(i%16)<<32 | uint64(j) + 1)
			} else {
				hs[j] = mix(uint64(i)<<8 | uint64(j) | 1<<62)
			}
		}
		for s := 0; s < convBlocks; s += evBlocks {
			ev := Stored{Replica: rep, Root: root, Hashes: hs[s : s+evBlocks], Tokens: toks[s*benchBS : (s+evBlocks)*benchBS], BlockSize: benchBS}
			if s > 0 {
				ev.HasParent, ev.ParentHash = true, hs[s-1]
			}
			ix.Stored(ev)
		}
		n := convBlocks
		ring = append(ring, conv{rep, hs})
		if len(ring)*convBlocks > live {
			old := ring[0]
			ring = ring[1:]
			// Only the conversation's own blocks: the system prompt stays.
			ix.Removed(Removed{Replica: old.rep, Hashes: old.hs[16:]})
			n += convBlocks - 16
		}
		return n
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Fill to live entries first (every table grows from empty here), so
	// that the timed loop measures the steady state at that size; the
	// fill's own rate is reported apart.
	i, blocks, f0 := 0, 0, threadCPU()
	for ; i <= live/convBlocks; i++ {
		blocks += step(i)
	}
	fill := float64(blocks) / (threadCPU() - f0).Seconds()
	st := ix.Stats()
	fillBytes := float64(st.Bytes) / float64(st.Holders)
	blocks = 0
	c0 := threadCPU()
	b.ResetTimer()
	for ; b.Loop(); i++ {
		blocks += step(i)
	}
	b.ReportMetric(fill, "fill-cpu-block-events/s") // after ResetTimer, which drops metrics
	b.ReportMetric(fillBytes, "fill-B/entry")
	st = ix.Stats()
	b.ReportMetric(float64(st.Bytes)/float64(st.Holders), "B/entry")
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "block-events/s")
	b.ReportMetric(float64(blocks)/(threadCPU()-c0).Seconds(), "cpu-block-events/s")
}

func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMemory10M fills an index with 10M (block, replica) entries and
// reports the heap it takes per entry (runtime.MemStats after GC) next to
// the index's own estimate. copies=1 is the worst case (one holder per key);
// copies=2 stores every conversation on two of 16 replicas. It runs once per
// -count and needs about 1 GiB.
func BenchmarkMemory10M(b *testing.B) {
	for _, copies := range []int{1, 2} {
		b.Run(fmt.Sprintf("copies=%d", copies), func(b *testing.B) {
			for range b.N {
				before := heapAfterGC()
				f := &fixture{ix: New(Config{})}
				fill(f, f.ix, 256, 10_000_000/copies, 16, copies, 0)
				after := heapAfterGC() + uint64(f.ix.env.slab.mapped)
				s := f.ix.Stats()
				entries := float64(s.Holders)
				b.ReportMetric(float64(after-before)/entries, "heap-B/entry")
				b.ReportMetric(float64(s.Bytes)/entries, "stats-B/entry")
				b.ReportMetric(float64(s.Bytes)/float64(after-before), "stats/heap")
				b.ReportMetric(entries, "entries")
				runtime.KeepAlive(f)
			}
		})
	}
}

// heapObjects is the bytes of the heap's objects, live or not yet swept:
// what the heap holds at this moment, garbage included.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// BenchmarkBudget stores 12M block entries (about six times what fits) into
// an index with a 64 MiB budget and reports how the index and the heap
// compare with the budget, after the fill (heap after GC) and at the peak
// during it: the heap's objects (garbage not yet collected included,
// runtime/metrics) sampled before every conversation, and the index's own
// Stats.Bytes at its highest.
func BenchmarkBudget(b *testing.B) {
	for range b.N {
		const budget = 64 << 20
		before := heapAfterGC()
		f := &fixture{ix: New(Config{MaxBytes: budget})}
		var peakHeap uint64
		var peakStats int64
		fillHook = func() {
			// The heap's objects (garbage included) plus the slot arrays
			// the index keeps mapped outside the heap.
			peakHeap = max(peakHeap, heapObjects()+uint64(f.ix.env.slab.mapped))
			peakStats = max(peakStats, f.ix.Stats().Bytes)
		}
		t0 := time.Now()
		fill(f, f.ix, 256, 3_000_000, 16, 1, 0)
		b.ReportMetric(12e6/time.Since(t0).Seconds(), "stored-blocks/s")
		fillHook = nil
		after := heapAfterGC() + uint64(f.ix.env.slab.mapped)
		s := f.ix.Stats()
		if s.Evicted == 0 {
			b.Fatal("budget never bit")
		}
		b.ReportMetric(float64(s.Bytes)/budget, "stats/budget")
		b.ReportMetric(float64(after-before)/budget, "heap/budget")
		b.ReportMetric(float64(peakHeap-before)/budget, "peak-heap/budget")
		b.ReportMetric(float64(peakStats)/budget, "peak-stats/budget")
		b.ReportMetric(float64(s.Holders), "entries")
		runtime.KeepAlive(f)
	}
}
