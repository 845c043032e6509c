"""Where KV lives: the per-layer KV pool, the slot allocator that owns free slot ids,
the ``req_to_token`` table of each running request's slots, and the radix cache
that owns which slots hold which token prefixes."""

from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT, KVPool, ReqToTokenTable, SlotAllocator
from radixlm.runtime.mem_cache.radix_cache import (
    DisabledCache,
    MatchResult,
    PrefixCache,
    RadixCache,
    TreeNode,
    common_prefix_len,
)

__all__ = [
    "PAD_SLOT",
    "DisabledCache",
    "KVPool",
    "MatchResult",
    "PrefixCache",
    "RadixCache",
    "ReqToTokenTable",
    "SlotAllocator",
    "TreeNode",
    "common_prefix_len",
]
