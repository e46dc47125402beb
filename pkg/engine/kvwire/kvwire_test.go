package kvwire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/pkg/engine"
)

// The worked examples of the wire research note (§6): ts 1757500000.25,
// rank 0, H1/H2 from its hash vectors.
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
		{"stored map", FormatMap, stored, "93cb41da305498100000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"},
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
