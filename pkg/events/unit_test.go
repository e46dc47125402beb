package events

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

func tokens(n int, seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 9))
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(150000))
	}
	return out
}

func applyPayload(t *testing.T, idx *index.Index, tg Target, payload []byte) ApplyStats {
	t.Helper()
	b, err := DecodeBatch(payload, HashVLLM)
	if err != nil {
		t.Fatal(err)
	}
	return NewApplier(idx).Apply(tg, &b)
}

// A salted (and LoRA, and multimodal) request hashes to exactly the keys
// a BlockStored event with vLLM's extra_keys indexes.
func TestSaltedRequestMatchesStoredKeys(t *testing.T) {
	const bs = 16
	toks := tokens(4*bs, 1)
	hashes := []uint64{11, 12, 13, 14}
	mm := []ExtraKey{{Kind: ExtraMM, Str: "img-abc", Int: -5}}
	tests := []struct {
		name  string
		lora  string
		extra []any
		opts  kvblock.Options
	}{
		{
			name:  "salt",
			extra: []any{[]any{"tenant-a"}, nil, nil, nil},
			opts:  kvblock.Options{CacheSalt: "tenant-a"},
		},
		{
			name:  "lora and salt",
			lora:  "my-lora",
			extra: []any{[]any{"my-lora", "tenant-a"}, []any{"my-lora"}, []any{"my-lora"}, []any{"my-lora"}},
			opts:  kvblock.Options{CacheSalt: "tenant-a"},
		},
		{
			name:  "salt, multimodal and prompt embeds",
			extra: []any{[]any{"tenant-a", []byte{1, 2}}, []any{[]any{"img-abc", -5}}, nil, nil},
			opts: kvblock.Options{CacheSalt: "tenant-a", Extras: [][]byte{
				ExtraBytes(nil, []ExtraKey{{Kind: ExtraBin, Bytes: []byte{1, 2}}}), ExtraBytes(nil, mm)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idx := index.New(index.Config{})
			ev := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil, "token_ids": toks,
				"block_size": bs, "lora_id": nil, "medium": "GPU", "extra_keys": tc.extra}
			if tc.lora != "" {
				ev["lora_name"] = tc.lora
			}
			st := applyPayload(t, idx, Target{Replica: "r", Model: "m", BlockSize: bs}, enc(t, []any{ts, []any{ev}, 0}))
			if st.StoredBlocks != 4 {
				t.Fatalf("stored %+v", st)
			}
			root := kvblock.Root("m", tc.lora)
			keys := kvblock.Keys(nil, root, toks, bs, tc.opts)
			if got := matchOf(idx, keys, "r"); got != 4 {
				t.Errorf("salted request matches %d of 4 blocks", got)
			}
			plain := kvblock.Keys(nil, root, toks, bs, kvblock.Options{})
			if got := matchOf(idx, plain, "r"); got != 0 {
				t.Errorf("unsalted request matches %d blocks of a salted store", got)
			}
			// A continuation event (with a parent) carries no salt.
			more := tokens(bs, 2)
			cont := map[string]any{"type": "BlockStored", "block_hashes": []uint64{15}, "parent_block_hash": uint64(14),
				"token_ids": more, "block_size": bs, "medium": "GPU", "lora_name": nil}
			if tc.lora != "" {
				cont["lora_name"] = tc.lora
				cont["extra_keys"] = []any{[]any{tc.lora}}
			}
			applyPayload(t, idx, Target{Replica: "r", Model: "m"}, enc(t, []any{ts, []any{cont}, 0}))
			all := kvblock.Keys(nil, root, append(append([]uint32(nil), toks...), more...), bs, tc.opts)
			if got := matchOf(idx, all, "r"); got != 5 {
				t.Errorf("continued chain matches %d of 5 blocks", got)
			}
		})
	}
}

