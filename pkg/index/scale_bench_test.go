package index

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
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

// convEvents writes conversation c for rep into toks, keys and hs and
// returns it as stored events of at most evBlocks blocks chained by
// parents (they share toks and hs).
func convEvents(rep ReplicaID, c int, toks, sys []uint32, keys []kvblock.Key, hs []uint64, evBlocks int, evs []Stored) []Stored {
	scaleTokens(toks, sys, c)
	keys = kvblock.Keys(keys[:0], scaleRoot, toks, benchBS, kvblock.Options{})
	for i, k := range keys {
		hs[i] = engineHash(rep, k, 0)
	}
	evs = evs[:0]
	for s := 0; s < len(keys); s += evBlocks {
		e := min(len(keys), s+evBlocks)
		ev := Stored{Replica: rep, Root: scaleRoot, Hashes: hs[s:e], Tokens: toks[s*benchBS : e*benchBS], BlockSize: benchBS}
		if s > 0 {
			ev.HasParent, ev.ParentHash = true, hs[s-1]
		}
		evs = append(evs, ev)
	}
	return evs
}

// scaleItem is one unit of an applier's queue: stored events, then the
// removal of hashes, of one replica; done is signalled once applied.
type scaleItem struct {
	stored  []Stored
	removed Removed
	tick    time.Time // when the stream's tick fired (steady state)
	done    chan struct{}
}

// appliers is the events layer's apply pool in small: n goroutines, each
// applying the items of the replicas sharded to it in order (as
// events.Manager does with its workers), so that writers never outnumber
// the cores whatever the number of streams.
type appliers struct {
	ix     *Index
	queues []chan scaleItem
	wg     sync.WaitGroup
	blocks atomic.Int64 // block events applied
	late   atomic.Int64 // items applied more than a period after their tick
	items  atomic.Int64
	cpu    atomic.Int64 // the appliers' thread CPU time, ns
}

func newAppliers(ix *Index, n int) *appliers {
	a := &appliers{ix: ix, queues: make([]chan scaleItem, n)}
	for i := range a.queues {
		q := make(chan scaleItem, 1024) // events.DefaultQueueSize
		a.queues[i] = q
		a.wg.Go(func() {
			runtime.LockOSThread() // so that thread CPU time is the applier's
			defer runtime.UnlockOSThread()
			for it := range q {
				c := threadCPU()
				n := 0
				for _, ev := range it.stored {
					n += ix.Stored(ev).Blocks
				}
				if len(it.removed.Hashes) > 0 {
					ix.Removed(it.removed)
					n += len(it.removed.Hashes)
				}
				a.blocks.Add(int64(n))
				a.cpu.Add(int64(threadCPU() - c))
				if !it.tick.IsZero() {
					a.items.Add(1)
					if time.Since(it.tick) > scalePeriod {
						a.late.Add(1)
					}
				}
				it.done <- struct{}{}
			}
		})
	}
	return a
}

// apply queues it on the applier of replica r (streams index r).
func (a *appliers) apply(r int, it scaleItem) { a.queues[r%len(a.queues)] <- it }

func (a *appliers) close() {
	for _, q := range a.queues {
		close(q)
	}
	a.wg.Wait()
}

// scalePeriod is a steady-state stream's tick: a 64-block store and a
// 64-block removal, 1,000 block events per second.
const scalePeriod = 128 * time.Millisecond

// schedWait is the time this process's threads have spent runnable but
// waiting for a CPU (from /proc/self/task/*/schedstat; 0 where there is
// none): on a shared machine, what the OS did not give the process.
func schedWait() time.Duration {
	tasks, _ := os.ReadDir("/proc/self/task")
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue
		}
		var run, wait int64
		if _, err := fmt.Sscan(string(b), &run, &wait); err == nil {
			sum += time.Duration(wait)
		}
	}
	return sum
}

