package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// HashMode says how an engine's block hash becomes the uint64 the index
// stores. Integers are taken as they are (a negative int64 keeps its two's
// complement bits); byte strings are cut to 8 bytes, read big-endian and
// left-padded with zeros when shorter.
type HashMode uint8

const (
	// HashVLLM takes the last 8 bytes of a byte-string hash, as vLLM does
	// when it turns a digest into an integer (int.from_bytes & (2^64-1)),
	// so that int-mode and bytes-mode streams agree.
	HashVLLM HashMode = iota
	// HashSGLang takes the first 8 bytes (SGLang's hash_str_to_int64).
	HashSGLang
)

// ParseEngine maps a Source.Engine name to its hash mode. The empty name is
// vLLM.
func ParseEngine(engine string) (HashMode, error) {
	switch engine {
	case "", "vllm":
		return HashVLLM, nil
	case "sglang":
		return HashSGLang, nil
	}
	return 0, fmt.Errorf("events: unknown engine %q (want vllm or sglang)", engine)
}

// EventType is the kind of one KV-cache event.
type EventType uint8

// The event types. Unknown tags are skipped and counted in Batch.Unknown.
const (
	EventBlockStored EventType = iota + 1
	EventBlockRemoved
	EventAllBlocksCleared
)

func (t EventType) String() string {
	switch t {
	case EventBlockStored:
		return "BlockStored"
	case EventBlockRemoved:
		return "BlockRemoved"
	case EventAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// ExtraKind says what one element of a block's extra-key tuple is.
type ExtraKind uint8

// The extra-key element kinds.
const (
	ExtraString ExtraKind = iota + 1 // a bare string: LoRA name, cache salt or bare MM identifier
	ExtraMM                          // a (identifier, offset) pair: multimodal item
	ExtraBin                         // a byte string: prompt-embeds hash
	ExtraInt                         // an integer
	ExtraOther                       // anything else, kept as its raw msgpack bytes
)

// ExtraKey is one element of a block's extra-key tuple.
type ExtraKey struct {
	Kind  ExtraKind
	Str   string // ExtraString, ExtraMM identifier
	Int   int64  // ExtraMM offset, ExtraInt
	Bytes []byte // ExtraBin, ExtraOther (raw msgpack)
}

// Event is one decoded KV-cache event. Fields that an event type does not
// carry are zero.
type Event struct {
	Type EventType
	// Hashes are the engine's block hashes, normalised by the HashMode.
	Hashes []uint64
	// HasParent reports whether Parent is set. A nil parent, and an
	// integer parent of 0 (what some simulators send at the root), mean
	// "starts at block 0".
	HasParent bool
	Parent    uint64
	Tokens    []uint32
	BlockSize int
	LoRAName  string
	// Medium is the engine's medium string; empty when absent or nil.
	Medium string
	// ExtraKeys has one entry per block when some block of the event
	// carries extra keys (an entry is nil for a block without); it is nil
	// when extra_keys is absent, nil, or has no extras for any block.
	ExtraKeys [][]ExtraKey
	// CacheSalt is an explicit salt (SGLang's cache_salt field or metadata
	// map); vLLM carries the salt inside ExtraKeys instead.
	CacheSalt string
	// GroupIdx is the KV-cache group, -1 when absent.
	GroupIdx int
	// SpecKind is kv_cache_spec_kind ("full_attention", ...), empty when absent.
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window in tokens, 0 when absent.
	SlidingWindow int
	// Locality is "LOCAL" or "REMOTE" (relative to the publisher; offload
	// tiers set it), empty when absent.
	Locality string
	// Ownership names the secondary offloading tier that produced the
	// event (e.g. "kvcr"), empty when absent.
	Ownership string
	// SessionID is the session of the request that triggered the store,
	// empty when absent. Informational: the router has its own session key.
	SessionID string
	// Lookahead holds, per block, the tokens after the block that the
	// engine folded into its hash (vLLM's lookahead_token_ids, EAGLE-style
	// speculative decoding); nil when absent.
	Lookahead [][]uint32
}

// Batch is one decoded event batch.
type Batch struct {
	// TS is the publisher's timestamp in seconds since the epoch.
	TS float64
	// DPRank is the data-parallel rank the batch names, -1 when absent.
	DPRank int
	Events []Event
	// Unknown counts events with an unknown type tag, skipped.
	Unknown int
	// UnknownKeys counts map keys the decoder does not know, ignored.
	UnknownKeys int
	// Invalid counts events dropped because a field had the wrong type or
	// value (for example a negative token id).
	Invalid int
}

// DecodeError is returned for a payload that is not a decodable batch.
type DecodeError struct {
	// Reason is a short metric label: "truncated", "too_long",
	// "not_batch", "bad_value".
	Reason string
	// Offset is the byte offset at which decoding stopped.
	Offset int
	Err    error
}

func (e *DecodeError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("events: decode batch: %s at byte %d: %v", e.Reason, e.Offset, e.Err)
	}
	return fmt.Sprintf("events: decode batch: %s at byte %d", e.Reason, e.Offset)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// ErrorReason returns the DecodeError reason in err's chain, or "other".
func ErrorReason(err error) string {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return "other"
}

// errBadField marks a field whose value has the wrong type; the value has
// been skipped and the event is dropped.
var errBadField = errors.New("bad field")

// DecodeBatch decodes one msgpack batch payload. It never trusts a claimed
// length: a container header claiming more elements than bytes remain is an
// error, and nothing is allocated for it.
func DecodeBatch(payload []byte, mode HashMode) (Batch, error) {
	var d Decoder
	var b Batch
	err := d.Decode(payload, mode, &b)
	return b, err
}

// Decoder decodes batches, reusing its own state and the Batch it is given.
// It streams over the payload with a msgpack.Decoder for headers and
// scalars; the bulk (token-id arrays) and skipped values are read straight
// from the payload bytes, iteratively, with every length checked against
// what remains. A Decoder is not safe for concurrent use.
type Decoder struct {
	br   bytes.Reader
	d    *msgpack.Decoder
	p    []byte
	mode HashMode
}

// Decode decodes payload into b, reusing b's slices. b is valid until the
// next Decode into it; it does not alias payload.
func (dec *Decoder) Decode(payload []byte, mode HashMode, b *Batch) error {
	dec.p = payload
	dec.mode = mode
	dec.br.Reset(payload)
	if dec.d == nil {
		dec.d = msgpack.NewDecoder(&dec.br)
	} else {
		dec.d.Reset(&dec.br)
	}
	b.TS, b.DPRank, b.Unknown, b.UnknownKeys, b.Invalid = 0, -1, 0, 0, 0
	b.Events = b.Events[:0]
	err := dec.batch(b)
	dec.p = nil
	return err
}

func (dec *Decoder) pos() int { return len(dec.p) - dec.br.Len() }

func (dec *Decoder) seek(pos int) { _, _ = dec.br.Seek(int64(pos), io.SeekStart) }

func (dec *Decoder) fail(reason string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		reason = "truncated"
	}
	return &DecodeError{Reason: reason, Offset: dec.pos(), Err: err}
}

func (dec *Decoder) peek() (byte, error) {
	if dec.br.Len() == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	return dec.p[dec.pos()], nil
}

// arrayLen reads an array header and checks that n elements can fit in the
// remaining bytes (each takes at least one).
func (dec *Decoder) arrayLen() (int, error) {
	n, err := dec.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > dec.br.Len() {
		return 0, &DecodeError{Reason: "too_long", Offset: dec.pos(), Err: fmt.Errorf("array of %d elements in %d bytes", n, dec.br.Len())}
	}
	return n, nil
}

func (dec *Decoder) mapLen() (int, error) {
	n, err := dec.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n > dec.br.Len()/2 {
		return 0, &DecodeError{Reason: "too_long", Offset: dec.pos(), Err: fmt.Errorf("map of %d entries in %d bytes", n, dec.br.Len())}
	}
	return n, nil
}

// rawStr reads a str or bin value and returns its bytes as a sub-slice of
// the payload (no copy). nil reads as an empty slice with ok=false.
func (dec *Decoder) rawStr() (b []byte, isNil bool, err error) {
	c, err := dec.peek()
	if err != nil {
		return nil, false, err
	}
	if c == msgpcode.Nil {
		dec.seek(dec.pos() + 1)
		return nil, true, nil
	}
	if !(msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32 ||
		c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32) {
		return nil, false, errBadField
	}
	n, err := dec.d.DecodeBytesLen()
	if err != nil {
		return nil, false, err
	}
	if n < 0 || n > dec.br.Len() {
		return nil, false, &DecodeError{Reason: "too_long", Offset: dec.pos(), Err: fmt.Errorf("string of %d bytes in %d", n, dec.br.Len())}
	}
	start := dec.pos()
	dec.seek(start + n)
	return dec.p[start : start+n], false, nil
}

// str reads a nil-or-string value, interning the common mediums.
func (dec *Decoder) str() (string, error) {
	b, _, err := dec.rawStr()
	if err != nil {
		return "", err
	}
	switch string(b) {
	case "":
		return "", nil
	case "GPU":
		return "GPU", nil
	case "CPU":
		return "CPU", nil
	case "full_attention":
		return "full_attention", nil
	}
	return string(b), nil
}

// skip skips one value of any shape without recursion: a deeply nested
// payload cannot exhaust the stack, and claimed lengths are checked against
// the remaining bytes.
func (dec *Decoder) skip() error {
	pos := dec.pos()
	end, err := skipValues(dec.p, pos, 1)
	if err != nil {
		return &DecodeError{Reason: reasonOf(err), Offset: pos, Err: err}
	}
	dec.seek(end)
	return nil
}

var (
	errTruncated = io.ErrUnexpectedEOF
	errTooLong   = errors.New("claimed length exceeds the remaining bytes")
	errBadCode   = errors.New("invalid msgpack code")
)

func reasonOf(err error) string {
	switch {
	case errors.Is(err, errTruncated):
		return "truncated"
	case errors.Is(err, errBadCode):
		return "bad_value"
	}
	return "too_long"
}

// skipValues returns the offset just past n consecutive values starting at
// p[pos].
func skipValues(p []byte, pos, n int) (int, error) {
	pending := n
	for pending > 0 {
		if pos >= len(p) {
			return pos, errTruncated
		}
		c := p[pos]
		pos++
		pending--
		var extra int // bytes to skip after the header
		var items int // nested values that follow
		var hdr int   // size of a length field
		var mult int  // items per claimed element (1 array, 2 map)
		var payload bool
		switch {
		case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow:
		case msgpcode.IsFixedMap(c):
			items = 2 * int(c&msgpcode.FixedMapMask)
		case msgpcode.IsFixedArray(c):
			items = int(c & msgpcode.FixedArrayMask)
		case msgpcode.IsFixedString(c):
			extra = int(c & msgpcode.FixedStrMask)
		default:
			switch c {
			case msgpcode.Nil, msgpcode.False, msgpcode.True:
			case msgpcode.Uint8, msgpcode.Int8:
				extra = 1
			case msgpcode.Uint16, msgpcode.Int16:
				extra = 2
			case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
				extra = 4
			case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
				extra = 8
			case msgpcode.Str8, msgpcode.Bin8:
				hdr, payload = 1, true
			case msgpcode.Str16, msgpcode.Bin16:
				hdr, payload = 2, true
			case msgpcode.Str32, msgpcode.Bin32:
				hdr, payload = 4, true
			case msgpcode.Array16:
				hdr, mult = 2, 1
			case msgpcode.Array32:
				hdr, mult = 4, 1
			case msgpcode.Map16:
				hdr, mult = 2, 2
			case msgpcode.Map32:
				hdr, mult = 4, 2
			case msgpcode.FixExt1:
				extra = 2
			case msgpcode.FixExt2:
				extra = 3
			case msgpcode.FixExt4:
				extra = 5
			case msgpcode.FixExt8:
				extra = 9
			case msgpcode.FixExt16:
				extra = 17
			case msgpcode.Ext8:
				hdr, payload = 1, true
			case msgpcode.Ext16:
				hdr, payload = 2, true
			case msgpcode.Ext32:
				hdr, payload = 4, true
			default:
				return pos, fmt.Errorf("%w %#x", errBadCode, c)
			}
		}
		if hdr > 0 {
			if len(p)-pos < hdr {
				return pos, errTruncated
			}
			var l uint64
			switch hdr {
			case 1:
				l = uint64(p[pos])
			case 2:
				l = uint64(binary.BigEndian.Uint16(p[pos:]))
			case 4:
				l = uint64(binary.BigEndian.Uint32(p[pos:]))
			}
			pos += hdr
			if c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32 {
				l++ // the type byte
			}
			if l > uint64(len(p)-pos) {
				return pos, fmt.Errorf("%w: %d > %d", errTooLong, l, len(p)-pos)
			}
			if payload {
				extra = int(l)
			} else {
				items = int(l) * mult
			}
		}
		if extra > len(p)-pos {
			return pos, errTruncated
		}
		pos += extra
		if items > len(p)-pos {
			return pos, fmt.Errorf("%w: %d values > %d", errTooLong, items, len(p)-pos)
		}
		pending += items
	}
	return pos, nil
}

// uintAt parses a non-negative integer at p[pos] for the common codes
// (positive fixint, uint8..uint64, non-negative int8..int64). It returns the
// offset after it; ok=false means "not a non-negative integer" (or
// truncated, when end > len(p)).
func uintAt(p []byte, pos int) (v uint64, end int, ok bool) {
	c := p[pos]
	if c <= msgpcode.PosFixedNumHigh {
		return uint64(c), pos + 1, true
	}
	var n int
	var sign uint64
	switch c {
	case msgpcode.Uint8:
		n = 1
	case msgpcode.Uint16:
		n = 2
	case msgpcode.Uint32:
		n = 4
	case msgpcode.Uint64:
		n = 8
	case msgpcode.Int8:
		n, sign = 1, 1<<7
	case msgpcode.Int16:
		n, sign = 2, 1<<15
	case msgpcode.Int32:
		n, sign = 4, 1<<31
	case msgpcode.Int64:
		n, sign = 8, 1<<63
	default:
		return 0, pos, false
	}
	if len(p)-pos-1 < n {
		return 0, len(p) + 1, false
	}
	b := p[pos+1 : pos+1+n]
	switch n {
	case 1:
		v = uint64(b[0])
	case 2:
		v = uint64(binary.BigEndian.Uint16(b))
	case 4:
		v = uint64(binary.BigEndian.Uint32(b))
	default:
		v = binary.BigEndian.Uint64(b)
	}
	if v&sign != 0 {
		return 0, pos, false
	}
	return v, pos + 1 + n, true
}

// uintFast reads a non-negative integer at the cursor straight from the
// payload; ok=false leaves the cursor untouched.
func (dec *Decoder) uintFast() (v uint64, ok bool, err error) {
	pos := dec.pos()
	if pos >= len(dec.p) {
		return 0, false, io.ErrUnexpectedEOF
	}
	v, end, ok := uintAt(dec.p, pos)
	if end > len(dec.p) {
		return 0, false, io.ErrUnexpectedEOF
	}
	if ok {
		dec.seek(end)
	}
	return v, ok, nil
}

// intVal reads a nil-or-integer value; isNil reports nil.
func (dec *Decoder) intVal() (v int64, isNil bool, err error) {
	c, err := dec.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		dec.seek(dec.pos() + 1)
		return 0, true, nil
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow,
		c == msgpcode.Int8, c == msgpcode.Int16, c == msgpcode.Int32, c == msgpcode.Int64,
		c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32:
		v, err = dec.d.DecodeInt64()
		return v, false, err
	case c == msgpcode.Uint64:
		u, err := dec.d.DecodeUint64()
		if err != nil {
			return 0, false, err
		}
		if u > math.MaxInt64 {
			return 0, false, errBadField
		}
		return int64(u), false, nil
	}
	return 0, false, dec.skipBad()
}

