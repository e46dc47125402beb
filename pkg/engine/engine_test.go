package engine

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func mustNew(t *testing.T, cfg Config, seed uint64) *Engine {
	t.Helper()
	e, err := New(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func prompt(n int, seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(50000))
	}
	return out
}

// drain steps e until idle and returns every step's result.
func drain(t *testing.T, e *Engine) []StepResult {
	t.Helper()
	var out []StepResult
	for i := 0; ; i++ {
		at, ok := e.NextEventTime()
		if !ok {
			return out
		}
		if i > 1_000_000 {
			t.Fatal("engine does not converge")
		}
		out = append(out, e.Step(at))
	}
}

func finishedOf(rs []StepResult) map[ReqID]Finished {
	m := map[ReqID]Finished{}
	for _, r := range rs {
		for _, f := range r.Finished {
			m[f.ID] = f
		}
	}
	return m
}

func eventsOf(rs []StepResult) []Event {
	var evs []Event
	for _, r := range rs {
		evs = append(evs, r.Events...)
	}
	return evs
}

func TestSecondRequestHitsCache(t *testing.T) {
	cases := []struct {
		name       string
		first, sec []uint32
		wantCached int
	}{
		// 100 tokens = 6 full blocks + 4; all 6 are served on the repeat.
		{"identical", prompt(100, 1), prompt(100, 1), 6 * 16},
		// A block-aligned prompt keeps its last block out: its last token
		// must be computed.
		{"aligned", prompt(96, 1), prompt(96, 1), 5 * 16},
		{"shared prefix", prompt(100, 1), append(prompt(40, 1), prompt(60, 2)...), 2 * 16},
		{"disjoint", prompt(100, 1), prompt(100, 3), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := mustNew(t, Config{}, 1)
			a, _ := e.Submit(0, Request{Prompt: c.first, MaxTokens: 4})
			drain(t, e)
			b, err := e.Submit(time.Second, Request{Prompt: c.sec, MaxTokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			fin := finishedOf(drain(t, e))
			if got := fin[b].CachedTokens; got != c.wantCached {
				t.Errorf("cached tokens = %d, want %d", got, c.wantCached)
			}
			if fin[b].OutputTokens != 4 || fin[b].PromptTokens != len(c.sec) {
				t.Errorf("usage %+v", fin[b])
			}
			_ = a
			st := e.Stats()
			if st.PrefixHits != int64(c.wantCached) || st.PrefixQueries != int64(len(c.first)+len(c.sec)) {
				t.Errorf("prefix stats %d/%d", st.PrefixHits, st.PrefixQueries)
			}
		})
	}
}

func TestStoredEventsDescribeBlocks(t *testing.T) {
	e := mustNew(t, Config{BlockSize: 4, NumGPUBlocks: 64, MaxModelLen: 64}, 9)
	p := prompt(10, 4) // 2 full prompt blocks
	_, _ = e.Submit(0, Request{Prompt: p, MaxTokens: 7, LoRAName: "ad", LoRAID: 2, CacheSalt: "s"})
	evs := eventsOf(drain(t, e))
	hashes := e.BlockHashes(Request{Prompt: p, LoRAName: "ad", CacheSalt: "s"})
	if len(evs) == 0 || evs[0].Kind != BlockStored {
		t.Fatalf("first event %+v", evs)
	}
	first := evs[0]
	if first.HasParent || !slices.Equal(first.Hashes, hashes) || !slices.Equal(first.Tokens, p[:8]) ||
		first.BlockSize != 4 || first.Medium != MediumGPU || first.LoRAName != "ad" || first.LoRAID != 2 {
		t.Fatalf("prompt event %+v, hashes %x", first, hashes)
	}
	if !slices.Equal(first.ExtraKeys[0], []string{"ad", "s"}) || !slices.Equal(first.ExtraKeys[1], []string{"ad"}) {
		t.Errorf("extra keys %q", first.ExtraKeys)
	}
	// 10 prompt + 7 output tokens, the last never computed: 16 computed =
	// 4 full blocks, the last two from the decode, one event each step.
	var all []uint64
	for _, ev := range evs {
		if ev.Kind != BlockStored {
			t.Fatalf("unexpected %v", ev.Kind)
		}
		if ev.HasParent != (len(all) > 0) || (ev.HasParent && ev.Parent != all[len(all)-1]) {
			t.Errorf("event parent %x after %x", ev.Parent, all)
		}
		all = append(all, ev.Hashes...)
	}
	if len(all) != 4 {
		t.Errorf("stored %d blocks, want 4", len(all))
	}
	// The salt and the adapter change every hash.
	plain := e.BlockHashes(Request{Prompt: p})
	for i := range plain {
		if plain[i] == hashes[i] {
			t.Errorf("block %d hash ignores extras", i)
		}
	}
}

func TestCapacityPressureEvicts(t *testing.T) {
	// 8 blocks; each request holds 5 (64 prompt tokens + 8 outputs).
	e := mustNew(t, Config{BlockSize: 16, NumGPUBlocks: 8, MaxModelLen: 128}, 1)
	a := Request{Prompt: prompt(64, 1), MaxTokens: 8}
	b := Request{Prompt: prompt(64, 2), MaxTokens: 8}
	_, _ = e.Submit(0, a)
	first := eventsOf(drain(t, e))
	_, _ = e.Submit(time.Second, b)
	evs := eventsOf(drain(t, e))
	var removed []uint64
	for _, ev := range evs {
		if ev.Kind == BlockRemoved {
			if ev.Medium != MediumGPU {
				t.Errorf("medium %q", ev.Medium)
			}
			removed = append(removed, ev.Hashes...)
		}
	}
	var storedA []uint64
	for _, ev := range first {
		storedA = append(storedA, ev.Hashes...)
	}
	if len(removed) == 0 {
		t.Fatal("no BlockRemoved under capacity pressure")
	}
	for _, h := range removed {
		if !slices.Contains(storedA, h) {
			t.Errorf("removed %x was never stored", h)
		}
	}
	// A's tail was evicted first (blocks are freed last-first), so A now
	// hits a strict prefix of what it had, starting from block 0.
	gpu, _ := e.CachedPrefix(a)
	if gpu >= 4 {
		t.Errorf("A still fully cached (%d blocks) after eviction", gpu)
	}
}

func TestCPUTierOffloadAndReload(t *testing.T) {
	e := mustNew(t, Config{BlockSize: 16, NumGPUBlocks: 8, NumCPUBlocks: 4, MaxModelLen: 128}, 1)
	a := Request{Prompt: prompt(70, 1), MaxTokens: 2}
	_, _ = e.Submit(0, a)
	drain(t, e)
	_, _ = e.Submit(time.Second, Request{Prompt: prompt(110, 2), MaxTokens: 2})
	evs := eventsOf(drain(t, e))
	var cpuStored, cpuRemoved int
	for _, ev := range evs {
		if ev.Kind == BlockStored && ev.Medium == MediumCPU {
			cpuStored++
		}
		if ev.Kind == BlockRemoved && ev.Medium == MediumCPU {
			cpuRemoved++
		}
	}
	if cpuStored == 0 {
		t.Fatal("eviction did not offload to the CPU tier")
	}
	gpu, cpu := e.CachedPrefix(a)
	if gpu+cpu == 0 || cpu == 0 {
		t.Fatalf("A's prefix gpu=%d cpu=%d", gpu, cpu)
	}
	before := gpu + cpu
	id, _ := e.Submit(2*time.Second, a)
	res := drain(t, e)
	fin := finishedOf(res)[id]
	if fin.ReloadedTokens != cpu*16 || fin.ReloadedTokens == 0 {
		t.Errorf("reloaded tokens %d, want %d", fin.ReloadedTokens, cpu*16)
	}
	if fin.CachedTokens != before*16 {
		t.Errorf("cached tokens %d, want %d (GPU + CPU hits)", fin.CachedTokens, before*16)
	}
	reloadedGPU := false
	for _, ev := range eventsOf(res) {
		if ev.Kind == BlockStored && ev.Medium == MediumGPU && len(ev.Hashes) > 0 {
			reloadedGPU = true
		}
	}
	if !reloadedGPU || res[0].ReloadedTokens == 0 {
		t.Errorf("no reload: reloaded tokens %d", res[0].ReloadedTokens)
	}
	// Fill the CPU tier past capacity: it evicts with BlockRemoved CPU.
	for i := range 4 {
		_, _ = e.Submit(time.Duration(3+i)*time.Second, Request{Prompt: prompt(110, uint64(10+i)), MaxTokens: 2})
		drain(t, e)
	}
	if st := e.Stats(); st.CPUBlocks > 4 {
		t.Errorf("CPU tier holds %d > 4", st.CPUBlocks)
	}
}

// model mirrors the cache from the events alone.
type model struct{ gpu, cpu map[uint64]bool }

func (m *model) apply(t *testing.T, evs []Event) {
	t.Helper()
	for _, ev := range evs {
		tier := m.gpu
		if ev.Medium == MediumCPU {
			tier = m.cpu
		}
		switch ev.Kind {
		case BlockStored:
			if len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize || len(ev.ExtraKeys) != len(ev.Hashes) {
				t.Fatalf("bad shape %+v", ev)
			}
			for _, h := range ev.Hashes {
				if tier[h] {
					t.Fatalf("%s %x stored twice", ev.Medium, h)
				}
				tier[h] = true
			}
		case BlockRemoved:
			for _, h := range ev.Hashes {
				if !tier[h] {
					t.Fatalf("%s %x removed but not held", ev.Medium, h)
				}
				delete(tier, h)
			}
		case AllBlocksCleared:
			clear(m.gpu)
			clear(m.cpu)
		}
	}
}

// The events alone reproduce the engine's cache exactly, under random load
// with sharing, preemption, chunked prefill and both tiers.
func TestEventsReproduceCache(t *testing.T) {
	for _, cpu := range []int{0, 16} {
		e := mustNew(t, Config{BlockSize: 8, NumGPUBlocks: 40, NumCPUBlocks: cpu, MaxModelLen: 256,
			MaxNumSeqs: 6, MaxNumBatchedTokens: 64}, 5)
		m := &model{gpu: map[uint64]bool{}, cpu: map[uint64]bool{}}
		rng := rand.New(rand.NewPCG(3, 3))
		bases := [][]uint32{prompt(120, 1), prompt(120, 2), prompt(120, 3)}
		now := time.Duration(0)
		var preempted int
		for i := range 300 {
			if i%2 == 0 {
				base := bases[rng.IntN(len(bases))]
				p := append(slices.Clone(base[:rng.IntN(len(base))+1]), prompt(rng.IntN(60), uint64(i+100))...)
				if _, err := e.Submit(now, Request{Prompt: p, MaxTokens: 1 + rng.IntN(30)}); err != nil {
					t.Fatal(err)
				}
			}
			if at, ok := e.NextEventTime(); ok {
				res := e.Step(at)
				now = res.End
				preempted += len(res.Preempted)
				m.apply(t, res.Events)
			}
		}
		for _, r := range drain(t, e) {
			m.apply(t, r.Events)
		}
		if len(m.gpu) != e.pool.gpuLen() {
			t.Errorf("cpu=%d: model has %d GPU blocks, engine %d", cpu, len(m.gpu), e.pool.gpuLen())
		}
		e.pool.loc.each(func(h uint64, w where) {
			if w.gpu >= 0 && !m.gpu[h] {
				t.Errorf("cpu=%d: engine block %x unknown to the events", cpu, h)
			}
		})
		if len(m.cpu) != e.pool.cpuLen() {
			t.Errorf("cpu=%d: model has %d CPU blocks, engine %d", cpu, len(m.cpu), e.pool.cpuLen())
		}
		for h := range m.cpu {
			if !e.pool.cpuHas(h) {
				t.Errorf("cpu=%d: phantom CPU block %x", cpu, h)
			}
		}
		if preempted == 0 {
			t.Errorf("cpu=%d: workload never preempted; the test does not cover preemption", cpu)
		}
		if st := e.Stats(); st.UsedGPUBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
			t.Errorf("leftover state %+v", st)
		}
	}
}

