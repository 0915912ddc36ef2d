"""Triton attention for query chunks (prefill, chunked prefill, prefix-cache extends).

One program handles BLOCK_M consecutive queries of one row and one query head. It first walks
the quantized pages any of its queries may read (blocks before floor((p+1)/BS)*BS), then the exact
tokens after the earliest query's boundary: those before the chunk come from the row's residual
slot, those inside the chunk from this step's K/V (original basis; pages are rotated, so the
query is rotated for them and their share of the output rotated back). Per (query, key) masks implement causality and
the position rule of ``s4kv.format`` exactly, including the block that completes inside the chunk
(read quantized by queries after its last token, exact by those before).
"""

import math

import torch
import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import dot_dtype, launch_options, rotation_operand, tl_dtype
from s4kv.kernels.quant import rotate_halves


@triton.jit
def _prefill_kernel(
    q_ptr, stride_qt, stride_qh,
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
    res_ptr, stride_rs, stride_rkv, stride_rh, stride_rt,
    cache_ptr, stride_cb, stride_ch,
    qsl_ptr, seq_lens_ptr, slots_ptr, block_table_ptr, stride_bt,
    tile_rows_ptr, tile_starts_ptr,  # per program: batch row and first query offset in the row
    out_ptr, stride_ot, stride_oh,
    rot_ptr, sm_scale,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BS: tl.constexpr, HALF: tl.constexpr, INV_SQRT_D: tl.constexpr,
    V_CODES: tl.constexpr, V_SCALE: tl.constexpr, K_SCALE: tl.constexpr, K_MIN: tl.constexpr,
    FIRST_KEY: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    tile = tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // GROUP
    row = tl.load(tile_rows_ptr + tile)
    m0 = tl.load(tile_starts_ptr + tile)
    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    ctx = seq_len - qlen
    slot = tl.load(slots_ptr + row)

    mi = m0 + tl.arange(0, BLOCK_M)
    q_ok = mi < qlen
    pos_q = ctx + mi  # positions of the queries
    boundary = (pos_q + 1) // BS * BS  # keys below: quantized; from here to pos_q: exact
    c = tl.arange(0, HALF)
    t = tl.arange(0, BS)
    scale = sm_scale * 1.4426950408889634
    qrow = q_ptr + (q_start + mi)[:, None] * stride_qt + hq * stride_qh
    qx_lo = tl.load(qrow + c[None, :], mask=q_ok[:, None], other=0.0)  # original basis, model dtype
    qx_hi = tl.load(qrow + HALF + c[None, :], mask=q_ok[:, None], other=0.0)
    q_lo, q_hi = rotate_halves(qx_lo, qx_hi, rot_ptr, HALF, DOT_DTYPE, INV_SQRT_D, False)
    q_lo = q_lo * scale  # rotated, pre-scaled: meets the pages
    q_hi = q_hi * scale

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_lo = tl.zeros([BLOCK_M, HALF], tl.float32)  # from pages, rotated basis
    acc_hi = tl.zeros([BLOCK_M, HALF], tl.float32)
    accx_lo = tl.zeros([BLOCK_M, HALF], tl.float32)  # from exact tokens, original basis
    accx_hi = tl.zeros([BLOCK_M, HALF], tl.float32)

    last_q = ctx + tl.minimum(m0 + BLOCK_M, qlen) - 1
    n_pages = (last_q + 1) // BS
    for page in range(n_pages):
        block_id = tl.load(block_table_ptr + row * stride_bt + page).to(tl.int64)
        region = cache_ptr + block_id * stride_cb + h * stride_ch
        ks_ptr = (region + K_SCALE).to(tl.pointer_type(tl.float16))
        km_ptr = (region + K_MIN).to(tl.pointer_type(tl.float16))
        fk_ptr = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
        ks_lo = tl.load(ks_ptr + c).to(tl.float32)
        ks_hi = tl.load(ks_ptr + HALF + c).to(tl.float32)
        km_lo = tl.load(km_ptr + c).to(tl.float32)
        km_hi = tl.load(km_ptr + HALF + c).to(tl.float32)
        kc = tl.load(region + t[:, None] * HALF + c[None, :])
        s = tl.dot((q_lo * ks_lo[None, :]).to(DOT_DTYPE), tl.trans((kc & 0xF).to(DOT_DTYPE)))
        s += tl.dot((q_hi * ks_hi[None, :]).to(DOT_DTYPE), tl.trans((kc >> 4).to(DOT_DTYPE)))
        s += (tl.sum(q_lo * km_lo[None, :], axis=1) + tl.sum(q_hi * km_hi[None, :], axis=1))[:, None]
        fk_lo = tl.load(fk_ptr + c).to(tl.float32)
        fk_hi = tl.load(fk_ptr + HALF + c).to(tl.float32)
        s0 = tl.sum(q_lo * fk_lo[None, :], axis=1) + tl.sum(q_hi * fk_hi[None, :], axis=1)
        s = tl.where(t[None, :] == 0, s0[:, None], s)
        key_pos = page * BS + t
        s = tl.where(key_pos[None, :] < boundary[:, None], s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pr = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        vs = tl.load((region + V_SCALE).to(tl.pointer_type(tl.float16)) + t).to(tl.float32)
        pv = pr * vs[None, :]
        corr = 7.5 * tl.sum(pv, axis=1)
        vc = tl.load(region + V_CODES + c[None, :] * BS + t[:, None])  # channel-major
        acc_lo = acc_lo * alpha[:, None] + tl.dot(pv.to(DOT_DTYPE), (vc & 0xF).to(DOT_DTYPE)) - corr[:, None]
        acc_hi = acc_hi * alpha[:, None] + tl.dot(pv.to(DOT_DTYPE), (vc >> 4).to(DOT_DTYPE)) - corr[:, None]
        m_i = m_new

    # exact keys: from the first query's boundary to the last query
    first_exact = (ctx + m0 + 1) // BS * BS
    tail_block = ctx // BS * BS  # residual index 0 is this position
    n = tl.arange(0, BLOCK_N)
    for start in range(first_exact, last_q + 1, BLOCK_N):
        key_pos = start + n
        from_res = key_pos < ctx
        from_new = (key_pos >= ctx) & (key_pos <= last_q)
        r_off = (key_pos - tail_block)[:, None] * stride_rt
        n_off = (q_start + key_pos - ctx)[:, None] * stride_kt
        rk = res_ptr + slot * stride_rs + h * stride_rh + r_off
        nk = k_ptr + h * stride_kh + n_off
        k_lo = tl.load(rk + c[None, :], mask=from_res[:, None], other=0.0) + \
            tl.load(nk + c[None, :], mask=from_new[:, None], other=0.0)
        k_hi = tl.load(rk + HALF + c[None, :], mask=from_res[:, None], other=0.0) + \
            tl.load(nk + HALF + c[None, :], mask=from_new[:, None], other=0.0)
        s = tl.dot(qx_lo.to(DOT_DTYPE), tl.trans(k_lo.to(DOT_DTYPE)))
        s += tl.dot(qx_hi.to(DOT_DTYPE), tl.trans(k_hi.to(DOT_DTYPE)))
        visible = (key_pos[None, :] >= boundary[:, None]) & (key_pos[None, :] <= pos_q[:, None])
        s = tl.where(visible, s * scale, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pr = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        rv = rk + stride_rkv
        nv = v_ptr + h * stride_vh + (q_start + key_pos - ctx)[:, None] * stride_vt
        v_lo = tl.load(rv + c[None, :], mask=from_res[:, None], other=0.0) + \
            tl.load(nv + c[None, :], mask=from_new[:, None], other=0.0)
        v_hi = tl.load(rv + HALF + c[None, :], mask=from_res[:, None], other=0.0) + \
            tl.load(nv + HALF + c[None, :], mask=from_new[:, None], other=0.0)
        acc_lo = acc_lo * alpha[:, None]
        acc_hi = acc_hi * alpha[:, None]
        accx_lo = accx_lo * alpha[:, None] + tl.dot(pr.to(DOT_DTYPE), v_lo.to(DOT_DTYPE))
        accx_hi = accx_hi * alpha[:, None] + tl.dot(pr.to(DOT_DTYPE), v_hi.to(DOT_DTYPE))
        m_i = m_new

    acc_lo, acc_hi = rotate_halves(acc_lo, acc_hi, rot_ptr, HALF, tl.float32, INV_SQRT_D, True)
    acc_lo += accx_lo
    acc_hi += accx_hi
    o = out_ptr + (q_start + mi)[:, None] * stride_ot + hq * stride_oh
    l_safe = tl.where(q_ok, l_i, 1.0)[:, None]  # padding queries see no key
    odt = out_ptr.dtype.element_ty
    tl.store(o + c[None, :], (acc_lo / l_safe).to(odt), mask=q_ok[:, None])
    tl.store(o + HALF + c[None, :], (acc_hi / l_safe).to(odt), mask=q_ok[:, None])


def prefill_attention(q, k, v, res, regions, md, first_row: int, sm_scale: float,
                      out: torch.Tensor) -> None:
    """out for the rows first_row.. (any query lengths). q, k, v exact (model dtype); host-side
    tiling from the CPU metadata. Tile sizes come with the launch options (block_m, block_n:
    queries and exact keys per tile; default 64)."""
    opts = launch_options("prefill", q.shape[2], q.device)
    block_m, block_n = opts.pop("block_m", 64), opts.pop("block_n", 64)
    num_reqs = md.num_reqs
    if first_row >= num_reqs:
        return
    qsl = md.query_start_loc_cpu[: num_reqs + 1].tolist()
    rows, starts = [], []
    for r in range(first_row, num_reqs):
        for m0 in range(0, qsl[r + 1] - qsl[r], block_m):
            rows.append(r)
            starts.append(m0)
    if not rows:
        return
    dev = q.device
    tile_rows = torch.tensor(rows, dtype=torch.int32).to(dev, non_blocking=True)
    tile_starts = torch.tensor(starts, dtype=torch.int32).to(dev, non_blocking=True)
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    lay = fmt.PageLayout(d)
    _prefill_kernel[(len(rows), hq)](
        q, q.stride(0), q.stride(1),
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        res, res.stride(0), res.stride(1), res.stride(2), res.stride(3),
        regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.slots, md.block_table, md.block_table.stride(0),
        tile_rows, tile_starts,
        out, out.stride(0), out.stride(1),
        rotation_operand(d, q.dtype, q.device), sm_scale,
        GROUP=hq // hkv, BLOCK_M=block_m, BLOCK_N=block_n,
        BS=fmt.BLOCK_SIZE, HALF=d // 2, INV_SQRT_D=1.0 / math.sqrt(d),
        V_CODES=lay.v_codes, V_SCALE=lay.v_scale, K_SCALE=lay.k_scale, K_MIN=lay.k_min,
        FIRST_KEY=lay.first_key, FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(q.dtype)),
        DOT_DTYPE=dot_dtype(q.dtype), **opts,
    )
