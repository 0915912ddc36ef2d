"""The int4_kivi store + attention in plain PyTorch (the CPU implementation).

One call does a whole layer for a batch, in three phases per request row (vectorized over tokens
and heads; the only Python loop is over requests):

1. store: the residual tail plus this step's tokens; every block that becomes complete is
   quantized into its page;
2. attend: queries read complete blocks from the pages (dequantized) and the rest exact, following
   the position rule of ``s4kv.format``;
3. keep: the new incomplete tail goes back into the request's residual slot. This comes last
   because phase 2 may still need the old residual tokens exact.

All tensors are in the rotated basis (see ``s4kv.format``).
"""

from __future__ import annotations

import torch

from s4kv import format as fmt


def _attend(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
            masks: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Softmax attention over several key segments, each with its own [Tq, Tk] visibility mask.

    q [Tq, Hq, D] fp32; keys/values [Tk, Hkv, D]. Returns [Tq, Hq, D] fp32.
    """
    tq, hq, d = q.shape
    hkv = keys[0].shape[1]
    group = hq // hkv
    qg = q.reshape(tq, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * tq, d)
    scores = []
    for k, m in zip(keys, masks):
        s = torch.bmm(qg, k.float().permute(1, 2, 0)) * scale  # [Hkv, group*Tq, Tk]
        s = s.view(hkv, group, tq, -1).masked_fill(~m, float("-inf"))
        scores.append(s)
    p = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = torch.zeros(hkv, group, tq, d, dtype=torch.float32)
    start = 0
    for v in values:
        n = v.shape[0]
        out += torch.matmul(p[..., start:start + n], v.float().permute(1, 0, 2).unsqueeze(1))
        start += n
    return out.permute(2, 0, 1, 3).reshape(tq, hq, d)


def forward(q_rot: torch.Tensor, k_rot: torch.Tensor, v_rot: torch.Tensor, regions: torch.Tensor,
            res: torch.Tensor, md, scale: float, out_rot: torch.Tensor, store: bool = True) -> None:
    """One layer for a batch.

    q_rot [N, Hq, D] fp32; k_rot, v_rot [N, Hkv, D] (model dtype); regions [num_blocks, Hkv,
    region_bytes] uint8 (a view of the layer's cache); res [slots, 2, Hkv, BLOCK_SIZE, D];
    out_rot [N, Hq, D] fp32 (written). ``store=False`` (a layer sharing another layer's cache)
    attends without writing.
    """
    bs = fmt.BLOCK_SIZE
    d = q_rot.shape[-1]
    n = md.num_reqs
    qsl_t = md.query_start_loc_cpu[: n + 1].long()
    qlens = qsl_t[1:] - qsl_t[:-1]
    decode_rows = (qlens == 1).nonzero().flatten()
    if len(decode_rows):
        _decode_rows(decode_rows, q_rot, k_rot, v_rot, regions, res, md, scale, out_rot, store)
    qsl = qsl_t.tolist()
    seq_lens = md.seq_lens_cpu.tolist()
    slots = md.slots_cpu.tolist()
    block_table = md.block_table
    for r in range(n):
        s, e = qsl[r], qsl[r + 1]
        qlen = e - s
        if qlen <= 1:  # decode rows are done above
            continue
        seq_len, slot = seq_lens[r], slots[r]
        ctx = seq_len - qlen
        first = ctx // bs  # first block that was not complete before this step
        n_full = seq_len // bs  # complete blocks after this step
        kept = ctx - first * bs  # tokens of block `first` already in the residual slot
        # Exact K/V of positions first*bs .. seq_len-1.
        k_exact = torch.cat([res[slot, 0, :, :kept].transpose(0, 1), k_rot[s:e]], dim=0)
        v_exact = torch.cat([res[slot, 1, :, :kept].transpose(0, 1), v_rot[s:e]], dim=0)
        blocks = block_table[r, :n_full].long()

        # 1. store every block completed by this step
        if store and n_full > first:
            m = n_full - first
            kb = k_exact[: m * bs].reshape(m, bs, *k_exact.shape[1:]).transpose(1, 2)
            vb = v_exact[: m * bs].reshape(m, bs, *v_exact.shape[1:]).transpose(1, 2)
            regions.index_copy_(0, blocks[first:], fmt.encode_blocks(kb, vb))

        # 2. attend
        pos_q = torch.arange(ctx, seq_len)[:, None]
        boundary = (pos_q + 1) // bs * bs  # queries read positions below this from pages
        keys, values, masks = [], [], []
        if n_full:
            kq, vq = fmt.decode_blocks(regions[blocks], d, k_rot.dtype)  # [n_full, Hkv, bs, D]
            keys.append(kq.transpose(1, 2).reshape(n_full * bs, -1, d))
            values.append(vq.transpose(1, 2).reshape(n_full * bs, -1, d))
            masks.append(torch.arange(n_full * bs)[None, :] < boundary)
        pos_x = torch.arange(first * bs, seq_len)[None, :]
        keys.append(k_exact)
        values.append(v_exact)
        masks.append((pos_x >= boundary) & (pos_x <= pos_q))
        out_rot[s:e] = _attend(q_rot[s:e], keys, values, masks, scale)

        # 3. keep the incomplete tail exact
        if store:
            tail = seq_len - n_full * bs
            if tail:
                off = (n_full - first) * bs
                res[slot, 0, :, :tail] = k_exact[off:].transpose(0, 1)
                res[slot, 1, :, :tail] = v_exact[off:].transpose(0, 1)


def _decode_rows(rows: torch.Tensor, q_rot, k_rot, v_rot, regions, res, md, scale, out_rot, store) -> None:
    """All single-token rows at once (the steady state of serving): no per-request Python loop."""
    bs = fmt.BLOCK_SIZE
    d = q_rot.shape[-1]
    dev = q_rot.device
    tok = md.query_start_loc_cpu[rows].long().to(dev)
    seq = md.seq_lens_cpu[rows].long()
    slots = md.slots_cpu[rows].long().to(dev)
    p = seq - 1  # query positions
    n_pages = seq // bs  # complete blocks, read quantized
    kept = p % bs  # residual tokens before p in its block
    completes = (seq % bs) == 0  # this token completes its block: nothing of the block stays exact
    k_new, v_new = k_rot[tok], v_rot[tok]  # [R, Hkv, D]
    bt = md.block_table[rows.to(md.block_table.device)].long()

    if store and bool(completes.any()):
        c = completes.nonzero().flatten()
        cs = slots[c.to(dev)]
        kb = torch.cat([res[cs, 0, :, : bs - 1], k_new[c.to(dev)].unsqueeze(2)], dim=2)  # [C, Hkv, bs, D]
        vb = torch.cat([res[cs, 1, :, : bs - 1], v_new[c.to(dev)].unsqueeze(2)], dim=2)
        ids = bt[c.to(bt.device), (n_pages[c] - 1).to(bt.device)]
        regions.index_copy_(0, ids.to(regions.device), fmt.encode_blocks(kb, vb))

    r_count, hkv = len(rows), k_rot.shape[1]
    hq = q_rot.shape[1]
    group = hq // hkv
    max_pages = int(n_pages.max())
    keys, values, masks = [], [], []
    if max_pages:
        cols = torch.arange(max_pages)
        page_ok = cols[None, :] < n_pages[:, None]  # [R, P]
        ids = torch.where(page_ok.to(bt.device), bt[:, :max_pages], bt[:, :1])
        kq, vq = fmt.decode_blocks(regions[ids.to(regions.device)], d, k_rot.dtype)  # [R, P, Hkv, bs, D]
        keys.append(kq.permute(0, 2, 1, 3, 4).reshape(r_count, hkv, max_pages * bs, d))
        values.append(vq.permute(0, 2, 1, 3, 4).reshape(r_count, hkv, max_pages * bs, d))
        masks.append(page_ok.repeat_interleave(bs, dim=1))
    # exact: residual tokens 0..kept-1 and the new token, unless the block just completed
    keys.append(torch.cat([res[slots, 0], k_new.unsqueeze(2)], dim=2).float())  # [R, Hkv, bs + 1, D]
    values.append(torch.cat([res[slots, 1], v_new.unsqueeze(2)], dim=2).float())
    idx = torch.arange(bs + 1)
    exact_ok = ((idx[None, :] < kept[:, None]) | (idx[None, :] == bs)) & ~completes[:, None]
    masks.append(exact_ok)
    qg = q_rot[tok].reshape(r_count, hkv, group, d)
    scores = torch.cat([torch.matmul(qg, k.transpose(-1, -2)) for k in keys], dim=-1) * scale
    mask = torch.cat(masks, dim=1).to(dev)[:, None, None, :]
    prob = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    out = torch.matmul(prob, torch.cat(values, dim=2))  # [R, Hkv, G, D]
    out_rot[tok] = out.reshape(r_count, hq, d)

    if store:
        keep = (~completes).nonzero().flatten()
        if len(keep):
            ks, kk = slots[keep.to(dev)], kept[keep].to(dev)
            res[ks, 0, :, kk] = k_new[keep.to(dev)]
            res[ks, 1, :, kk] = v_new[keep.to(dev)]
