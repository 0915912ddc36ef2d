"""The int4_kivi store + attention with the Triton kernels (the CUDA implementation).

Same contract as ``s4kv.backend.torch_ops.forward``; the phases are separate launches:
store completed blocks -> decode rows (split-KV) -> chunk rows (stage pages, FlashAttention) ->
append tails.
"""

from __future__ import annotations

import torch

from s4kv.kernels.chunk import chunk_attention
from s4kv.kernels.decode import decode_attention
from s4kv.kernels.store import append_tail, store_blocks


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, regions: torch.Tensor,
            res: torch.Tensor, md, scale: float, out: torch.Tensor, store: bool = True) -> None:
    if store:
        store_blocks(k, v, res, regions, md, md.max_new_blocks)
    decode_attention(q, k, v, res, regions, md, md.num_decodes, scale, out, md.decode_splits)
    chunk_attention(q, k, v, res, regions, md, md.num_decodes, scale, out)
    if store:
        append_tail(k, v, res, md)
