package events

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// groupWorld is one replica fed map-form events through one Applier, the
// way a worker applies a replica's batches.
type groupWorld struct {
	t    *testing.T
	idx  *index.Index
	ap   *Applier
	tg   Target
	toks []uint32
	hs   []uint64
	keys []kvblock.Key
}

const gbs = 4

func newGroupWorld(t *testing.T, blocks int) *groupWorld {
	w := &groupWorld{t: t, idx: index.New(index.Config{}), tg: Target{Replica: "r", Model: "m", BlockSize: gbs}}
	w.ap = NewApplier(w.idx)
	w.toks = tokens(blocks*gbs, 7)
	for i := range blocks {
		w.hs = append(w.hs, uint64(1000+i))
	}
	w.keys = kvblock.Keys(nil, kvblock.Root("m", ""), w.toks, gbs, kvblock.Options{})
	return w
}

func (w *groupWorld) apply(evs ...map[string]any) ApplyStats {
	w.t.Helper()
	list := make([]any, len(evs))
	for i, e := range evs {
		list[i] = e
	}
	b, err := DecodeBatch(enc(w.t, []any{ts, list, 0}), HashVLLM)
	if err != nil {
		w.t.Fatal(err)
	}
	if b.Invalid != 0 {
		w.t.Fatalf("%d invalid events", b.Invalid)
	}
	return w.ap.Apply(w.tg, &b)
}

// store is a BlockStored of every block; fields are added on top.
func (w *groupWorld) store(fields map[string]any) map[string]any {
	ev := map[string]any{"type": "BlockStored", "block_hashes": w.hs, "parent_block_hash": nil, "token_ids": w.toks,
		"block_size": gbs, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	for k, v := range fields {
		ev[k] = v
	}
	return ev
}

func (w *groupWorld) remove(fields map[string]any) map[string]any {
	ev := map[string]any{"type": "BlockRemoved", "block_hashes": w.hs, "medium": "GPU"}
	for k, v := range fields {
		ev[k] = v
	}
	return ev
}

func (w *groupWorld) match() index.ReplicaMatch {
	for _, m := range w.idx.Match(w.keys, nil) {
		if m.Replica == "r" {
			return m
		}
	}
	return index.ReplicaMatch{Replica: "r"}
}

func (w *groupWorld) wantBlocks(what string, n int) {
	w.t.Helper()
	if got := w.match().Blocks; got != n {
		w.t.Fatalf("%s: %d blocks matched, want %d", what, got, n)
	}
}

type g = map[string]any

// The hybrid case of issue 13: a sliding-window group vLLM does not label
// (0.33 labels GPU events with group_idx only) stores and evicts the same
// hashes as the full-attention group; its evictions must not erase what
// the full-attention group holds.
func TestGroupRemovalOnlyAffectsItsGroup(t *testing.T) {
	w := newGroupWorld(t, 6)
	w.apply(w.store(g{"group_idx": 0}), w.store(g{"group_idx": 1}))
	w.wantBlocks("both groups stored", 6)
	st := w.apply(w.remove(g{"group_idx": 1}))
	if st.GroupHeld != 6 || st.RemovedBlocks != 0 {
		t.Fatalf("sliding-window eviction: %+v", st)
	}
	w.wantBlocks("after group 1 evicted", 6)
	st = w.apply(w.remove(g{"group_idx": 0}))
	if st.GroupHeld != 0 || st.RemovedBlocks != 6 {
		t.Fatalf("full-attention eviction: %+v", st)
	}
	w.wantBlocks("after both evicted", 0)

	// Order does not matter: full attention evicts first, the window
	// group still holds the blocks (documented over-hold).
	w.apply(w.store(g{"group_idx": 0}), w.store(g{"group_idx": 1}))
	w.apply(w.remove(g{"group_idx": 0, "block_hashes": w.hs[3:]}))
	w.wantBlocks("full group evicted the tail, window group holds it", 6)
	w.apply(w.remove(g{"group_idx": 1, "block_hashes": w.hs[3:]}))
	w.wantBlocks("tail evicted by both", 3)
}

func TestGroupKinds(t *testing.T) {
	cases := []struct {
		kind               string
		indexed            bool
		unknown, otherGrp  int
		removalErasesGroup bool
	}{
		{"full_attention", true, 0, 0, false},
		{"mla_attention", true, 0, 0, false},
		{"sink_full_attention", true, 0, 0, false},
		{"unknown", true, 1, 0, false},
		{"a_kind_from_the_future", true, 1, 0, false},
		{"sliding_window", false, 0, 1, false},
		{"sliding_window_mla", false, 0, 1, false},
		{"chunked_local_attention", false, 0, 1, false},
		{"mamba", false, 0, 1, false},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			w := newGroupWorld(t, 4)
			// Group 0 is full attention; group 1 has the kind under test.
			w.apply(w.store(g{"group_idx": 0, "kv_cache_spec_kind": "full_attention"}))
			w.idx.Cleared("r")
			w.ap.Forget("r")
			st := w.apply(w.store(g{"group_idx": 1, "kv_cache_spec_kind": c.kind, "kv_cache_spec_sliding_window": 128}))
			if st.UnknownKind != c.unknown || st.OtherGroup != c.otherGrp {
				t.Fatalf("stats %+v", st)
			}
			want := 0
			if c.indexed {
				want = 4
			}
			w.wantBlocks("group 1 store", want)
			// Group 0 stores too; group 1's removal (unlabelled, as vLLM
			// sends removals) never erases group 0's blocks.
			w.apply(w.store(g{"group_idx": 0}))
			st = w.apply(w.remove(g{"group_idx": 1}))
			w.wantBlocks("after group 1 removal", 4)
			if !c.indexed && st.OtherGroup != 1 {
				t.Fatalf("removal of a partial group not skipped: %+v", st)
			}
			w.apply(w.remove(g{"group_idx": 0}))
			w.wantBlocks("after group 0 removal", 0)
		})
	}
}

