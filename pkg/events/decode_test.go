package events

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

const (
	h1 = uint64(0x1e0b2e028ef071cb)
	h2 = uint64(0xefad121d154ab2d6)
	ts = 1757500000.25
)

func readHex(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

var cmpEvents = cmpopts.EquateEmpty()

// The worked examples of the wire spec, byte for byte.
func TestDecodeGolden(t *testing.T) {
	stored := Event{
		Type: EventBlockStored, Hashes: []uint64{h1, h2}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8},
		BlockSize: 4, Medium: "GPU", GroupIdx: 0, SpecKind: "full_attention",
	}
	removed := Event{Type: EventBlockRemoved, Hashes: []uint64{h2}, Medium: "GPU", GroupIdx: 0}
	removed090 := Event{Type: EventBlockRemoved, Hashes: []uint64{h2}, GroupIdx: -1}
	cleared := Event{Type: EventAllBlocksCleared, GroupIdx: -1}
	tests := []struct {
		file string
		size int
		rank int
		want Event
	}{
		{"stored_map.hex", 202, 0, stored},
		{"stored_array.hex", 81, 0, stored},
		{"removed_map.hex", 76, 0, removed},
		{"removed_array.hex", 41, 0, removed},
		{"removed_v090.hex", 35, -1, removed090},
		{"cleared_map.hex", 35, 0, cleared},
		{"cleared_array.hex", 30, 0, cleared},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			p := readHex(t, tc.file)
			if len(p) != tc.size {
				t.Fatalf("golden is %d bytes, spec says %d", len(p), tc.size)
			}
			b, err := DecodeBatch(p, HashVLLM)
			if err != nil {
				t.Fatal(err)
			}
			if b.TS != ts || b.DPRank != tc.rank || b.Unknown != 0 || b.Invalid != 0 || b.UnknownKeys != 0 {
				t.Errorf("batch header: ts=%v rank=%d unknown=%d invalid=%d keys=%d", b.TS, b.DPRank, b.Unknown, b.Invalid, b.UnknownKeys)
			}
			if len(b.Events) != 1 {
				t.Fatalf("%d events", len(b.Events))
			}
			if d := cmp.Diff(tc.want, b.Events[0], cmpEvents); d != "" {
				t.Errorf("event (-want +got):\n%s", d)
			}
			// Every strict prefix is an error, never a panic or a partial batch.
			for n := range len(p) {
				if _, err := DecodeBatch(p[:n], HashVLLM); err == nil {
					t.Fatalf("prefix of %d bytes decoded without error", n)
				}
			}
		})
	}
}

