"""Encodes a hybrid model's KV events with vLLM's own msgspec structs.

Loads vllm/distributed/kv_events.py without torch through the loader of
pkg/events/testdata/vllmwire/gen.py and prints, as hex, the batch a vLLM
0.33 engine with a full-attention group (0) and a sliding-window group (1,
window 128) publishes for one stored run of two 4-token blocks (one
BlockStored per group, each labelled as KVCacheManager.take_events labels
it) and the sliding-window group's eviction of the second block. The Go
test TestVLLMHybridBytes encodes the same events with kvwire and compares
the bytes.
"""
import importlib.util
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
gen_path = os.path.join(here, "..", "..", "..", "events", "testdata", "vllmwire", "gen.py")
spec = importlib.util.spec_from_file_location("vllmwire_gen", gen_path)
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

path, _ = gen.locate()
kv = gen.load(path)
import msgspec  # noqa: E402

H1, H2, TS = 0x1E0B2E028EF071CB, 0xEFAD121D154AB2D6, 1757500000.25
common = dict(block_hashes=[H1, H2], parent_block_hash=None, token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4,
              lora_id=None, medium="GPU", lora_name=None, extra_keys=[None, None])
full = kv.BlockStored(**common, group_idx=0, kv_cache_spec_kind="full_attention", kv_cache_spec_sliding_window=None)
sliding = kv.BlockStored(**common, group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128)
removed = kv.BlockRemoved(block_hashes=[H2], medium="GPU", group_idx=1)
batch = kv.KVEventBatch(ts=TS, events=[full, sliding, removed], data_parallel_rank=0)
sys.stdout.write(msgspec.msgpack.Encoder().encode(batch).hex() + "\n")
