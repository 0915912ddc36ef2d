"""vLLM 0.24 only: the KV-cache spec whose page size is the real int4_kivi page.

(vLLM 0.32 lets the backend shape the page through ``customize_spec`` instead.) No new dataclass
fields: ``FullAttentionSpec.merge`` rebuilds ``cls(...)`` from the base fields, and vLLM's spec
registry resolves this subclass to the full-attention manager through its MRO.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.kv_cache_interface import FullAttentionSpec

from s4kv import format as fmt


@dataclass(frozen=True, kw_only=True)
class S4KVFullAttentionSpec(FullAttentionSpec):
    @property
    def real_page_size_bytes(self) -> int:
        return self.num_kv_heads * fmt.PageLayout(self.head_size, self.block_size).region_bytes
