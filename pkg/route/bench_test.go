package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

const (
	benchReplicas  = 16
	benchBlock     = 16
	benchIndexKeys = 1 << 20
	benchMaxBlocks = 8192
)

var benchFixture struct {
	once   sync.Once
	ix     *index.Index
	st     *fakeState
	prompt []uint32 // benchMaxBlocks blocks
}

// benchSetup builds, once per process, an index of about 1M keys over 16
// replicas: background prompts of 256 blocks spread over the replicas, plus
// the benchmark prompt's prefix on every replica at a different depth
// (replica i holds its first i/16 of benchMaxBlocks blocks), so that a
// Match walks deep and many replicas stay alive along the way.
func benchSetup(b *testing.B) {
	f := &benchFixture
	f.once.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		f.ix = index.New(index.Config{})
		f.st = &fakeState{loads: map[index.ReplicaID]load.Load{}, trust: map[index.ReplicaID]float64{}}
		for i := range benchReplicas {
			id := index.ReplicaID(fmt.Sprintf("replica-%02d", i))
			f.st.reps = append(f.st.reps, Replica{ID: id, Address: fmt.Sprintf("10.0.0.%d:8000", i), Model: model, BlockSize: benchBlock})
			f.st.loads[id] = load.Load{Healthy: true, ActivePrefillBlocks: float64(r.IntN(2000)), ActiveDecodeBlocks: float64(r.IntN(2000)), ActiveRequests: r.IntN(64)}
		}
		tokens := func(n int) []uint32 {
			out := make([]uint32, n)
			for i := range out {
				out[i] = uint32(r.IntN(150_000))
			}
			return out
		}
		root := kvblock.Root(model, "")
		stored := func(id index.ReplicaID, toks []uint32) {
			keys := kvblock.Keys(nil, root, toks, benchBlock, kvblock.Options{})
			hashes := make([]uint64, len(keys))
			for i, k := range keys {
				hashes[i] = uint64(k) ^ 0xabcdef // synthetic engine hashes
			}
			f.ix.Stored(index.Stored{Replica: id, Root: root, Hashes: hashes, Tokens: toks, BlockSize: benchBlock, Tier: index.TierGPU})
		}
		f.prompt = tokens(benchMaxBlocks * benchBlock)
		for i, rep := range f.st.reps {
			stored(rep.ID, f.prompt[:benchMaxBlocks*(i+1)/benchReplicas*benchBlock])
		}
		// Random background prompts share no block, so each adds 256 keys.
		for n := benchMaxBlocks; n < benchIndexKeys; n += 256 {
			stored(f.st.reps[(n/256)%benchReplicas].ID, tokens(256*benchBlock))
		}
		if k := f.ix.Stats().Keys; k < benchIndexKeys {
			panic(fmt.Sprintf("bench index has %d keys, want %d", k, benchIndexKeys))
		}
	})
	b.ResetTimer()
}

// BenchmarkDecide measures Decide end to end for a pre-tokenized request:
// keys, match against a ~1M-key index, scoring 16 replicas with blended,
// pick, decision assembly. Targets: p99 <= 10µs at 256 blocks, <= 250µs at
// 8,192 blocks (128k tokens). p50/p99 come from per-call timings.
func BenchmarkDecide(b *testing.B) {
	for _, blocks := range []int{256, benchMaxBlocks} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			benchSetup(b)
			f := &benchFixture
			p, err := policy.New(policy.NameBlended, policy.Config{})
			if err != nil {
				b.Fatal(err)
			}
			rt := New(Options{Matcher: f.ix, State: f.st, Policy: p, Seed: 1})
			req := Request{Model: model, Tokens: f.prompt[:blocks*benchBlock], MaxTokens: 512}
			d, err := rt.Decide(b.Context(), req)
			if err != nil || d.MatchedBlocks() == 0 {
				b.Fatalf("setup decision: matched %d, %v", d.MatchedBlocks(), err)
			}
			times := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				if _, err := rt.Decide(b.Context(), req); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(times)
			pct := func(q float64) float64 { return float64(times[int(q*float64(len(times)-1))].Nanoseconds()) }
			b.ReportMetric(pct(0.50), "p50-ns")
			b.ReportMetric(pct(0.99), "p99-ns")
		})
	}
}

// fixedMatcher answers every query with the same matches: it isolates
// Decide's own cost (keys, candidates, policy, decision) from the index.
type fixedMatcher []index.ReplicaMatch

func (m fixedMatcher) Match(_ []kvblock.Key, dst []index.ReplicaMatch) []index.ReplicaMatch {
	return append(dst, m...)
}

