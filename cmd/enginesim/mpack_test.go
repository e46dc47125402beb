package main

import (
	"encoding/binary"
	"fmt"
	"math"
)

// mpDecode is a small msgpack decoder for tests, independent of the encoder
// under test: it returns nil, bool, uint64, int64, float64, string, []byte,
// []any or mapEntries (keys in wire order).
func mpDecode(b []byte) (any, error) {
	v, rest, err := mpValue(b)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(rest))
	}
	return v, nil
}

type mapEntry struct {
	key string
	val any
}

type mapEntries []mapEntry

func (m mapEntries) get(k string) (any, bool) {
	for _, e := range m {
		if e.key == k {
			return e.val, true
		}
	}
	return nil, false
}

func mpValue(b []byte) (any, []byte, error) {
	if len(b) == 0 {
		return nil, nil, fmt.Errorf("truncated")
	}
	need := func(n int) error {
		if len(b) < 1+n {
			return fmt.Errorf("truncated at %#x", b[0])
		}
		return nil
	}
	c := b[0]
	switch {
	case c <= 0x7f:
		return uint64(c), b[1:], nil
	case c >= 0xe0:
		return int64(int8(c)), b[1:], nil
	case c&0xf0 == 0x90:
		return mpArray(b[1:], int(c&0x0f))
	case c&0xf0 == 0x80:
		return mpMap(b[1:], int(c&0x0f))
	case c&0xe0 == 0xa0:
		return mpStr(b[1:], int(c&0x1f))
	}
	switch c {
	case 0xc0:
		return nil, b[1:], nil
	case 0xc2, 0xc3:
		return c == 0xc3, b[1:], nil
	case 0xcc:
		if err := need(1); err != nil {
			return nil, nil, err
		}
		return uint64(b[1]), b[2:], nil
	case 0xcd:
		if err := need(2); err != nil {
			return nil, nil, err
		}
		return uint64(binary.BigEndian.Uint16(b[1:])), b[3:], nil
	case 0xce:
		if err := need(4); err != nil {
			return nil, nil, err
		}
		return uint64(binary.BigEndian.Uint32(b[1:])), b[5:], nil
	case 0xcf:
		if err := need(8); err != nil {
			return nil, nil, err
		}
		return binary.BigEndian.Uint64(b[1:]), b[9:], nil
	case 0xcb:
		if err := need(8); err != nil {
			return nil, nil, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(b[1:])), b[9:], nil
	case 0xd9:
		if err := need(1); err != nil {
			return nil, nil, err
		}
		return mpStr(b[2:], int(b[1]))
	case 0xc4:
		if err := need(1); err != nil {
			return nil, nil, err
		}
		n := int(b[1])
		if len(b) < 2+n {
			return nil, nil, fmt.Errorf("truncated bin")
		}
		return append([]byte(nil), b[2:2+n]...), b[2+n:], nil
	case 0xdc:
		if err := need(2); err != nil {
			return nil, nil, err
		}
		return mpArray(b[3:], int(binary.BigEndian.Uint16(b[1:])))
	case 0xdd:
		if err := need(4); err != nil {
			return nil, nil, err
		}
		return mpArray(b[5:], int(binary.BigEndian.Uint32(b[1:])))
	case 0xde:
		if err := need(2); err != nil {
			return nil, nil, err
		}
		return mpMap(b[3:], int(binary.BigEndian.Uint16(b[1:])))
	}
	return nil, nil, fmt.Errorf("unsupported msgpack code %#x", c)
}

func mpStr(b []byte, n int) (any, []byte, error) {
	if len(b) < n {
		return nil, nil, fmt.Errorf("truncated str")
	}
	return string(b[:n]), b[n:], nil
}

func mpArray(b []byte, n int) (any, []byte, error) {
	out := make([]any, 0, n)
	for range n {
		v, rest, err := mpValue(b)
		if err != nil {
			return nil, nil, err
		}
		out, b = append(out, v), rest
	}
	return out, b, nil
}

func mpMap(b []byte, n int) (any, []byte, error) {
	out := make(mapEntries, 0, n)
	for range n {
		k, rest, err := mpValue(b)
		if err != nil {
			return nil, nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, nil, fmt.Errorf("non-string key %v", k)
		}
		v, rest2, err := mpValue(rest)
		if err != nil {
			return nil, nil, err
		}
		out, b = append(out, mapEntry{ks, v}), rest2
	}
	return out, b, nil
}

// wireEvent is a decoded event in either encoding.
type wireEvent struct {
	kind      string
	hashes    []uint64
	parent    any
	tokens    []uint64
	blockSize uint64
	medium    any
	loraName  any
	extraKeys any
	keys      []string // map form: key order
}

func asU64(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case int64:
		return uint64(x)
	case []byte:
		if len(x) >= 8 {
			return binary.BigEndian.Uint64(x[len(x)-8:])
		}
	}
	return 0
}

func u64s(v any) []uint64 {
	a, _ := v.([]any)
	out := make([]uint64, len(a))
	for i, x := range a {
		out[i] = asU64(x)
	}
	return out
}

// decodeBatch decodes a payload into its timestamp, events and rank.
func decodeBatch(payload []byte) (float64, []wireEvent, any, error) {
	v, err := mpDecode(payload)
	if err != nil {
		return 0, nil, nil, err
	}
	top, ok := v.([]any)
	if !ok || len(top) != 3 {
		return 0, nil, nil, fmt.Errorf("batch is not a 3-array: %v", v)
	}
	ts, ok := top[0].(float64)
	if !ok {
		return 0, nil, nil, fmt.Errorf("ts is %T", top[0])
	}
	raw, _ := top[1].([]any)
	var evs []wireEvent
	for _, r := range raw {
		var ev wireEvent
		switch x := r.(type) {
		case mapEntries:
			for _, e := range x {
				ev.keys = append(ev.keys, e.key)
			}
			get := func(k string) any { v, _ := x.get(k); return v }
			ev.kind, _ = get("type").(string)
			ev.hashes = u64s(get("block_hashes"))
			ev.parent = get("parent_block_hash")
			ev.tokens = u64s(get("token_ids"))
			ev.blockSize = asU64(get("block_size"))
			ev.medium = get("medium")
			ev.loraName = get("lora_name")
			ev.extraKeys = get("extra_keys")
		case []any:
			ev.kind, _ = x[0].(string)
			switch ev.kind {
			case "BlockStored":
				if len(x) != 12 {
					return 0, nil, nil, fmt.Errorf("array BlockStored has %d elements", len(x))
				}
				ev.hashes, ev.parent, ev.tokens = u64s(x[1]), x[2], u64s(x[3])
				ev.blockSize, ev.medium, ev.loraName, ev.extraKeys = asU64(x[4]), x[6], x[7], x[8]
			case "BlockRemoved":
				ev.hashes, ev.medium = u64s(x[1]), x[2]
			}
		default:
			return 0, nil, nil, fmt.Errorf("event is %T", r)
		}
		evs = append(evs, ev)
	}
	return ts, evs, top[2], nil
}