// The router never reproduces vLLM's digests: the §2.3 sha256_cbor values
// in the golden example and arbitrary hashes index the same router keys.
func TestEngineHashesAreOpaque(t *testing.T) {
	golden := readHex(t, "stored_array.hex")
	a := index.New(index.Config{})
	applyPayload(t, a, Target{Replica: "r", Model: "m"}, golden)
	b := index.New(index.Config{})
	applyPayload(t, b, Target{Replica: "r", Model: "m"},
		enc(t, []any{ts, []any{[]any{"BlockStored", []uint64{1, 2}, nil, []int{1, 2, 3, 4, 5, 6, 7, 8}, 4, nil, "GPU"}}, 0}))
	keys := kvblock.Keys(nil, kvblock.Root("m", ""), []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, kvblock.Options{})
	if ga, gb := matchOf(a, keys, "r"), matchOf(b, keys, "r"); ga != 2 || gb != 2 {
		t.Errorf("matches %d and %d, want 2 and 2", ga, gb)
	}
	// Removal goes by the engine's own hash.
	applyPayload(t, a, Target{Replica: "r", Model: "m"}, readHex(t, "removed_map.hex"))
	if got := matchOf(a, keys, "r"); got != 1 {
		t.Errorf("after removing H2: %d blocks", got)
	}
}

func TestApplySkips(t *testing.T) {
	tg := Target{Replica: "r", Model: "m", BlockSize: 16}
	stored := func(mut func(ev map[string]any)) []byte {
		ev := map[string]any{"type": "BlockStored", "block_hashes": []uint64{1}, "parent_block_hash": nil,
			"token_ids": []int{1, 2, 3, 4}, "block_size": 4, "medium": "GPU"}
		mut(ev)
		return enc(t, []any{ts, []any{ev}, 0})
	}
	tests := []struct {
		name    string
		payload []byte
		want    ApplyStats
	}{
		{"block size mismatch is indexed and counted", stored(func(map[string]any) {}), ApplyStats{Stored: 1, StoredBlocks: 1, BlockSizeMismatch: 1, EngineBlockSize: 4}},
		{"bad shape", stored(func(ev map[string]any) { ev["token_ids"] = []int{1, 2, 3} }), ApplyStats{BadShape: 1}},
		{"unknown medium", stored(func(ev map[string]any) { ev["medium"] = "TAPE" }), ApplyStats{UnknownMedium: 1}},
		{"cpu medium", stored(func(ev map[string]any) { ev["medium"] = "CPU" }), ApplyStats{Stored: 1, StoredBlocks: 1, BlockSizeMismatch: 1, EngineBlockSize: 4}},
		{"sliding window group", stored(func(ev map[string]any) { ev["kv_cache_spec_kind"] = "sliding_window" }), ApplyStats{OtherGroup: 1}},
		{"unknown parent", stored(func(ev map[string]any) { ev["parent_block_hash"] = uint64(77) }), ApplyStats{UnknownParentBlocks: 1, BlockSizeMismatch: 1, EngineBlockSize: 4}},
		{"remove unknown medium", enc(t, []any{ts, []any{[]any{"BlockRemoved", []uint64{1}, "TAPE"}}, 0}), ApplyStats{UnknownMedium: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := applyPayload(t, index.New(index.Config{}), tg, tc.payload)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("stats (-want +got):\n%s", d)
			}
		})
	}
}

func TestStoredOptions(t *testing.T) {
	mm := ExtraKey{Kind: ExtraMM, Str: "img", Int: 3}
	tests := []struct {
		name     string
		ev       Event
		wantSalt string
		wantX    [][]ExtraKey // expected remaining keys per block (nil = none)
	}{
		{"none", Event{}, "", nil},
		{"salt only", Event{ExtraKeys: [][]ExtraKey{{{Kind: ExtraString, Str: "s"}}, nil}}, "s", nil},
		{"salt ignored with parent", Event{HasParent: true, ExtraKeys: [][]ExtraKey{{{Kind: ExtraString, Str: "s"}}}}, "", [][]ExtraKey{{{Kind: ExtraString, Str: "s"}}}},
		{"lora stripped everywhere", Event{LoRAName: "l", ExtraKeys: [][]ExtraKey{{{Kind: ExtraString, Str: "l"}}, {{Kind: ExtraString, Str: "l"}}}}, "", nil},
		{"lora, mm, salt", Event{LoRAName: "l", ExtraKeys: [][]ExtraKey{{{Kind: ExtraString, Str: "l"}, mm, {Kind: ExtraString, Str: "s"}}}}, "s", [][]ExtraKey{{mm}}},
		{"explicit salt wins", Event{CacheSalt: "x", ExtraKeys: [][]ExtraKey{{mm}}}, "x", [][]ExtraKey{{mm}}},
		{"mm on block 1", Event{ExtraKeys: [][]ExtraKey{nil, {mm}}}, "", [][]ExtraKey{nil, {mm}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := StoredOptions(&tc.ev, nil)
			if o.CacheSalt != tc.wantSalt {
				t.Errorf("salt %q, want %q", o.CacheSalt, tc.wantSalt)
			}
			var want [][]byte
			for _, ks := range tc.wantX {
				if len(ks) == 0 {
					want = append(want, nil)
					continue
				}
				want = append(want, ExtraBytes(nil, ks))
			}
			got := o.Extras
			for len(got) > len(want) && got[len(got)-1] == nil {
				got = got[:len(got)-1]
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("extras (-want +got):\n%s", d)
			}
		})
	}
	// The encoding is unambiguous.
	a := ExtraBytes(nil, []ExtraKey{{Kind: ExtraString, Str: "ab"}, {Kind: ExtraString, Str: "c"}})
	b := ExtraBytes(nil, []ExtraKey{{Kind: ExtraString, Str: "a"}, {Kind: ExtraString, Str: "bc"}})
	if string(a) == string(b) {
		t.Error("ExtraBytes is ambiguous")
	}
}