// A kind learned from a labelled event (offload events carry it) holds for
// the group's later unlabelled events.
func TestGroupKindIsRemembered(t *testing.T) {
	w := newGroupWorld(t, 3)
	w.apply(w.store(g{"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "medium": "CPU"}))
	if st := w.apply(w.store(g{"group_idx": 1})); st.OtherGroup != 1 || st.Stored != 0 {
		t.Fatalf("unlabelled store of a sliding-window group: %+v", st)
	}
	w.apply(w.store(g{"group_idx": 0}))
	if st := w.apply(w.remove(g{"group_idx": 1})); st.OtherGroup != 1 || st.RemovedBlocks != 0 {
		t.Fatalf("removal of a sliding-window group: %+v", st)
	}
	w.wantBlocks("full attention intact", 3)
}

// Holdings are per tier: a group's GPU eviction leaves its CPU copy.
func TestGroupTiers(t *testing.T) {
	w := newGroupWorld(t, 2)
	w.apply(w.store(g{"group_idx": 0}), w.store(g{"group_idx": 0, "medium": "CPU"}), w.store(g{"group_idx": 1}))
	w.apply(w.remove(g{"group_idx": 0}))
	m := w.match()
	if m.Blocks != 2 || m.ByTier[index.TierGPU] != 2 {
		t.Fatalf("GPU held by group 1: %+v", m)
	}
	w.apply(w.remove(g{"group_idx": 1}))
	m = w.match()
	if m.Blocks != 2 || m.ByTier[index.TierCPU] != 2 {
		t.Fatalf("CPU copy: %+v", m)
	}
}

// AllBlocksCleared and a resync (Forget) drop the holdings.
func TestGroupClear(t *testing.T) {
	for _, how := range []string{"AllBlocksCleared", "Forget"} {
		t.Run(how, func(t *testing.T) {
			w := newGroupWorld(t, 2)
			w.apply(w.store(g{"group_idx": 0}))
			if how == "Forget" {
				w.idx.Cleared("r")
				w.ap.Forget("r")
			} else {
				w.apply(g{"type": "AllBlocksCleared"})
			}
			w.wantBlocks("cleared", 0)
			w.apply(w.store(g{"group_idx": 1}))
			w.apply(w.remove(g{"group_idx": 1}))
			w.wantBlocks("group 1 stored and removed after the clear", 0)
		})
	}
}

// A group-tagged store of another block size (a coarser group, e.g. mamba
// or a bigger attention block) is not indexed; an untagged one is indexed
// as given (the older behaviour), both counted.
func TestGroupBlockSizeMismatch(t *testing.T) {
	w := newGroupWorld(t, 4)
	big := g{"block_hashes": []uint64{2000, 2001}, "block_size": 8}
	tagged := w.store(big)
	tagged["group_idx"] = 1
	if st := w.apply(tagged); st.BlockSizeMismatch != 1 || st.Stored != 0 || st.EngineBlockSize != 8 {
		t.Fatalf("tagged: %+v", st)
	}
	if st := w.apply(w.store(big)); st.BlockSizeMismatch != 1 || st.Stored != 1 {
		t.Fatalf("untagged: %+v", st)
	}
}

// REMOTE locality: a network tier the engine reads from; held at the disk
// tier whatever the medium, and removed from there.
func TestRemoteLocality(t *testing.T) {
	w := newGroupWorld(t, 2)
	w.apply(w.store(g{"medium": "CPU", "locality": "REMOTE", "ownership": "kvcr", "session_id": "s1"}))
	m := w.match()
	if m.Blocks != 2 || m.ByTier[index.TierDisk] != 2 {
		t.Fatalf("remote store: %+v", m)
	}
	w.apply(w.store(g{"medium": "CPU", "locality": "LOCAL"}))
	if m := w.match(); m.ByTier[index.TierCPU] != 2 {
		t.Fatalf("local store: %+v", m)
	}
	w.apply(w.remove(g{"medium": "CPU", "locality": "REMOTE"}))
	if m := w.match(); m.Blocks != 2 || m.ByTier[index.TierCPU] != 2 || m.ByTier[index.TierDisk] != 0 {
		t.Fatalf("after the remote removal: %+v", m)
	}
}

// lookahead_token_ids: vLLM's hash of block i covers the n tokens after
// it; the index keys the block the same way, so only a request hashed with
// kvblock.Options.WithLookahead meets it.
func TestLookaheadKeys(t *testing.T) {
	const n = 3
	w := newGroupWorld(t, 4)
	all := append(append([]uint32(nil), w.toks...), tokens(n, 99)...) // the prompt goes on past the stored blocks
	var la [][]uint32
	for i := range 4 {
		end := (i + 1) * gbs
		la = append(la, all[end:end+n])
	}
	st := w.apply(w.store(g{"group_idx": 0, "lookahead_token_ids": la, "extra_keys": []any{[]any{"salt-1"}, nil, nil, nil}}))
	if st.StoredBlocks != 4 || st.Lookahead != n || st.EngineBlockSize != gbs {
		t.Fatalf("stored %+v", st)
	}
	root := kvblock.Root("m", "")
	opts, m := kvblock.Options{CacheSalt: "salt-1"}.WithLookahead(all, gbs, n)
	if m != 4*gbs {
		t.Fatalf("keyable tokens %d", m)
	}
	keys := kvblock.Keys(nil, root, all[:m], gbs, opts)
	if got := matchOf(w.idx, keys, "r"); got != 4 {
		t.Fatalf("lookahead request matches %d of 4", got)
	}
	if got := matchOf(w.idx, kvblock.Keys(nil, root, w.toks, gbs, kvblock.Options{CacheSalt: "salt-1"}), "r"); got != 0 {
		t.Fatalf("request without lookahead matches %d", got)
	}
	// Other tokens after block 3: the engine could not serve block 3.
	other := append([]uint32(nil), all...)
	other[len(other)-1]++
	opts, m = kvblock.Options{CacheSalt: "salt-1"}.WithLookahead(other, gbs, n)
	if got := matchOf(w.idx, kvblock.Keys(nil, root, other[:m], gbs, opts), "r"); got != 3 {
		t.Fatalf("changed lookahead of block 3: %d matched, want 3", got)
	}
	// One list per block, or the store is malformed.
	if st := w.apply(w.store(g{"lookahead_token_ids": la[:2]})); st.BadShape != 1 {
		t.Fatalf("short lookahead list: %+v", st)
	}
}

func TestClassifyKind(t *testing.T) {
	got := map[string]groupKind{}
	for _, k := range []string{"", "full_attention", "sink_full_attention", "sliding_window", "sliding_window_mla", "mamba", "unknown", "x"} {
		got[k] = classifyKind(k)
	}
	want := map[string]groupKind{"": kindPresumed, "full_attention": kindFull, "sink_full_attention": kindFull,
		"sliding_window": kindSliding, "sliding_window_mla": kindSliding, "mamba": kindPartial, "unknown": kindUnknown, "x": kindUnknown}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatal(d)
	}
	// High group indices share the last bit; tiers never collide.
	if groupBit(15, index.TierGPU) != groupBit(40, index.TierGPU) || groupBit(0, index.TierCPU)&tierMask(index.TierGPU) != 0 {
		t.Fatal("group bits")
	}
}

// Status reports what the engine's events say about how to hash requests
// for it: its block (SGLang: page) size and its lookahead.
func TestStatusReportsEngineBlockSizeAndLookahead(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewManager(index.New(index.Config{}), Config{}, reg, nil)
	if err := m.SetSources([]Source{{ID: "r", Model: "m", Endpoint: "tcp://127.0.0.1:1", Engine: "sglang", BlockSize: 16}}); err != nil {
		t.Fatal(err)
	}
	rep := m.lookup("r")
	w := &worker{m: m, ap: NewApplier(m.idx)}
	ev := map[string]any{"type": "BlockStored", "block_hashes": []uint64{1, 2}, "parent_block_hash": nil,
		"token_ids": []int{1, 2}, "block_size": 1, "medium": "GPU", "lookahead_token_ids": [][]int{{2, 3}, {3, 4}}}
	w.handle(item{rep: rep, kind: itemBatch, epoch: rep.epoch.Load(), payload: enc(t, []any{ts, []any{ev}, 0})})
	st := m.Status("r")
	if st.EngineBlockSize != 1 || st.Lookahead != 2 {
		t.Fatalf("status %+v", st)
	}
	if got := gather(t, reg, "kvroute_events_engine_block_size"); got != 1 {
		t.Fatalf("engine_block_size %v", got)
	}
	if got := gather(t, reg, "kvroute_events_block_size_mismatch_total"); got != 1 {
		t.Fatalf("mismatch %v", got)
	}
	want := "SGLang publishes pages of 1 tokens but the replica's block_size is 16; requests will not match: set block_size: 1 on the replica, or start SGLang with --page-size 16"
	if got := blockSizeAdvice(HashSGLang, 1, 16); got != want {
		t.Fatalf("advice %q", got)
	}
}

// Kinds configured per source (Source.GroupKinds) label groups that vLLM's
// GPU events leave unlabelled; a kind on an event still wins; a resync
// keeps learned kinds.
func TestGroupKindsConfigured(t *testing.T) {
	w := newGroupWorld(t, 3)
	w.tg.GroupKinds = "full_attention, sliding_window"
	if st := w.apply(w.store(g{"group_idx": 1})); st.OtherGroup != 1 || st.Stored != 0 {
		t.Fatalf("configured sliding-window group stored: %+v", st)
	}
	w.apply(w.store(g{"group_idx": 0}))
	if st := w.apply(w.remove(g{"group_idx": 1})); st.OtherGroup != 1 || st.RemovedBlocks != 0 {
		t.Fatalf("configured sliding-window removal: %+v", st)
	}
	w.wantBlocks("full attention intact", 3)
	// Group 2 learns its kind from an event; a resync keeps it.
	w.apply(w.store(g{"group_idx": 2, "kv_cache_spec_kind": "mamba"}))
	w.idx.Cleared("r")
	w.ap.Reset("r")
	if st := w.apply(w.store(g{"group_idx": 2})); st.OtherGroup != 1 {
		t.Fatalf("learned kind lost on reset: %+v", st)
	}
	// An event's kind wins over the configured one.
	if st := w.apply(w.store(g{"group_idx": 1, "kv_cache_spec_kind": "full_attention"})); st.Stored != 1 {
		t.Fatalf("event kind did not win: %+v", st)
	}
	// Forget (the source left or changed) drops everything.
	w.ap.Forget("r")
	w.tg.GroupKinds = ""
	if st := w.apply(w.store(g{"group_idx": 2})); st.Stored != 1 {
		t.Fatalf("forgotten kinds still apply: %+v", st)
	}
}

func TestSourceGroupKindsValidation(t *testing.T) {
	m := NewManager(index.New(index.Config{}), Config{}, nil, nil)
	for kinds, ok := range map[string]bool{
		"":                                  true,
		"full_attention,sliding_window":     true,
		",sliding_window":                   true,
		"full_attention,slidng_window":      false,
		"a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q": false,
	} {
		err := m.SetSources([]Source{{ID: "r", Endpoint: "tcp://127.0.0.1:1", GroupKinds: kinds}})
		if (err == nil) != ok {
			t.Errorf("GroupKinds %q: err %v", kinds, err)
		}
	}
}
