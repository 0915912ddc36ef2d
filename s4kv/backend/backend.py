"""The backend class vLLM selects for ``--kv-cache-dtype int4_kivi`` (through the selector patch).

One class serves vLLM 0.24 and 0.32: each version calls only its own page-shaping method
(0.24: ``get_kv_cache_shape``; 0.32: ``customize_spec`` + ``supported_kv_cache_layouts``).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend

from s4kv import format as fmt


class S4KVAttentionBackend(AttentionBackend):
    # The store needs each row's window and completed units together, which only forward() has.
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = [fmt.KV_CACHE_DTYPE]

    @staticmethod
    def get_name() -> str:
        # Attention.__init__ looks the name up in AttentionBackendEnum; CUSTOM is the member meant
        # for out-of-tree backends (registered to this class by s4kv.vllm_hooks).
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        from s4kv.backend.impl import S4KVAttentionImpl

        return S4KVAttentionImpl

    @staticmethod
    def get_builder_cls():
        from s4kv.backend.metadata import S4KVMetadataBuilder

        return S4KVMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return [fmt.BLOCK_SIZE]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(fmt.SUPPORTED_HEAD_SIZES)

    # vLLM 0.24: the page view
    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = fmt.KV_CACHE_DTYPE) -> tuple[int, ...]:
        return (num_blocks, num_kv_heads, block_size, fmt.bytes_per_token_per_head(head_size))

    # vLLM 0.32: the page content per (block, head, token)
    @classmethod
    def customize_spec(cls, spec):
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        from s4kv.backend.spec import S4KVFullAttentionSpec

        content = fmt.bytes_per_token_per_head(spec.head_size)
        if type(spec) is not FullAttentionSpec:  # refused at startup (s4kv.validation)
            return replace(spec, state_content_bytes=content)
        base = {f.name: getattr(spec, f.name) for f in fields(spec)}
        return S4KVFullAttentionSpec(**{**base, "state_content_bytes": content})

    @classmethod
    def supported_kv_cache_layouts(cls):
        from vllm.v1.kv_cache_layout import KVCacheLayout  # vLLM 0.32+ only calls this

        # Any layout whose [N, C] (tokens, bytes) is contiguous inside one (block, head): kernels
        # take the block and head strides from the tensor.
        return tuple(m for m in KVCacheLayout if m.value[-2:] == (3, 4))
