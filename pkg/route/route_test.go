package route

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// fakeState is a fixed replica set with per-replica load and trust.
type fakeState struct {
	reps  []Replica
	loads map[index.ReplicaID]load.Load
	trust map[index.ReplicaID]float64
}

func (s *fakeState) Replicas() []Replica { return s.reps }
func (s *fakeState) Load(id index.ReplicaID) load.Load {
	if l, ok := s.loads[id]; ok {
		return l
	}
	return load.Load{Healthy: true}
}
func (s *fakeState) Trust(id index.ReplicaID) float64 {
	if c, ok := s.trust[id]; ok {
		return c
	}
	return 1
}

type tokenizerFunc func(ctx context.Context, model string, in TokenizeInput) (Tokens, error)

func (f tokenizerFunc) Tokenize(ctx context.Context, model string, in TokenizeInput) (Tokens, error) {
	return f(ctx, model, in)
}

func seq(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// store tells the index that replica holds tokens (whole blocks) at bs.
func store(t testing.TB, ix *index.Index, replica index.ReplicaID, model string, tokens []uint32, bs int) {
	t.Helper()
	n := len(tokens) / bs
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(i+1)<<32 | uint64(len(replica))<<16 | uint64(bs) // opaque engine hashes
		hashes[i] ^= uint64(tokens[i*bs]) << 40
	}
	res := ix.Stored(index.Stored{
		Replica: replica, Root: kvblock.Root(model, ""), Hashes: hashes,
		Tokens: tokens[:n*bs], BlockSize: bs, Tier: index.TierGPU,
	})
	if res.Blocks != n {
		t.Fatalf("store: %+v", res)
	}
}

const model = "m"

func fleet(n int) *fakeState {
	s := &fakeState{loads: map[index.ReplicaID]load.Load{}, trust: map[index.ReplicaID]float64{}}
	for i := range n {
		id := index.ReplicaID(fmt.Sprint("r", i))
		s.reps = append(s.reps, Replica{ID: id, Address: fmt.Sprintf("10.0.0.%d:8000", i), Model: model, BlockSize: 16})
		s.loads[id] = load.Load{Healthy: true, ActivePrefillBlocks: float64(10 * (i + 1))}
	}
	return s
}

