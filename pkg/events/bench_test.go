package events

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	zmq "github.com/pebbe/zmq4"
)

// benchBatches builds n pairs of payloads: a batch of perBatch BlockStored
// events of 64 blocks each (block size 16, token ids drawn from a 128k
// vocabulary, map encoding) and the batch of BlockRemoved events that evicts
// the same blocks.
func benchBatches(tb testing.TB, n, perBatch int) (stored, removed [][]byte, blocks int) {
	return benchBatchesGroup(tb, n, perBatch, true)
}

// benchBatchesGroup is benchBatches with or without group_idx (and the
// spec kind) on the events: without, the KV-cache group tracking is off.
func benchBatchesGroup(tb testing.TB, n, perBatch int, grouped bool) (stored, removed [][]byte, blocks int) {
	r := rand.New(rand.NewPCG(7, 7))
	const nBlocks, bs = 64, 16
	for range n {
		var sev, rev []any
		for range perBatch {
			hashes := make([]uint64, nBlocks)
			for i := range hashes {
				hashes[i] = r.Uint64()
			}
			toks := make([]uint32, nBlocks*bs)
			for i := range toks {
				toks[i] = uint32(r.IntN(128000))
			}
			st := map[string]any{
				"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil, "token_ids": toks,
				"block_size": bs, "lora_id": nil, "medium": "GPU", "lora_name": nil,
				"extra_keys": make([]any, nBlocks),
			}
			rm := map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
			if grouped {
				st["group_idx"], st["kv_cache_spec_kind"], rm["group_idx"] = 0, "full_attention", 0
			}
			sev = append(sev, st)
			rev = append(rev, rm)
			blocks += nBlocks
		}
		stored = append(stored, enc(tb, []any{ts, sev, 0}))
		removed = append(removed, enc(tb, []any{ts, rev, 0}))
	}
	return stored, removed, blocks / n
}

// BenchmarkDecodeApply decodes and applies one batch of 16 BlockStored
// events of 64 blocks per iteration, on one goroutine. The index is kept at
// a steady size: before a batch is stored again, the batch that removes its
// blocks is decoded and applied too (its cost is included; its blocks are
// not counted). The metric stored_blocks/s counts blocks of BlockStored
// events only.
func BenchmarkDecodeApply(b *testing.B) { benchDecodeApply(b, true) }

// BenchmarkDecodeApplyNoGroup is BenchmarkDecodeApply with events that name
// no KV-cache group (older vLLM, SGLang): no group holdings are tracked.
func BenchmarkDecodeApplyNoGroup(b *testing.B) { benchDecodeApply(b, false) }

func benchDecodeApply(b *testing.B, grouped bool) {
	const ring = 32
	stored, removed, perBatch := benchBatchesGroup(b, ring, 16, grouped)
	idx := index.New(index.Config{})
	ap := NewApplier(idx)
	t := Target{Replica: "r0", Model: "m", BlockSize: 16}
	var dec Decoder
	var batch Batch
	i := 0
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		j := i % ring
		if i >= ring {
			if err := dec.Decode(removed[j], HashVLLM, &batch); err != nil {
				b.Fatal(err)
			}
			ap.Apply(t, &batch)
		}
		if err := dec.Decode(stored[j], HashVLLM, &batch); err != nil {
			b.Fatal(err)
		}
		if st := ap.Apply(t, &batch); st.StoredBlocks != perBatch {
			b.Fatalf("stored %d blocks, want %d", st.StoredBlocks, perBatch)
		}
		i++
	}
	b.ReportMetric(float64(i*perBatch)/b.Elapsed().Seconds(), "stored_blocks/s")
	b.ReportMetric(float64(i*perBatch)/(cpuTime(b)-cpu0).Seconds(), "stored_blocks/cpu-s")
}

