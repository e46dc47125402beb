package kvwire

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/engine"
)

// Format selects the event encoding.
type Format uint8

// The formats.
const (
	FormatMap   Format = iota // current vLLM: tagged maps
	FormatArray               // vLLM before mid-2026: tagged arrays
)

// ParseFormat parses "map" or "array".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "map":
		return FormatMap, nil
	case "array":
		return FormatArray, nil
	}
	return 0, fmt.Errorf("kvwire: unknown format %q (want map or array)", s)
}

// HashMode selects how block hashes are written.
type HashMode uint8

// The hash modes.
const (
	HashInt   HashMode = iota // uint64 (vLLM's default)
	HashBytes                 // 32-byte bin whose last 8 bytes are the int
)

// ParseHashMode parses "int" or "bytes".
func ParseHashMode(s string) (HashMode, error) {
	switch s {
	case "int":
		return HashInt, nil
	case "bytes":
		return HashBytes, nil
	}
	return 0, fmt.Errorf("kvwire: unknown hash mode %q (want int or bytes)", s)
}

// Options configure an Encoder.
type Options struct {
	Format Format
	Hash   HashMode
	// DPRank is the batch's data_parallel_rank.
	DPRank int
}

// Hash32 returns the 32-byte form of a block hash: a deterministic
// 24-byte expansion followed by the hash in big-endian order, so that a
// consumer taking the last 8 bytes recovers the int form.
func Hash32(h uint64) [32]byte {
	var out [32]byte
	var in [8]byte
	binary.BigEndian.PutUint64(in[:], h)
	hi := xxh3.Hash128(in[:]).Bytes()
	copy(out[:16], hi[:])
	binary.BigEndian.PutUint64(out[16:24], xxh3.HashSeed(in[:], 0x5eed))
	copy(out[24:], in[:])
	return out
}

// Encoder encodes batches. It is not safe for concurrent use.
type Encoder struct {
	o   Options
	buf bytes.Buffer
	enc *msgpack.Encoder
}

// NewEncoder returns an encoder for o.
func NewEncoder(o Options) *Encoder {
	e := &Encoder{o: o}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// Encode returns the msgpack payload of one batch stamped ts (seconds since
// the Unix epoch). The returned slice is freshly allocated.
func (e *Encoder) Encode(ts float64, events []engine.Event) ([]byte, error) {
	e.buf.Reset()
	m := e.enc
	err := m.EncodeArrayLen(3)
	try := func(e2 error) {
		if err == nil {
			err = e2
		}
	}
	try(m.EncodeFloat64(ts))
	try(m.EncodeArrayLen(len(events)))
	for i := range events {
		try(e.event(&events[i]))
	}
	try(m.EncodeInt(int64(e.o.DPRank)))
	if err != nil {
		return nil, fmt.Errorf("kvwire: encode: %w", err)
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

func (e *Encoder) hash(h uint64) error {
	if e.o.Hash == HashBytes {
		b := Hash32(h)
		return e.enc.EncodeBytes(b[:])
	}
	return e.enc.EncodeUint(h)
}

func (e *Encoder) event(ev *engine.Event) error {
	m := e.enc
	mapped := e.o.Format == FormatMap
	var err error
	try := func(e2 error) {
		if err == nil {
			err = e2
		}
	}
	key := func(k string) {
		if mapped {
			try(m.EncodeString(k))
		}
	}
	head := func(mapLen, arrayLen int) {
		if mapped {
			if ev.Kind == engine.BlockStored {
				// msgspec sizes a struct's map header by its field
				// count: vLLM 0.33's BlockStored has 16 with the tag,
				// so it always writes map16, even for fewer entries.
				e.buf.Write([]byte{0xde, 0, byte(mapLen)})
			} else {
				try(m.EncodeMapLen(mapLen))
			}
			try(m.EncodeString("type"))
		} else {
			try(m.EncodeArrayLen(arrayLen))
		}
		try(m.EncodeString(ev.Kind.String()))
	}
	hashes := func() {
		key("block_hashes")
		try(m.EncodeArrayLen(len(ev.Hashes)))
		for _, h := range ev.Hashes {
			try(e.hash(h))
		}
	}
	optStr := func(s string) {
		if s == "" {
			try(m.EncodeNil())
		} else {
			try(m.EncodeString(s))
		}
	}
	switch ev.Kind {
	case engine.BlockStored:
		if mapped && ev.SlidingWindow > 0 {
			head(12, 12)
		} else {
			head(11, 12)
		}
		hashes()
		key("parent_block_hash")
		if ev.HasParent {
			try(e.hash(ev.Parent))
		} else {
			try(m.EncodeNil())
		}
		key("token_ids")
		try(m.EncodeArrayLen(len(ev.Tokens)))
		for _, t := range ev.Tokens {
			try(m.EncodeUint(uint64(t)))
		}
		key("block_size")
		try(m.EncodeInt(int64(ev.BlockSize)))
		key("lora_id")
		if ev.LoRAName != "" {
			try(m.EncodeInt(int64(ev.LoRAID)))
		} else {
			try(m.EncodeNil())
		}
		key("medium")
		optStr(ev.Medium)
		key("lora_name")
		optStr(ev.LoRAName)
		key("extra_keys")
		try(m.EncodeArrayLen(len(ev.ExtraKeys)))
		for _, x := range ev.ExtraKeys {
			if x == nil {
				try(m.EncodeNil())
				continue
			}
			try(m.EncodeArrayLen(len(x)))
			for _, s := range x {
				try(m.EncodeString(s))
			}
		}
		key("group_idx")
		try(m.EncodeInt(int64(ev.Group)))
		key("kv_cache_spec_kind")
		kind := ev.SpecKind
		if kind == "" {
			kind = engine.SpecFullAttention
		}
		try(m.EncodeString(kind))
		switch {
		case ev.SlidingWindow > 0:
			key("kv_cache_spec_sliding_window")
			try(m.EncodeInt(int64(ev.SlidingWindow)))
		case !mapped:
			try(m.EncodeNil()) // kv_cache_spec_sliding_window
		}
	case engine.BlockRemoved:
		head(4, 4)
		hashes()
		key("medium")
		optStr(ev.Medium)
		key("group_idx")
		try(m.EncodeInt(int64(ev.Group)))
	case engine.AllBlocksCleared:
		head(1, 1)
	default:
		return fmt.Errorf("kvwire: unknown event kind %d", ev.Kind)
	}
	return err
}