// enc encodes v with a generic msgpack encoder the way msgspec would for
// these shapes (minimal integers, float64).
func enc(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	e.UseCompactFloats(false)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// storedMap builds a map-form BlockStored event with the given hash values.
func storedMap(hashes []any, parent any) map[string]any {
	return map[string]any{
		"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
		"token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": nil,
	}
}

func TestDecodeHashForms(t *testing.T) {
	digest := func(tail uint64) []byte {
		d := bytes.Repeat([]byte{0xab}, 32)
		for i := range 8 {
			d[31-i] = byte(tail >> (8 * i))
		}
		return d
	}
	neg := int64(-2)
	tests := []struct {
		name   string
		mode   HashMode
		hashes []any
		parent any
		want   []uint64
		wantP  uint64
	}{
		{"uint64", HashVLLM, []any{h1, h2}, nil, []uint64{h1, h2}, 0},
		{"int64 negative", HashVLLM, []any{neg, int64(5)}, neg, []uint64{uint64(neg), 5}, uint64(neg)},
		{"bin 32 bytes vllm", HashVLLM, []any{digest(h1), digest(h2)}, digest(h2), []uint64{h1, h2}, h2},
		{"bin short", HashVLLM, []any{[]byte{0x01, 0x02}, []byte{}}, nil, []uint64{0x0102, 0}, 0},
		{"bin 32 bytes sglang", HashSGLang, []any{digest(h1)}, nil, []uint64{0xabababababababab}, 0},
		{"sglang int64", HashSGLang, []any{int64(-1)}, nil, []uint64{^uint64(0)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := enc(t, []any{ts, []any{storedMap(tc.hashes, tc.parent)}, 0})
			b, err := DecodeBatch(p, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 1 {
				t.Fatalf("events: %d (invalid %d)", len(b.Events), b.Invalid)
			}
			ev := b.Events[0]
			if d := cmp.Diff(tc.want, ev.Hashes); d != "" {
				t.Errorf("hashes (-want +got):\n%s", d)
			}
			if ev.HasParent != (tc.parent != nil) || ev.Parent != tc.wantP {
				t.Errorf("parent = %v %#x, want %v %#x", ev.HasParent, ev.Parent, tc.parent != nil, tc.wantP)
			}
		})
	}
	// Bytes-mode and int-mode vLLM streams agree.
	a, _ := DecodeBatch(enc(t, []any{ts, []any{storedMap([]any{digest(h1)}, nil)}, 0}), HashVLLM)
	b, _ := DecodeBatch(enc(t, []any{ts, []any{storedMap([]any{h1}, nil)}, 0}), HashVLLM)
	if a.Events[0].Hashes[0] != b.Events[0].Hashes[0] {
		t.Error("bytes and int hashes differ")
	}
}

func TestDecodeTolerance(t *testing.T) {
	tests := []struct {
		name        string
		v           any
		events      int
		unknown     int
		invalid     int
		unknownKeys int
		check       func(t *testing.T, b Batch)
	}{
		{
			name: "map batch", v: map[string]any{"ts": ts, "events": []any{[]any{"AllBlocksCleared"}}, "data_parallel_rank": 3},
			events: 1, check: func(t *testing.T, b Batch) {
				if b.DPRank != 3 || b.TS != ts {
					t.Errorf("rank %d ts %v", b.DPRank, b.TS)
				}
			},
		},
		{name: "string ts", v: []any{"later", []any{[]any{"AllBlocksCleared"}}, 0}, events: 1, check: func(t *testing.T, b Batch) {
			if b.TS != 0 {
				t.Errorf("ts %v", b.TS)
			}
		}},
		{name: "integer ts", v: []any{1757500000, []any{}, 0}, check: func(t *testing.T, b Batch) {
			if b.TS != 1757500000 {
				t.Errorf("ts %v", b.TS)
			}
		}},
		{name: "nil rank", v: []any{ts, []any{}, nil}, check: func(t *testing.T, b Batch) {
			if b.DPRank != -1 {
				t.Errorf("rank %d", b.DPRank)
			}
		}},
		{name: "extra batch elements", v: []any{ts, []any{[]any{"AllBlocksCleared"}}, 0, "future", []int{1}}, events: 1},
		{name: "unknown event type", v: []any{ts, []any{[]any{"BlockMoved", 1, 2}, map[string]any{"type": "Other", "x": []int{1}}, []any{"AllBlocksCleared"}}, 0}, events: 1, unknown: 2, unknownKeys: 1},
		{name: "unknown keys", v: []any{ts, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{h1}, "medium": "CPU", "future_field": map[string]any{"a": []int{1, 2}}}}, 0}, events: 1, unknownKeys: 1, check: func(t *testing.T, b Batch) {
			if b.Events[0].Medium != "CPU" || b.Events[0].Hashes[0] != h1 {
				t.Errorf("%+v", b.Events[0])
			}
		}},
		{name: "short array event", v: []any{ts, []any{[]any{"BlockStored", []uint64{h1}, nil, []int{1, 2, 3, 4}, 4}}, 0}, events: 1, check: func(t *testing.T, b Batch) {
			ev := b.Events[0]
			if ev.BlockSize != 4 || len(ev.Tokens) != 4 || ev.Medium != "" || ev.GroupIdx != -1 {
				t.Errorf("%+v", ev)
			}
		}},
		{name: "long array event", v: []any{ts, []any{[]any{"BlockRemoved", []uint64{h1}, "GPU", 0, "LOCAL", "owner", "more"}}, 0}, events: 1},
		{name: "negative token", v: []any{ts, []any{[]any{"BlockStored", []any{h1}, nil, []any{1, -2, 3, 4}, 4}, []any{"AllBlocksCleared"}}, 0}, events: 1, invalid: 1},
		{name: "string token", v: []any{ts, []any{[]any{"BlockStored", []any{h1}, nil, []any{1, "x", 3, 4}, 4}}, 0}, invalid: 1},
		{name: "token over uint32", v: []any{ts, []any{[]any{"BlockStored", []any{h1}, nil, []any{1, uint64(1) << 33, 3, 4}, 4}}, 0}, invalid: 1},
		{name: "event not a container", v: []any{ts, []any{"BlockStored", 7, []any{"AllBlocksCleared"}}, 0}, events: 1, invalid: 2},
		{name: "non-string tag", v: []any{ts, []any{[]any{5, 1}}, 0}, invalid: 1},
		{name: "sglang metadata map", v: []any{ts, []any{[]any{"BlockStored", []any{h1}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", map[string]any{"cache_salt": "s1"}}}, 0}, events: 1, check: func(t *testing.T, b Batch) {
			if b.Events[0].CacheSalt != "s1" {
				t.Errorf("salt %q", b.Events[0].CacheSalt)
			}
		}},
		{name: "extra keys", v: []any{ts, []any{map[string]any{
			"type": "BlockStored", "block_hashes": []any{h1, h2}, "parent_block_hash": nil, "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8},
			"block_size": 4, "lora_name": "my-lora",
			"extra_keys": []any{[]any{"my-lora", []any{"img0", -3}, "salt-1", []byte{9, 9}}, nil},
		}}, 0}, events: 1, check: func(t *testing.T, b Batch) {
			want := [][]ExtraKey{{{Kind: ExtraString, Str: "my-lora"}, {Kind: ExtraMM, Str: "img0", Int: -3}, {Kind: ExtraString, Str: "salt-1"}, {Kind: ExtraBin, Bytes: []byte{9, 9}}}, nil}
			if d := cmp.Diff(want, b.Events[0].ExtraKeys); d != "" {
				t.Errorf("extra keys (-want +got):\n%s", d)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := DecodeBatch(enc(t, tc.v), HashVLLM)
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != tc.events || b.Unknown != tc.unknown || b.Invalid != tc.invalid || b.UnknownKeys != tc.unknownKeys {
				t.Errorf("events %d unknown %d invalid %d keys %d, want %d %d %d %d",
					len(b.Events), b.Unknown, b.Invalid, b.UnknownKeys, tc.events, tc.unknown, tc.invalid, tc.unknownKeys)
			}
			if tc.check != nil && len(b.Events) == tc.events {
				tc.check(t, b)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		p       []byte
		reason  string
		fromHex bool
	}{
		{name: "empty", p: nil, reason: "truncated"},
		{name: "scalar", p: []byte{0x07}, reason: "not_batch"},
		{name: "one element", p: []byte{0x91, 0x01}, reason: "not_batch"},
		{name: "events not array", p: []byte{0x92, 0x01, 0x02}, reason: "not_batch"},
		{name: "huge array claim", p: []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01}, reason: "too_long"},
		{name: "huge events claim", p: []byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff}, reason: "too_long"},
		{name: "huge tokens claim", p: []byte{0x92, 0x01, 0x91, 0x94, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0xdd, 0x7f, 0xff, 0xff, 0xff}, reason: "too_long"},
		{name: "huge map claim", p: []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, reason: "too_long"},
		{name: "huge string claim", p: []byte{0x92, 0x01, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}, reason: "too_long"},
		{name: "reserved code", p: []byte{0x92, 0x01, 0x91, 0xc1}, reason: "bad_value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeBatch(tc.p, HashVLLM)
			if err == nil {
				t.Fatal("no error")
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a DecodeError", err)
			}
			if got := ErrorReason(err); got != tc.reason {
				t.Errorf("reason %q, want %q (%v)", got, tc.reason, err)
			}
		})
	}
}

// Deep nesting is skipped iteratively: no recursion, no stack growth.
func TestDecodeDeepNesting(t *testing.T) {
	p := []byte{0x92, 0x01, 0x91, 0x92, 0xa1, 'X'}
	p = append(p, bytes.Repeat([]byte{0x91}, 1<<20)...)
	p = append(p, 0xc0)
	b, err := DecodeBatch(p, HashVLLM)
	if err != nil {
		t.Fatal(err)
	}
	if b.Unknown != 1 {
		t.Errorf("unknown %d", b.Unknown)
	}
}

// Huge claimed lengths allocate nothing proportional to the claim.
func TestDecodeClaimsDoNotAllocate(t *testing.T) {
	claims := [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff},
		{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff},
		{0x92, 0x01, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0xdd, 0xff, 0xff, 0xff, 0xf0},
		{0x92, 0x01, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xaa, 'e', 'x', 't', 'r', 'a', '_', 'k', 'e', 'y', 's', 0xdd, 0xff, 0xff, 0xff, 0xf0},
	}
	var d Decoder
	var b Batch
	for i, p := range claims {
		allocs := testing.AllocsPerRun(50, func() {
			if err := d.Decode(p, HashVLLM, &b); err == nil {
				t.Fatalf("claim %d decoded", i)
			}
		})
		// A few small error values, never a claim-sized buffer.
		if allocs > 8 {
			t.Errorf("claim %d: %.0f allocations", i, allocs)
		}
	}
}

// The decoder reuses a Batch without leaking state from a previous batch.
func TestDecoderReuse(t *testing.T) {
	var d Decoder
	var b Batch
	if err := d.Decode(readHex(t, "stored_map.hex"), HashVLLM, &b); err != nil {
		t.Fatal(err)
	}
	if err := d.Decode(readHex(t, "removed_v090.hex"), HashVLLM, &b); err != nil {
		t.Fatal(err)
	}
	want := Event{Type: EventBlockRemoved, Hashes: []uint64{h2}, GroupIdx: -1}
	if d := cmp.Diff(want, b.Events[0], cmpEvents); d != "" || b.DPRank != -1 {
		t.Errorf("reused batch (-want +got):\n%s rank %d", d, b.DPRank)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, name := range []string{"stored_map.hex", "stored_array.hex", "removed_map.hex", "removed_array.hex", "removed_v090.hex", "cleared_map.hex", "cleared_array.hex"} {
		f.Add(readHex(f, name))
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	// Frames vLLM 0.33's own structs produced (every field).
	raw, err := os.ReadFile(vllmWireGolden)
	if err != nil {
		f.Fatal(err)
	}
	var w vllmWire
	if err := json.Unmarshal(raw, &w); err != nil {
		f.Fatal(err)
	}
	for _, c := range w.Cases {
		p, err := hex.DecodeString(c.Hex)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var d Decoder
		var b Batch
		err := d.Decode(p, HashVLLM, &b)
		if err != nil && ErrorReason(err) == "other" {
			t.Fatalf("unclassified error: %v", err)
		}
		// Allocated sizes are bounded by the payload: nothing was sized
		// on a claim alone (each element takes at least one byte).
		total := cap(b.Events)
		for _, ev := range b.Events[:cap(b.Events)] {
			total += cap(ev.Hashes) + cap(ev.Tokens) + cap(ev.ExtraKeys)
			for _, ks := range ev.ExtraKeys {
				total += cap(ks)
			}
			total += cap(ev.Lookahead)
			for _, la := range ev.Lookahead {
				total += cap(la)
			}
		}
		if total > 2*len(p)+1 {
			t.Fatalf("%d elements allocated for %d bytes", total, len(p))
		}
		_ = d.Decode(p, HashSGLang, &b)
	})
}

// vLLM 0.33's fields, in map and positional form, and their malformed
// variants (the event is dropped and counted, the batch still decodes).
func TestDecodeVLLM033Fields(t *testing.T) {
	want := Event{
		Type: EventBlockStored, Hashes: []uint64{h1}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "CPU",
		LoRAName: "a", GroupIdx: 3, SpecKind: "sink_full_attention", SlidingWindow: 512, Locality: "REMOTE",
		Ownership: "kvcr", SessionID: "s-9", Lookahead: [][]uint32{{5, 6, 300}},
	}
	m := map[string]any{
		"type": "BlockStored", "block_hashes": []uint64{h1}, "parent_block_hash": nil, "token_ids": []int{1, 2, 3, 4},
		"block_size": 4, "lora_id": 7, "medium": "CPU", "lora_name": "a", "group_idx": 3,
		"kv_cache_spec_kind": "sink_full_attention", "kv_cache_spec_sliding_window": 512, "locality": "REMOTE",
		"ownership": "kvcr", "session_id": "s-9", "lookahead_token_ids": [][]int{{5, 6, 300}},
	}
	arr := []any{"BlockStored", []uint64{h1}, nil, []int{1, 2, 3, 4}, 4, 7, "CPU", "a", nil, 3, "sink_full_attention",
		512, "REMOTE", "kvcr", "s-9", [][]int{{5, 6, 300}}, "a later field"}
	for name, ev := range map[string]any{"map": m, "array": arr} {
		b, err := DecodeBatch(enc(t, []any{ts, []any{ev}, 0}), HashVLLM)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(b.Events) != 1 || b.Invalid != 0 || b.UnknownKeys != 0 {
			t.Fatalf("%s: %+v", name, b)
		}
		if d := cmp.Diff(want, b.Events[0], cmpEvents); d != "" {
			t.Errorf("%s (-want +got):\n%s", name, d)
		}
	}
	rm := map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{h2}, "medium": "CPU", "group_idx": 1, "locality": "LOCAL", "ownership": "o"}
	b, err := DecodeBatch(enc(t, []any{ts, []any{rm, []any{"BlockRemoved", []uint64{h2}, "CPU", 1, "LOCAL", "o"}}, 0}), HashVLLM)
	if err != nil {
		t.Fatal(err)
	}
	wantRm := Event{Type: EventBlockRemoved, Hashes: []uint64{h2}, Medium: "CPU", GroupIdx: 1, Locality: "LOCAL", Ownership: "o"}
	if d := cmp.Diff([]Event{wantRm, wantRm}, b.Events, cmpEvents); d != "" {
		t.Errorf("removed (-want +got):\n%s", d)
	}
	// Nil optional fields are "absent".
	nils := map[string]any{"type": "BlockStored", "block_hashes": []uint64{h1}, "parent_block_hash": nil, "token_ids": []int{1, 2, 3, 4},
		"block_size": 4, "kv_cache_spec_sliding_window": nil, "locality": nil, "ownership": nil, "session_id": nil, "lookahead_token_ids": nil}
	b, err = DecodeBatch(enc(t, []any{ts, []any{nils}, 0}), HashVLLM)
	if err != nil || b.Invalid != 0 || b.Events[0].Lookahead != nil || b.Events[0].SlidingWindow != 0 || b.Events[0].Locality != "" {
		t.Fatalf("nil fields: %v %+v", err, b)
	}
	for name, bad := range map[string]any{
		"window negative":         -1,
		"window string":           "x",
		"locality int":            map[string]any{"locality": 5},
		"lookahead not a list":    map[string]any{"lookahead_token_ids": 5},
		"lookahead entry nil":     map[string]any{"lookahead_token_ids": []any{nil}},
		"lookahead negative tok":  map[string]any{"lookahead_token_ids": [][]int{{-1}}},
		"lookahead entry a map":   map[string]any{"lookahead_token_ids": []any{map[string]int{"a": 1}}},
		"session id list":         map[string]any{"session_id": []int{1}},
		"ownership bytes-ish map": map[string]any{"ownership": map[string]int{}},
	} {
		ev := map[string]any{"type": "BlockStored", "block_hashes": []uint64{h1}, "parent_block_hash": nil, "token_ids": []int{1, 2, 3, 4}, "block_size": 4}
		if f, ok := bad.(map[string]any); ok {
			for k, v := range f {
				ev[k] = v
			}
		} else {
			ev["kv_cache_spec_sliding_window"] = bad
		}
		p := enc(t, []any{ts, []any{ev, map[string]any{"type": "AllBlocksCleared"}}, 0})
		b, err := DecodeBatch(p, HashVLLM)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b.Invalid != 1 || len(b.Events) != 1 || b.Events[0].Type != EventAllBlocksCleared {
			t.Errorf("%s: invalid %d, events %+v", name, b.Invalid, b.Events)
		}
		for n := range len(p) {
			if _, err := DecodeBatch(p[:n], HashVLLM); err == nil {
				t.Fatalf("%s: prefix of %d bytes decoded", name, n)
			}
		}
	}
}