func newRouter(t testing.TB, st State, ix Matcher, tok Tokenizer) *Router {
	t.Helper()
	p, err := policy.New(policy.NameBlended, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return New(Options{Matcher: ix, State: st, Policy: p, Tokenizer: tok, Seed: 1})
}

func TestDecidePrefersCache(t *testing.T) {
	st := fleet(3)
	ix := index.New(index.Config{})
	prompt := seq(40*16+5, 100)
	store(t, ix, "r2", model, prompt[:32*16], 16)
	rt := newRouter(t, st, ix, nil)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: prompt, MaxTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	if d.Replica != "r2" || d.Address != "10.0.0.2:8000" || d.Reason != policy.ReasonCost || d.Degraded != "" {
		t.Fatalf("decision %+v", d)
	}
	if d.PromptTokens != len(prompt) || d.PromptBlocks != 40 || d.TokenSource != SourcePassthrough || d.Policy != policy.NameBlended {
		t.Fatalf("decision %+v", d)
	}
	if d.MatchedBlocks() != 32 || len(d.Candidates) != 3 {
		t.Fatalf("matched %d, %d candidates", d.MatchedBlocks(), len(d.Candidates))
	}
	// cost of r2 = 30 + 40 - 32 + 0 + 64/16
	if c := d.Candidates[2]; c.Cost != 42 || !c.Eligible || c.Trust != 1 || c.Load.ActivePrefillBlocks != 30 {
		t.Fatalf("candidate %+v", c)
	}
	if want := []string{"10.0.0.0:8000", "10.0.0.1:8000"}; !slices.Equal(d.Fallbacks, want) {
		t.Fatalf("fallbacks %v, want %v", d.Fallbacks, want)
	}
}

func TestDecideCandidates(t *testing.T) {
	st := fleet(4)
	st.reps = append(st.reps, Replica{ID: "other", Address: "10.0.1.1:8000", Model: "other", BlockSize: 16})
	st.loads["r3"] = load.Load{Healthy: false}
	ix := index.New(index.Config{})
	prompt := seq(64, 1)
	store(t, ix, "r3", model, prompt, 16) // the unhealthy one holds the cache
	rt := newRouter(t, st, ix, nil)

	tests := []struct {
		name    string
		req     Request
		err     error
		want    index.ReplicaID
		nCands  int
		reason  string
		inCands []index.ReplicaID
	}{
		{name: "model filter, unhealthy never picked", req: Request{Model: model, Tokens: prompt}, want: "r0", nCands: 4, reason: policy.ReasonColdIndex},
		{name: "subset restricts", req: Request{Model: model, Tokens: prompt, Subset: []string{"10.0.0.2:8000", "10.0.0.1:8000"}}, want: "r1", nCands: 2, reason: policy.ReasonColdIndex},
		{name: "empty subset", req: Request{Model: model, Tokens: prompt, Subset: []string{}}, err: ErrNoReplica},
		{name: "subset of strangers", req: Request{Model: model, Tokens: prompt, Subset: []string{"1.2.3.4:1"}}, err: ErrNoReplica},
		{name: "subset of unhealthy only", req: Request{Model: model, Tokens: prompt, Subset: []string{"10.0.0.3:8000"}}, err: ErrNoReplica},
		{name: "unknown model", req: Request{Model: "nope", Tokens: prompt}, err: ErrUnknownModel},
		{name: "no model: every replica", req: Request{Tokens: prompt}, want: "other", nCands: 5, reason: policy.ReasonColdIndex},
		{name: "other model", req: Request{Model: "other", Tokens: prompt}, want: "other", nCands: 1, reason: policy.ReasonColdIndex},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := rt.Decide(t.Context(), tt.req)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Replica != tt.want || len(d.Candidates) != tt.nCands || d.Reason != tt.reason {
				t.Fatalf("picked %s (%s) from %d candidates, want %s (%s) from %d", d.Replica, d.Reason, len(d.Candidates), tt.want, tt.reason, tt.nCands)
			}
		})
	}
	t.Run("empty set", func(t *testing.T) {
		_, err := newRouter(t, &fakeState{}, ix, nil).Decide(t.Context(), Request{Model: model, Tokens: prompt})
		if !errors.Is(err, ErrNoReplica) {
			t.Fatalf("err %v", err)
		}
	})
}

// A pinned request (a stored response's follow-up, retrieval or
// cancellation) goes to the replica at its pin whatever the others offer,
// within its model and subset; an unhealthy holder is an error naming it,
// and a holder gone from the set leaves the request routed as any other.
func TestDecidePin(t *testing.T) {
	st := fleet(4)
	st.loads["r3"] = load.Load{Healthy: false}
	st.reps = append(st.reps, Replica{ID: "other", Address: "10.0.1.1:8000", Model: "other", BlockSize: 16})
	ix := index.New(index.Config{})
	prompt := seq(64, 1)
	store(t, ix, "r1", model, prompt, 16)
	rt := newRouter(t, st, ix, nil)
	free, err := rt.Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil || free.Replica == "r2" {
		t.Fatalf("without a pin: %s, %v (the test pins elsewhere)", free.Replica, err)
	}
	for _, tt := range []struct {
		name   string
		req    Request
		want   index.ReplicaID
		pin    string
		err    string
		nCands int
	}{
		{name: "held to the holder", req: Request{Model: model, Tokens: prompt, Pin: "10.0.0.2:8000"}, want: "r2", pin: "10.0.0.2:8000", nCands: 1},
		{name: "no model: any replica at the pin", req: Request{Pin: "10.0.1.1:8000"}, want: "other", pin: "10.0.1.1:8000", nCands: 1},
		{name: "holder gone: routed as any other", req: Request{Model: model, Tokens: prompt, Pin: "10.9.9.9:8000"}, want: free.Replica, nCands: 4},
		{name: "holder of another model: not a candidate", req: Request{Model: model, Tokens: prompt, Pin: "10.0.1.1:8000"}, want: free.Replica, nCands: 4},
		{name: "outside the subset: dropped", req: Request{Model: model, Tokens: prompt, Pin: "10.0.0.2:8000", Subset: []string{"10.0.0.0:8000"}}, want: "r0", nCands: 1},
		{name: "unhealthy holder", req: Request{Model: model, Tokens: prompt, Pin: "10.0.0.3:8000"}, err: "10.0.0.3:8000 stores the response"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := rt.Decide(t.Context(), tt.req)
			if tt.err != "" {
				if !errors.Is(err, ErrPinUnhealthy) || !errors.Is(err, ErrNoReplica) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want ErrPinUnhealthy (an ErrNoReplica) naming %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Replica != tt.want || d.Pin != tt.pin || len(d.Candidates) != tt.nCands {
				t.Fatalf("picked %s (pin %q) from %d candidates, want %s (pin %q) from %d", d.Replica, d.Pin, len(d.Candidates), tt.want, tt.pin, tt.nCands)
			}
			if d.Pin != "" && len(d.Fallbacks) != 0 {
				t.Errorf("a pinned pick has fallbacks %v: a retry there is a 404", d.Fallbacks)
			}
		})
	}
}

