"""Regenerates the golden batches with msgspec, using structs shaped like
vLLM's KV-event definitions (array era: array_like=True; map era: no
array_like; both omit_defaults=True, tagged by class name under "type").

    python3 -m venv venv && venv/bin/pip install msgspec==0.19.0
    venv/bin/python gen_golden.py   # prints "<name> <hex>" lines

The outputs equal the *.hex files byte for byte (checked with msgspec 0.19.0).
removed_v090.hex (the 2-element batch of vLLM 0.9.0) is hand-assembled.
"""
from typing import Any, Optional

import msgspec

H1, H2, TS = 0x1E0B2E028EF071CB, 0xEFAD121D154AB2D6, 1757500000.25


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: Optional[int] = None


def event_types(array_like):
    opts = dict(array_like=array_like, omit_defaults=True, gc=False)

    class Stored(msgspec.Struct, tag="BlockStored", **opts):
        block_hashes: list
        parent_block_hash: Any
        token_ids: list
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

    class Removed(msgspec.Struct, tag="BlockRemoved", **opts):
        block_hashes: list
        medium: Optional[str]
        group_idx: Optional[int] = None

    class Cleared(msgspec.Struct, tag="AllBlocksCleared", **opts):
        pass

    return Stored, Removed, Cleared


enc = msgspec.msgpack.Encoder()
for era, array_like in (("map", False), ("array", True)):
    Stored, Removed, Cleared = event_types(array_like)
    stored = Stored([H1, H2], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU", None, [None, None], 0, "full_attention")
    for name, ev in (("stored", stored), ("removed", Removed([H2], "GPU", 0)), ("cleared", Cleared())):
        print(f"{name}_{era}", enc.encode(Batch(TS, [ev], 0)).hex())
