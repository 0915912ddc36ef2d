"""Triton decode attention over int4_kivi pages (split-KV, GQA-packed) and its reduction.

Three launches per layer and step, all with grids that depend only on the batch size (graph-safe;
which pages a split covers is computed from the sequence lengths on the device):

1. ``_rotate_queries_kernel``: the decode queries rotated into the pages' basis and pre-scaled
   (fp32), once per row, so that no split repeats it and the page loop carries no rotation.
2. ``_decode_kernel``, one program per (decode row, kv head, split): splits 0..splits-1 walk their
   share of the row's quantized pages, loading each page once for all query heads of the kv head;
   split `splits` attends to the exact tail (its rows in the pages plus this step's token) in the
   original basis, as a 16-bit cache would. Pages are never dequantized into tiles: per-channel key
   scales go into the query (q . (c * s + m) = (q * s) . c + q . m) and per-token value scales into
   the probabilities (p @ ((c - 7.5) * s) = (p * s) @ (c - 7.5)), so the dots run on the codes,
   which become 16-bit operands by bit operations (s4kv.kernels.quant.code_operands). A block's
   first token is the exception (exact key, 8-bit value): its score comes from the exact key, and
   the high nibbles of its value codes are added on their own.
3. ``_reduce_kernel``, one program per (row, kv head): merges the page splits (log-sum-exp), rotates
   their sum back to the original basis once, adds the tail's partial and normalizes.
"""

import math
from typing import ClassVar

import torch
import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import dot_dtype, interpreted, launch_options, rotation_operand, tl_dtype
from s4kv.kernels.quant import code_operands, rotate_halves
from s4kv.kernels.tail import tail_constants, tail_rows

LOG2E = 1.4426950408889634


