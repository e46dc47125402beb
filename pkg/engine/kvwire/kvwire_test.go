package kvwire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/pkg/engine"
)

// The worked examples of the wire research note (§6): ts 1757500000.25,
// rank 0, H1/H2 from its hash vectors. The note's map-form BlockStored has
// a fixmap header (a generic encoder's); msgspec, which vLLM encodes with,
// writes map16 for BlockStored (16 fields with the tag), and so does
// kvwire (checked against vLLM's own encoder in TestVLLMHybridBytes).
const (
	ts = 1757500000.25
	h1 = 0x1e0b2e028ef071cb
	h2 = 0xefad121d154ab2d6
)

var stored = engine.Event{
	Kind: engine.BlockStored, Hashes: []uint64{h1, h2}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8},
	BlockSize: 4, Medium: "GPU", ExtraKeys: [][]string{nil, nil},
}

func TestGolden(t *testing.T) {
	cases := []struct {
		name   string
		format Format
		ev     engine.Event
		hex    string
	}{
		{"stored map", FormatMap, stored, "93cb41da30549810000091de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"},
		{"stored array", FormatArray, stored, "93cb41da305498100000919cab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c098010203040506070804c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec000"},
		{"removed map", FormatMap, engine.Event{Kind: engine.BlockRemoved, Hashes: []uint64{h2}, Medium: "GPU"}, "93cb41da3054981000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfefad121d154ab2d6a66d656469756da3475055a967726f75705f6964780000"},
		{"removed array", FormatArray, engine.Event{Kind: engine.BlockRemoved, Hashes: []uint64{h2}, Medium: "GPU"}, "93cb41da3054981000009194ac426c6f636b52656d6f76656491cfefad121d154ab2d6a34750550000"},
		{"cleared map", FormatMap, engine.Event{Kind: engine.AllBlocksCleared}, "93cb41da3054981000009181a474797065b0416c6c426c6f636b73436c656172656400"},
		{"cleared array", FormatArray, engine.Event{Kind: engine.AllBlocksCleared}, "93cb41da3054981000009191b0416c6c426c6f636b73436c656172656400"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := NewEncoder(Options{Format: c.format}).Encode(ts, []engine.Event{c.ev})
			if err != nil {
				t.Fatal(err)
			}
			if h := hex.EncodeToString(got); h != c.hex {
				t.Fatalf("got  %s\nwant %s", h, c.hex)
			}
		})
	}
}

func TestLoRASaltAndBytesHashes(t *testing.T) {
	ev := engine.Event{
		Kind: engine.BlockStored, Hashes: []uint64{h1}, Parent: h2, HasParent: true,
		Tokens: []uint32{1, 2, 3, 300}, BlockSize: 4, Medium: "GPU", LoRAID: 3, LoRAName: "my-lora",
		ExtraKeys: [][]string{{"my-lora", "salt-1"}},
	}
	got, err := NewEncoder(Options{Format: FormatMap, Hash: HashBytes, DPRank: 2}).Encode(ts, []engine.Event{ev})
	if err != nil {
		t.Fatal(err)
	}
	var batch []any
	if err := msgpack.Unmarshal(got, &batch); err != nil {
		t.Fatal(err)
	}
	if len(batch) != 3 || batch[2] != int8(2) {
		t.Fatalf("batch %v", batch)
	}
	m := batch[1].([]any)[0].(map[string]any)
	last8 := func(v any) uint64 {
		b := v.([]byte)
		if len(b) != 32 {
			t.Fatalf("hash is %d bytes", len(b))
		}
		return binary.BigEndian.Uint64(b[24:])
	}
	if last8(m["block_hashes"].([]any)[0]) != h1 || last8(m["parent_block_hash"]) != h2 {
		t.Errorf("bytes hashes do not end with the int form: %v", m)
	}
	if m["lora_name"] != "my-lora" || m["lora_id"] != int8(3) {
		t.Errorf("lora fields %v %v", m["lora_name"], m["lora_id"])
	}
	xk := m["extra_keys"].([]any)[0].([]any)
	if len(xk) != 2 || xk[0] != "my-lora" || xk[1] != "salt-1" {
		t.Errorf("extra_keys %v", xk)
	}
	// The token 300 takes the uint16 form (cd 01 2c).
	if !bytes.Contains(got, []byte{0x94, 1, 2, 3, 0xcd, 0x01, 0x2c}) {
		t.Errorf("token ids not minimal ints: %x", got)
	}
}

