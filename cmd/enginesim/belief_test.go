package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/engine/kvwire"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// The router's event layer (pkg/events) and index (pkg/index), fed only by
// the simulator's PUB and replay sockets, end up believing exactly what the
// simulated engine holds: the same matched prefix, tier by tier, for every
// prompt, and no block the engine does not hold — also with batches dropped
// on the wire and healed by replay, with the CPU tier, and for a hybrid
// model, whose sliding-window group's stores and evictions (of hashes the
// full-attention group may still hold) must leave the router believing
// the full-attention group's holdings, and its matcher (the index cut by
// the sliding-window view) predicting exactly the hit the engine serves.
func TestIndexBeliefMatchesEngine(t *testing.T) {
	cases := []struct {
		name   string
		drop   float64
		cpu    int
		format kvwire.Format
		hash   kvwire.HashMode
		sw     int
	}{
		{"gpu", 0, 0, kvwire.FormatMap, kvwire.HashInt, 0},
		{"gpu drops", 0.3, 0, kvwire.FormatMap, kvwire.HashInt, 0},
		{"cpu tier drops array bytes", 0.3, 24, kvwire.FormatArray, kvwire.HashBytes, 0},
		{"hybrid sliding window drops", 0.3, 0, kvwire.FormatMap, kvwire.HashInt, 48},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const model = "sim-model"
			eng, err := engine.New(engine.Config{
				Model: model, BlockSize: 16, NumGPUBlocks: 48, NumCPUBlocks: c.cpu, MaxModelLen: 512,
				MaxNumSeqs: 8, MaxNumBatchedTokens: 256, SlidingWindow: c.sw,
			}, 7)
			if err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			pub, err := newPublisher(pubConfig{
				endpoint: "tcp://127.0.0.1:0", replayEndpoint: "tcp://127.0.0.1:0", bufferSteps: 100000,
				dropRate: c.drop, wire: kvwire.Options{Format: c.format, Hash: c.hash}, seed: 3, queue: 100000,
			}, log)
			if err != nil {
				t.Fatal(err)
			}
			pub.start()
			defer pub.Close()
			d := newDriver(eng, 200, pub.Publish)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			wg.Add(1)
			go func() { defer wg.Done(); d.run(ctx) }()

			idx := index.New(index.Config{})
			m := events.NewManager(idx, events.Config{PollInterval: 10 * time.Millisecond, ReplayTimeout: 5 * time.Second}, nil, nil)
			if err := m.SetSources([]events.Source{{ID: "sim", Model: model, Endpoint: pub.endpoint,
				ReplayEndpoint: pub.replayEndpoint, BlockSize: 16}}); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); _ = m.Run(ctx) }()

			rng := rand.New(rand.NewPCG(11, 11))
			bases := [][]uint32{randTokens(rng, 200), randTokens(rng, 200), randTokens(rng, 200)}
			var probes []engine.Request
			mk := func() engine.Request {
				b := bases[rng.IntN(len(bases))]
				p := append(append([]uint32(nil), b[:16+rng.IntN(len(b)-16)]...), randTokens(rng, rng.IntN(80))...)
				r := engine.Request{Prompt: p, MaxTokens: 1 + rng.IntN(40)}
				switch rng.IntN(6) {
				case 0:
					r.LoRAName, r.LoRAID = "adapter", 1
				case 1:
					r.CacheSalt = "tenant"
				}
				return r
			}
			runAll := func(reqs []engine.Request) {
				t.Helper()
				var all sync.WaitGroup
				for _, r := range reqs {
					sk := &sink{ch: make(chan item, r.MaxTokens+1)}
					if _, err := d.submit([]engine.Request{r}, sk); err != nil {
						t.Fatal(err)
					}
					all.Add(1)
					go func() {
						defer all.Done()
						for it := range sk.ch {
							if it.fin != nil {
								return
							}
						}
					}()
				}
				all.Wait()
			}
			for range 6 {
				var wave []engine.Request
				for range 10 {
					wave = append(wave, mk())
				}
				probes = append(probes, wave...)
				runAll(wave)
			}
			// Converge: the router must have applied every sequence number
			// (a dropped last batch is only noticed as a gap once a later
			// one arrives, so keep the engine publishing until it is).
			deadline := time.Now().Add(60 * time.Second)
			for {
				st := m.Status("sim")
				n := pub.seqs.Load()
				if st.CaughtUp && st.HasSeq && st.LastSeq+1 == n && len(pub.in) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("router did not converge: status %+v, published %d", st, n)
				}
				if st.HasSeq && st.LastSeq+1 == n || !st.CaughtUp {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				extra := mk()
				probes = append(probes, extra)
				runAll([]engine.Request{extra})
			}
			if c.drop > 0 && pub.injected.Load() == 0 {
				t.Fatal("no batch was dropped; the test does not cover replay")
			}
			// The engine is idle now; the router applies its last batches
			// asynchronously, so compare until equal or a deadline.
			probes = append(probes, mk(), mk())
			matcher := m.Matcher()
			var cut int
			compare := func() (problems []string, hit int) {
				cut = 0
				d.mu.Lock()
				defer d.mu.Unlock()
				for i, r := range probes {
					keys := kvblock.Keys(nil, kvblock.Root(model, r.LoRAName), r.Prompt, 16, kvblock.Options{CacheSalt: r.CacheSalt})
					var got index.ReplicaMatch
					for _, rm := range idx.Match(keys, nil) {
						if rm.Replica == "sim" {
							got = rm
						}
					}
					gpu, cpu := eng.CachedPrefix(r)
					hit += gpu + cpu
					if c.sw > 0 {
						var pred int
						for _, rm := range matcher.Match(keys, nil) {
							if rm.Replica == "sim" {
								pred = rm.Blocks
							}
						}
						if want := eng.HitBlocks(r); pred != want {
							problems = append(problems, fmt.Sprintf("probe %d: router predicts a hit of %d blocks, the engine would serve %d", i, pred, want))
						}
						if eng.HitBlocks(r) < gpu {
							cut++
						}
					}
					if got.Blocks != gpu+cpu || got.ByTier[index.TierGPU] != gpu || got.ByTier[index.TierCPU] != cpu {
						problems = append(problems, fmt.Sprintf("probe %d: index believes %d blocks %v, engine holds gpu %d cpu %d",
							i, got.Blocks, got.ByTier, gpu, cpu))
					}
				}
				if holders, held := idx.Stats().Holders, eng.CachedBlocks(); holders != held {
					problems = append(problems, fmt.Sprintf("index holds %d blocks (phantoms if more), engine %d", holders, held))
				}
				return problems, hit
			}
			var problems []string
			var hit int
			for end := time.Now().Add(10 * time.Second); ; {
				problems, hit = compare()
				if len(problems) == 0 || time.Now().After(end) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, p := range problems {
				t.Error(p)
			}
			d.mu.Lock()
			held := eng.CachedBlocks()
			d.mu.Unlock()
			switch {
			case hit == 0 && (c.sw == 0 || held == 0):
				t.Error("no probe matched anything; the comparison is vacuous")
			case hit == 0:
				// A hybrid model's sliding-window group evicts in real
				// time, and some runs end with none of the probes' first
				// blocks held; the index's holdings were still compared
				// with the engine's blocks above.
				t.Logf("no probe's prefix is held at the end of this run (%d blocks held, matched by the index)", held)
			}
			if c.sw > 0 && cut == 0 {
				// The waves run in real time, so how much of the early
				// sliding-window blocks is evicted by the end varies; a
				// run without a cut still checks the predictions (the
				// cut itself is covered by pkg/engine's and the e2e
				// hybrid tests). Usually 17 of 62 probes are cut.
				t.Log("no probe's hit was cut by the sliding window this run")
			}
			t.Logf("%s: %d probes (%d cut by the window), %d batches (%d dropped), %d blocks held", c.name, len(probes), cut, pub.seqs.Load(), pub.injected.Load(), held)
		})
	}
}

func randTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(50000))
	}
	return out
}
