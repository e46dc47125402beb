package kvblock

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Key is a router block key: a chained hash over a prompt prefix that ends at
// a block boundary.
type Key uint64

// DefaultBlockSize is vLLM's default KV block size in tokens.
const DefaultBlockSize = 16

// Root returns the chain seed for a model, or for a LoRA adapter when lora is
// not empty. Requests for different models or adapters never share keys.
func Root(model, lora string) Key {
	if lora != "" {
		return Key(xxh3.HashString("kvroute/lora\x00" + lora))
	}
	return Key(xxh3.HashString("kvroute/model\x00" + model))
}

// Options are the parts of a request, besides its tokens, that enter the keys.
type Options struct {
	// CacheSalt is folded into block 0 only (vLLM's cache_salt), so it
	// changes every key of the chain.
	CacheSalt string
	// Extras holds optional per-block extra keys (multimodal identifiers),
	// indexed by block. Missing or empty entries mean "no extras".
	Extras [][]byte
}

// Extra returns the extra-key bytes of block i under o: the salt for block 0
// followed by the block's own extras. It returns nil when the block has none.
func (o Options) Extra(i int) []byte {
	var own []byte
	if i < len(o.Extras) {
		own = o.Extras[i]
	}
	salt := i == 0 && o.CacheSalt != ""
	if !salt && len(own) == 0 {
		return nil
	}
	buf := make([]byte, 0, 2+2*binary.MaxVarintLen64+len(o.CacheSalt)+len(own))
	if salt {
		buf = append(buf, 's')
		buf = binary.AppendUvarint(buf, uint64(len(o.CacheSalt)))
		buf = append(buf, o.CacheSalt...)
	}
	if len(own) > 0 {
		buf = append(buf, 'x')
		buf = binary.AppendUvarint(buf, uint64(len(own)))
		buf = append(buf, own...)
	}
	return buf
}

// NumBlocks returns how many full blocks n tokens make.
func NumBlocks(n, blockSize int) int {
	if blockSize <= 0 || n <= 0 {
		return 0
	}
	return n / blockSize
}

// Keys appends to dst the keys of every full block of tokens and returns the
// extended slice. blockSize must be positive; a non-positive block size yields
// no keys.
func Keys(dst []Key, root Key, tokens []uint32, blockSize int, o Options) []Key {
	n := NumBlocks(len(tokens), blockSize)
	if n == 0 {
		return dst
	}
	if cap(dst)-len(dst) < n {
		grown := make([]Key, len(dst), len(dst)+n)
		copy(grown, dst)
		dst = grown
	}
	parent := root
	plain := o.CacheSalt == "" && len(o.Extras) == 0
	for i := range n {
		blk := tokens[i*blockSize : (i+1)*blockSize]
		if plain {
			parent = Chain(parent, blk, nil)
		} else {
			parent = Chain(parent, blk, o.Extra(i))
		}
		dst = append(dst, parent)
	}
	return dst
}

// Chain returns the key of one block given its parent's key (or the root for
// block 0), the block's tokens and its extra-key bytes (nil for none).
func Chain(parent Key, tokens []uint32, extra []byte) Key {
	h := xxh3.HashSeed(tokenBytes(tokens), uint64(parent))
	if len(extra) > 0 {
		// Re-seed with the token hash so that tokens and extras can never
		// be confused with one another, whatever their lengths.
		h = xxh3.HashSeed(extra, h^0x9e3779b97f4a7c15)
	}
	return Key(h)
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// tokenBytes views tokens as little-endian bytes, without copying on
// little-endian machines.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
	}
	b := make([]byte, 0, len(tokens)*4)
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return b
}

// AppendLookahead appends to dst the encoding of a block's lookahead tokens:
// the tokens after the block that an engine hashing with lookahead (vLLM's
// num_hash_lookahead_tokens, EAGLE-style speculative decoding with prefix
// caching) folds into the block's hash, as the extra keys (E, *tokens).
// It goes after the block's own extras in Options.Extras[i]:
//
//	'l' uvarint(len(tokens)) tokens as little-endian uint32
func AppendLookahead(dst []byte, tokens []uint32) []byte {
	dst = append(dst, 'l')
	dst = binary.AppendUvarint(dst, uint64(len(tokens)))
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}

// WithLookahead returns o with each block's extras followed by the n tokens
// after the block (AppendLookahead), and how many of tokens can be keyed:
// as in vLLM, a block has a key only once the n tokens after it exist, so
// Keys(dst, root, tokens[:m], blockSize, o2) gives the keys an engine
// hashing with n lookahead tokens publishes for this prompt. n <= 0 returns
// o and len(tokens) unchanged.
func (o Options) WithLookahead(tokens []uint32, blockSize, n int) (Options, int) {
	if n <= 0 {
		return o, len(tokens)
	}
	if blockSize <= 0 || len(tokens) < n {
		return o, 0
	}
	blocks := NumBlocks(len(tokens)-n, blockSize)
	extras := make([][]byte, blocks)
	for i := range blocks {
		var own []byte
		if i < len(o.Extras) {
			own = o.Extras[i]
		}
		end := (i + 1) * blockSize
		extras[i] = AppendLookahead(append([]byte(nil), own...), tokens[end:end+n])
	}
	o.Extras = extras
	return o, blocks * blockSize
}