func TestDecideTokenizer(t *testing.T) {
	st := fleet(3)
	ix := index.New(index.Config{})
	prompt := seq(40*16, 7)
	store(t, ix, "r2", model, prompt, 16) // cached on the most loaded replica
	boom := errors.New("boom")
	tests := []struct {
		name     string
		tok      Tokenizer
		deadline bool
		want     index.ReplicaID
		degraded string
		source   string
		matched  int
	}{
		{"exact tokens are matched", tokenizerFunc(func(context.Context, string, TokenizeInput) (Tokens, error) {
			return Tokens{IDs: prompt, Source: "remote", Exact: true}, nil
		}), false, "r2", "", "remote", 40},
		{"error routes by load", tokenizerFunc(func(context.Context, string, TokenizeInput) (Tokens, error) {
			return Tokens{}, fmt.Errorf("remote: %w", boom)
		}), false, "r0", DegradedTokenizeError, "", 0},
		{"timeout routes by load", tokenizerFunc(func(ctx context.Context, _ string, _ TokenizeInput) (Tokens, error) {
			<-ctx.Done()
			return Tokens{}, fmt.Errorf("remote: %w", ctx.Err())
		}), true, "r0", DegradedTokenizeTimeout, "", 0},
		{"approximate tokens are never matched", tokenizerFunc(func(context.Context, string, TokenizeInput) (Tokens, error) {
			return Tokens{IDs: prompt, Source: "approximate", Exact: false}, nil
		}), false, "r0", DegradedApproximate, "approximate", 0},
		{"no tokenizer", nil, false, "r0", DegradedNoTokenizer, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
			}
			d, err := newRouter(t, st, ix, tt.tok).Decide(ctx, Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
			if err != nil {
				t.Fatal(err)
			}
			if d.Replica != tt.want || d.Degraded != tt.degraded || d.TokenSource != tt.source {
				t.Fatalf("picked %s degraded %q source %q, want %s %q %q", d.Replica, d.Degraded, d.TokenSource, tt.want, tt.degraded, tt.source)
			}
			for _, c := range d.Candidates {
				if c.Replica == "r2" && c.Matched[0] != tt.matched {
					t.Fatalf("r2 matched %d, want %d", c.Matched[0], tt.matched)
				}
			}
		})
	}
	t.Run("cancelled request is an error", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		tok := tokenizerFunc(func(ctx context.Context, _ string, _ TokenizeInput) (Tokens, error) {
			return Tokens{}, ctx.Err()
		})
		if _, err := newRouter(t, st, ix, tok).Decide(ctx, Request{Model: model}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
	})
}

