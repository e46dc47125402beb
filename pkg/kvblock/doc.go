// Package kvblock turns token ids into the router's chained 64-bit block keys.
//
// A prompt of n tokens is cut into n/blockSize full blocks; a trailing partial
// block never gets a key, and a prompt shorter than one block has none. Each
// key covers its whole prefix:
//
//	key_0 = H(root, tokens_0, extra_0)
//	key_i = H(key_{i-1}, tokens_i, extra_i)
//
// where root is derived from the model name, or from the LoRA adapter name when
// the request uses one, so that different models and adapters never share a
// key. The request's cache_salt folds into extra_0 only, and so changes every
// key of the chain. Optional per-block extras carry multimodal identifiers.
//
// H is XXH3-64 seeded with the parent key over the block's token ids written as
// little-endian uint32, followed, when the block has extras, by a tagged,
// length-prefixed encoding of them. The keys are the router's own: they are
// not vLLM's block digests (which hash a pickled or CBOR 3-tuple rooted at a
// per-process random NONE_HASH). The index maps each engine's digests onto
// these keys when it applies the engine's BlockStored events.
//
// The package is pure: no goroutines, no clock, no logging, no shared state.
package kvblock
