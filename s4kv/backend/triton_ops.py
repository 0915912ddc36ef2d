"""The int4_kivi store + attention with the Triton kernels (the CUDA implementation).

Same contract as ``s4kv.backend.torch_ops.forward``; the phases are separate launches:
this step's tokens as 8-bit window rows, with the decode rows' queries rotated and their rows
written into their windows in the same launch -> store the units decode rows complete -> decode
rows (split-KV) -> chunk rows, wave by wave (stage their window blocks, store the units they
complete, stage their pages, FlashAttention) -> append the chunk rows' windows. The order follows
the windows: a chunk row's old window lives in the pages its store and its new window rows
overwrite (s4kv.format), so everything that reads it comes before them; a decode row's new row
goes to the slot after its window, which nothing reads in this step.
"""

from __future__ import annotations

import torch

from s4kv.kernels.chunk import chunk_attention
from s4kv.kernels.decode import decode_attention
from s4kv.kernels.store import append_window, quantize_rows, store_blocks


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, regions: torch.Tensor,
            md, scale: float, out: torch.Tensor, store: bool = True) -> None:
    # one launch also rotates the decode rows' queries and (store) writes their rows into their windows
    rows = quantize_rows(k, v, decodes=(q, regions, md, scale) if store else None)
    if store:
        # a decode row completes at most one unit: one program per block
        store_blocks(rows, regions, md, md.decode_stores, q.dtype, rows_range=(0, md.num_decodes))
    decode_attention(q, rows, regions, md, md.num_decodes, scale, out, md.decode_splits, queries_rotated=store)
    chunk_attention(q, rows, regions, md, md.num_decodes, scale, out, store=store)
    if store:
        append_window(rows, regions, md, first_row=md.num_decodes)
