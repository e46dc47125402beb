package index

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/kvblock"
	"golang.org/x/sys/unix"
)

// scaleEnv gates BenchmarkScale: it needs about 3 GiB and a few minutes.
const scaleEnv = "KVROUTE_INDEX_SCALE"

// scaleStream is one replica's event stream in BenchmarkScale. Replica r
// holds conversations r*per .. r*per+per-1 (its own) and those of replica
// r+1 (so every conversation is on two replicas), each of scaleConv blocks
// starting with a system prompt that every replica holds.
type scaleStream struct {
	rep  ReplicaID
	own  int // first conversation id of its own conversations
	next int // first conversation id of its neighbour's
}

const (
	scaleReplicas = 1024
	scaleConv     = 256 // blocks per conversation
	scaleSys      = 16  // blocks of the shared system prompt
)

var scaleRoot = kvblock.Root("scale-model", "")

// scaleTokens writes conversation c's tokens into toks: the shared system
// prompt, then tokens drawn from c.
func scaleTokens(toks, sys []uint32, c int) {
	copy(toks, sys)
	r := rand.New(rand.NewPCG(uint64(c), 0x5ca1e))
	for i := len(sys); i < len(toks); i++ {
		toks[i] = uint32(r.IntN(50000))
	}
}

// storeConv applies conversation c for rep as stored events of at most
// evBlocks blocks chained by parents, and returns the blocks stored.
func storeConv(ix *Index, rep ReplicaID, c int, toks, sys []uint32, keys []kvblock.Key, hs []uint64, evBlocks int) []kvblock.Key {
	scaleTokens(toks, sys, c)
	keys = kvblock.Keys(keys[:0], scaleRoot, toks, benchBS, kvblock.Options{})
	for i, k := range keys {
		hs[i] = engineHash(rep, k, 0)
	}
	for s := 0; s < len(keys); s += evBlocks {
		e := min(len(keys), s+evBlocks)
		ev := Stored{Replica: rep, Root: scaleRoot, Hashes: hs[s:e], Tokens: toks[s*benchBS : e*benchBS], BlockSize: benchBS}
		if s > 0 {
			ev.HasParent, ev.ParentHash = true, hs[s-1]
		}
		ix.Stored(ev)
	}
	return keys
}