func TestDecideResyncingReplicaGetsNoCredit(t *testing.T) {
	st := fleet(2)
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 10}
	st.loads["r1"] = load.Load{Healthy: true, ActivePrefillBlocks: 15}
	ix := index.New(index.Config{})
	prompt := seq(20*16, 3)
	store(t, ix, "r1", model, prompt, 16)
	rt := newRouter(t, st, ix, nil)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil || d.Replica != "r1" {
		t.Fatalf("with credit: %s, %v", d.Replica, err)
	}
	st.trust["r1"] = 0
	d, err = rt.Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil || d.Replica != "r0" || d.Degraded != DegradedColdIndex {
		t.Fatalf("resyncing: %s (%s), %v", d.Replica, d.Degraded, err)
	}
	if c := d.Candidates[1]; c.Trust != 0 || c.Matched[0] != 20 {
		t.Fatalf("resyncing candidate %+v: its match is still reported, its trust 0", c)
	}
}

func TestDecideFallbackOrder(t *testing.T) {
	st := fleet(5)
	for i, pf := range []float64{50, 10, 40, 20, 30} {
		id := index.ReplicaID(fmt.Sprint("r", i))
		st.loads[id] = load.Load{Healthy: i != 3, ActivePrefillBlocks: pf}
	}
	ix := index.New(index.Config{})
	prompt := seq(10*16, 9)
	store(t, ix, "r0", model, prompt, 16)
	d, err := newRouter(t, st, ix, nil).Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil {
		t.Fatal(err)
	}
	// costs: r0 50+10-10=50, r1 20, r2 50, r3 unhealthy, r4 40
	if d.Replica != "r1" {
		t.Fatalf("picked %s", d.Replica)
	}
	if want := []string{"10.0.0.4:8000", "10.0.0.2:8000"}; !slices.Equal(d.Fallbacks, want) {
		t.Fatalf("fallbacks %v, want %v (r2 before r0: equal cost, less load)", d.Fallbacks, want)
	}
	if !math.IsNaN(d.Candidates[3].Cost) || d.Candidates[3].Eligible {
		t.Fatalf("unhealthy candidate %+v", d.Candidates[3])
	}
}

func TestDecideMultiBlockSize(t *testing.T) {
	st := fleet(2)
	st.reps[1].BlockSize = 32
	st.loads["r0"] = load.Load{Healthy: true}
	st.loads["r1"] = load.Load{Healthy: true, ActivePrefillBlocks: 3}
	ix := index.New(index.Config{})
	prompt := seq(12*16, 5)
	store(t, ix, "r1", model, prompt[:4*32], 32) // 4 blocks of 32 = 8 of 16
	store(t, ix, "r0", model, prompt[:2*16], 16)
	d, err := newRouter(t, st, ix, nil).Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Candidates[1].Matched[0]; got != 4 {
		t.Fatalf("r1 matched %d of its own 32-token blocks, want 4", got)
	}
	if got := d.Candidates[0].Matched[0]; got != 2 {
		t.Fatalf("r0 matched %d, want 2", got)
	}
	// r0: 0+12-2 = 10; r1: 3+12-8 = 7 (its 4 blocks count as 8 of 16 tokens)
	if d.Replica != "r1" || d.Candidates[1].Cost != 7 || d.Candidates[0].Cost != 10 {
		t.Fatalf("picked %s, costs %v %v", d.Replica, d.Candidates[0].Cost, d.Candidates[1].Cost)
	}
}

func TestDecideKeysIncludeLoRAAndSalt(t *testing.T) {
	st := fleet(2)
	ix := index.New(index.Config{})
	prompt := seq(8*16, 5)
	store(t, ix, "r1", model, prompt, 16)
	rt := newRouter(t, st, ix, nil)
	for _, req := range []Request{
		{Model: model, LoRA: "adapter", Tokens: prompt},
		{Model: model, CacheSalt: "tenant-a", Tokens: prompt},
	} {
		d, err := rt.Decide(t.Context(), req)
		if err != nil || d.MatchedBlocks() != 0 || d.Replica != "r0" {
			t.Fatalf("%+v: picked %s matched %d (%v): base-model cache must not match", req, d.Replica, d.MatchedBlocks(), err)
		}
	}
}