@triton.jit
def _rotate_queries_kernel(q_ptr, stride_qt, stride_qh, qsl_ptr, qr_ptr, rot_ptr, scale,
                           GROUP: tl.constexpr, G_PAD: tl.constexpr, HALF: tl.constexpr,
                           INV_SQRT_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """qr[row, hq] = q[row, hq] @ R * scale in fp32: the decode queries as the pages meet them
    (model-dtype operands times the +-1 matrix: exact products, fp32 sums)."""
    row = tl.program_id(0)
    h = tl.program_id(1)
    q_start = tl.load(qsl_ptr + row)
    if tl.load(qsl_ptr + row + 1) - q_start != 1:  # not a decode row (padding)
        return
    g = tl.arange(0, G_PAD)
    c = tl.arange(0, HALF)
    g_ok = g < GROUP
    hq = h * GROUP + g
    qrow = q_ptr + q_start * stride_qt + hq[:, None] * stride_qh
    x_lo = tl.load(qrow + c[None, :], mask=g_ok[:, None], other=0.0)
    x_hi = tl.load(qrow + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
    y_lo, y_hi = rotate_halves(x_lo, x_hi, rot_ptr, HALF, DOT_DTYPE, INV_SQRT_D, False)
    out = qr_ptr + (row * GROUP * tl.num_programs(1) + hq[:, None]) * (2 * HALF)
    tl.store(out + c[None, :], y_lo * scale, mask=g_ok[:, None])
    tl.store(out + HALF + c[None, :], y_hi * scale, mask=g_ok[:, None])


# splits is a runtime argument, not a constexpr, and not specialized: it follows the decode batch size,
# and each new value would compile both kernels again in the serving path (about 2 s each for sm90;
# a shrinking batch of 16 SmolLM2 requests met 10 values)
@triton.jit(do_not_specialize=["splits"])
def _decode_kernel(
    q_ptr, stride_qt, stride_qh,  # queries [T, Hq, D] (model dtype, original basis), decode rows first
    qr_ptr,  # [R, Hq, D] fp32: decode queries rotated and scaled by sm_scale * log2(e)
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh,  # this step's K/V (original basis)
    cache_ptr, stride_cb, stride_ch,  # pages, uint8 (exact tails included)
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    part_o_ptr, part_ml_ptr,  # [R, Hq, splits + 1, D] fp32, [R, Hq, splits + 1, 2] fp32
    sm_scale, splits,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, SUB: tl.constexpr,
    PAGE_STAGES: tl.constexpr, TAIL_SUB: tl.constexpr, TAIL_STAGES: tl.constexpr,
    BS: tl.constexpr, HALF: tl.constexpr,
    V_CODES: tl.constexpr, V_SCALE: tl.constexpr, K_SCALE: tl.constexpr, K_MIN: tl.constexpr,
    FIRST_KEY: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr, CODE_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, USE_PTX: tl.constexpr, TAIL_ROWS: tl.constexpr, ROW_BYTES: tl.constexpr,
):
    row = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, G_PAD)
    c = tl.arange(0, HALF)
    g_ok = g < GROUP
    hq = h * GROUP + g
    part_base = (row * (GROUP * tl.num_programs(1)) + hq) * (splits + 1) + split

    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    p = tl.load(seq_lens_ptr + row) - 1  # the query's position
    n_pages = (p + 1) // BS  # complete blocks: read quantized

    m_i = tl.full([G_PAD], -float("inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc_lo = tl.zeros([G_PAD, HALF], tl.float32)
    acc_hi = tl.zeros([G_PAD, HALF], tl.float32)

    if qlen == 1:
        if split < splits:
            # pages (rotated basis; the reduction rotates their share back)
            per_split = tl.cdiv(n_pages, splits)
            page_lo = split * per_split
            page_hi = tl.minimum(page_lo + per_split, n_pages)
            qr_row = qr_ptr + (row * GROUP * tl.num_programs(1) + hq[:, None]) * (2 * HALF)
            q_lo = tl.load(qr_row + c[None, :], mask=g_ok[:, None], other=0.0)
            q_hi = tl.load(qr_row + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
            for page in tl.range(page_lo, page_hi, num_stages=PAGE_STAGES):
                block_id = tl.load(block_table_ptr + row * stride_bt + page).to(tl.int64)
                region = cache_ptr + block_id * stride_cb + h * stride_ch
                ks_ptr = (region + K_SCALE).to(tl.pointer_type(tl.float16))
                km_ptr = (region + K_MIN).to(tl.pointer_type(tl.float16))
                fk_ptr = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
                # q . (c * s + m) = (q * s) . c + q . m: the scales go into the query, the dots
                # run on the codes themselves
                qk_lo = (q_lo * tl.load(ks_ptr + c).to(tl.float32)[None, :]).to(DOT_DTYPE)
                qk_hi = (q_hi * tl.load(ks_ptr + HALF + c).to(tl.float32)[None, :]).to(DOT_DTYPE)
                s_min = tl.sum(q_lo * tl.load(km_ptr + c).to(tl.float32)[None, :]
                               + q_hi * tl.load(km_ptr + HALF + c).to(tl.float32)[None, :], axis=1)
                s_first = tl.sum(q_lo * tl.load(fk_ptr + c).to(tl.float32)[None, :]
                                 + q_hi * tl.load(fk_ptr + HALF + c).to(tl.float32)[None, :], axis=1)
                # the block's first value is 8-bit codes: the page loop reads their low nibbles as
                # 4-bit codes, and code - 127.5 = (low - 7.5) + 16 * (high - 7.5) adds the high
                # nibbles (in the key code row of token 0, contiguous) on their own
                vs_ptr = (region + V_SCALE).to(tl.pointer_type(tl.float16))
                f16s = 16.0 * tl.load(vs_ptr).to(tl.float32)
                k0 = tl.load(region + c)
                fv_lo = ((k0 & 0xF).to(tl.float32) - 7.5) * f16s
                fv_hi = ((k0 >> 4).to(tl.float32) - 7.5) * f16s
                for sub in tl.static_range(BS // SUB):
                    ts = sub * SUB + tl.arange(0, SUB)
                    kc = tl.load(region + ts[:, None] * HALF + c[None, :])  # [SUB, HALF] token-major
                    k_lo, k_hi = code_operands(kc, False, CODE_DTYPE, DOT_DTYPE, USE_PTX)
                    s = tl.dot(qk_lo, tl.trans(k_lo))
                    s = tl.dot(qk_hi, tl.trans(k_hi), s)
                    s += s_min[:, None]
                    if sub == 0:  # the block's first token: exact key
                        s = tl.where(ts[None, :] == 0, s_first[:, None], s)
                    m_new = tl.maximum(m_i, tl.max(s, axis=1))
                    alpha = tl.exp2(m_i - m_new)
                    pr = tl.exp2(s - m_new[:, None])
                    l_i = l_i * alpha + tl.sum(pr, axis=1)
                    # p @ ((c - 7.5) * s) = (p * s) @ (c - 7.5): the per-token scales go into p
                    vs = tl.load(vs_ptr + ts).to(tl.float32)
                    pv = (pr * vs[None, :]).to(DOT_DTYPE)
                    vc = tl.load(region + V_CODES + c[None, :] * BS + ts[:, None])  # channel-major
                    v_lo, v_hi = code_operands(vc, True, CODE_DTYPE, DOT_DTYPE, USE_PTX)
                    acc_lo = tl.dot(pv, v_lo, acc_lo * alpha[:, None])
                    acc_hi = tl.dot(pv, v_hi, acc_hi * alpha[:, None])
                    if sub == 0:  # the first value's high nibbles
                        p_first = tl.exp2(s_first - m_new)[:, None]  # = pr[:, 0], without a reduction
                        acc_lo += p_first * fv_lo[None, :]
                        acc_hi += p_first * fv_hi[None, :]
                    m_i = m_new
        else:
            # the exact tail (original basis, as a 16-bit cache): positions n_pages*BS .. p-1
            # from the tail in the pages, in TAIL_SUB-token tiles, then this step's token
            scale = sm_scale * 1.4426950408889634  # exp2 domain
            qrow = q_ptr + q_start * stride_qt + hq[:, None] * stride_qh
            qx_lo = tl.load(qrow + c[None, :], mask=g_ok[:, None], other=0.0)
            qx_hi = tl.load(qrow + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
            tail = p - n_pages * BS  # tail tokens before p (-1: the block just completed)
            bt_row = block_table_ptr + row * stride_bt
            dt = k_ptr.dtype.element_ty
            for t0 in tl.range(0, tail, TAIL_SUB, num_stages=TAIL_STAGES):
                tt = t0 + tl.arange(0, TAIL_SUB)
                in_tail = tt < tail
                rk = tail_rows(cache_ptr, bt_row, n_pages, tt, h * stride_ch, stride_cb, in_tail,
                               TAIL_ROWS, ROW_BYTES, dt)[:, None]
                rk_lo = tl.load(rk + c[None, :], mask=in_tail[:, None], other=0.0)
                rk_hi = tl.load(rk + HALF + c[None, :], mask=in_tail[:, None], other=0.0)
                # unscaled model-dtype operands, scaled in fp32 after the product (as a 16-bit cache)
                s = tl.dot(qx_lo.to(DOT_DTYPE), tl.trans(rk_lo.to(DOT_DTYPE)))
                s = tl.dot(qx_hi.to(DOT_DTYPE), tl.trans(rk_hi.to(DOT_DTYPE)), s)
                s = tl.where(in_tail[None, :], s * scale, -float("inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_safe)
                pr = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(pr, axis=1)
                rv = tail_rows(cache_ptr, bt_row, n_pages, BS + tt, h * stride_ch, stride_cb, in_tail,
                               TAIL_ROWS, ROW_BYTES, dt)[:, None]
                rv_lo = tl.load(rv + c[None, :], mask=in_tail[:, None], other=0.0)
                rv_hi = tl.load(rv + HALF + c[None, :], mask=in_tail[:, None], other=0.0)
                acc_lo = tl.dot(pr.to(DOT_DTYPE), rv_lo.to(DOT_DTYPE), acc_lo * alpha[:, None])
                acc_hi = tl.dot(pr.to(DOT_DTYPE), rv_hi.to(DOT_DTYPE), acc_hi * alpha[:, None])
                m_i = m_new
            # this step's token (exact unless it completed its block, then it is in a page)
            nk = k_ptr + q_start * stride_kt + h * stride_kh
            s_new = tl.sum(qx_lo.to(tl.float32) * tl.load(nk + c).to(tl.float32)[None, :], axis=1) \
                + tl.sum(qx_hi.to(tl.float32) * tl.load(nk + HALF + c).to(tl.float32)[None, :], axis=1)
            s_new = tl.where(tail >= 0, s_new * scale, -float("inf"))
            m_new = tl.maximum(m_i, s_new)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p_new = tl.exp2(s_new - m_safe)
            l_i = l_i * alpha + p_new
            nv = v_ptr + q_start * stride_vt + h * stride_vh
            acc_lo = acc_lo * alpha[:, None] + p_new[:, None] * tl.load(nv + c).to(tl.float32)[None, :]
            acc_hi = acc_hi * alpha[:, None] + p_new[:, None] * tl.load(nv + HALF + c).to(tl.float32)[None, :]
            m_i = m_new

    o_ptr = part_o_ptr + part_base[:, None] * (2 * HALF)
    tl.store(o_ptr + c[None, :], acc_lo, mask=g_ok[:, None])
    tl.store(o_ptr + HALF + c[None, :], acc_hi, mask=g_ok[:, None])
    tl.store(part_ml_ptr + part_base * 2, m_i, mask=g_ok)
    tl.store(part_ml_ptr + part_base * 2 + 1, l_i, mask=g_ok)


@triton.jit(do_not_specialize=["splits"])
def _reduce_kernel(part_o_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh, qsl_ptr, rot_ptr, splits,
                   GROUP: tl.constexpr, G_PAD: tl.constexpr, HALF: tl.constexpr, INV_SQRT_D: tl.constexpr):
    """Merge the page splits (log-sum-exp, rotated basis), rotate their sum back, add the exact
    tail's partial (split `splits`, original basis) and normalize. out: any float dtype."""
    row = tl.program_id(0)
    h = tl.program_id(1)
    q_start = tl.load(qsl_ptr + row)
    if tl.load(qsl_ptr + row + 1) - q_start != 1:
        return
    g = tl.arange(0, G_PAD)
    c = tl.arange(0, HALF)
    g_ok = g < GROUP
    hq = h * GROUP + g
    base = (row * GROUP * tl.num_programs(1) + hq) * (splits + 1)  # [G_PAD]
    m_all = tl.full([G_PAD], -float("inf"), tl.float32)
    for s in range(splits + 1):
        m_all = tl.maximum(m_all, tl.load(part_ml_ptr + (base + s) * 2, mask=g_ok, other=-float("inf")))
    m_all = tl.where(m_all == -float("inf"), 0.0, m_all)
    l_all = tl.zeros([G_PAD], tl.float32)
    rot_lo = tl.zeros([G_PAD, HALF], tl.float32)
    rot_hi = tl.zeros([G_PAD, HALF], tl.float32)
    for s in range(splits):
        m = tl.load(part_ml_ptr + (base + s) * 2, mask=g_ok, other=-float("inf"))
        w = tl.exp2(m - m_all)  # 0 for an empty split (m = -inf)
        l_all += w * tl.load(part_ml_ptr + (base + s) * 2 + 1, mask=g_ok, other=0.0)
        o = part_o_ptr + (base + s)[:, None] * (2 * HALF)
        rot_lo += w[:, None] * tl.load(o + c[None, :], mask=g_ok[:, None], other=0.0)
        rot_hi += w[:, None] * tl.load(o + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
    # the pages' share back to the original basis (fp32 operands: tf32 on tensor cores)
    out_lo, out_hi = rotate_halves(rot_lo, rot_hi, rot_ptr, HALF, tl.float32, INV_SQRT_D, True)
    m = tl.load(part_ml_ptr + (base + splits) * 2, mask=g_ok, other=-float("inf"))
    w = tl.exp2(m - m_all)
    l_all += w * tl.load(part_ml_ptr + (base + splits) * 2 + 1, mask=g_ok, other=0.0)
    o = part_o_ptr + (base + splits)[:, None] * (2 * HALF)
    out_lo = (out_lo + w[:, None] * tl.load(o + c[None, :], mask=g_ok[:, None], other=0.0)) / l_all[:, None]
    out_hi = (out_hi + w[:, None] * tl.load(o + HALF + c[None, :], mask=g_ok[:, None], other=0.0)) \
        / l_all[:, None]
    dst = out_ptr + q_start * stride_ot + hq[:, None] * stride_oh
    tl.store(dst + c[None, :], out_lo.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
    tl.store(dst + HALF + c[None, :], out_hi.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


# Page programs per SM (four 4-warp programs are resident on sm80/sm90, tools/kernel_static.py) and
# the most splits of one row; launch_options("decode-grid", 0) overrides them (tools/gpu/tune_kernels.py)
PROGRAMS_PER_SM = 4
MAX_SPLITS = 32


def num_splits(num_rows: int, num_kv_heads: int, num_sms: int, max_splits: int | None = None) -> int:
    """Page splits per (row, kv head), from the batch shape only (graph-safe): as many page programs
    as fit PROGRAMS_PER_SM times on the GPU, rounded down so that no second, nearly empty wave of
    page programs follows (each (row, kv head) also has one short tail program, launched last)."""
    grid = launch_options("decode-grid", 0)
    want = grid.get("programs_per_sm", PROGRAMS_PER_SM) * num_sms
    max_splits = max_splits or grid.get("max_splits", MAX_SPLITS)
    return max(1, min(max_splits, want // max(1, num_rows * num_kv_heads)))


class DecodeWorkspace:
    """Rotated queries and split partials, reserved once per process while the model loads (so
    vLLM's memory profiling counts them) and never reallocated (captured CUDA graphs keep reading
    the same addresses). A row has `splits` page partials and one for its exact tail."""

    _buffers: ClassVar[dict] = {}
    _reserved: ClassVar[set] = set()

    @staticmethod
    def capacity(max_rows: int, num_kv_heads: int, num_sms: int) -> int:
        """Largest rows * (splits + 1) over every decode batch size up to max_rows."""
        return max(r * (num_splits(r, num_kv_heads, num_sms) + 1) for r in range(1, max_rows + 1))

    @classmethod
    def _fits(cls, key, partials: int, rows: int, hq: int, d: int) -> bool:
        return key in cls._buffers and cls._buffers[key][1].shape[0] >= partials * hq \
            and cls._buffers[key][2].numel() >= rows * hq * d

    @classmethod
    def _allocate(cls, key, partials: int, rows: int, hq: int, d: int, device) -> None:
        cls._buffers[key] = (torch.empty(partials * hq * d, dtype=torch.float32, device=device),
                             torch.empty(partials * hq, 2, dtype=torch.float32, device=device),
                             torch.empty(rows * hq * d, dtype=torch.float32, device=device))

    @classmethod
    def nbytes(cls) -> int:
        """Bytes of every workspace this process holds."""
        return sum(t.numel() * t.element_size() for bufs in cls._buffers.values() for t in bufs)

    @classmethod
    def reserve(cls, max_rows: int, hq: int, d: int, num_kv_heads: int, num_sms: int, device) -> None:
        key = (str(device), hq, d)
        partials = cls.capacity(max_rows, num_kv_heads, num_sms)
        if not cls._fits(key, partials, max_rows, hq, d):
            cls._allocate(key, partials, max_rows, hq, d, device)
        cls._reserved.add(key)

    @classmethod
    def get(cls, rows: int, hq: int, splits: int, d: int, device):
        """(partial outputs, partial (max, sum), rotated queries) for `rows` decode rows."""
        key = (str(device), hq, d)
        partials = rows * (splits + 1)
        if not cls._fits(key, partials, rows, hq, d):
            if key in cls._reserved:
                raise RuntimeError(f"int4_kivi decode workspace reserved too small for {rows} rows "
                                   f"x {splits + 1} partials")
            cls._allocate(key, partials, rows, hq, d, device)  # outside an engine (tests, benchmarks)
        return cls._buffers[key]


# Launch options of the decode kernel; launch_options("decode", d) overrides them (tools/gpu/tune_kernels.py).
# SUB: tokens of a page per step. PAGE_STAGES: software-pipeline depth of the page loop; behind the
# block-table indirection Triton 3.6 double-buffers the pages only from 5 stages on (two pages in
# flight while one is computed; with 2-4 the next page's copy is issued after the compute).
# TAIL_SUB / TAIL_STAGES: the exact tail's tiles (its buffers are allocated beside the page
# loop's, so they stay small). maxnreg 128 keeps four 4-warp programs resident per SM without
# spills on sm80-sm90 (tools/kernel_static.py).
DECODE_DEFAULTS = {"SUB": fmt.BLOCK_SIZE, "PAGE_STAGES": 5, "TAIL_SUB": 32, "TAIL_STAGES": 1,
                   "num_warps": 4, "maxnreg": 128}


def decode_attention(q, k, v, regions, md, num_decodes: int, sm_scale: float,
                     out: torch.Tensor, splits: int) -> None:
    """out[:num_decodes] = attention of the decode rows (query length 1, rows 0..num_decodes-1).

    q [T, Hq, D], k, v [T, Hkv, D] (model dtype, exact); out [T, Hq, D] (any float dtype).
    Three launches: rotate the queries, pages and tails (split-KV), reduce.
    """
    if num_decodes == 0:
        return
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    group = hq // hkv
    g_pad = max(16, triton.next_power_of_2(group))
    lay = fmt.PageLayout(d)
    part_o, part_ml, qr = DecodeWorkspace.get(num_decodes, hq, splits, d, q.device)
    rot = rotation_operand(d, q.dtype, q.device)
    inv_sqrt_d = 1.0 / math.sqrt(d)
    _rotate_queries_kernel[(num_decodes, hkv)](
        q, q.stride(0), q.stride(1), md.query_start_loc, qr, rot, sm_scale * LOG2E,
        GROUP=group, G_PAD=g_pad, HALF=d // 2, INV_SQRT_D=inv_sqrt_d, DOT_DTYPE=dot_dtype(q.dtype),
    )
    _decode_kernel[(num_decodes, hkv, splits + 1)](
        q, q.stride(0), q.stride(1), qr,
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0),
        part_o, part_ml, sm_scale, splits,
        GROUP=group, G_PAD=g_pad,
        BS=fmt.BLOCK_SIZE, HALF=d // 2,
        V_CODES=lay.v_codes, V_SCALE=lay.v_scale, K_SCALE=lay.k_scale, K_MIN=lay.k_min,
        FIRST_KEY=lay.first_key, FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(q.dtype)),
        CODE_DTYPE=tl_dtype(q.dtype), DOT_DTYPE=dot_dtype(q.dtype), **tail_constants(d, k.dtype),
        **{**DECODE_DEFAULTS, "USE_PTX": not interpreted(), **launch_options("decode", d, q.device)},
    )
    _reduce_kernel[(num_decodes, hkv)](
        part_o, part_ml, out, out.stride(0), out.stride(1), md.query_start_loc, rot, splits,
        GROUP=group, G_PAD=g_pad, HALF=d // 2, INV_SQRT_D=inv_sqrt_d,
    )
