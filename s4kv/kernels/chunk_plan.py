"""Host-side plan of chunk attention (prefill, chunked prefill, prefix-cache extends): which pages
each chunk row needs in the 16-bit scratch, and the FlashAttention call that reads them.

The position rule of ``s4kv.format`` says a query at position p reads positions below
B(p) = floor((p + 1) / UNIT) * UNIT from pages and B(p)..p from window rows. Queries with the same
g = floor((p + 1) / UNIT) see the same thing: the pages of units 0..g-1, then the rows of unit g up
to themselves. So the queries of a row are cut into *groups* by g (positions g*UNIT - 1 ..
g*UNIT + UNIT - 2: the last token of a unit already sees its own unit from pages), and every group
becomes one sequence of a paged, causal FlashAttention call whose key pages are

    [ page 0 dequantized, ..., page 2g-1 dequantized, block 2g's rows, block 2g+1's rows ]

(the rows' blocks as far as the group's queries reach) with the causal mask aligned at the bottom
right (FlashAttention's convention), so query p sees keys 0..p of that list: exactly the position
rule. The dequantized pages are shared by all groups of a row (the block table lists them again),
so each page is unpacked once per row and layer, in the original basis, and the attention is
vLLM's own FlashAttention.

A plan is a list of waves: a wave is as many consecutive chunk rows as the scratch holds (an
engine reserves enough for one row of max_model_len plus a full chunk, so a wave has at least
one row). Everything here depends on lengths only, so one plan serves every layer of a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import torch

from s4kv import format as fmt

# What a scratch page is filled with (the stage kernel's `kind`).
PAGE = 0  # a block of a complete unit, dequantized from its int4 page (original basis)
WINDOW = 1  # a block's window rows (the request's window and this step's rows; zeros after them),
# dequantized and rotated back


def scratch_pages(max_model_len: int, max_num_batched_tokens: int) -> int:
    """Scratch pages that hold any single chunk row: every block of a max_model_len sequence, and
    two window blocks per group of a chunk of max_num_batched_tokens (a chunk meets at most
    cdiv(chunk, UNIT) + 1 groups)."""
    return -(-max_model_len // fmt.BLOCK_SIZE) + fmt.UNIT_BLOCKS * (-(-max_num_batched_tokens // fmt.UNIT) + 1)


@dataclass
class Wave:
    """One FlashAttention call over the queries q[tok0:tok1] and the scratch pages 0..len(jobs)-1."""

    tok0: int
    tok1: int
    row0: int  # the wave's batch rows: row0 .. row1 - 1 (whole rows)
    row1: int
    max_new_blocks: int  # the most blocks one of its rows completes in this step
    jobs: np.ndarray  # [pages, 3] int32: (batch row, block index in the row, PAGE | WINDOW); page i <- jobs[i]
    cu_seqlens_q: np.ndarray  # [groups + 1] int32, relative to tok0
    seqused_k: np.ndarray  # [groups] int32: keys of each group (its last query's position + 1)
    block_table: np.ndarray  # [groups, width] int32: scratch pages of each group, in key order
    device: dict = field(default_factory=dict)  # the arrays above as device tensors (to_device)
    # jobs of each kind: a kind with none needs no stage launch (a step of prompts shorter than a
    # unit reads no page, and a launch costs ~20-40 us of host time per layer: tools/launch_host_time.py)
    page_jobs: int = field(init=False)
    window_jobs: int = field(init=False)
    # FlashAttention's launch bounds, computed once here: every layer of the step reads them
    max_seqlen_q: int = field(init=False)
    max_seqlen_k: int = field(init=False)

    def __post_init__(self):
        self.max_seqlen_q = int(np.diff(self.cu_seqlens_q).max())
        self.max_seqlen_k = int(self.seqused_k.max())
        self.window_jobs = int(self.jobs[:, 2].sum())
        self.page_jobs = len(self.jobs) - self.window_jobs


def plan_chunks(query_start_loc: np.ndarray, seq_lens: np.ndarray, first_row: int,
                capacity: int | None) -> list[Wave]:
    """Waves for the batch rows first_row.. (host copies of the metadata; rows with no query are
    skipped). `capacity`: scratch pages a wave may use (None: no limit, one wave).

    Closed forms, vectorized over rows, groups and pages: the plan is host time in every step with a
    chunk row, and built page by page in Python it took 80-440 µs per step (tools/plan_time.py).
    Per row with context ctx and length L (queries ctx..L-1):
    - groups g = g0 .. L // UNIT with g0 = (ctx + 1) // UNIT, none of them empty: g's queries are
      max(ctx, g*UNIT - 1) .. min(L - 1, g*UNIT + UNIT - 2);
    - pages: blocks 0 .. n_full - 1 (n_full = L // UNIT * UNIT_BLOCKS), then the window blocks
      UNIT_BLOCKS*g0 .. (L - 1) // BLOCK_SIZE: each group reads the blocks of its unit that its last
      query reaches, and over the row's groups those are consecutive;
    - group g's key pages: the row's first UNIT_BLOCKS*g pages, then its unit's window blocks up to
      its last query, window block b being the row's page n_full + b - UNIT_BLOCKS*g0."""
    unit, ub = fmt.UNIT, fmt.UNIT_BLOCKS
    n = len(seq_lens)
    q_start = np.asarray(query_start_loc[first_row:n + 1], dtype=np.int64)
    seq = np.asarray(seq_lens[first_row:n], dtype=np.int64)
    qlen = q_start[1:] - q_start[:-1]
    rows = np.arange(first_row, n)
    has_query = qlen > 0
    if not has_query.all():
        rows, seq, qlen, q_start = rows[has_query], seq[has_query], qlen[has_query], q_start[:-1][has_query]
        if not len(rows):
            return []
    ctx = seq - qlen
    g0 = (ctx + 1) // unit
    n_full = seq // unit * ub
    need = n_full + (seq - 1) // fmt.BLOCK_SIZE + 1 - ub * g0  # pages of the row: n_full + its window blocks
    if capacity is not None and int(need.max()) > capacity:
        i = int(np.argmax(need > capacity))
        raise RuntimeError(f"int4_kivi chunk attention: a row of {int(seq[i])} tokens ({int(qlen[i])} new) needs "
                           f"{int(need[i])} scratch pages, {capacity} reserved")
    # waves: as many consecutive rows as fit the capacity (a row starts a new wave when it does not)
    bounds = [0]
    if capacity is not None and int(need.sum()) > capacity:
        used = 0
        for i, pages in enumerate(need.tolist()):
            if used + pages > capacity:
                bounds.append(i)
                used = 0
            used += pages
    bounds.append(len(rows))
    tok = q_start.tolist()
    new_blocks = (n_full - ctx // unit * ub).tolist()
    return [_wave(tok[a], tok[b - 1] + int(qlen[b - 1]), rows[a:b], ctx[a:b], seq[a:b], g0[a:b], n_full[a:b],
                  need[a:b], max(new_blocks[a:b])) for a, b in pairwise(bounds)]


def _wave(tok0, tok1, rows, ctx, seq, g0, n_full, need, max_new_blocks) -> Wave:
    """One wave's arrays from its rows' closed forms (plan_chunks). Few numpy calls: on arrays this
    small each costs about a microsecond, whatever its size."""
    bs, unit, ub = fmt.BLOCK_SIZE, fmt.UNIT, fmt.UNIT_BLOCKS
    first_page = np.cumsum(need) - need
    # jobs: per row its n_full PAGE blocks, then its window blocks from UNIT_BLOCKS*g0 on
    job_row = np.repeat(np.arange(len(rows)), need)
    within = np.arange(len(job_row)) - first_page[job_row]
    n_full_j = n_full[job_row]
    is_window = within >= n_full_j
    jobs = np.empty((len(job_row), 3), dtype=np.int32)
    jobs[:, 0] = rows[job_row]
    jobs[:, 1] = within + is_window * (ub * g0[job_row] - n_full_j)
    jobs[:, 2] = is_window  # WINDOW = 1, PAGE = 0
    # groups, in row order
    n_groups = seq // unit - g0 + 1
    grp_row = np.repeat(np.arange(len(rows)), n_groups)
    g_unit = (g0[grp_row] + np.arange(len(grp_row)) - (np.cumsum(n_groups) - n_groups)[grp_row]) * unit
    p0 = np.maximum(ctx[grp_row], g_unit - 1)
    p1 = np.minimum(seq[grp_row] - 1, g_unit + unit - 2)
    own = g_unit // bs  # pages of the complete units before the group's (UNIT_BLOCKS * g)
    width = own + np.minimum(p1 // bs - own + 1, ub)  # and the window blocks of its unit it reaches
    col = np.arange(int(width.max()))
    table = (first_page[grp_row][:, None] + col) + (col >= own[:, None]) * (n_full - ub * g0)[grp_row][:, None]
    table[col >= width[:, None]] = 0
    cu = np.zeros(len(p0) + 1, dtype=np.int32)
    np.cumsum(p1 - p0 + 1, out=cu[1:])
    return Wave(tok0, tok1, int(rows[0]), int(rows[-1]) + 1, max_new_blocks, jobs, cu, (p1 + 1).astype(np.int32),
                table.astype(np.int32))


def to_device(waves: list[Wave], device) -> list[Wave]:
    """Upload every wave's arrays in one host-to-device copy (views into one int32 buffer)."""
    if not waves:
        return waves
    parts = [a for w in waves for a in (w.jobs, w.cu_seqlens_q, w.seqused_k, w.block_table)]
    flat = torch.from_numpy(np.concatenate([a.ravel() for a in parts])).to(device, non_blocking=True)
    off = 0
    for w in waves:
        for name in ("jobs", "cu_seqlens_q", "seqused_k", "block_table"):
            a = getattr(w, name)
            w.device[name] = flat[off:off + a.size].view(a.shape)
            off += a.size
    return waves
