"""The int4_kivi store + attention with the Triton kernels (the CUDA implementation).

Same contract as ``s4kv.backend.torch_ops.forward``; the phases are separate launches:
this step's tokens as 8-bit window rows, with the decode rows' queries rotated and their rows
written into their windows, and the chunk rows' queries cast for FlashAttention, in the same
launch -> store the units decode rows complete -> decode rows (split-KV) -> chunk rows, wave by
wave (stage their window blocks, store the units they complete, stage their pages,
FlashAttention) -> append the chunk rows' windows. The order follows
the windows: a chunk row's old window lives in the pages its store and its new window rows
overwrite (s4kv.format), so everything that reads it comes before them; a decode row's new row
goes to the slot after its window, which nothing reads in this step.
"""

from __future__ import annotations

import torch

from s4kv.kernels.chunk import chunk_attention, staged_queries
from s4kv.kernels.decode import decode_attention, programmatic_rows
from s4kv.kernels.store import append_window, quantize_rows, store_blocks


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, regions: torch.Tensor,
            md, scale: float, out: torch.Tensor, store: bool = True) -> None:
    # one launch also rotates the decode rows' queries, (store) writes their rows into their windows
    # and casts the chunk rows' queries for FlashAttention
    staged_q = staged_queries(q, md)
    # the row kernel and the decode rows' store overlap the launches after them (an option, off)
    pdl = store and md.num_decodes > 0 and programmatic_rows(q.device)
    rows = quantize_rows(k, v, decodes=(q, regions, md, scale) if store else None,
                         stage=None if staged_q is None else (q, staged_q, md.num_decodes), pdl=pdl)
    if store:
        # a decode row completes at most one unit: one program per block
        store_blocks(rows, regions, md, md.decode_stores, q.dtype, rows_range=(0, md.num_decodes), pdl=pdl)
    decode_attention(q, rows, regions, md, md.num_decodes, scale, out, md.decode_splits, queries_rotated=store)
    chunk_attention(q, rows, regions, md, md.num_decodes, scale, out, store=store, staged_q=staged_q)
    if store:
        append_window(rows, regions, md, first_row=md.num_decodes)