// skipBad skips the value at the cursor and reports errBadField (or the
// structural error that made skipping impossible).
func (dec *Decoder) skipBad() error {
	if err := dec.skip(); err != nil {
		return err
	}
	return errBadField
}

// hash reads one block hash: uint64, int64 or bin/str bytes.
func (dec *Decoder) hash() (h uint64, isNil bool, err error) {
	if v, ok, err := dec.uintFast(); err != nil || ok {
		return v, false, err
	}
	c, err := dec.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		dec.seek(dec.pos() + 1)
		return 0, true, nil
	case c >= msgpcode.NegFixedNumLow || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64:
		v, err := dec.d.DecodeInt64()
		return uint64(v), false, err
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 ||
		msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32:
		b, _, err := dec.rawStr()
		if err != nil {
			return 0, false, err
		}
		return bytesHash(b, dec.mode), false, nil
	}
	return 0, false, dec.skipBad()
}

// bytesHash turns a byte-string digest into the index's uint64.
func bytesHash(b []byte, mode HashMode) uint64 {
	if len(b) > 8 {
		if mode == HashSGLang {
			b = b[:8]
		} else {
			b = b[len(b)-8:]
		}
	}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

// optArray starts a list field that may be nil: ok is false for nil (the
// nil consumed, err nil) and for a value that is not an array (skipped,
// err errBadField); otherwise n is the array's length.
func (dec *Decoder) optArray() (n int, ok bool, err error) {
	c, err := dec.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		dec.seek(dec.pos() + 1)
		return 0, false, nil
	}
	if !isArray(c) {
		return 0, false, dec.skipBad()
	}
	n, err = dec.arrayLen()
	return n, err == nil, err
}

