"""What one step's batch looks like to the kernels: the rows, their lengths and pages (device
tensors and the host copies the launches are planned from), and the launch shapes
planned from them. The backend's metadata builder fills it from vLLM's metadata; tests and
benchmarks build it directly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from s4kv import format as fmt


@dataclass
class S4KVMetadata:
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, device
    seq_lens: torch.Tensor  # [num_reqs] int32, device: context length after this step
    # [num_reqs, max_blocks] int32, device: a row of L tokens lists fmt.blocks_held(L) pages
    # (its blocks, then the rest of its window's pages)
    block_table: torch.Tensor
    # Host copies, exact for everything s4kv accepts (no speculative decoding).
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    # Launch shapes, from the host copies (constant for a captured decode graph).
    num_decodes: int = 0  # leading rows with query length 1 (the runner puts decodes first)
    max_new_blocks: int = 0  # most blocks any row's completed units hold in this step
    # The decode rows' block store's programs per row: UNIT_BLOCKS (one per block of the unit a row
    # completes, stored at once) when it must launch, that is when some decode row may complete its
    # unit (always in a captured decode graph; outside one, only when one does: a mixed step's
    # launches are paid on the host, tools/gpu/host_overhead.py); else 0
    decode_stores: int = 0
    decode_splits: int = 1  # KV splits per decode row and kv head
    # The chunk rows' plan (s4kv.kernels.chunk_plan), made by the first layer of the step that needs it.
    chunk_waves: tuple | None = None


def plan_launch(md: S4KVMetadata, num_kv_heads: int, num_sms: int, uniform_decode: bool = False) -> S4KVMetadata:
    """Fill the launch shapes of ``md`` from its host copies.

    ``uniform_decode``: every row is a single-token decode (the shape of a captured CUDA graph),
    so the values must not depend on the data of this particular batch.
    """
    from s4kv.kernels.decode import num_splits

    n = md.num_reqs
    if uniform_decode:
        md.num_decodes, md.max_new_blocks, md.decode_stores = n, fmt.UNIT_BLOCKS, fmt.UNIT_BLOCKS
    elif n:
        # numpy views of the host copies: on arrays this small a torch CPU op costs several times a
        # numpy one, and this runs on the host before every mixed or prefill step (tools/plan_time.py)
        qsl = md.query_start_loc_cpu.numpy()
        seq = md.seq_lens_cpu.numpy()[:n].astype(np.int64)
        qlens = qsl[1:n + 1] - qsl[:n]
        not_decode = np.flatnonzero(qlens != 1)
        md.num_decodes = int(not_decode[0]) if len(not_decode) else n
        ctx = seq - qlens
        md.max_new_blocks = int(((seq // fmt.UNIT - ctx // fmt.UNIT) * fmt.UNIT_BLOCKS).max())
        # a decode row completes its unit when its new token is the unit's last
        md.decode_stores = fmt.UNIT_BLOCKS * int(bool((seq[:md.num_decodes] % fmt.UNIT == 0).any()))
    else:
        md.num_decodes = md.max_new_blocks = md.decode_stores = 0
    md.decode_splits = num_splits(md.num_decodes, num_kv_heads, num_sms)
    return md