func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScale simulates a 1,024-replica fleet with 64k blocks per
// replica (64M (block, replica) entries, 32M keys); set
// KVROUTE_INDEX_SCALE=1 to run it (a number above 1 sets the blocks per
// replica instead):
//
//   - warm: 1,024 goroutines, one per replica's replay buffer, apply their
//     replica's stored events (256-block conversations in 64-block events)
//     as fast as they can; reports the time to warm and the block events
//     per second of wall and of process CPU (event generation included);
//   - memory: heap after GC and Stats.Bytes per entry;
//   - steady state: the 1,024 streams each apply 1,000 block events per
//     second (a new 64-block conversation tail stored, an old one removed)
//     for 20 s while one goroutine matches prompts whose 16-block system
//     prompt all 1,024 replicas hold (1,024 candidates); reports the
//     achieved event rate, the CPU it took, and Match p50/p99 (thread CPU
//     time and wall), and Match on the quiet index after.
func BenchmarkScale(b *testing.B) {
	if os.Getenv(scaleEnv) == "" {
		b.Skip("set " + scaleEnv + "=1 to run (about 3 GiB, a few minutes)")
	}
	blocksPer := 64 << 10
	if n, err := strconv.Atoi(os.Getenv(scaleEnv)); err == nil && n > 1 {
		blocksPer = n // a smaller run, to try the benchmark out
	}
	per := blocksPer / scaleConv / 2 // own conversations per replica
	for range b.N {
		heap0 := heapAfterGC() + uint64(mappedTotal.Load())
		ix := New(Config{})
		sys := tokens(rand.New(rand.NewPCG(1, 2)), scaleSys*benchBS)
		streams := make([]scaleStream, scaleReplicas)
		for r := range streams {
			streams[r] = scaleStream{
				rep:  ReplicaID(fmt.Sprintf("replica-%04d", r)),
				own:  r * per,
				next: (r + 1) % scaleReplicas * per,
			}
		}
		// Warm: every stream replays its replica's conversations.
		var wg sync.WaitGroup
		c0, t0 := processCPU(), time.Now()
		for _, st := range streams {
			wg.Go(func() {
				toks := make([]uint32, scaleConv*benchBS)
				keys := make([]kvblock.Key, 0, scaleConv)
				hs := make([]uint64, scaleConv)
				for j := range per {
					storeConv(ix, st.rep, st.own+j, toks, sys, keys, hs, 64)
					storeConv(ix, st.rep, st.next+j, toks, sys, keys, hs, 64)
				}
			})
		}
		wg.Wait()
		warm, warmCPU := time.Since(t0), processCPU()-c0
		s := ix.Stats()
		entries := float64(s.Holders)
		b.ReportMetric(warm.Seconds(), "warm-s")
		b.ReportMetric(entries/warm.Seconds(), "warm-block-events/s")
		b.ReportMetric(entries/warmCPU.Seconds(), "warm-cpu-block-events/s")
		heap1 := heapAfterGC() + uint64(mappedTotal.Load())
		b.ReportMetric(entries, "entries")
		b.ReportMetric(float64(s.Keys), "keys")
		b.ReportMetric(float64(heap1-heap0)/entries, "heap-B/entry")
		b.ReportMetric(float64(s.Bytes)/entries, "stats-B/entry")
		b.ReportMetric(float64(heap1-heap0)/(1<<30), "heap-GiB")

		// Queries: conversations' prompts; block 0..15 held by all.
		var prompts [][]kvblock.Key
		toks := make([]uint32, scaleConv*benchBS)
		for c := 0; c < scaleReplicas*per; c += scaleReplicas * per / 200 {
			scaleTokens(toks, sys, c)
			prompts = append(prompts, kvblock.Keys(nil, scaleRoot, toks, benchBS, kvblock.Options{}))
		}
		matchQuiet := func() (p50, p99 float64) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var lat []time.Duration
			dst := make([]ReplicaMatch, 0, scaleReplicas)
			for i := range 4000 {
				c := threadCPU()
				dst = ix.Match(prompts[i%len(prompts)], dst[:0])
				lat = append(lat, threadCPU()-c)
				if len(dst) != scaleReplicas {
					b.Fatalf("%d candidates, want %d", len(dst), scaleReplicas)
				}
			}
			return pct(lat, 50), pct(lat, 99)
		}
		p50, p99 := matchQuiet()
		b.ReportMetric(p50, "quiet-match-cpu-p50-ns")
		b.ReportMetric(p99, "quiet-match-cpu-p99-ns")

		// Steady state: 1,000 block events per second per stream, as a
		// 64-block stored event every 128 ms and the removal of the
		// stream's previous tail (64 blocks) after it.
		const run = 20 * time.Second
		stop := make(chan struct{})
		var applied atomic.Int64
		var lagged atomic.Int64
		c1, t1 := processCPU(), time.Now()
		for ri, st := range streams {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(ri), 9))
				toks := make([]uint32, 64*benchBS)
				hs := make([]uint64, 64)
				var prev []uint64
				tick := time.NewTicker(128 * time.Millisecond)
				defer tick.Stop()
				// Spread the streams' phases over the period.
				time.Sleep(time.Duration(r.Int64N(int64(128 * time.Millisecond))))
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					start := time.Now()
					for i := range toks {
						toks[i] = uint32(r.IntN(50000))
					}
					// A new 64-block conversation; the previous one goes.
					for i := range hs {
						hs[i] = r.Uint64()
					}
					ix.Stored(Stored{Replica: st.rep, Root: scaleRoot, Hashes: hs, Tokens: toks, BlockSize: benchBS})
					if prev != nil {
						ix.Removed(Removed{Replica: st.rep, Hashes: prev})
					}
					prev = append(prev[:0], hs...)
					applied.Add(128)
					if time.Since(start) > 128*time.Millisecond {
						lagged.Add(1)
					}
				}
			})
		}
		var lat, wall []time.Duration
		func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			dst := make([]ReplicaMatch, 0, scaleReplicas)
			for i := 0; time.Since(t1) < run; i++ {
				c, w := threadCPU(), time.Now()
				dst = ix.Match(prompts[i%len(prompts)], dst[:0])
				wall = append(wall, time.Since(w))
				lat = append(lat, threadCPU()-c)
				time.Sleep(time.Millisecond)
			}
		}()
		close(stop)
		wg.Wait()
		el, cpu := time.Since(t1), processCPU()-c1
		b.ReportMetric(float64(applied.Load())/el.Seconds(), "steady-block-events/s")
		b.ReportMetric(cpu.Seconds()/el.Seconds(), "steady-cores")
		b.ReportMetric(float64(applied.Load())/el.Seconds()/(scaleReplicas*1000), "steady-achieved/offered")
		b.ReportMetric(float64(lagged.Load())/float64(applied.Load()/128), "steady-late-tick-fraction")
		b.ReportMetric(pct(lat, 50), "steady-match-cpu-p50-ns")
		b.ReportMetric(pct(lat, 99), "steady-match-cpu-p99-ns")
		b.ReportMetric(pct(wall, 50), "steady-match-p50-ns")
		b.ReportMetric(pct(wall, 99), "steady-match-p99-ns")
		runtime.KeepAlive(ix)
	}
}
