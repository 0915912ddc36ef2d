"""The int4_kivi store + attention in plain PyTorch (the CPU implementation).

One call does a whole layer for a batch, in three phases per request row:

1. store: this step's tokens become 8-bit window rows (s4kv.format.quantize_window); every unit
   that becomes complete is quantized from its rows (the old window's, read first: they live in
   the pages the store writes, s4kv.format "The window", and this step's) into its two pages;
2. attend: queries read complete units from the pages and the rest, their own token included,
   from window rows, all dequantized in the rotated basis with the rotated query, following the
   position rule of ``s4kv.format``;
3. keep: this step's rows of the new incomplete unit are written into the window's pages. This
   comes last because phase 2 may still need the old window's rows.

Single-token (decode) rows are done together, vectorized over rows, tokens and heads; rows with
longer queries (prefill chunks) one by one, vectorized over tokens and heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from s4kv import format as fmt


@dataclass
class Segment:
    keys: torch.Tensor  # [..., Hkv, L, D], rotated basis
    values: torch.Tensor  # [..., Hkv, L, D], rotated basis
    mask: torch.Tensor  # [..., Tq, L] (broadcast over heads)


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
    q_rot = fmt.rotate(q, torch.float64)
    scores = []
    for seg in segments:
        s = torch.matmul(q_rot, seg.keys.double().transpose(-1, -2)) * scale
        scores.append(s.masked_fill(~seg.mask.unsqueeze(-3), float("-inf")))
    p = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out_rot = torch.zeros_like(q_rot)
    start = 0
    for seg in segments:
        n = seg.keys.shape[-2]
        out_rot = out_rot + torch.matmul(p[..., start:start + n], seg.values.double())
        start += n
    return fmt.unrotate(out_rot, torch.float64)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, regions: torch.Tensor,
            md, scale: float, out: torch.Tensor, store: bool = True) -> None:
    """One layer for a batch.

    q [N, Hq, D], k, v [N, Hkv, D] (model dtype, as the layer computed them); regions [num_blocks,
    Hkv, region_bytes] uint8 (a view of the layer's cache, windows included); out [N, Hq, D]
    is written for every row with a query. ``store=False`` (a layer sharing another layer's cache)
    attends without writing.
    """
    bs, unit = fmt.BLOCK_SIZE, fmt.UNIT
    d = q.shape[-1]
    n = md.num_reqs
    qsl_t = md.query_start_loc_cpu[: n + 1].long()
    qlens = qsl_t[1:] - qsl_t[:-1]
    # every token's window row, once (codes and scales, and what they read back as)
    rows_k, rows_v = fmt.quantize_window(k), fmt.quantize_window(v)
    kw, vw = fmt.dequantize_window(*rows_k), fmt.dequantize_window(*rows_v)  # [N, Hkv, D] rotated
    decode_rows = (qlens == 1).nonzero().flatten()
    if len(decode_rows):
        _decode_rows(decode_rows, q, rows_k, rows_v, kw, vw, regions, md, scale, out, store)
    qsl = qsl_t.tolist()
    seq_lens = md.seq_lens_cpu.tolist()
    block_table = md.block_table.long()
    hkv = k.shape[1]
    group = q.shape[1] // hkv
    for r in range(n):
        s, e = qsl[r], qsl[r + 1]
        qlen = e - s
        if qlen <= 1:  # decode rows are done above
            continue
        seq_len = seq_lens[r]
        ctx = seq_len - qlen
        first = ctx // unit * fmt.UNIT_BLOCKS  # first block of the unit that was not complete before this step
        n_full = seq_len // unit * fmt.UNIT_BLOCKS  # blocks in pages after this step
        kept = ctx - first * bs  # rows of that unit already in its window
        # rows of positions first*bs .. seq_len-1, [Hkv, L, D] (rotated), the old ones read before the
        # store overwrites the old window's pages
        k_old, v_old = fmt.read_window(regions, block_table[r:r + 1, first:first + fmt.WINDOW_PAGES], kept)
        k_rows = torch.cat([k_old[0], kw[s:e].transpose(0, 1)], dim=1)
        v_rows = torch.cat([v_old[0], vw[s:e].transpose(0, 1)], dim=1)
        blocks = block_table[r, :n_full]

        # 1. store every block of the units completed by this step, from their rows
        if store and n_full > first:
            m = n_full - first
            kb = k_rows[:, : m * bs].reshape(hkv, m, bs, d).transpose(0, 1)
            vb = v_rows[:, : m * bs].reshape(hkv, m, bs, d).transpose(0, 1)
            regions.index_copy_(0, blocks[first:].to(regions.device), fmt.encode_window_blocks(kb, vb, k.dtype))

        # 2. attend; queries laid out [Hkv, G*qlen, D] (head-major inside a group)
        pos_q = torch.arange(ctx, seq_len).repeat(group)[:, None]
        boundary = fmt.pages_boundary(pos_q)  # queries read positions below this from pages
        qg = q[s:e].reshape(qlen, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * qlen, d)
        segments = []
        if n_full:
            kq, vq = fmt.decode_blocks(regions[blocks.to(regions.device)], d, k.dtype)  # [n_full, Hkv, bs, D]
            segments.append(Segment(kq.transpose(0, 1).reshape(hkv, n_full * bs, d),
                                    vq.transpose(0, 1).reshape(hkv, n_full * bs, d),
                                    (torch.arange(n_full * bs)[None, :] < boundary).to(q.device)))
        pos_x = torch.arange(first * bs, seq_len)[None, :]
        segments.append(Segment(k_rows, v_rows, ((pos_x >= boundary) & (pos_x <= pos_q)).to(q.device)))
        o = _attend(qg, segments, scale)  # [Hkv, G*qlen, D]
        out[s:e] = o.reshape(hkv, group, qlen, d).permute(2, 0, 1, 3).reshape(qlen, -1, d).to(out.dtype)

        # 3. keep this step's rows of the incomplete unit n_full / 2 in its window
        if store:
            tail = seq_len - n_full * bs
            new = min(tail, qlen)
            if new:
                pos = torch.arange(tail - new, tail)[None, :]
                t = slice(e - new, e)
                fmt.write_window(regions, block_table[r:r + 1, n_full:n_full + fmt.WINDOW_PAGES], pos,
                                 rows_k[0][t][None], rows_k[1][t][None], rows_v[0][t][None], rows_v[1][t][None])


def _decode_rows(rows: torch.Tensor, q, rows_k, rows_v, kw, vw, regions, md, scale, out, store) -> None:
    """All single-token rows at once (the steady state of serving): no per-request Python loop."""
    bs, unit = fmt.BLOCK_SIZE, fmt.UNIT
    d = q.shape[-1]
    dev = q.device
    tok = md.query_start_loc_cpu[rows].long().to(dev)
    seq = md.seq_lens_cpu[rows].long()
    p = seq - 1  # query positions
    n_pages = fmt.pages_boundary(p) // bs  # blocks read from pages
    kept = p % unit  # window rows before p in its unit
    completes = (seq % unit) == 0  # this token completes its unit: nothing of it stays in the window
    k_new, v_new = kw[tok], vw[tok]  # [R, Hkv, D] (rotated, 8-bit)
    bt = md.block_table[rows.to(md.block_table.device)].long()
    r_count, hkv = len(rows), kw.shape[1]
    group = q.shape[1] // hkv
    # the window of unit p // unit (read before the store, which overwrites its first pages when the
    # unit completes), as [R, Hkv, width, D]: as many rows as the longest window holds (unit - 1 when
    # a row completes its unit)
    width = int(kept.max())
    first = (p // unit * fmt.UNIT_BLOCKS).to(bt.device)
    window_pages = torch.gather(bt, 1, first[:, None] + torch.arange(fmt.WINDOW_PAGES, device=bt.device)[None, :])
    k_old, v_old = fmt.read_window(regions, window_pages, width)
    # rows past a request's window hold other bytes of its pages (any bit pattern, NaN included)
    live = (torch.arange(width)[None, :] < kept[:, None]).to(dev)[:, None, :, None]
    k_old, v_old = k_old.where(live, 0), v_old.where(live, 0)

    if store and bool(completes.any()):
        c = completes.nonzero().flatten()
        cd = c.to(dev)
        ku = torch.cat([k_old[cd], k_new[cd].unsqueeze(2)], dim=2)  # [C, Hkv, unit, D]
        vu = torch.cat([v_old[cd], v_new[cd].unsqueeze(2)], dim=2)
        blocks_of = [x.reshape(len(c), hkv, fmt.UNIT_BLOCKS, bs, d).transpose(1, 2) for x in (ku, vu)]
        ids = bt[c.to(bt.device)[:, None], (first[c.to(bt.device)][:, None]
                                            + torch.arange(fmt.UNIT_BLOCKS, device=bt.device)[None, :])]
        regions.index_copy_(0, ids.flatten().to(regions.device),
                            fmt.encode_window_blocks(*blocks_of, q.dtype).flatten(0, 1))

    segments = []
    max_pages = int(n_pages.max())
    if max_pages:
        cols = torch.arange(max_pages)
        page_ok = cols[None, :] < n_pages[:, None]  # [R, P]
        ids = torch.where(page_ok.to(bt.device), bt[:, :max_pages], bt[:, :1])
        kq, vq = fmt.decode_blocks(regions[ids.to(regions.device)], d, q.dtype)  # [R, P, Hkv, bs, D]
        # a row's padding pages are some page of its own (a window, say): any bytes, NaN included
        ok = page_ok.to(dev)[:, :, None, None, None]
        kq, vq = kq.where(ok, 0), vq.where(ok, 0)
        segments.append(Segment(kq.permute(0, 2, 1, 3, 4).reshape(r_count, hkv, max_pages * bs, d),
                                vq.permute(0, 2, 1, 3, 4).reshape(r_count, hkv, max_pages * bs, d),
                                page_ok.repeat_interleave(bs, dim=1)[:, None, :].to(dev)))
    # window: rows 0..kept-1 and the new token's (after the `width` rows), unless the unit just completed
    idx = torch.arange(width + 1)
    window_ok = ((idx[None, :] < kept[:, None]) | (idx[None, :] == width)) & ~completes[:, None]
    segments.append(Segment(torch.cat([k_old, k_new.unsqueeze(2)], dim=2),
                            torch.cat([v_old, v_new.unsqueeze(2)], dim=2),
                            window_ok[:, None, :].to(dev)))
    qg = q[tok].reshape(r_count, hkv, group, d)
    o = _attend(qg, segments, scale)  # [R, Hkv, G, D]
    out[tok] = o.reshape(r_count, -1, d).to(out.dtype)

    if store:
        keep = (~completes).nonzero().flatten()
        if len(keep):
            kd, kb = keep.to(dev), keep.to(bt.device)
            t = tok[kd]
            fmt.write_window(regions, window_pages[kb], kept[keep][:, None].to(bt.device),
                             rows_k[0][t][:, None], rows_k[1][t][:, None], rows_v[0][t][:, None], rows_v[1][t][:, None])
