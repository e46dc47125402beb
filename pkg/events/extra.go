package events

import (
	"encoding/binary"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// StoredOptions turns a BlockStored event's salt and extra keys into the
// kvblock.Options the index chains its router keys with, so that a request
// hashed with kvblock.Keys(root, tokens, blockSize, Options{CacheSalt,
// Extras}) meets the same keys.
//
// vLLM's per-block extra tuple is, in order: the LoRA name (every block of a
// LoRA request), multimodal (identifier, offset) pairs, the cache_salt
// string (block 0 only), prompt-embeds hashes (bytes). The LoRA name is
// stripped (the adapter already selects the chain root); in block 0 of an
// event without a parent, the last string before any trailing byte strings
// is the cache salt. Everything else is encoded by ExtraBytes. An explicit
// salt (SGLang's cache_salt) wins over one found in the tuple.
//
// The returned Options.Extras is indexed by the event's blocks, and buf is
// reused for it.
//
// With lookahead_token_ids (vLLM's hash covers the tokens after each block,
// as the extra keys (E, *tokens)), each block's extras are followed by
// kvblock.AppendLookahead of its lookahead tokens, so the keys equal those
// of a request hashed with kvblock.Options.WithLookahead.
func StoredOptions(ev *Event, buf [][]byte) kvblock.Options {
	o := kvblock.Options{CacheSalt: ev.CacheSalt}
	if !ev.HasParent && ev.CacheSalt == "" && len(ev.ExtraKeys) > 0 {
		o.CacheSalt = saltOf(ev.ExtraKeys[0], ev.LoRAName)
	}
	if ev.Lookahead != nil {
		buf = buf[:0]
		for i, toks := range ev.Lookahead {
			var b []byte
			if i < len(ev.ExtraKeys) {
				keys := stripLoRA(ev.ExtraKeys[i], ev.LoRAName)
				if i == 0 && !ev.HasParent && o.CacheSalt != "" {
					keys = stripSalt(keys, o.CacheSalt)
				}
				if len(keys) > 0 {
					b = ExtraBytes(nil, keys)
				}
			}
			buf = append(buf, kvblock.AppendLookahead(b, toks))
		}
		o.Extras = buf
		return o
	}
	if len(ev.ExtraKeys) == 0 {
		return o
	}
	buf = buf[:0]
	has := false
	for i, keys := range ev.ExtraKeys {
		keys = stripLoRA(keys, ev.LoRAName)
		if i == 0 && !ev.HasParent && o.CacheSalt != "" {
			keys = stripSalt(keys, o.CacheSalt)
		}
		var b []byte
		if len(keys) > 0 {
			b = ExtraBytes(nil, keys)
			has = true
		}
		buf = append(buf, b)
	}
	if has {
		o.Extras = buf
	}
	return o
}

func stripLoRA(keys []ExtraKey, lora string) []ExtraKey {
	if lora != "" && len(keys) > 0 && keys[0].Kind == ExtraString && keys[0].Str == lora {
		return keys[1:]
	}
	return keys
}

// saltIndex returns the index of block 0's salt in keys (after the LoRA
// name is stripped), or -1.
func saltIndex(keys []ExtraKey) int {
	i := len(keys) - 1
	for i >= 0 && keys[i].Kind == ExtraBin {
		i--
	}
	if i >= 0 && keys[i].Kind == ExtraString {
		return i
	}
	return -1
}

func saltOf(keys []ExtraKey, lora string) string {
	keys = stripLoRA(keys, lora)
	if i := saltIndex(keys); i >= 0 {
		return keys[i].Str
	}
	return ""
}

func stripSalt(keys []ExtraKey, salt string) []ExtraKey {
	i := saltIndex(keys)
	if i < 0 || keys[i].Str != salt {
		return keys
	}
	out := make([]ExtraKey, 0, len(keys)-1)
	out = append(out, keys[:i]...)
	return append(out, keys[i+1:]...)
}

// ExtraBytes appends the router's encoding of a block's extra keys (LoRA
// name and salt already removed) to dst. Each element is a one-byte tag and
// a length-prefixed body, so the encoding is deterministic and unambiguous:
//
//	multimodal pair  'm' uvarint(len(id)) id varint(offset)
//	bare string      'i' uvarint(len) bytes
//	byte string      'e' uvarint(len) bytes
//	integer          'n' varint(value)
//	other            'r' uvarint(len) raw-msgpack
//
// A request carrying the same items (kvblock.Options.Extras[i]) hashes to
// the same keys.
func ExtraBytes(dst []byte, keys []ExtraKey) []byte {
	for _, k := range keys {
		switch k.Kind {
		case ExtraMM:
			dst = append(dst, 'm')
			dst = binary.AppendUvarint(dst, uint64(len(k.Str)))
			dst = append(dst, k.Str...)
			dst = binary.AppendVarint(dst, k.Int)
		case ExtraString:
			dst = appendTagged(dst, 'i', []byte(k.Str))
		case ExtraBin:
			dst = appendTagged(dst, 'e', k.Bytes)
		case ExtraInt:
			dst = append(dst, 'n')
			dst = binary.AppendVarint(dst, k.Int)
		default:
			dst = appendTagged(dst, 'r', k.Bytes)
		}
	}
	return dst
}

func appendTagged(dst []byte, tag byte, b []byte) []byte {
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}