// BenchmarkDecideOverhead is BenchmarkDecide's 256-block case with the
// index replaced by fixed matches for all 16 replicas.
func BenchmarkDecideOverhead(b *testing.B) {
	st := fleet(benchReplicas)
	var m fixedMatcher
	for i, rep := range st.reps {
		m = append(m, index.ReplicaMatch{Replica: rep.ID, Blocks: 16 * i, ByTier: [index.NumTiers]int{16 * i}})
	}
	p, err := policy.New(policy.NameBlended, policy.Config{})
	if err != nil {
		b.Fatal(err)
	}
	rt := New(Options{Matcher: m, State: st, Policy: p, Seed: 1})
	req := Request{Model: model, Tokens: seq(256*benchBlock, 1), MaxTokens: 512}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rt.Decide(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecideParallel decides 256-block requests from GOMAXPROCS
// goroutines at once, each resending a prompt of its own: the fixture's
// first 128 blocks, which the index holds on every replica (a shared
// system prompt), then 128 blocks of its own, with
// kvroute (the default policy), the session memory and the router's
// Pending on, as kvroute runs. Run with -cpu 1,2 to see how far decisions
// scale across cores: from the loads to the pick's charge a decision holds
// the router's lock (see Router.decide), and that part runs one decision
// at a time.
func BenchmarkDecideParallel(b *testing.B) {
	benchSetup(b)
	f := &benchFixture
	p, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		b.Fatal(err)
	}
	rt := New(Options{Matcher: f.ix, State: f.st, Policy: p, Seed: 1, SessionMemory: DefaultSessionMemory, Pending: NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})})
	// Each goroutine marks its own half with its id in bits 20 and up, so
	// no two goroutines' prompts can meet there: the prompt's tokens
	// must all be below 1<<20.
	if m := slices.Max(f.prompt[:256*benchBlock]); m >= 1<<20 {
		b.Fatalf("fixture token %d does not leave bits 20 and up for a goroutine's id", m)
	}
	var workers atomic.Uint32
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := workers.Add(1)
		toks := slices.Clone(f.prompt[:256*benchBlock])
		for i := 128 * benchBlock; i < len(toks); i++ {
			toks[i] ^= id << 20
		}
		req := Request{Model: model, Tokens: toks, MaxTokens: 512}
		for pb.Next() {
			if _, err := rt.Decide(b.Context(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDecideViewGaps is BenchmarkDecide with the router's Pending on
// (as kvroute runs) and a State that does not report view gaps ("off":
// nothing vouched), that does but has none ("book"), and that has one on
// every replica ("gapped": each decision also probes the book, a look-up
// per prompt block). Each decision records its prompt in the book; the
// request, without a key, resends the one prompt, which the book's
// continuation probe answers at once.
func BenchmarkDecideViewGaps(b *testing.B) {
	for _, blocks := range []int{256, benchMaxBlocks} {
		for _, mode := range []string{"off", "book", "gapped"} {
			b.Run(fmt.Sprintf("blocks=%d/%s", blocks, mode), func(b *testing.B) {
				benchSetup(b)
				f := &benchFixture
				p, err := policy.New(policy.NameBlended, policy.Config{})
				if err != nil {
					b.Fatal(err)
				}
				var st State = f.st
				if mode != "off" {
					gs := &gapState{fakeState: f.st, gaps: map[index.ReplicaID]bool{}}
					if mode == "gapped" {
						for _, r := range f.st.reps {
							gs.gaps[r.ID] = true
						}
					}
					st = gs
				}
				rt := New(Options{Matcher: f.ix, State: st, Policy: p, Seed: 1, Pending: NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})})
				req := Request{Model: model, Tokens: f.prompt[:blocks*benchBlock], MaxTokens: 512}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if _, err := rt.Decide(b.Context(), req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPromptBookProbe is the prompt book's worst case: a prompt none
// of whose prefixes was sent, in a book holding DefaultSessionMemory/2
// prompts, probed at every block down to 0 (longest: the view-gap vouch)
// and for the conversation it continues (continues: continueWindow blocks
// down from the deepest indexed match).
func BenchmarkPromptBookProbe(b *testing.B) {
	for _, blocks := range []int{256, benchMaxBlocks} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			book := newPromptBook(DefaultSessionMemory)
			root := kvblock.Root(model, "")
			for i := range DefaultSessionMemory/2 - 1 {
				book.set(kvblock.Keys(nil, root, seq(benchBlock, uint32(i)*benchBlock+1<<30), benchBlock, kvblock.Options{})[0], "r", 1, "")
			}
			keys := kvblock.Keys(nil, root, seq(blocks*benchBlock, 7), benchBlock, kvblock.Options{})
			b.Run("longest", func(b *testing.B) {
				for b.Loop() {
					if _, ok := book.longest(keys, 0); ok {
						b.Fatal("found")
					}
				}
			})
			// A request without a key, its whole prompt held in some
			// replica's index: probed continueWindow blocks down.
			b.Run("continues", func(b *testing.B) {
				for b.Loop() {
					if _, _, ok := book.continues(keys, len(keys), false); ok {
						b.Fatal("found")
					}
				}
			})
		})
	}
}