func TestDecideClockAndDeterminism(t *testing.T) {
	st := fleet(4)
	for i := range 4 {
		st.loads[index.ReplicaID(fmt.Sprint("r", i))] = load.Load{Healthy: true} // all tied
	}
	ix := index.New(index.Config{})
	var now time.Time
	clock := func() time.Time { now = now.Add(time.Millisecond); return now }
	tok := tokenizerFunc(func(context.Context, string, TokenizeInput) (Tokens, error) {
		return Tokens{IDs: seq(64, 1), Source: "remote", Exact: true}, nil
	})
	picks := func() []index.ReplicaID {
		p, _ := policy.New(policy.NameBlended, policy.Config{})
		rt := New(Options{Matcher: ix, State: st, Policy: p, Tokenizer: tok, Seed: 99, Now: clock})
		var out []index.ReplicaID
		for range 40 {
			d, err := rt.Decide(t.Context(), Request{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			if d.TokenizeTime != time.Millisecond || d.DecideTime != 3*time.Millisecond {
				t.Fatalf("times %v %v, want 1ms 3ms from the injected clock", d.TokenizeTime, d.DecideTime)
			}
			out = append(out, d.Replica)
		}
		return out
	}
	a, b := picks(), picks()
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tie-breaks:\n%v\n%v", a, b)
	}
	seen := map[index.ReplicaID]bool{}
	for _, r := range a {
		seen[r] = true
	}
	if len(seen) != 4 {
		t.Fatalf("ties went to %v only", seen)
	}
}

func TestDecideConcurrent(t *testing.T) {
	st := fleet(8)
	ix := index.New(index.Config{})
	prompt := seq(30*16, 11)
	store(t, ix, "r5", model, prompt, 16)
	for i := range 8 {
		st.loads[index.ReplicaID(fmt.Sprint("r", i))] = load.Load{Healthy: true}
	}
	rt := newRouter(t, st, ix, nil)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				d, err := rt.Decide(context.Background(), Request{Model: model, Tokens: prompt})
				if err != nil || d.Replica != "r5" || d.MatchedBlocks() != 30 {
					t.Errorf("%s %d %v", d.Replica, d.MatchedBlocks(), err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestNewDefaults(t *testing.T) {
	rt := New(Options{State: fleet(2)})
	if rt.Policy().Name() != policy.NameKVRoute {
		t.Fatalf("default policy %s", rt.Policy().Name())
	}
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(64, 1)})
	if err != nil || d.Replica != "r0" || d.Degraded != DegradedColdIndex {
		t.Fatalf("%+v %v", d, err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New without State did not panic")
		}
	}()
	New(Options{})
}

func TestDecideRoutesAdaptersToTheirReplicas(t *testing.T) {
	st := fleet(3)
	st.reps[1].Adapters = []string{"sql-lora"}
	st.reps[2].Adapters = []string{"sql-lora", "chat-lora"}
	for _, r := range st.reps {
		st.loads[r.ID] = load.Load{Healthy: true} // tied: the cache decides
	}
	ix := index.New(index.Config{})
	prompt := seq(8*16, 5)
	// r2 holds the prompt under the adapter's root (as events with
	// lora_name store it), r0 under the base model's.
	store(t, ix, "r0", model, prompt, 16)
	res := ix.Stored(index.Stored{Replica: "r2", Root: kvblock.Root(model, "sql-lora"), Hashes: seqHashes(8), Tokens: prompt, BlockSize: 16, Tier: index.TierGPU})
	if res.Blocks != 8 {
		t.Fatalf("store: %+v", res)
	}
	var asked string
	tok := tokenizerFunc(func(_ context.Context, m string, _ TokenizeInput) (Tokens, error) {
		asked = m
		return Tokens{IDs: prompt, Source: "remote", Exact: true}, nil
	})
	p, _ := policy.New(policy.NameBlended, policy.Config{})
	rt := New(Options{Matcher: ix, State: st, Policy: p, Tokenizer: tok, Seed: 1})

	d, err := rt.Decide(t.Context(), Request{Model: "sql-lora", Input: TokenizeInput{Prompt: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if asked != model {
		t.Errorf("tokenized with model %q, want the base model %q", asked, model)
	}
	if len(d.Candidates) != 2 || d.Candidates[0].Replica != "r1" || d.Candidates[1].Replica != "r2" {
		t.Fatalf("candidates %+v, want r1 and r2 (the replicas serving sql-lora)", d.Candidates)
	}
	if d.Replica != "r2" || d.Candidates[1].Matched[0] != 8 || d.Candidates[0].Matched[0] != 0 {
		t.Fatalf("picked %s, matched %v/%v: want r2 with the adapter's 8 blocks", d.Replica, d.Candidates[0].Matched, d.Candidates[1].Matched)
	}
	// Another adapter on the same replica does not see sql-lora's blocks.
	d, err = rt.Decide(t.Context(), Request{Model: "chat-lora", Tokens: prompt})
	if err != nil || d.Replica != "r2" || d.MatchedBlocks() != 0 {
		t.Fatalf("chat-lora: picked %s matched %d (%v)", d.Replica, d.MatchedBlocks(), err)
	}
	// The base model sees its own blocks only, on every replica.
	d, err = rt.Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil || len(d.Candidates) != 3 || d.Replica != "r0" || d.Candidates[2].Matched[0] != 0 {
		t.Fatalf("base: picked %s, candidates %d (%v)", d.Replica, len(d.Candidates), err)
	}
	// An adapter nobody serves is an unknown model.
	if _, err := rt.Decide(t.Context(), Request{Model: "nope-lora", Tokens: prompt}); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown adapter: %v", err)
	}
}

func seqHashes(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = 0xada0000 + uint64(i)
	}
	return out
}

// TestDecideKeysWithTheReplicasLookahead: an engine hashing with lookahead
// tokens publishes blocks whose keys fold in the tokens after each block;
// the request's keys for that replica are computed the same way, so its
// blocks match there, and only there.
func TestDecideKeysWithTheReplicasLookahead(t *testing.T) {
	st := fleet(2)
	for _, r := range st.reps {
		st.loads[r.ID] = load.Load{Healthy: true}
	}
	const la = 3
	st.reps[1].Lookahead = la
	ix := index.New(index.Config{})
	prompt := seq(8*16, 5)
	// What r1's engine publishes: the blocks that have la tokens after
	// them, keyed with those tokens folded in.
	o, n := kvblock.Options{}.WithLookahead(prompt, 16, la)
	if n != 7*16 {
		t.Fatalf("WithLookahead keyed %d tokens, want %d", n, 7*16)
	}
	res := ix.Stored(index.Stored{Replica: "r1", Root: kvblock.Root(model, ""), Hashes: seqHashes(7), Tokens: prompt[:n], BlockSize: 16, Tier: index.TierGPU, Extras: o})
	if res.Blocks != 7 {
		t.Fatalf("store: %+v", res)
	}
	rt := newRouter(t, st, ix, nil)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: prompt})
	if err != nil {
		t.Fatal(err)
	}
	if d.Replica != "r1" || d.Candidates[1].Matched[0] != 7 || d.Candidates[0].Matched[0] != 0 {
		t.Fatalf("picked %s, matched %v / %v: want r1 with 7 blocks", d.Replica, d.Candidates[0].Matched, d.Candidates[1].Matched)
	}
	// Without the lookahead the same blocks do not match (the keys differ).
	st.reps[1].Lookahead = 0
	if d, err = rt.Decide(t.Context(), Request{Model: model, Tokens: prompt}); err != nil || d.MatchedBlocks() != 0 {
		t.Fatalf("without lookahead: matched %d (%v), want 0", d.MatchedBlocks(), err)
	}
}
