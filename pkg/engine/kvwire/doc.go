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
// group_idx (Event.Group) and kv_cache_spec_kind (Event.SpecKind,
// "full_attention" when empty), then kv_cache_spec_sliding_window: the
// window when the event has one (a hybrid engine's sliding-window group),
// else omitted in the map form (msgspec omits a defaulted None) and nil in
// the array form. BlockRemoved carries block_hashes, medium and group_idx
// (Event.Group). AllBlocksCleared has no fields. This is what vLLM 0.33
// publishes: every GPU BlockStored is labelled with its group's kind and
// window (KVCacheManager.take_events), BlockRemoved with its group only.
//
// The package is pure: no goroutines, no I/O.
package kvwire