func TestDP(t *testing.T) {
	srcs, err := DPSources(Source{ID: "pod-a", Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5600"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []Source{
		{ID: "pod-a", Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5600"},
		{ID: "pod-a#dp1", Endpoint: "tcp://10.0.0.1:5558", ReplayEndpoint: "tcp://10.0.0.1:5601", DPRank: 1},
		{ID: "pod-a#dp2", Endpoint: "tcp://10.0.0.1:5559", ReplayEndpoint: "tcp://10.0.0.1:5602", DPRank: 2},
	}
	if d := cmp.Diff(want, srcs); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	for _, tc := range []struct {
		id   index.ReplicaID
		base index.ReplicaID
		rank int
	}{{"pod-a", "pod-a", 0}, {"pod-a#dp2", "pod-a", 2}, {"pod#dpx", "pod#dpx", 0}, {"pod#dp0", "pod#dp0", 0}, {"pod#dp01", "pod#dp01", 0}} {
		if b, r := SplitDPReplicaID(tc.id); b != tc.base || r != tc.rank {
			t.Errorf("Split(%q) = %q %d", tc.id, b, r)
		}
	}
	for _, tc := range []struct {
		ep, want string
		ok       bool
	}{
		{"inproc://ev", "inproc://ev_dp1", true},
		{"tcp://*:0", "tcp://*:0", true},
		{"tcp://[::1]:5557", "tcp://[::1]:5558", true},
		{"ipc:///tmp/ev", "", false},
		{"tcp://host:65535", "", false},
		{"tcp://host", "", false},
	} {
		got, err := offsetEndpoint(tc.ep, 1)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("offset(%q) = %q, %v", tc.ep, got, err)
		}
	}
}

// fakeClock is a settable clock for the silence check.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestSilentReplica(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	m := NewManager(index.New(index.Config{}), Config{SilentAfter: time.Minute, Now: clk.Now}, nil, nil)
	if err := m.SetSources([]Source{{ID: "r", Endpoint: "tcp://127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	r := m.lookup("r")
	if m.Status("r").Silent {
		t.Fatal("silent without requests")
	}
	m.NoteRouted("r", clk.Now())
	clk.Add(30 * time.Second)
	m.NoteRouted("r", clk.Now())
	if m.Status("r").Silent {
		t.Fatal("silent before the window")
	}
	clk.Add(31 * time.Second)
	st := m.Status("r")
	if !st.Silent || !st.LastRouted.Equal(clk.Now().Add(-31*time.Second)) {
		t.Fatalf("not silent a minute after the first routed request: %+v", st)
	}
	r.noteEvent(clk.Now())
	if m.Status("r").Silent {
		t.Fatal("still silent after an event")
	}
	m.NoteRouted("unknown", clk.Now()) // ignored
}

// A live batch that finds the queue full is counted and resyncs the
// replica; the view is cleared in order through the queue.
func TestOverflowResyncs(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewManager(index.New(index.Config{}), Config{Workers: 1, QueueSize: 1, ResyncQuiet: time.Hour}, reg, nil)
	if err := m.SetSources([]Source{{ID: "r", Endpoint: "tcp://127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	rep := m.lookup("r")
	q := make(chan item, 1)
	s := newZMQSubscriber(m, rep, nil, q)
	ctx := context.Background()
	s.step(ctx, s.seq.Live(time.Now(), liveMsg{0, []byte{1}})) // queued; stream seen from 0: caught up
	if m.Credit("r") != 1 {
		t.Fatal("not caught up from seq 0")
	}
	// The queue is full: seq 1 overflows, and the reset then waits for
	// room, which is only made once the overflow has been counted.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.step(ctx, s.seq.Live(time.Now(), liveMsg{1, []byte{2}}))
	}()
	eventually(t, "overflow counted", func() error {
		if gather(t, reg, "kvroute_events_queue_overflows_total") != 1 {
			return fmt.Errorf("no overflow yet")
		}
		return nil
	})
	got := []item{<-q, <-q}
	<-done
	if len(got) != 2 || got[0].kind != itemBatch || got[1].kind != itemReset || got[1].epoch != rep.epoch.Load() {
		t.Fatalf("queue saw %+v", got)
	}
	if m.Credit("r") != 0 || !m.Status("r").Resyncing {
		t.Error("overflow did not withhold credit")
	}
	for name, want := range map[string]float64{
		"kvroute_events_queue_overflows_total": 1,
		"kvroute_events_resyncing":             1,
	} {
		if got := gather(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := gatherLabel(t, reg, "kvroute_events_resyncs_total", "reason", "overflow"); got != 1 {
		t.Errorf("overflow resyncs = %v", got)
	}
}

func TestBackoff(t *testing.T) {
	lo, hi := 100*time.Millisecond, 2*time.Second
	for attempt := range 40 {
		d := backoff(lo, hi, attempt)
		ceil := min(hi, lo<<min(attempt, 20))
		if d < ceil/2 || d > ceil {
			t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, ceil/2, ceil)
		}
	}
}

func gather(t *testing.T, reg *prometheus.Registry, name string) float64 {
	return gatherLabel(t, reg, name, "", "")
}

func gatherLabel(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if label != "" {
				for _, l := range m.GetLabel() {
					if l.GetName() == label && l.GetValue() != value {
						continue next
					}
				}
			}
			if c := m.GetCounter(); c != nil {
				total += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				total += g.GetValue()
			}
		}
	}
	return total
}

// A store whose parent the view does not hold marks the replica's view as
// missing stores (ViewGaps) for index.GapHold; a store chained to a known
// parent does not, and the mark is per replica.
func TestViewGapsAfterUnknownParent(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	m := NewManager(index.New(index.Config{}), Config{Now: clk.Now}, nil, nil)
	if err := m.SetSources([]Source{{ID: "r", Model: "m", Endpoint: "tcp://127.0.0.1:1", BlockSize: 4},
		{ID: "q", Model: "m", Endpoint: "tcp://127.0.0.1:2", BlockSize: 4}}); err != nil {
		t.Fatal(err)
	}
	rep := m.lookup("r")
	w := &worker{m: m, ap: NewApplier(m.idx)}
	store := func(hash uint64, parent any, tok int) {
		ev := map[string]any{"type": "BlockStored", "block_hashes": []uint64{hash}, "parent_block_hash": parent,
			"token_ids": []int{tok, tok + 1, tok + 2, tok + 3}, "block_size": 4, "medium": "GPU"}
		w.handle(item{rep: rep, kind: itemBatch, epoch: rep.epoch.Load(), payload: enc(t, []any{ts, []any{ev}, 0})})
	}
	store(1, nil, 10)
	store(2, uint64(1), 20) // chained to a block the view holds
	if m.ViewGaps("r") {
		t.Fatal("gaps after stores chained to known parents")
	}
	store(4, uint64(3), 40) // block 3's store never arrived
	if !m.ViewGaps("r") || m.ViewGaps("q") || m.ViewGaps("unknown") {
		t.Fatalf("after an unknown parent: r %v q %v unknown %v, want r only", m.ViewGaps("r"), m.ViewGaps("q"), m.ViewGaps("unknown"))
	}
	clk.Add(index.GapHold - time.Second)
	if !m.ViewGaps("r") {
		t.Fatal("gap forgotten before index.GapHold")
	}
	clk.Add(time.Second)
	if m.ViewGaps("r") {
		t.Fatal("gap still reported index.GapHold after the last unknown parent")
	}
}
