"""The int4_kivi store + attention in plain PyTorch (the CPU implementation).

One call does a whole layer for a batch, in three phases per request row:

1. store: the exact tail plus this step's tokens; every block that becomes complete is
   rotated, quantized and written into its page (the old tail is read first: its rows live in
   the pages the store writes, s4kv.format "The exact tail");
2. attend: queries read complete blocks from the pages (dequantized, rotated basis, with the
   rotated query) and the rest exact (original basis), following the position rule of
   ``s4kv.format``;
3. keep: the new incomplete tail is written into its pages. This comes last because phase 2
   may still need the old tail tokens.

Single-token (decode) rows are done together, vectorized over rows, tokens and heads; rows with
longer queries (prefill chunks) one by one, vectorized over tokens and heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from s4kv import format as fmt


@dataclass
class Segment:
    keys: torch.Tensor  # [..., Hkv, L, D]
    values: torch.Tensor  # [..., Hkv, L, D]
    mask: torch.Tensor  # [..., Tq, L] (broadcast over heads)
    rotated: bool  # pages: rotated basis


def _attend(q: torch.Tensor, segments: list[Segment], scale: float) -> torch.Tensor:
    """Softmax attention over key segments. q [..., Hkv, G*Tq... ] see callers: q [..., Hkv, M, D]
    (M = query rows per kv head), keys/values [..., Hkv, L, D], masks [..., M, L]. Returns
    [..., Hkv, M, D] in the original basis (float64; callers cast to the model dtype).

    Accumulated in float64 so that a query's result does not depend on the batch it is in: the
    tensor shapes here (other rows' page counts, where a chunk starts and ends) change how fp32
    matmul and softmax reductions are ordered, and that rounding noise, rounded to the model dtype
    and amplified by int4 quantization of later tokens, changed greedy tokens with the batch
    composition (chunking, preemption, prefix hits) where a 16-bit cache gives identical tokens.
    In float64 the noise stays far below the model dtype's rounding."""
    qf = q.double()
    d = q.shape[-1]
    pm1 = fmt.rotation_pm1(d, q.device, torch.float64)  # R * sqrt(D), entries +-1
    q_rot = (qf @ pm1) * (1.0 / math.sqrt(d)) if any(s.rotated for s in segments) else None
    scores = []
    for seg in segments:
        qq = q_rot if seg.rotated else qf
        s = torch.matmul(qq, seg.keys.double().transpose(-1, -2)) * scale
        scores.append(s.masked_fill(~seg.mask.unsqueeze(-3), float("-inf")))
    p = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = torch.zeros_like(qf)
    out_rot = None
    start = 0
    for seg in segments:
        n = seg.keys.shape[-2]
        part = torch.matmul(p[..., start:start + n], seg.values.double())
        if seg.rotated:
            out_rot = part if out_rot is None else out_rot + part
        else:
            out = out + part
        start += n
    return out if out_rot is None else out + (out_rot @ pm1.T) * (1.0 / math.sqrt(d))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, regions: torch.Tensor,
            md, scale: float, out: torch.Tensor, store: bool = True) -> None:
    """One layer for a batch.

    q [N, Hq, D], k, v [N, Hkv, D] (model dtype, as the layer computed them); regions [num_blocks,
    Hkv, region_bytes] uint8 (a view of the layer's cache, exact tails included); out [N, Hq, D]
    is written for every row with a query. ``store=False`` (a layer sharing another layer's cache)
    attends without writing.
    """
    bs = fmt.BLOCK_SIZE
    d = q.shape[-1]
    n = md.num_reqs
    qsl_t = md.query_start_loc_cpu[: n + 1].long()
    qlens = qsl_t[1:] - qsl_t[:-1]
    decode_rows = (qlens == 1).nonzero().flatten()
    if len(decode_rows):
        _decode_rows(decode_rows, q, k, v, regions, md, scale, out, store)
    qsl = qsl_t.tolist()
    seq_lens = md.seq_lens_cpu.tolist()
    block_table = md.block_table.long()
    tb = fmt.tail_blocks(d, k.dtype.itemsize)
    hkv = k.shape[1]
    group = q.shape[1] // hkv
    for r in range(n):
        s, e = qsl[r], qsl[r + 1]
        qlen = e - s
        if qlen <= 1:  # decode rows are done above
            continue
        seq_len = seq_lens[r]
        ctx = seq_len - qlen
        first = ctx // bs  # first block that was not complete before this step
        n_full = seq_len // bs  # complete blocks after this step
        kept = ctx - first * bs  # tokens of block `first` already in its exact tail
        # Exact K/V of positions first*bs .. seq_len-1, [Hkv, L, D], read before the store
        # overwrites the old tail's pages.
        k_old, v_old = fmt.read_tail(regions, block_table[r:r + 1, first:first + tb], kept, k.dtype)
        k_exact = torch.cat([k_old[0], k[s:e].transpose(0, 1)], dim=1)
        v_exact = torch.cat([v_old[0], v[s:e].transpose(0, 1)], dim=1)
        blocks = block_table[r, :n_full]

        # 1. store every block completed by this step
        if store and n_full > first:
            m = n_full - first
            kb = k_exact[:, : m * bs].reshape(hkv, m, bs, d).transpose(0, 1)
            vb = v_exact[:, : m * bs].reshape(hkv, m, bs, d).transpose(0, 1)
            regions.index_copy_(0, blocks[first:].to(regions.device), fmt.encode_blocks(kb, vb))

        # 2. attend; queries laid out [Hkv, G*qlen, D] (head-major inside a group)
        pos_q = torch.arange(ctx, seq_len).repeat(group)[:, None]
        boundary = (pos_q + 1) // bs * bs  # queries read positions below this from pages
        qg = q[s:e].reshape(qlen, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * qlen, d)
        segments = []
        if n_full:
            kq, vq = fmt.decode_blocks(regions[blocks.to(regions.device)], d, k.dtype)  # [n_full, Hkv, bs, D]
            segments.append(Segment(kq.transpose(0, 1).reshape(hkv, n_full * bs, d),
                                    vq.transpose(0, 1).reshape(hkv, n_full * bs, d),
                                    (torch.arange(n_full * bs)[None, :] < boundary).to(q.device), True))
        pos_x = torch.arange(first * bs, seq_len)[None, :]
        segments.append(Segment(k_exact, v_exact, ((pos_x >= boundary) & (pos_x <= pos_q)).to(q.device), False))
        o = _attend(qg, segments, scale)  # [Hkv, G*qlen, D]
        out[s:e] = o.reshape(hkv, group, qlen, d).permute(2, 0, 1, 3).reshape(qlen, -1, d).to(out.dtype)

        # 3. keep the incomplete tail exact: the tokens of block n_full this step computed
        if store:
            tail = seq_len - n_full * bs
            new = min(tail, qlen)
            if new:
                pos = torch.arange(tail - new, tail)[None, :]
                fmt.write_tail(regions, block_table[r:r + 1, n_full:n_full + tb], pos,
                               k_exact[:, -new:].transpose(0, 1)[None], v_exact[:, -new:].transpose(0, 1)[None])