// mutexWait is the total time goroutines have spent blocked on sync.Mutex
// and sync.RWMutex (the index's lock included).
func mutexWait() time.Duration {
	s := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration(s[0].Value.Float64() * float64(time.Second))
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
// replica instead). Events reach the index as they do through the events
// layer: each replica's stream hands its events to the apply pool
// (GOMAXPROCS appliers, replicas sharded over them, each replica's events in
// order), which applies them.
//
//   - warm: 1,024 streams, one per replica's replay buffer, hand over
//     their replica's stored events (256-block conversations in 64-block
//     events) as fast as the pool applies them; reports the time to warm
//     and the block events per second of wall and of process CPU (event
//     generation included);
//   - memory: heap after GC plus mapped slot arrays, and Stats.Bytes, per
//     entry;
//   - steady state: the 1,024 streams each offer 1,000 block events per
//     second (every 128 ms a new 64-block conversation tail stored and the
//     previous one removed) for 20 s while one goroutine matches prompts
//     whose 16-block system prompt all 1,024 replicas hold (1,024
//     candidates); reports the achieved event rate, the CPU it took (and
//     per block event: the process's, and the appliers' own, from which
//     the cores the offered rate needs), the time the process's threads
//     waited for a CPU and goroutines waited on locks, and Match p50/p99
//     (thread CPU time and wall), and Match on the quiet index before.
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
		ap := newAppliers(ix, runtime.GOMAXPROCS(0))
		var wg sync.WaitGroup
		c0, t0 := processCPU(), time.Now()
		for ri, st := range streams {
			wg.Go(func() {
				toks := make([]uint32, scaleConv*benchBS)
				keys := make([]kvblock.Key, 0, scaleConv)
				hs := make([]uint64, scaleConv)
				var evs []Stored
				done := make(chan struct{}, 1)
				for j := range 2 * per {
					c := st.own + j/2
					if j%2 == 1 {
						c = st.next + j/2
					}
					evs = convEvents(st.rep, c, toks, sys, keys, hs, 64, evs)
					ap.apply(ri, scaleItem{stored: evs, done: done})
					<-done // the buffers are reused for the next one
				}
			})
		}
		wg.Wait()
		warm, warmCPU := time.Since(t0), processCPU()-c0
		ap.close()
		s := ix.Stats()
		entries := float64(s.Holders)
		b.ReportMetric(warm.Seconds(), "warm-s")
		b.ReportMetric(entries/warm.Seconds(), "warm-block-events/s")
		b.ReportMetric(entries/warmCPU.Seconds(), "warm-cpu-block-events/s")
		b.ReportMetric(entries/time.Duration(ap.cpu.Load()).Seconds(), "warm-apply-cpu-block-events/s")
		heap1 := heapAfterGC() + uint64(mappedTotal.Load())
		b.ReportMetric(entries, "entries")
		b.ReportMetric(float64(s.Keys), "keys")
		b.ReportMetric(float64(heap1-heap0)/entries, "heap-B/entry")
		b.ReportMetric(float64(s.Bytes)/entries, "stats-B/entry")
		b.ReportMetric(float64(heap1-heap0)/(1<<30), "heap-GiB")

		// Queries: conversations' prompts; block 0..15 held by all.
		var prompts [][]kvblock.Key
		toks := make([]uint32, scaleConv*benchBS)
		for c := 0; c < scaleReplicas*per; c += max(1, scaleReplicas*per/200) {
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
		// stream's previous tail (64 blocks) with it.
		const run = 20 * time.Second
		stop := make(chan struct{})
		ap = newAppliers(ix, runtime.GOMAXPROCS(0))
		c1, t1, w1, m1 := processCPU(), time.Now(), schedWait(), mutexWait()
		for ri, st := range streams {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(ri), 9))
				toks := make([]uint32, 64*benchBS)
				hs := [2][]uint64{make([]uint64, 64), make([]uint64, 64)}
				done := make(chan struct{}, 1)
				tick := time.NewTicker(scalePeriod)
				defer tick.Stop()
				// Spread the streams' phases over the period.
				time.Sleep(time.Duration(r.Int64N(int64(scalePeriod))))
				pending := false
				for n := 0; ; n++ {
					var at time.Time
					select {
					case <-stop:
						if pending {
							<-done
						}
						return
					case at = <-tick.C:
					}
					if pending {
						<-done // the previous tick's item is applied
					}
					cur, prev := hs[n%2], hs[(n+1)%2]
					for i := range toks {
						toks[i] = uint32(r.IntN(50000))
					}
					// A new 64-block conversation; the previous one goes.
					for i := range cur {
						cur[i] = r.Uint64()
					}
					it := scaleItem{stored: []Stored{{Replica: st.rep, Root: scaleRoot, Hashes: cur, Tokens: toks, BlockSize: benchBS}}, tick: at, done: done}
					if n > 0 {
						it.removed = Removed{Replica: st.rep, Hashes: prev}
					}
					ap.apply(ri, it)
					pending = true
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
		waited, locked := schedWait()-w1, mutexWait()-m1
		ap.close()
		applied := float64(ap.blocks.Load())
		b.ReportMetric(applied/el.Seconds(), "steady-block-events/s")
		b.ReportMetric(cpu.Seconds()/el.Seconds(), "steady-cores")
		b.ReportMetric(float64(cpu.Nanoseconds())/applied, "steady-cpu-ns/block-event")
		b.ReportMetric(float64(ap.cpu.Load())/applied, "steady-apply-cpu-ns/block-event")
		b.ReportMetric(float64(ap.cpu.Load())/applied*scaleReplicas*1000/1e9, "steady-apply-cores-needed")
		b.ReportMetric(waited.Seconds()/el.Seconds(), "steady-cpu-wait-cores")
		b.ReportMetric(locked.Seconds()/el.Seconds(), "steady-lock-wait-s/s")
		b.ReportMetric(applied/el.Seconds()/(scaleReplicas*1000), "steady-achieved/offered")
		b.ReportMetric(float64(ap.late.Load())/float64(max(1, ap.items.Load())), "steady-late-tick-fraction")
		b.ReportMetric(pct(lat, 50), "steady-match-cpu-p50-ns")
		b.ReportMetric(pct(lat, 99), "steady-match-cpu-p99-ns")
		b.ReportMetric(pct(wall, 50), "steady-match-p50-ns")
		b.ReportMetric(pct(wall, 99), "steady-match-p99-ns")
		runtime.KeepAlive(ix)
	}
}
