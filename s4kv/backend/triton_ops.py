"""The int4_kivi store + attention with the Triton kernels (the CUDA implementation).

Same contract as ``s4kv.backend.torch_ops.forward``; the phases are separate launches:
store the blocks decode rows complete -> decode rows (split-KV) -> chunk rows, wave by wave
(stage their exact blocks, store the blocks they complete, stage their pages, FlashAttention) ->
append tails. The order follows the tails: a row's old tail lives in the pages its store writes
(s4kv.format), so everything that reads it comes before that row's store.
"""

from __future__ import annotations

import torch

from s4kv.kernels.chunk import chunk_attention
from s4kv.kernels.decode import decode_attention
from s4kv.kernels.store import append_tail, store_blocks


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, regions: torch.Tensor,
            md, scale: float, out: torch.Tensor, store: bool = True) -> None:
    if store:
        store_blocks(k, v, regions, md, min(md.max_new_blocks, 1), rows=(0, md.num_decodes))
    decode_attention(q, k, v, regions, md, md.num_decodes, scale, out, md.decode_splits)
    chunk_attention(q, k, v, regions, md, md.num_decodes, scale, out, store=store)
    if store:
        append_tail(k, v, regions, md)
