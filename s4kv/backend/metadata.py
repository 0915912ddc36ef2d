"""The int4_kivi backend's metadata builder: vLLM's per-step metadata into the kernels' batch
(s4kv.kernels.batch.S4KVMetadata, shared by every layer of a step).

No per-request state lives outside vLLM's pages: a request's window is in pages its block
table lists (s4kv.format), so rows need nothing but the block table, whatever the runner does
with them (condense, swap, reorder) and whoever fills them (dummy and padding rows read and write
only the null page or pages of their own)."""

from __future__ import annotations

import torch

from s4kv import format as fmt
from s4kv.kernels import num_sms
from s4kv.kernels.batch import S4KVMetadata, plan_launch

try:  # vLLM is only needed when the backend is used inside an engine.
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder
except ImportError:  # pragma: no cover - s4kv's pure parts import without vLLM
    AttentionMetadataBuilder = object  # type: ignore[assignment,misc]
    AttentionCGSupport = None  # type: ignore[assignment]


class S4KVMetadataBuilder(AttentionMetadataBuilder):
    # Decode-only full CUDA graphs; prefill and mixed batches run piecewise (attention is a
    # graph-splitting op there).
    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if AttentionCGSupport else None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)  # decodes first: kernels split the batch on the host
        self.block_size = kv_cache_spec.block_size
        if self.block_size != fmt.BLOCK_SIZE:
            raise ValueError(f"int4_kivi needs block_size {fmt.BLOCK_SIZE}, the KV cache spec has "
                             f"{self.block_size}")
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.num_sms = num_sms(torch.device(device))

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> S4KVMetadata:
        cam = common_attn_metadata
        n = cam.num_reqs
        seq_lens_cpu = cam.seq_lens_cpu_upper_bound
        if seq_lens_cpu is None:
            seq_lens_cpu = cam.seq_lens.cpu()
        md = S4KVMetadata(
            num_reqs=n,
            num_actual_tokens=cam.num_actual_tokens,
            max_query_len=cam.max_query_len,
            max_seq_len=cam.max_seq_len,
            query_start_loc=cam.query_start_loc,
            seq_lens=cam.seq_lens,
            block_table=cam.block_table_tensor,
            query_start_loc_cpu=cam.query_start_loc_cpu,
            seq_lens_cpu=seq_lens_cpu[:n],
        )
        return plan_launch(md, self.num_kv_heads, self.num_sms, uniform_decode=self._uniform_decode(cam))

    @staticmethod
    def _uniform_decode(cam) -> bool:
        return cam.max_query_len == 1

    def build_for_cudagraph_capture(self, common_attn_metadata) -> S4KVMetadata:
        return self.build(0, common_attn_metadata)
