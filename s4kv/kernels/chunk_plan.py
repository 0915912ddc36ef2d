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
    # FlashAttention's launch bounds, computed once here: every layer of the step reads them
    max_seqlen_q: int = field(init=False)
    max_seqlen_k: int = field(init=False)

    def __post_init__(self):
        self.max_seqlen_q = int(np.diff(self.cu_seqlens_q).max())
        self.max_seqlen_k = int(self.seqused_k.max())


def _row_groups(ctx: int, seq_len: int):
    """(first position, last position, g) of every non-empty group of a row's queries ctx..seq_len-1."""
    unit = fmt.UNIT
    for g in range((ctx + 1) // unit, seq_len // unit + 1):
        p0, p1 = max(ctx, g * unit - 1), min(seq_len - 1, g * unit + unit - 2)
        if p0 <= p1:
            yield p0, p1, g


def _window_blocks(g: int, p1: int) -> list[int]:
    """The blocks of unit g whose rows a group reaching position p1 reads."""
    return [b for b in range(fmt.UNIT_BLOCKS * g, fmt.UNIT_BLOCKS * (g + 1)) if p1 >= b * fmt.BLOCK_SIZE]


def plan_chunks(query_start_loc: np.ndarray, seq_lens: np.ndarray, first_row: int,
                capacity: int | None) -> list[Wave]:
    """Waves for the batch rows first_row.. (host copies of the metadata; rows with no query are
    skipped). `capacity`: scratch pages a wave may use (None: no limit, one wave)."""
    waves: list[Wave] = []
    cur: dict | None = None

    def close():
        if cur and cur["groups"]:
            width = max(len(p) for p in cur["groups"])
            table = np.zeros((len(cur["groups"]), width), dtype=np.int32)
            for i, pages in enumerate(cur["groups"]):
                table[i, :len(pages)] = pages
            waves.append(Wave(cur["tok0"], cur["tok1"], cur["row0"], cur["row1"], cur["new"],
                              np.asarray(cur["jobs"], dtype=np.int32).reshape(-1, 3),
                              np.asarray(cur["cu"], dtype=np.int32), np.asarray(cur["used"], dtype=np.int32),
                              table))

    for r in range(first_row, len(seq_lens)):
        q0, q1 = int(query_start_loc[r]), int(query_start_loc[r + 1])
        seq_len = int(seq_lens[r])
        qlen = q1 - q0
        if qlen <= 0:
            continue
        ctx = seq_len - qlen
        groups = list(_row_groups(ctx, seq_len))
        n_full = seq_len // fmt.UNIT * fmt.UNIT_BLOCKS  # blocks in pages after this step
        window = [b for _, p1, g in groups for b in _window_blocks(g, p1)]
        need = n_full + len(window)
        if capacity is not None and need > capacity:
            raise RuntimeError(f"int4_kivi chunk attention: a row of {seq_len} tokens ({qlen} new) needs {need} "
                               f"scratch pages, {capacity} reserved")
        if cur is None or (capacity is not None and len(cur["jobs"]) + need > capacity):
            close()
            cur = {"tok0": q0, "tok1": q0, "row0": r, "row1": r, "new": 0, "jobs": [], "cu": [0], "used": [],
                   "groups": []}
        base = len(cur["jobs"])
        cur["jobs"] += [(r, b, PAGE) for b in range(n_full)]
        window_page = {b: base + n_full + i for i, b in enumerate(window)}
        cur["jobs"] += [(r, b, WINDOW) for b in window]
        for p0, p1, g in groups:
            pages = list(range(base, base + fmt.UNIT_BLOCKS * g))
            cur["groups"].append(pages + [window_page[b] for b in _window_blocks(g, p1)])
            cur["cu"].append(cur["cu"][-1] + p1 - p0 + 1)
            cur["used"].append(p1 + 1)
        cur["tok1"] = q1
        cur["row1"] = r + 1
        cur["new"] = max(cur["new"], n_full - ctx // fmt.UNIT * fmt.UNIT_BLOCKS)
    close()
    return waves


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