func TestParse(t *testing.T) {
	if f, err := ParseFormat("array"); err != nil || f != FormatArray {
		t.Error("array")
	}
	if _, err := ParseFormat("json"); err == nil {
		t.Error("json accepted")
	}
	if h, err := ParseHashMode("bytes"); err != nil || h != HashBytes {
		t.Error("bytes")
	}
	if _, err := ParseHashMode("hex"); err == nil {
		t.Error("hex accepted")
	}
	if _, err := NewEncoder(Options{}).Encode(ts, []engine.Event{{Kind: 99}}); err == nil {
		t.Error("unknown kind encoded")
	}
}

// A hybrid engine's groups: group_idx, kv_cache_spec_kind and, for the
// sliding-window group, kv_cache_spec_sliding_window, by name in the map
// form and in place (array elements 9, 10, 11) in the array form, as
// vLLM 0.33 labels its stores; BlockRemoved names its group.
func TestHybridGroupFields(t *testing.T) {
	sw := stored
	sw.Group, sw.SpecKind, sw.SlidingWindow = 1, engine.SpecSlidingWindow, 128
	rm := engine.Event{Kind: engine.BlockRemoved, Hashes: []uint64{h2}, Medium: "GPU", Group: 1}
	for _, f := range []Format{FormatMap, FormatArray} {
		got, err := NewEncoder(Options{Format: f}).Encode(ts, []engine.Event{stored, sw, rm})
		if err != nil {
			t.Fatal(err)
		}
		var batch []any
		if err := msgpack.Unmarshal(got, &batch); err != nil {
			t.Fatal(err)
		}
		evs := batch[1].([]any)
		type fields struct {
			group  any
			kind   any
			window any
			has    bool
		}
		read := func(v any, removed bool) fields {
			if f == FormatMap {
				m := v.(map[string]any)
				if removed {
					return fields{group: m["group_idx"]}
				}
				w, has := m["kv_cache_spec_sliding_window"]
				return fields{m["group_idx"], m["kv_cache_spec_kind"], w, has}
			}
			a := v.([]any)
			if removed {
				return fields{group: a[3]}
			}
			if len(a) != 12 {
				t.Fatalf("array BlockStored of %d elements, want 12", len(a))
			}
			return fields{a[9], a[10], a[11], true}
		}
		full, slid, gone := read(evs[0], false), read(evs[1], false), read(evs[2], true)
		num := func(v any) string { return fmt.Sprint(v) }
		if num(full.group) != "0" || full.kind != "full_attention" || full.window != nil || (f == FormatMap && full.has) {
			t.Errorf("format %d: full-attention store %+v (map form omits the nil window)", f, full)
		}
		if num(slid.group) != "1" || slid.kind != "sliding_window" || num(slid.window) != "128" {
			t.Errorf("format %d: sliding-window store %+v", f, slid)
		}
		if num(gone.group) != "1" {
			t.Errorf("format %d: removal group %v", f, gone.group)
		}
	}
}

// TestVLLMHybridBytes: the batch a vLLM 0.33 hybrid model publishes for a
// stored run in its full-attention and sliding-window groups and a
// sliding-window eviction, encoded by vLLM's own msgspec structs
// (testdata/vllm_hybrid.py), is byte for byte what kvwire encodes. Needs
// python3 with msgspec and vllm (pip install --no-deps vllm==0.33.0
// msgspec pyzmq). Without them it is skipped, unless
// KVROUTE_VLLM_WIRE=require (make test installs them and sets it, so
// there a missing dependency fails instead of skipping).
func TestVLLMHybridBytes(t *testing.T) {
	need := os.Getenv("KVROUTE_VLLM_WIRE") == "require"
	py, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(py, "-c", "import importlib.util as u, msgspec, sys; sys.exit(u.find_spec('vllm') is None)").Run()
	}
	if err != nil {
		if need {
			t.Fatalf("python3 with msgspec and vllm: %v", err)
		}
		t.Skip("python3 with msgspec and vllm not found (pip install --no-deps vllm==0.33.0 msgspec pyzmq)")
	}
	out, err := exec.Command(py, filepath.Join("testdata", "vllm_hybrid.py")).Output()
	if err != nil {
		t.Fatalf("vllm_hybrid.py: %v", err)
	}
	sw := stored
	sw.Group, sw.SpecKind, sw.SlidingWindow = engine.GroupSlidingWindow, engine.SpecSlidingWindow, 128
	rm := engine.Event{Kind: engine.BlockRemoved, Hashes: []uint64{h2}, Medium: "GPU", Group: engine.GroupSlidingWindow}
	got, err := NewEncoder(Options{Format: FormatMap}).Encode(ts, []engine.Event{stored, sw, rm})
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(out)); hex.EncodeToString(got) != want {
		t.Fatalf("kvwire %x\nvLLM   %s", got, want)
	}
}
