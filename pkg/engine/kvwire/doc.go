// Package kvwire encodes engine cache events exactly as vLLM publishes them:
// a msgpack KVEventBatch, always positional [ts float64, events, dp_rank],
// whose events are either tagged maps (vLLM since mid-2026: key "type"
// first, then the fields in declaration order, defaulted optional fields
// omitted) or tagged arrays (older vLLM: every field positionally, trailing
// nils included). Floats are float64, integers use the smallest msgpack
// form, block hashes are uint64 (int mode) or 32-byte bin (bytes mode).
//
// BlockStored carries block_hashes, parent_block_hash (nil at a chain's
// start), token_ids, block_size, lora_id, medium, lora_name, extra_keys,
// group_idx (0) and kv_cache_spec_kind ("full_attention"); the array form
// appends kv_cache_spec_sliding_window (nil). BlockRemoved carries
// block_hashes, medium and group_idx (0). AllBlocksCleared has no fields.
//
// The package is pure: no goroutines, no I/O.
package kvwire
