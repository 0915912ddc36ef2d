"""The int4_kivi KV-cache spec and its block manager.

The spec is a full-attention spec whose page is the real int4_kivi page (vLLM 0.24 builds it
through the patched ``Attention.get_kv_cache_spec``, 0.32 through the backend's
``customize_spec``). Its manager, registered with vLLM's KV-cache spec registry (the documented
way to plug in a spec type; no vLLM code is changed for it), gives a request of L tokens
``fmt.blocks_held(L)`` pages instead of cdiv(L, BLOCK_SIZE): its blocks and the pages where its
window lives (s4kv.format, "The window"). So the window is allocated, counted, freed on finish
and preemption, and checked for room before a request is admitted by vLLM's own allocator, and
nothing is reserved per ``max_num_seqs``. It also keeps prefix caching to whole units (two
blocks): a block is offered to the prefix cache only once its unit is complete (before that its
page holds window rows, not its quantized codes), and a hit is cut at a unit boundary (the first
query after it must find no window rows it did not write: s4kv.format, the position rule). A
preempted request resumes through the same lookup.

No new dataclass fields: ``FullAttentionSpec.merge`` rebuilds ``cls(...)`` from the base fields.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

from s4kv import format as fmt


def _with_window(num_tokens: int) -> int:
    """Token slots to ask the full-attention manager for, so that it allocates blocks_held pages
    (the request's blocks and its window's pages)."""
    return fmt.blocks_held(num_tokens) * fmt.BLOCK_SIZE


class S4KVAttentionManager(FullAttentionManager):
    """Full attention whose requests also hold the pages of their window, and whose prefix cache
    holds whole units. Everything else (freeing, eviction) is the full-attention manager's."""

    def get_num_blocks_to_allocate(self, request_id, num_tokens, *args, **kwargs) -> int:
        return super().get_num_blocks_to_allocate(request_id, _with_window(num_tokens), *args, **kwargs)

    def allocate_new_blocks(self, request_id, num_tokens, *args, **kwargs):
        return super().allocate_new_blocks(request_id, _with_window(num_tokens), *args, **kwargs)

    def cache_blocks(self, request, num_tokens, *args, **kwargs):
        # the blocks of complete units only: an incomplete unit's pages hold its window rows
        return super().cache_blocks(request, num_tokens // fmt.UNIT * fmt.UNIT, *args, **kwargs)

    @classmethod
    def find_longest_cache_hit(cls, *args, **kwargs):
        # hits end at a unit boundary (vLLM rounds a hit down to alignment_tokens; a unit's blocks
        # can also be evicted one without the other)
        call = inspect.signature(super().find_longest_cache_hit).bind(*args, **kwargs)
        call.arguments["alignment_tokens"] = math.lcm(call.arguments["alignment_tokens"], fmt.UNIT)
        return super().find_longest_cache_hit(*call.args, **call.kwargs)


@dataclass(frozen=True, kw_only=True)
class S4KVFullAttentionSpec(FullAttentionSpec):
    @property
    def real_page_size_bytes(self) -> int:
        return self.num_kv_heads * fmt.PageLayout(self.head_size, self.block_size).region_bytes

    def max_num_blocks_per_req(self, vllm_config, max_len: int) -> int:  # vLLM 0.32+
        return fmt.blocks_held(max_len)

    def max_memory_usage_bytes(self, vllm_config) -> int:
        return fmt.blocks_held(vllm_config.model_config.max_model_len) * self.page_size_bytes


def tail_bytes_per_request(spec: FullAttentionSpec, num_layers: int) -> int:
    """KV-pool bytes of the WINDOW_PAGES pages a running request holds for its window (the pages
    of its incomplete unit and the ones after it)."""
    return fmt.WINDOW_PAGES * fmt.page_size_bytes(spec.num_kv_heads, spec.head_size) * num_layers


# vLLM registers its own specs lazily, only while the registry is empty: let it do so before
# ours goes in, or it would skip them.
KVCacheSpecRegistry.check_kv_cache_spec_registry({})
KVCacheSpecRegistry.register(S4KVFullAttentionSpec, S4KVAttentionManager, uniform_type_base_spec=FullAttentionSpec)