func (dec *Decoder) hashes(dst []uint64) ([]uint64, error) {
	n, ok, err := dec.optArray()
	if err != nil || !ok {
		return dst, err
	}
	dst = grow(dst, n)
	bad := false
	for range n {
		h, isNil, err := dec.hash()
		if errors.Is(err, errBadField) || isNil {
			bad = true
			continue
		}
		if err != nil {
			return dst, err
		}
		dst = append(dst, h)
	}
	if bad {
		return dst, errBadField
	}
	return dst, nil
}

func (dec *Decoder) tokens(dst []uint32) ([]uint32, error) {
	n, ok, err := dec.optArray()
	if err != nil || !ok {
		return dst, err
	}
	dst = grow(dst, n)
	bad := false
	// Hot loop: parse straight from the payload, one seek at the end.
	p, pos := dec.p, dec.pos()
	for range n {
		if pos >= len(p) {
			dec.seek(pos)
			return dst, io.ErrUnexpectedEOF
		}
		// The codes token ids use, inline.
		switch c := p[pos]; {
		case c <= msgpcode.PosFixedNumHigh:
			dst = append(dst, uint32(c))
			pos++
			continue
		case c == msgpcode.Uint16 && len(p)-pos >= 3:
			dst = append(dst, uint32(binary.BigEndian.Uint16(p[pos+1:])))
			pos += 3
			continue
		case c == msgpcode.Uint32 && len(p)-pos >= 5:
			dst = append(dst, binary.BigEndian.Uint32(p[pos+1:]))
			pos += 5
			continue
		}
		v, end, ok := uintAt(p, pos)
		if end > len(p) {
			dec.seek(len(p))
			return dst, io.ErrUnexpectedEOF
		}
		if ok && v <= math.MaxUint32 {
			dst = append(dst, uint32(v))
			pos = end
			continue
		}
		bad = true
		if ok {
			pos = end
			continue
		}
		e, err := skipValues(p, pos, 1)
		if err != nil {
			dec.seek(pos)
			return dst, &DecodeError{Reason: reasonOf(err), Offset: pos, Err: err}
		}
		pos = e
	}
	dec.seek(pos)
	if bad {
		return dst, errBadField
	}
	return dst, nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isStr(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

// grow returns dst[:0] with capacity for n more elements (n has been
// checked against the remaining payload bytes).
func grow[T any](dst []T, n int) []T {
	if cap(dst) < n {
		return make([]T, 0, n)
	}
	return dst[:0]
}

func (dec *Decoder) float() (float64, error) {
	c, err := dec.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case msgpcode.Double, msgpcode.Float:
		return dec.d.DecodeFloat64()
	case msgpcode.Nil:
		dec.seek(dec.pos() + 1)
		return 0, nil
	}
	// An integer timestamp is taken as is; any other value is skipped and
	// leaves the timestamp unknown (0): it only feeds the lag gauge.
	v, _, err := dec.intVal()
	if errors.Is(err, errBadField) {
		return 0, nil
	}
	return float64(v), err
}

func (dec *Decoder) batch(b *Batch) error {
	c, err := dec.peek()
	if err != nil {
		return dec.fail("truncated", err)
	}
	switch {
	case isArray(c):
		n, err := dec.arrayLen()
		if err != nil {
			return dec.wrap(err)
		}
		if n < 2 {
			return &DecodeError{Reason: "not_batch", Offset: dec.pos(), Err: fmt.Errorf("batch array of %d elements", n)}
		}
		if b.TS, err = dec.float(); err != nil {
			return dec.wrap(err)
		}
		if err := dec.events(b); err != nil {
			return dec.wrap(err)
		}
		if n >= 3 {
			if err := dec.rank(b); err != nil {
				return dec.wrap(err)
			}
		}
		for i := 3; i < n; i++ {
			if err := dec.skip(); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := dec.mapLen()
		if err != nil {
			return dec.wrap(err)
		}
		for range n {
			k, _, err := dec.rawStr()
			if errors.Is(err, errBadField) {
				if err := dec.skip(); err != nil {
					return err
				}
				b.UnknownKeys++
				if err := dec.skip(); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return dec.wrap(err)
			}
			switch string(k) {
			case "ts":
				b.TS, err = dec.float()
			case "events":
				err = dec.events(b)
			case "data_parallel_rank", "attn_dp_rank":
				err = dec.rank(b)
			default:
				b.UnknownKeys++
				err = dec.skip()
			}
			if err != nil {
				return dec.wrap(err)
			}
		}
		return nil
	}
	return &DecodeError{Reason: "not_batch", Offset: dec.pos(), Err: fmt.Errorf("batch is msgpack code %#x, want array or map", c)}
}

func (dec *Decoder) rank(b *Batch) error {
	v, isNil, err := dec.intVal()
	if errors.Is(err, errBadField) {
		return nil
	}
	if err != nil {
		return err
	}
	if !isNil && v >= 0 && v <= math.MaxInt32 {
		b.DPRank = int(v)
	}
	return nil
}

// wrap turns low-level errors into DecodeErrors, keeping existing ones.
func (dec *Decoder) wrap(err error) error {
	var de *DecodeError
	if errors.As(err, &de) {
		return err
	}
	if errors.Is(err, errBadField) {
		return &DecodeError{Reason: "bad_value", Offset: dec.pos(), Err: err}
	}
	return dec.fail("bad_value", err)
}

func (dec *Decoder) events(b *Batch) error {
	c, err := dec.peek()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		dec.seek(dec.pos() + 1)
		return nil
	}
	if !isArray(c) {
		return &DecodeError{Reason: "not_batch", Offset: dec.pos(), Err: fmt.Errorf("events is msgpack code %#x, want array", c)}
	}
	n, err := dec.arrayLen()
	if err != nil {
		return err
	}
	for range n {
		ev := b.next()
		c, err := dec.peek()
		if err != nil {
			return err
		}
		switch {
		case isMap(c):
			err = dec.mapEvent(b, ev)
		case isArray(c):
			err = dec.arrayEvent(b, ev)
		default:
			err = dec.skipBad()
		}
		switch {
		case errors.Is(err, errBadField):
			b.Invalid++
			b.Events = b.Events[:len(b.Events)-1]
		case err != nil:
			b.Events = b.Events[:len(b.Events)-1]
			return err
		case ev.Type == 0:
			b.Unknown++
			b.Events = b.Events[:len(b.Events)-1]
		}
	}
	return nil
}

// next appends an event to b, reusing the slices of a previous Decode.
func (b *Batch) next() *Event {
	if len(b.Events) < cap(b.Events) {
		b.Events = b.Events[:len(b.Events)+1]
	} else {
		b.Events = append(b.Events, Event{})
	}
	ev := &b.Events[len(b.Events)-1]
	*ev = Event{Hashes: ev.Hashes[:0], Tokens: ev.Tokens[:0], GroupIdx: -1}
	return ev
}

func eventType(tag []byte) EventType {
	switch string(tag) {
	case "BlockStored":
		return EventBlockStored
	case "BlockRemoved":
		return EventBlockRemoved
	case "AllBlocksCleared":
		return EventAllBlocksCleared
	}
	return 0
}

// Positional field orders (after the tag) of the array era; later versions
// appended fields, so any prefix is accepted and extra elements ignored.
var (
	storedFields = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
		"lookahead_token_ids"}
	removedFields = []string{"block_hashes", "medium", "group_idx", "locality", "ownership"}
)