def _decode_rows(rows: torch.Tensor, q, k, v, regions, md, scale, out, store) -> None:
    """All single-token rows at once (the steady state of serving): no per-request Python loop."""
    bs = fmt.BLOCK_SIZE
    d = q.shape[-1]
    dev = q.device
    tok = md.query_start_loc_cpu[rows].long().to(dev)
    seq = md.seq_lens_cpu[rows].long()
    p = seq - 1  # query positions
    n_pages = seq // bs  # complete blocks, read quantized
    kept = p % bs  # exact tail tokens before p in its block
    completes = (seq % bs) == 0  # this token completes its block: nothing of the block stays exact
    k_new, v_new = k[tok], v[tok]  # [R, Hkv, D]
    bt = md.block_table[rows.to(md.block_table.device)].long()
    r_count, hkv = len(rows), k.shape[1]
    group = q.shape[1] // hkv
    # the tail of block p // bs (read before the store, which overwrites its first rows when the
    # block completes), as [R, Hkv, bs - 1, D]
    tail_block = (p // bs).to(bt.device)
    tail_pages = torch.gather(bt, 1, tail_block[:, None] + torch.arange(fmt.tail_blocks(d, k.dtype.itemsize), device=bt.device)[None, :])
    k_old, v_old = fmt.read_tail(regions, tail_pages, bs - 1, k.dtype)
    # rows past a request's tail hold other bytes of its pages (any bit pattern, NaN included)
    live = (torch.arange(bs - 1)[None, :] < kept[:, None]).to(dev)[:, None, :, None]
    k_old, v_old = k_old.where(live, 0), v_old.where(live, 0)

    if store and bool(completes.any()):
        c = completes.nonzero().flatten()
        cd = c.to(dev)
        kb = torch.cat([k_old[cd], k_new[cd].unsqueeze(2)], dim=2)  # [C, Hkv, bs, D]
        vb = torch.cat([v_old[cd], v_new[cd].unsqueeze(2)], dim=2)
        ids = bt[c.to(bt.device), (n_pages[c] - 1).to(bt.device)]
        regions.index_copy_(0, ids.to(regions.device), fmt.encode_blocks(kb, vb))

    segments = []
    max_pages = int(n_pages.max())
    if max_pages:
        cols = torch.arange(max_pages)
        page_ok = cols[None, :] < n_pages[:, None]  # [R, P]
        ids = torch.where(page_ok.to(bt.device), bt[:, :max_pages], bt[:, :1])
        kq, vq = fmt.decode_blocks(regions[ids.to(regions.device)], d, k.dtype)  # [R, P, Hkv, bs, D]
        # a row's padding pages are some page of its own (an exact tail, say): any bytes, NaN included
        ok = page_ok.to(dev)[:, :, None, None, None]
        kq, vq = kq.where(ok, 0), vq.where(ok, 0)
        segments.append(Segment(kq.permute(0, 2, 1, 3, 4).reshape(r_count, hkv, max_pages * bs, d),
                                vq.permute(0, 2, 1, 3, 4).reshape(r_count, hkv, max_pages * bs, d),
                                page_ok.repeat_interleave(bs, dim=1)[:, None, :].to(dev), True))
    # exact: tail tokens 0..kept-1 and the new token, unless the block just completed
    idx = torch.arange(bs)
    exact_ok = ((idx[None, :] < kept[:, None]) | (idx[None, :] == bs - 1)) & ~completes[:, None]
    segments.append(Segment(torch.cat([k_old, k_new.unsqueeze(2)], dim=2),
                            torch.cat([v_old, v_new.unsqueeze(2)], dim=2),
                            exact_ok[:, None, :].to(dev), False))
    qg = q[tok].reshape(r_count, hkv, group, d)
    o = _attend(qg, segments, scale)  # [R, Hkv, G, D]
    out[tok] = o.reshape(r_count, -1, d).to(out.dtype)

    if store:
        keep = (~completes).nonzero().flatten()
        if len(keep):
            kd = keep.to(dev)
            fmt.write_tail(regions, tail_pages[keep.to(bt.device)], kept[keep][:, None].to(bt.device),
                           k_new[kd].unsqueeze(1), v_new[kd].unsqueeze(1))