// cpuTime is the process's user+system CPU time. On a shared machine the
// wall clock overstates a single-goroutine benchmark's cost; CPU time
// (which also counts the garbage collector's background work) does not.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecode measures decoding alone.
func BenchmarkDecode(b *testing.B) {
	stored, _, perBatch := benchBatches(b, 4, 16)
	var dec Decoder
	var batch Batch
	i := 0
	b.SetBytes(int64(len(stored[0])))
	cpu0 := cpuTime(b)
	for b.Loop() {
		if err := dec.Decode(stored[i%4], HashVLLM, &batch); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i*perBatch)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(i*perBatch)/(cpuTime(b)-cpu0).Seconds(), "blocks/cpu-s")
}

// BenchmarkDecodeApplyStoreOnly is BenchmarkDecodeApply without the
// removals: each round of the ring is stored into an emptied replica (the
// clearing is outside the timer and the CPU count).
func BenchmarkDecodeApplyStoreOnly(b *testing.B) {
	const ring = 32
	stored, _, perBatch := benchBatches(b, ring, 16)
	idx := index.New(index.Config{})
	ap := NewApplier(idx)
	t := Target{Replica: "r0", Model: "m", BlockSize: 16}
	var dec Decoder
	var batch Batch
	i := 0
	var cpu time.Duration
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		j := i % ring
		if j == 0 && i > 0 {
			b.StopTimer()
			cpu += cpuTime(b) - cpu0
			idx.Cleared(t.Replica)
			cpu0 = cpuTime(b)
			b.StartTimer()
		}
		if err := dec.Decode(stored[j], HashVLLM, &batch); err != nil {
			b.Fatal(err)
		}
		if st := ap.Apply(t, &batch); st.StoredBlocks != perBatch {
			b.Fatalf("stored %d blocks, want %d", st.StoredBlocks, perBatch)
		}
		i++
	}
	cpu += cpuTime(b) - cpu0
	b.ReportMetric(float64(i*perBatch)/b.Elapsed().Seconds(), "stored_blocks/s")
	b.ReportMetric(float64(i*perBatch)/cpu.Seconds(), "stored_blocks/cpu-s")
}

// BenchmarkGroupTracker measures the KV-cache group holdings: the memory
// the Applier keeps per engine hash of a group-tagged store (vLLM 0.33 tags
// every GPU event with group_idx), and the cost of recording and removing.
func BenchmarkGroupTracker(b *testing.B) {
	const n = 1 << 20
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 | 1
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g := newGroupTracker()
	g.stored(0, index.TierGPU, hashes)
	runtime.GC()
	runtime.ReadMemStats(&after)
	perHash := float64(after.HeapAlloc-before.HeapAlloc) / n
	var dst []uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := hashes[i%n : i%n+1]
		g.stored(1, index.TierGPU, h)
		dst, _ = g.removed(dst[:0], 1, index.TierGPU, h)
	}
	b.ReportMetric(perHash, "heap-bytes/hash")
}

// BenchmarkIdleSources is what following quiet engines costs: 16 sources,
// each a bound PUB socket that never publishes, caught up by the quiet
// window, with the default poll interval. An iteration is 100 ms of wall
// time; the metric is CPU per second of it, per source.
func BenchmarkIdleSources(b *testing.B) {
	const n = 16
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	var srcs []Source
	for i := range n {
		pub, err := zctx.NewSocket(zmq.PUB)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = pub.Close() }()
		if err := errors.Join(pub.SetLinger(0), pub.Bind("tcp://127.0.0.1:*")); err != nil {
			b.Fatal(err)
		}
		ep, err := pub.GetLastEndpoint()
		if err != nil {
			b.Fatal(err)
		}
		srcs = append(srcs, Source{ID: index.ReplicaID(fmt.Sprint("r", i)), Model: "m", Endpoint: ep, Topic: "kv", BlockSize: 16})
	}
	m := NewManager(index.New(index.Config{}), Config{ResyncQuiet: 50 * time.Millisecond}.WithDefaults(), nil, nil)
	if err := m.SetSources(srcs); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ready := 0
		for _, s := range srcs {
			if m.Status(s.ID).CaughtUp {
				ready++
			}
		}
		if ready == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d sources caught up", ready, n)
		}
	}
	runtime.GC()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for range b.N {
		time.Sleep(100 * time.Millisecond)
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/b.Elapsed().Seconds()/n, "cpu-us/s/source")
}
