"""Triton decode attention over int4_kivi pages (split-KV, GQA-packed) and its reduction.

One program handles one (decode row, kv head, split): it walks its share of the row's quantized
pages, loading each page once for all query heads of the kv head, and the last split also attends
to the exact tail (the residual slot plus this step's token). Pages are in the rotated basis, so
the query is rotated in the kernel and the pages' part of the output rotated back before the
split's partial result is written; exact tokens are used in the original basis. Scores and values are computed
without dequantizing tiles: per-channel key scales are folded into the query
(q . (c * s + m) = (q * s) . c + q . m) and per-token value scales into the probabilities
(p @ ((c - 7.5) * s) = (p * s) @ c - 7.5 * sum(p * s)), so the inner products run on the raw
4-bit codes. A second kernel merges the splits (log-sum-exp).

Graph-safe: the grid depends only on the batch size; which pages a split covers is computed from
the sequence lengths on the device.
"""

import math
from typing import ClassVar

import torch
import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import dot_dtype, launch_options, rotation_operand, tl_dtype
from s4kv.kernels.quant import rotate_halves

LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(
    q_ptr, stride_qt, stride_qh,  # rotated queries [T, Hq, D] (model dtype), decode rows first
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh,  # this step's rotated K/V
    res_ptr, stride_rs, stride_rkv, stride_rh, stride_rt,  # residual [S, 2, Hkv, BS, D]
    cache_ptr, stride_cb, stride_ch,
    qsl_ptr, seq_lens_ptr, slots_ptr, block_table_ptr, stride_bt,
    part_o_ptr, part_ml_ptr,  # [R, Hq, SPLITS, D] fp32, [R, Hq, SPLITS, 2] fp32
    rot_ptr, sm_scale,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, SPLITS: tl.constexpr, SUB: tl.constexpr,
    BS: tl.constexpr, HALF: tl.constexpr, INV_SQRT_D: tl.constexpr,
    V_CODES: tl.constexpr, V_SCALE: tl.constexpr, K_SCALE: tl.constexpr, K_MIN: tl.constexpr,
    FIRST_KEY: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    row = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, G_PAD)
    c = tl.arange(0, HALF)
    g_ok = g < GROUP
    hq = h * GROUP + g
    part_base = (row * (GROUP * tl.num_programs(1)) + hq) * SPLITS + split

    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    p = seq_len - 1  # the query's position
    n_pages = (p + 1) // BS  # complete blocks: read quantized
    per_split = tl.cdiv(n_pages, SPLITS)
    page_lo = split * per_split
    page_hi = tl.minimum(page_lo + per_split, n_pages)
    is_last = split == SPLITS - 1

    m_i = tl.full([G_PAD], -float("inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc_lo = tl.zeros([G_PAD, HALF], tl.float32)  # pages: rotated basis; after the loop, original
    acc_hi = tl.zeros([G_PAD, HALF], tl.float32)

    if qlen == 1:
        qrow = q_ptr + q_start * stride_qt + hq[:, None] * stride_qh
        scale = sm_scale * 1.4426950408889634  # exp2 domain
        qx_lo = tl.load(qrow + c[None, :], mask=g_ok[:, None], other=0.0)
        qx_hi = tl.load(qrow + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
        q_lo, q_hi = rotate_halves(qx_lo, qx_hi, rot_ptr, HALF, DOT_DTYPE, INV_SQRT_D, False)
        q_lo = q_lo * scale
        q_hi = q_hi * scale
        qs_lo = qx_lo.to(tl.float32) * scale
        qs_hi = qx_hi.to(tl.float32) * scale
        for page in range(page_lo, page_hi):
            block_id = tl.load(block_table_ptr + row * stride_bt + page).to(tl.int64)
            region = cache_ptr + block_id * stride_cb + h * stride_ch
            ks_ptr = (region + K_SCALE).to(tl.pointer_type(tl.float16))
            km_ptr = (region + K_MIN).to(tl.pointer_type(tl.float16))
            fk_ptr = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
            ks_lo = tl.load(ks_ptr + c).to(tl.float32)
            ks_hi = tl.load(ks_ptr + HALF + c).to(tl.float32)
            km_lo = tl.load(km_ptr + c).to(tl.float32)
            km_hi = tl.load(km_ptr + HALF + c).to(tl.float32)
            fk_lo = tl.load(fk_ptr + c).to(tl.float32)
            fk_hi = tl.load(fk_ptr + HALF + c).to(tl.float32)
            qk_lo = (q_lo * ks_lo[None, :]).to(DOT_DTYPE)
            qk_hi = (q_hi * ks_hi[None, :]).to(DOT_DTYPE)
            s_min = tl.sum(q_lo * km_lo[None, :], axis=1) + tl.sum(q_hi * km_hi[None, :], axis=1)
            s_first = tl.sum(q_lo * fk_lo[None, :], axis=1) + tl.sum(q_hi * fk_hi[None, :], axis=1)
            # SUB tokens at a time: smaller live tiles, more programs resident per SM
            for sub in tl.static_range(BS // SUB):
                ts = sub * SUB + tl.arange(0, SUB)
                kc = tl.load(region + ts[:, None] * HALF + c[None, :])  # [SUB, HALF] packed
                s = tl.dot(qk_lo, tl.trans((kc & 0xF).to(DOT_DTYPE)))
                s += tl.dot(qk_hi, tl.trans((kc >> 4).to(DOT_DTYPE)))
                s += s_min[:, None]
                if sub == 0:  # the block's first token: exact key
                    s = tl.where(ts[None, :] == 0, s_first[:, None], s)
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                alpha = tl.exp2(m_i - m_new)
                pr = tl.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(pr, axis=1)
                vs = tl.load((region + V_SCALE).to(tl.pointer_type(tl.float16)) + ts).to(tl.float32)
                pv = pr * vs[None, :]
                vc = tl.load(region + V_CODES + ts[:, None] * HALF + c[None, :])
                corr = 7.5 * tl.sum(pv, axis=1)
                acc_lo = acc_lo * alpha[:, None] + tl.dot(pv.to(DOT_DTYPE), (vc & 0xF).to(DOT_DTYPE)) \
                    - corr[:, None]
                acc_hi = acc_hi * alpha[:, None] + tl.dot(pv.to(DOT_DTYPE), (vc >> 4).to(DOT_DTYPE)) \
                    - corr[:, None]
                m_i = m_new

        # the pages' share back to the original basis (fp32 operands: tf32 on tensor cores)
        acc_lo, acc_hi = rotate_halves(acc_lo, acc_hi, rot_ptr, HALF, tl.float32, INV_SQRT_D, True)

        if is_last:
            # exact tail (original basis): residual positions n_pages*BS .. p-1 in SUB-token tiles
            # (small live tiles keep the kernel's register peak down), then this step's token
            tail = p - n_pages * BS  # residual tokens before p (-1: the block just completed)
            slot = tl.load(slots_ptr + row)
            res_row = res_ptr + slot * stride_rs + h * stride_rh
            for t0 in range(0, tail, SUB):
                tt = t0 + tl.arange(0, SUB)
                in_tail = tt < tail
                rk = res_row + tt[:, None] * stride_rt
                rk_lo = tl.load(rk + c[None, :], mask=in_tail[:, None], other=0.0)
                rk_hi = tl.load(rk + HALF + c[None, :], mask=in_tail[:, None], other=0.0)
                # unscaled model-dtype operands, scaled in fp32 after the product (as a 16-bit cache)
                s = tl.dot(qx_lo.to(DOT_DTYPE), tl.trans(rk_lo.to(DOT_DTYPE)))
                s += tl.dot(qx_hi.to(DOT_DTYPE), tl.trans(rk_hi.to(DOT_DTYPE)))
                s = tl.where(in_tail[None, :], s * scale, -float("inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_safe)
                pr = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(pr, axis=1)
                rv = rk + stride_rkv
                rv_lo = tl.load(rv + c[None, :], mask=in_tail[:, None], other=0.0)
                rv_hi = tl.load(rv + HALF + c[None, :], mask=in_tail[:, None], other=0.0)
                acc_lo = acc_lo * alpha[:, None] + tl.dot(pr.to(DOT_DTYPE), rv_lo.to(DOT_DTYPE))
                acc_hi = acc_hi * alpha[:, None] + tl.dot(pr.to(DOT_DTYPE), rv_hi.to(DOT_DTYPE))
                m_i = m_new
            # this step's token (exact unless it completed its block, then it is in a page)
            nk = k_ptr + q_start * stride_kt + h * stride_kh
            nk_lo = tl.load(nk + c).to(tl.float32)
            nk_hi = tl.load(nk + HALF + c).to(tl.float32)
            s_new = tl.sum(qs_lo * nk_lo[None, :], axis=1) + tl.sum(qs_hi * nk_hi[None, :], axis=1)
            s_new = tl.where(tail >= 0, s_new, -float("inf"))
            m_new = tl.maximum(m_i, s_new)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p_new = tl.exp2(s_new - m_safe)
            l_i = l_i * alpha + p_new
            nv = v_ptr + q_start * stride_vt + h * stride_vh
            nv_lo = tl.load(nv + c).to(tl.float32)
            nv_hi = tl.load(nv + HALF + c).to(tl.float32)
            acc_lo = acc_lo * alpha[:, None] + p_new[:, None] * nv_lo[None, :]
            acc_hi = acc_hi * alpha[:, None] + p_new[:, None] * nv_hi[None, :]
            m_i = m_new

    o_ptr = part_o_ptr + part_base[:, None] * (2 * HALF)
    tl.store(o_ptr + c[None, :], acc_lo, mask=g_ok[:, None])
    tl.store(o_ptr + HALF + c[None, :], acc_hi, mask=g_ok[:, None])
    tl.store(part_ml_ptr + part_base * 2, m_i, mask=g_ok)
    tl.store(part_ml_ptr + part_base * 2 + 1, l_i, mask=g_ok)


@triton.jit
def _reduce_kernel(part_o_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh, qsl_ptr,  # out: any float dtype
                   SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, D: tl.constexpr):
    row = tl.program_id(0)
    hq = tl.program_id(1)
    num_hq = tl.num_programs(1)
    q_start = tl.load(qsl_ptr + row)
    if tl.load(qsl_ptr + row + 1) - q_start != 1:
        return
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D)
    base = (row * num_hq + hq) * SPLITS
    ok = sp < SPLITS
    m = tl.load(part_ml_ptr + (base + sp) * 2, mask=ok, other=-float("inf"))
    l = tl.load(part_ml_ptr + (base + sp) * 2 + 1, mask=ok, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.where(m == -float("inf"), 0.0, tl.exp2(m - m_all))
    o = tl.load(part_o_ptr + (base + sp)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(o * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out_ptr + q_start * stride_ot + hq * stride_oh + d, out.to(out_ptr.dtype.element_ty))


# Decode programs to launch per SM and the most splits of one row; launch_options("decode-grid", 0)
# overrides them (tools/gpu/tune_kernels.py)
PROGRAMS_PER_SM = 4
MAX_SPLITS = 32


def num_splits(num_rows: int, num_kv_heads: int, num_sms: int, max_splits: int | None = None) -> int:
    """Enough programs to fill the GPU PROGRAMS_PER_SM times, from the batch shape only (graph-safe)."""
    grid = launch_options("decode-grid", 0)
    want = grid.get("programs_per_sm", PROGRAMS_PER_SM) * num_sms
    max_splits = max_splits or grid.get("max_splits", MAX_SPLITS)
    return max(1, min(max_splits, math.ceil(want / max(1, num_rows * num_kv_heads))))


class DecodeWorkspace:
    """Split partials, reserved once per process while the model loads (so vLLM's memory profiling
    counts them) and never reallocated (captured CUDA graphs keep reading the same addresses)."""

    _buffers: ClassVar[dict] = {}
    _reserved: ClassVar[set] = set()

    @staticmethod
    def capacity(max_rows: int, num_kv_heads: int, num_sms: int) -> int:
        """Largest rows * splits over every decode batch size up to max_rows."""
        return max(r * num_splits(r, num_kv_heads, num_sms) for r in range(1, max_rows + 1))

    @classmethod
    def reserve(cls, max_rows: int, hq: int, d: int, num_kv_heads: int, num_sms: int, device) -> None:
        key = (str(device), hq, d)
        need = cls.capacity(max_rows, num_kv_heads, num_sms) * hq
        if key not in cls._buffers or cls._buffers[key][1].shape[0] < need:
            cls._buffers[key] = (torch.empty(need * d, dtype=torch.float32, device=device),
                                 torch.empty(need, 2, dtype=torch.float32, device=device))
        cls._reserved.add(key)

    @classmethod
    def get(cls, rows: int, hq: int, splits: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (str(device), hq, d)
        need = rows * hq * splits
        if key not in cls._reserved and (key not in cls._buffers or cls._buffers[key][1].shape[0] < need):
            # outside an engine (tests, benchmarks): grow on demand
            cls._buffers[key] = (torch.empty(need * d, dtype=torch.float32, device=device),
                                 torch.empty(need, 2, dtype=torch.float32, device=device))
        part_o, part_ml = cls._buffers[key]
        if part_ml.shape[0] < need:
            raise RuntimeError(f"int4_kivi decode workspace holds {part_ml.shape[0]} partials, needs {need}")
        return part_o, part_ml


def decode_attention(q, k, v, res, regions, md, num_decodes: int, sm_scale: float,
                     out: torch.Tensor, splits: int) -> None:
    """out[:num_decodes] = attention of the decode rows (query length 1, rows 0..num_decodes-1).

    q [T, Hq, D], k, v [T, Hkv, D] (model dtype, exact); out [T, Hq, D] (any float dtype).
    """
    if num_decodes == 0:
        return
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    group = hq // hkv
    lay = fmt.PageLayout(d)
    part_o, part_ml = DecodeWorkspace.get(num_decodes, hq, splits, d, q.device)
    _decode_kernel[(num_decodes, hkv, splits)](
        q, q.stride(0), q.stride(1),
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        res, res.stride(0), res.stride(1), res.stride(2), res.stride(3),
        regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.slots, md.block_table, md.block_table.stride(0),
        part_o, part_ml, rotation_operand(d, q.dtype, q.device), sm_scale,
        GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)), SPLITS=splits,
        BS=fmt.BLOCK_SIZE, HALF=d // 2, INV_SQRT_D=1.0 / math.sqrt(d),
        V_CODES=lay.v_codes, V_SCALE=lay.v_scale, K_SCALE=lay.k_scale, K_MIN=lay.k_min,
        FIRST_KEY=lay.first_key, FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(q.dtype)),
        DOT_DTYPE=dot_dtype(q.dtype), **{"SUB": fmt.BLOCK_SIZE, **launch_options("decode", d)},
    )
    _reduce_kernel[(num_decodes, hq)](
        part_o, part_ml, out, out.stride(0), out.stride(1), md.query_start_loc,
        SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), D=d,
    )