func (dec *Decoder) arrayEvent(b *Batch, ev *Event) error {
	n, err := dec.arrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return errBadField
	}
	tag, _, err := dec.rawStr()
	if err != nil {
		if errors.Is(err, errBadField) {
			if err := skipN(dec, n-1); err != nil {
				return err
			}
		}
		return err
	}
	ev.Type = eventType(tag)
	var fields []string
	switch ev.Type {
	case EventBlockStored:
		fields = storedFields
	case EventBlockRemoved:
		fields = removedFields
	}
	bad := false
	for i := 1; i < n; i++ {
		name := ""
		if i-1 < len(fields) {
			name = fields[i-1]
		}
		// SGLang builds appended a metadata map to salted stores.
		if ev.Type == EventBlockStored && i-1 >= 6 {
			if c, err := dec.peek(); err == nil && isMap(c) {
				name = "metadata"
			}
		}
		err := dec.field(b, ev, name)
		if errors.Is(err, errBadField) {
			bad = true
			continue
		}
		if err != nil {
			return err
		}
	}
	if bad {
		return errBadField
	}
	return nil
}

func skipN(dec *Decoder, n int) error {
	for range n {
		if err := dec.skip(); err != nil {
			return err
		}
	}
	return nil
}

func (dec *Decoder) mapEvent(b *Batch, ev *Event) error {
	n, err := dec.mapLen()
	if err != nil {
		return err
	}
	bad := false
	for range n {
		k, _, err := dec.rawStr()
		if errors.Is(err, errBadField) {
			if err := dec.skip(); err != nil {
				return err
			}
			b.UnknownKeys++
			continue
		}
		if err != nil {
			return err
		}
		if string(k) == "type" {
			tag, _, err := dec.rawStr()
			if errors.Is(err, errBadField) {
				bad = true
				if err := dec.skip(); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			ev.Type = eventType(tag)
			continue
		}
		name := string(k)
		if !knownField(name) {
			b.UnknownKeys++
			name = ""
		}
		err = dec.field(b, ev, name)
		if errors.Is(err, errBadField) {
			bad = true
			continue
		}
		if err != nil {
			return err
		}
	}
	if bad {
		return errBadField
	}
	return nil
}

func knownField(name string) bool {
	switch name {
	case "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "cache_salt", "kv_cache_spec_sliding_window", "locality",
		"ownership", "session_id", "lookahead_token_ids":
		return true
	}
	return false
}

// field decodes one named field into ev; an empty or unused name skips the
// value.
func (dec *Decoder) field(b *Batch, ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.Hashes, err = dec.hashes(ev.Hashes)
	case "parent_block_hash":
		var isNil bool
		ev.Parent, isNil, err = dec.hash()
		ev.HasParent = err == nil && !isNil && ev.Parent != 0
	case "token_ids":
		ev.Tokens, err = dec.tokens(ev.Tokens)
	case "block_size":
		var v int64
		v, _, err = dec.intVal()
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = errBadField
		}
		ev.BlockSize = int(v)
	case "medium":
		ev.Medium, err = dec.strField()
	case "lora_name":
		ev.LoRAName, err = dec.strField()
	case "cache_salt":
		ev.CacheSalt, err = dec.strField()
	case "kv_cache_spec_kind":
		ev.SpecKind, err = dec.strField()
	case "group_idx":
		var v int64
		var isNil bool
		v, isNil, err = dec.intVal()
		if err == nil && !isNil && v >= 0 && v <= math.MaxInt32 {
			ev.GroupIdx = int(v)
		}
	case "kv_cache_spec_sliding_window":
		var v int64
		var isNil bool
		v, isNil, err = dec.intVal()
		if err == nil && !isNil && (v < 0 || v > math.MaxInt32) {
			err = errBadField
		}
		if err == nil && !isNil {
			ev.SlidingWindow = int(v)
		}
	case "locality":
		ev.Locality, err = dec.strField()
	case "ownership":
		ev.Ownership, err = dec.strField()
	case "session_id":
		ev.SessionID, err = dec.strField()
	case "lookahead_token_ids":
		ev.Lookahead, err = dec.lookahead()
	case "extra_keys":
		ev.ExtraKeys, err = dec.extraKeys()
	case "metadata":
		err = dec.metadata(b, ev)
	default:
		err = dec.skip()
	}
	return err
}

