"""Produces KV-event batches with vLLM's own msgspec structs.

It loads vllm/distributed/kv_events.py from an installed vllm package
(``pip install --no-deps vllm==<version> msgspec pyzmq``) without importing
vllm itself (no torch): the few vllm modules the file imports are replaced by
small stand-ins, so the structs, their field order and msgspec's encoder are
exactly the release's. KVROUTE_VLLM_KV_EVENTS may name the file instead.

Prints one JSON document: the vLLM version, the field names of each event
struct (in declaration order), and the cases: name and payload as hex,
encoded with msgspec.msgpack.Encoder() as ZmqEventPublisher does.
The Go test TestVLLMWireConformance compares this output with
vllm-<version>.json and decodes every case.
"""
import importlib.util
import json
import logging
import os
import re
import sys
import types


def locate():
    path = os.environ.get("KVROUTE_VLLM_KV_EVENTS")
    if path:
        return path, "unknown"
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("vllm is not installed (pip install --no-deps vllm msgspec pyzmq)")
    root = list(spec.submodule_search_locations)[0]
    version = "unknown"
    vfile = os.path.join(root, "_version.py")
    if os.path.exists(vfile):
        m = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)['"]""", open(vfile).read()) or re.search(
            r"""__version__\s*=\s*['"]([^'"]+)['"]""", open(vfile).read())
        if m:
            version = m.group(1)
    return os.path.join(root, "distributed", "kv_events.py"), version


def stub(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def load(path):
    # Stand-ins for the vllm modules kv_events.py imports at module level.
    for pkg in ("vllm", "vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core", "vllm.distributed"):
        stub(pkg, __path__=[])

    class KVEventsConfig:  # the publisher records its settings in one
        def __init__(self, **kw):
            self.__dict__.update(kw)

    stub("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
    stub("vllm.logger", init_logger=logging.getLogger)
    stub("vllm.utils.network_utils", get_ip=lambda: "127.0.0.1", get_tcp_uri=lambda h, p: f"tcp://{h}:{p}",
         is_valid_ipv6_address=lambda a: False, split_zmq_path=lambda p: ("tcp", p, ""))
    stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    spec = importlib.util.spec_from_file_location("vllm.distributed.kv_events", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm.distributed.kv_events"] = mod
    spec.loader.exec_module(mod)
    return mod


H1, H2, TS = 0x1E0B2E028EF071CB, 0xEFAD121D154AB2D6, 1757500000.25
D1 = bytes(range(32))
D2 = bytes(range(32, 64))


def cases(kv):
    S, R, C = kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared
    full = S(
        block_hashes=[H1, H2], parent_block_hash=None, token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4,
        lora_id=3, medium="GPU", lora_name="sql-lora",
        extra_keys=[("sql-lora", ("img-1", -2), "salt-1"), ("sql-lora",)],
        group_idx=1, kv_cache_spec_kind="sink_full_attention", kv_cache_spec_sliding_window=128,
        locality="REMOTE", ownership="kvcr", session_id="sess-1", lookahead_token_ids=[[9, 10], [11, 12]],
    )
    minimal = S(block_hashes=[H1], parent_block_hash=H2, token_ids=[1, 2, 3, 4], block_size=4,
                lora_id=None, medium=None, lora_name=None)
    byte_hashes = S(block_hashes=[D1, D2], parent_block_hash=D1, token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
                    block_size=4, lora_id=None, medium="CPU", lora_name=None, extra_keys=[None, (b"\x01\x02",)])
    sliding = S(block_hashes=[H1], parent_block_hash=None, token_ids=[7, 7, 7, 7], block_size=4, lora_id=None,
                medium="CPU", lora_name=None, group_idx=2, kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=4096, locality="LOCAL")
    removed_full = R(block_hashes=[H2], medium="CPU", group_idx=2, locality="LOCAL", ownership="kvcr")
    removed_min = R(block_hashes=[H1, H2], medium="GPU")
    batch = kv.KVEventBatch
    return [
        ("stored_every_field", batch(ts=TS, events=[full], data_parallel_rank=0)),
        ("stored_required_only", batch(ts=TS, events=[minimal], data_parallel_rank=0)),
        ("stored_bytes_hashes", batch(ts=TS, events=[byte_hashes], data_parallel_rank=0)),
        ("stored_sliding_window_group", batch(ts=TS, events=[sliding], data_parallel_rank=0)),
        ("removed_every_field", batch(ts=TS, events=[removed_full], data_parallel_rank=0)),
        ("removed_required_only", batch(ts=TS, events=[removed_min], data_parallel_rank=0)),
        ("cleared", batch(ts=TS, events=[C()], data_parallel_rank=0)),
        ("mixed_dp_rank_3", batch(ts=TS, events=[minimal, removed_min, C()], data_parallel_rank=3)),
        ("rank_unset", batch(ts=TS, events=[removed_min])),
    ]


def main():
    path, version = locate()
    kv = load(path)
    import msgspec

    enc = msgspec.msgpack.Encoder()
    out = {
        "vllm_version": version,
        "fields": {c.__name__: list(c.__struct_fields__) for c in (kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared)},
        "batch_fields": list(kv.KVEventBatch.__struct_fields__),
        "cases": [{"name": n, "hex": enc.encode(b).hex()} for n, b in cases(kv)],
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