// A request admitted while another computes its prefix finds the blocks
// the running request's step is scheduled to compute, as in vLLM v1, which
// caches a step's blocks when it schedules them: the same step does not
// compute them twice, and the event names each block once.
func TestSameStepAdmissionSharesScheduledBlocks(t *testing.T) {
	t.Run("same step", func(t *testing.T) {
		e := mustNew(t, Config{}, 1)
		p := prompt(200, 1) // 12 full blocks + 8 tokens
		a, _ := e.Submit(0, Request{Prompt: p, MaxTokens: 2})
		b, _ := e.Submit(0, Request{Prompt: p, MaxTokens: 2})
		res := drain(t, e)
		if res[0].Batch != 2 || res[0].PrefillTokens != 200+8 {
			t.Fatalf("first step: batch %d prefill %d, want 2 and %d", res[0].Batch, res[0].PrefillTokens, 200+8)
		}
		fin := finishedOf(res)
		if fin[a].CachedTokens != 0 || fin[b].CachedTokens != 12*16 {
			t.Errorf("cached tokens %d and %d, want 0 and %d", fin[a].CachedTokens, fin[b].CachedTokens, 12*16)
		}
		if fin[a].FirstToken != fin[b].FirstToken {
			t.Errorf("first tokens at %v and %v, want the same step", fin[a].FirstToken, fin[b].FirstToken)
		}
		seen := map[uint64]int{}
		for _, ev := range eventsOf(res) {
			for _, h := range ev.Hashes {
				seen[h]++
			}
		}
		for i, h := range e.BlockHashes(Request{Prompt: p}) {
			if seen[h] != 1 {
				t.Errorf("block %d stored %d times, want once", i, seen[h])
			}
		}
	})
	t.Run("chunk in flight", func(t *testing.T) {
		// A 2,000-token prompt at 512 tokens a step. The second request
		// arrives after the first step; the first request's chunks take
		// every step's budget until its last chunk (464 tokens), beside
		// which the second is admitted and finds all 124 blocks it may
		// (the 125th holds its last token): the last chunk's blocks too,
		// scheduled in that same step.
		cfg := Config{BlockSize: 16, NumGPUBlocks: 512, MaxModelLen: 4096, MaxNumBatchedTokens: 512,
			PrefillTokensPerSec: 1000, StepTime: 10 * time.Millisecond, StepTimePerSeq: time.Millisecond}
		e := mustNew(t, cfg, 1)
		p := prompt(2000, 1)
		if _, err := e.Submit(0, Request{Prompt: p, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		first := e.Step(0)
		if first.PrefillTokens != 512 {
			t.Fatalf("first step prefilled %d", first.PrefillTokens)
		}
		b, _ := e.Submit(first.End, Request{Prompt: p, MaxTokens: 1})
		second := e.Step(first.End)
		// The first request takes the whole budget: the second waits.
		if second.Batch != 1 {
			t.Fatalf("second step batch %d, want 1", second.Batch)
		}
		fin := finishedOf(append([]StepResult{first, second}, drain(t, e)...))
		if got, want := fin[b].CachedTokens, 124*16; got != want {
			t.Errorf("second request found %d cached tokens, want %d", got, want)
		}
		if got, want := e.Stats().PrefillTokens, int64(2000+16); got != want {
			t.Errorf("prefilled %d tokens in all, want %d", got, want)
		}
	})
}

func TestChunkedPrefillAndTiming(t *testing.T) {
	cfg := Config{BlockSize: 16, NumGPUBlocks: 512, MaxModelLen: 4096, MaxNumBatchedTokens: 512,
		PrefillTokensPerSec: 1000, StepTime: 10 * time.Millisecond, StepTimePerSeq: time.Millisecond}
	e := mustNew(t, cfg, 1)
	id, _ := e.Submit(0, Request{Prompt: prompt(2000, 1), MaxTokens: 3})
	res := drain(t, e)
	// 2000 tokens at 512 per step: 4 prefill steps, then 2 decodes.
	if len(res) != 6 {
		t.Fatalf("%d steps, want 6", len(res))
	}
	for i, r := range res[:3] {
		if r.PrefillTokens != 512 || len(r.Tokens) != 0 {
			t.Errorf("step %d: prefill %d tokens %d", i, r.PrefillTokens, len(r.Tokens))
		}
	}
	f := finishedOf(res)[id]
	// TTFT = 4 steps of 11 ms + 2000 tokens at 1000/s.
	if want := 4*11*time.Millisecond + 2*time.Second; f.FirstToken != want {
		t.Errorf("first token at %v, want %v", f.FirstToken, want)
	}
	if f.Finish != f.FirstToken+2*11*time.Millisecond {
		t.Errorf("finish %v first %v", f.Finish, f.FirstToken)
	}
}

// Retime changes the speed of the steps that start after it, cache and
// queue kept, and refuses a configuration that changes anything else.
func TestRetime(t *testing.T) {
	cfg := Config{BlockSize: 16, NumGPUBlocks: 512, MaxModelLen: 4096, MaxNumBatchedTokens: 512,
		PrefillTokensPerSec: 1000, StepTime: 10 * time.Millisecond, StepTimePerSeq: time.Millisecond}
	e := mustNew(t, cfg, 1)
	id, _ := e.Submit(0, Request{Prompt: prompt(1024, 1), MaxTokens: 3})
	first := e.Step(0) // 512 tokens at the old speed
	if d := first.End - first.Start; d != 11*time.Millisecond+512*time.Millisecond {
		t.Fatalf("first step %v", d)
	}
	slow := cfg
	slow.PrefillTokensPerSec, slow.StepTime, slow.StepTimePerSeq = 250, 40*time.Millisecond, 4*time.Millisecond
	if err := e.Retime(slow); err != nil {
		t.Fatal(err)
	}
	res := drain(t, e)
	if d := res[0].End - res[0].Start; d != 44*time.Millisecond+2048*time.Millisecond {
		t.Errorf("second prefill step after Retime %v, want 44 ms + 512 tokens at 250/s", d)
	}
	f := finishedOf(res)[id]
	if f.Finish != f.FirstToken+2*44*time.Millisecond {
		t.Errorf("decode steps after Retime: finish %v, first token %v", f.Finish, f.FirstToken)
	}
	if e.Config() != slow.Defaults() {
		t.Errorf("Config after Retime = %+v", e.Config())
	}
	bigger := slow
	bigger.NumGPUBlocks = 1024
	if err := e.Retime(bigger); !errors.Is(err, ErrConfig) {
		t.Errorf("Retime changing the cache: %v, want ErrConfig", err)
	}
	stopped := slow
	stopped.PrefillTokensPerSec = -1
	if err := e.Retime(stopped); !errors.Is(err, ErrConfig) {
		t.Errorf("Retime to a negative speed: %v, want ErrConfig", err)
	}
	if e.Config() != slow.Defaults() {
		t.Errorf("a refused Retime changed the config: %+v", e.Config())
	}
}

func TestDecodeStepGrowsWithBatch(t *testing.T) {
	cfg := Config{StepTime: 10 * time.Millisecond, StepTimePerSeq: time.Millisecond}
	step := func(n int) time.Duration {
		e := mustNew(t, cfg, 1)
		for i := range n {
			_, _ = e.Submit(0, Request{Prompt: prompt(20, uint64(i)), MaxTokens: 5})
		}
		e.Step(0)
		r := e.Step(time.Second)
		if r.DecodeTokens != n {
			t.Fatalf("decodes %d, want %d", r.DecodeTokens, n)
		}
		return r.End - r.Start
	}
	if a, b := step(1), step(50); b-a != 49*time.Millisecond {
		t.Errorf("batch 1 step %v, batch 50 step %v", a, b)
	}
}

func TestWaitingQueueOverMaxNumSeqs(t *testing.T) {
	e := mustNew(t, Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 1024}, 1)
	for i := range 5 {
		_, _ = e.Submit(0, Request{Prompt: prompt(30, uint64(i)), MaxTokens: 3})
	}
	e.Step(0)
	if st := e.Stats(); st.Running != 2 || st.Waiting != 3 {
		t.Fatalf("running %d waiting %d", st.Running, st.Waiting)
	}
	fin := finishedOf(drain(t, e))
	if len(fin) != 5 {
		t.Fatalf("%d finished", len(fin))
	}
	if fin[5].FirstToken <= fin[1].Finish {
		t.Errorf("queued request started before a slot was free")
	}
}

func TestDeterministic(t *testing.T) {
	run := func(seed uint64) ([]Event, []Token) {
		e := mustNew(t, Config{NumGPUBlocks: 40, MaxModelLen: 512, BlockSize: 16}, seed)
		for i := range 20 {
			_, _ = e.Submit(time.Duration(i)*time.Millisecond, Request{Prompt: prompt(100+i*7, uint64(i%4)), MaxTokens: 10})
		}
		res := drain(t, e)
		var toks []Token
		for _, r := range res {
			toks = append(toks, r.Tokens...)
		}
		return eventsOf(res), toks
	}
	e1, t1 := run(1)
	e2, t2 := run(1)
	e3, _ := run(2)
	if !slices.EqualFunc(e1, e2, eventEqual) || !slices.Equal(t1, t2) {
		t.Fatal("same seed, different results")
	}
	if e1[0].Hashes[0] == e3[0].Hashes[0] {
		t.Error("seed does not change the hash root")
	}
}

func eventEqual(a, b Event) bool {
	return a.Kind == b.Kind && slices.Equal(a.Hashes, b.Hashes) && a.Parent == b.Parent &&
		a.HasParent == b.HasParent && slices.Equal(a.Tokens, b.Tokens) && a.Medium == b.Medium
}

func TestSubmitErrors(t *testing.T) {
	e := mustNew(t, Config{MaxModelLen: 100}, 1)
	cases := []struct {
		name string
		req  Request
		want error
	}{
		{"empty", Request{MaxTokens: 1}, ErrEmptyPrompt},
		{"zero max tokens", Request{Prompt: prompt(5, 1)}, ErrMaxTokens},
		{"prompt too long", Request{Prompt: prompt(101, 1), MaxTokens: 1}, ErrPromptTooLong},
		{"total too long", Request{Prompt: prompt(90, 1), MaxTokens: 11}, ErrMaxTokensTooLong},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Submit(0, c.req)
			if !errors.Is(err, c.want) || !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
	if _, err := e.Submit(0, Request{Prompt: prompt(90, 1), MaxTokens: 10}); err != nil {
		t.Fatalf("exact fit rejected: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := map[string]Config{
		"too small cache":   {NumGPUBlocks: 10, MaxModelLen: 4096},
		"budget below seqs": {MaxNumSeqs: 10, MaxNumBatchedTokens: 5},
		"negative cpu":      {NumCPUBlocks: -1},
	}
	for name, c := range cases {
		if _, err := New(c, 1); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestResetPrefixCache(t *testing.T) {
	e := mustNew(t, Config{NumCPUBlocks: 8}, 1)
	r := Request{Prompt: prompt(64, 1), MaxTokens: 50}
	_, _ = e.Submit(0, r)
	e.Step(0)
	if _, ok := e.ResetPrefixCache(); ok {
		t.Fatal("reset succeeded while a request holds blocks")
	}
	drain(t, e)
	evs, ok := e.ResetPrefixCache()
	if !ok || len(evs) != 1 || evs[0].Kind != AllBlocksCleared {
		t.Fatalf("reset: %v %v", evs, ok)
	}
	if g, c := e.CachedPrefix(r); g+c != 0 {
		t.Errorf("blocks survive reset: %d %d", g, c)
	}
}

func TestAbort(t *testing.T) {
	e := mustNew(t, Config{MaxNumSeqs: 1, MaxNumBatchedTokens: 64}, 1)
	a, _ := e.Submit(0, Request{Prompt: prompt(30, 1), MaxTokens: 100})
	b, _ := e.Submit(0, Request{Prompt: prompt(30, 2), MaxTokens: 100})
	e.Step(0)
	if !e.Abort(a) || !e.Abort(b) || e.Abort(a) {
		t.Fatal("abort results wrong")
	}
	if st := e.Stats(); st.UsedGPUBlocks != 0 || st.Running+st.Waiting != 0 {
		t.Errorf("state after abort %+v", st)
	}
	if _, ok := e.NextEventTime(); ok {
		t.Error("engine not idle after aborting everything")
	}
}

// The figures a real engine reports: free blocks, computed prefill tokens,
// the TTFT, queue, prefill and decode time sums, and the step averages.
func TestStatsReported(t *testing.T) {
	cfg := Config{NumGPUBlocks: 256, MaxNumBatchedTokens: 1024, PrefillTokensPerSec: 1000,
		StepTime: 10 * time.Millisecond, StepTimePerSeq: time.Millisecond}
	e := mustNew(t, cfg, 1)
	if st := e.Stats(); st.FreeGPUBlocks != 256 || st.PrefillRate != 0 || st.DecodeStep != 0 {
		t.Fatalf("fresh stats %+v", st)
	}
	_, _ = e.Submit(0, Request{Prompt: prompt(1000, 1), MaxTokens: 3})
	at, _ := e.NextEventTime()
	e.Step(at)
	// One prefill step of 1000 tokens: 10 + 1 + 1000 ms.
	st := e.Stats()
	wantStep := 1011 * time.Millisecond
	if st.Busy != wantStep || st.PrefillTokens != 1000 || st.FirstTokens != 1 || st.TTFTSum != wantStep ||
		st.QueueTimeSum != 0 || st.PrefillTimeSum != wantStep || st.PrefillRate != 1000/wantStep.Seconds() {
		t.Fatalf("after the prefill step: %+v", st)
	}
	// 1001 tokens of KV (1000 prompt + 1 output) hold 63 blocks of 16.
	if st.UsedGPUBlocks != 63 || st.FreeGPUBlocks != 256-63 || st.DecodeStep != 0 {
		t.Fatalf("blocks used %d free %d, decode step %v", st.UsedGPUBlocks, st.FreeGPUBlocks, st.DecodeStep)
	}
	drain(t, e)
	st = e.Stats()
	// Two decode steps of 11 ms each.
	if st.DecodeStep != 11*time.Millisecond || st.DecodeTimeSum != 22*time.Millisecond || st.Finished != 1 ||
		st.GenerationTokens != 3 || st.FreeGPUBlocks != 256 {
		t.Fatalf("after the decode: %+v", st)
	}
	// A second request that hits the cache computes only its uncached part.
	p := append(prompt(1000, 1)[:992:992], prompt(40, 2)...)
	_, _ = e.Submit(5*time.Second, Request{Prompt: p, MaxTokens: 1})
	e.Step(5 * time.Second)
	if st := e.Stats(); st.PrefillTokens != 1000+40 || st.FirstTokens != 2 || st.QueueTimeSum != 0 ||
		st.TTFTSum != wantStep+51*time.Millisecond || st.Running != 0 {
		t.Fatalf("after a cached request: %+v", st)
	}
}

// ExtendHashes continues a conversation's hashes (a fresh slice, the
// prefix untouched, a shorter prompt cut) as BlockHashes computes them
// whole; Generated is what the engine generates for a prompt, greedily or
// at a sampling seed.
func TestExtendHashesAndGenerated(t *testing.T) {
	e, err := New(Config{BlockSize: 16, NumGPUBlocks: 256}, 3)
	if err != nil {
		t.Fatal(err)
	}
	long := prompt(16*10+5, 1)
	full := e.BlockHashes(Request{Prompt: long})
	prefix := e.BlockHashes(Request{Prompt: long[:16*4+3]})
	if got := e.ExtendHashes(prefix, Request{Prompt: long}); !slices.Equal(got, full) {
		t.Fatalf("extended %v, want %v", got, full)
	}
	// A conversation cut short, then continued otherwise: the hashes
	// handed out before stay as they were.
	keep := slices.Clone(full)
	cut := e.ExtendHashes(full, Request{Prompt: long[:16*3]})
	if !slices.Equal(cut, full[:3]) {
		t.Fatalf("cut: %v", cut)
	}
	other := append(slices.Clone(long[:16*3]), prompt(16*5, 9)...)
	if got := e.ExtendHashes(cut, Request{Prompt: other}); !slices.Equal(got, e.BlockHashes(Request{Prompt: other})) || !slices.Equal(full, keep) {
		t.Fatalf("continued %v; earlier hashes now %v, were %v", got, full, keep)
	}
	id, err := e.Submit(0, Request{Prompt: long, MaxTokens: 7})
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for _, r := range drain(t, e) {
		for _, tk := range r.Tokens {
			if tk.ID == id {
				out = append(out, tk.Token)
			}
		}
	}
	if want := e.Generated(long, 0, 7); !slices.Equal(out, want) {
		t.Fatalf("generated %v, engine %v", want, out)
	}
	// Sampled requests of one prompt answer it differently; one sampling
	// seed repeats its answer, and the engine generates what Generated says.
	a, b := e.Generated(long, 1, 64), e.Generated(long, 2, 64)
	if slices.Equal(a, b) || slices.Equal(a, e.Generated(long, 0, 64)) {
		t.Fatal("sampling seeds 0, 1 and 2 gave one answer")
	}
	if !slices.Equal(a, e.Generated(long, 1, 64)) {
		t.Fatal("sampling seed 1 gave two answers")
	}
	id, err = e.Submit(0, Request{Prompt: long, MaxTokens: 64, Sample: 2})
	if err != nil {
		t.Fatal(err)
	}
	out = out[:0]
	for _, r := range drain(t, e) {
		for _, tk := range r.Tokens {
			if tk.ID == id {
				out = append(out, tk.Token)
			}
		}
	}
	if !slices.Equal(out, b) {
		t.Fatalf("sampled: generated %v, engine %v", b, out)
	}
}

// TestPrefetchChangesNothing runs a workload that evicts from both tiers
// with the prefetches (prefix walk, growth, allocation) on and off: every
// event, token and finished request must be the same.
func TestPrefetchChangesNothing(t *testing.T) {
	run := func(on bool) ([]Event, []Token, map[ReqID]Finished) {
		defer func(was bool) { prefetching = was }(prefetching)
		prefetching = on
		e := mustNew(t, Config{NumGPUBlocks: 64, NumCPUBlocks: 48, MaxModelLen: 1024, BlockSize: 16, MaxNumSeqs: 8}, 1)
		for i := range 60 {
			p := append(prompt(200, uint64(i%5)), prompt(50+i*3, uint64(100+i))...)
			_, _ = e.Submit(time.Duration(i)*5*time.Millisecond, Request{Prompt: p, MaxTokens: 40})
		}
		res := drain(t, e)
		var toks []Token
		for _, r := range res {
			toks = append(toks, r.Tokens...)
		}
		return eventsOf(res), toks, finishedOf(res)
	}
	e1, t1, f1 := run(true)
	e0, t0, f0 := run(false)
	cpuRemoved := 0
	for _, ev := range e1 {
		if ev.Kind == BlockRemoved && ev.Medium == MediumCPU {
			cpuRemoved++
		}
	}
	if cpuRemoved == 0 {
		t.Fatal("the workload never evicted from the CPU tier: the prefetches were not exercised")
	}
	if !slices.EqualFunc(e1, e0, eventEqual) || !slices.Equal(t1, t0) || len(f1) != len(f0) {
		t.Fatal("prefetching changed the run")
	}
	for id, f := range f1 {
		g := f0[id]
		if f.CachedTokens != g.CachedTokens || f.FirstToken != g.FirstToken || f.Finish != g.Finish || !slices.Equal(f.Hashes, g.Hashes) {
			t.Fatalf("request %v: %+v with prefetching, %+v without", id, f, g)
		}
	}
}

func TestConfigAtSpeed(t *testing.T) {
	c := Config{PrefillTokensPerSec: 1000, StepTime: 10 * time.Millisecond, StepTimePerSeq: time.Millisecond, NumGPUBlocks: 64}
	if got := c.AtSpeed(1); got != c {
		t.Errorf("AtSpeed(1) = %+v", got)
	}
	got := c.AtSpeed(0.25)
	want := c
	want.PrefillTokensPerSec, want.StepTime, want.StepTimePerSeq = 250, 40*time.Millisecond, 4*time.Millisecond
	if got != want {
		t.Errorf("AtSpeed(0.25) = %+v, want %+v", got, want)
	}
}