func (dec *Decoder) strField() (string, error) {
	s, err := dec.str()
	if errors.Is(err, errBadField) {
		return "", dec.skipBad()
	}
	return s, err
}

// metadata reads SGLang's interim metadata map ({"cache_salt": ..., ...}).
func (dec *Decoder) metadata(b *Batch, ev *Event) error {
	n, err := dec.mapLen()
	if err != nil {
		return err
	}
	for range n {
		k, _, err := dec.rawStr()
		if errors.Is(err, errBadField) {
			if err := dec.skip(); err != nil {
				return err
			}
			k = nil
		} else if err != nil {
			return err
		}
		switch string(k) {
		case "cache_salt":
			ev.CacheSalt, err = dec.strField()
		case "lora_name":
			ev.LoRAName, err = dec.strField()
		default:
			b.UnknownKeys++
			err = dec.skip()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// lookahead reads lookahead_token_ids: nil, or one token list per block.
// A block's entry of the wrong shape makes the event invalid.
func (dec *Decoder) lookahead() ([][]uint32, error) {
	n, ok, err := dec.optArray()
	if err != nil || !ok {
		return nil, err
	}
	out := make([][]uint32, 0, n)
	bad := false
	for range n {
		c, err := dec.peek()
		if err != nil {
			return nil, err
		}
		if !isArray(c) {
			// nil or another shape: every block must carry its list.
			bad = true
			if err := dec.skip(); err != nil {
				return nil, err
			}
			continue
		}
		toks, err := dec.tokens(nil)
		if errors.Is(err, errBadField) {
			bad = true
			continue
		}
		if err != nil {
			return nil, err
		}
		if toks == nil {
			toks = []uint32{}
		}
		out = append(out, toks)
	}
	if bad {
		return nil, errBadField
	}
	return out, nil
}

func (dec *Decoder) extraKeys() ([][]ExtraKey, error) {
	n, ok, err := dec.optArray()
	if err != nil || !ok {
		return nil, err
	}
	var out [][]ExtraKey // allocated at the first block with extras
	for i := range n {
		c, err := dec.peek()
		if err != nil {
			return nil, err
		}
		if c == msgpcode.Nil {
			dec.seek(dec.pos() + 1)
			continue
		}
		if !isArray(c) {
			// A single bare value where a tuple is expected: keep it
			// as a one-element tuple.
			k, err := dec.extraKey()
			if err != nil {
				return nil, err
			}
			if out == nil {
				out = make([][]ExtraKey, n)
			}
			out[i] = []ExtraKey{k}
			continue
		}
		m, err := dec.arrayLen()
		if err != nil {
			return nil, err
		}
		if m == 0 {
			continue
		}
		keys := make([]ExtraKey, 0, m)
		for range m {
			k, err := dec.extraKey()
			if err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
		if out == nil {
			out = make([][]ExtraKey, n)
		}
		out[i] = keys
	}
	return out, nil
}

func (dec *Decoder) extraKey() (ExtraKey, error) {
	c, err := dec.peek()
	if err != nil {
		return ExtraKey{}, err
	}
	start := dec.pos()
	switch {
	case isStr(c):
		s, err := dec.str()
		return ExtraKey{Kind: ExtraString, Str: s}, err
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32:
		b, _, err := dec.rawStr()
		return ExtraKey{Kind: ExtraBin, Bytes: append([]byte(nil), b...)}, err
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow ||
		(c >= msgpcode.Uint8 && c <= msgpcode.Int64):
		v, _, err := dec.intVal()
		if errors.Is(err, errBadField) {
			break
		}
		return ExtraKey{Kind: ExtraInt, Int: v}, err
	case isArray(c):
		// A multimodal (identifier, offset) pair.
		if k, ok := dec.mmPair(); ok {
			return k, nil
		}
		dec.seek(start)
	}
	dec.seek(start)
	if err := dec.skip(); err != nil {
		return ExtraKey{}, err
	}
	return ExtraKey{Kind: ExtraOther, Bytes: append([]byte(nil), dec.p[start:dec.pos()]...)}, nil
}

// mmPair reads [str, int]; ok=false means the value has another shape (the
// caller rewinds).
func (dec *Decoder) mmPair() (ExtraKey, bool) {
	n, err := dec.arrayLen()
	if err != nil || n != 2 {
		return ExtraKey{}, false
	}
	if c, err := dec.peek(); err != nil || !isStr(c) {
		return ExtraKey{}, false
	}
	s, err := dec.str()
	if err != nil {
		return ExtraKey{}, false
	}
	v, isNil, err := dec.intVal()
	if err != nil || isNil {
		return ExtraKey{}, false
	}
	return ExtraKey{Kind: ExtraMM, Str: s, Int: v}, true
}
