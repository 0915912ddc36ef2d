"""Triton decode attention over int4_kivi pages (split-KV, GQA-packed) and its reduction.

Three launches per layer and step, all with grids that depend only on the batch size (graph-safe;
which pages a split covers is computed from the sequence lengths on the device):

1. ``_rotate_queries_kernel``: the decode queries rotated into the pages' basis and pre-scaled
   (fp32), once per row, so that no split repeats it and the page loop carries no rotation.
2. ``_decode_kernel``, one program per (decode row, kv head, split): splits 0..splits-1 walk their
   share of the row's quantized pages, loading each page once for all query heads of the kv head;
   splits splits..splits+window_splits-1 attend to their share of the window (its 8-bit rows in the
   pages, s4kv.kernels.window; the first of them also this step's token's row), in the rotated basis
   too. Pages are never dequantized into tiles: per-channel key
   scales go into the query (q . (c * s + m) = (q * s) . c + q . m) and per-token value scales into
   the probabilities (p @ ((c - 7.5) * s) = (p * s) @ (c - 7.5)), so the dots run on the codes,
   which become 16-bit operands B + c by bit operations (s4kv.kernels.quant.biased_code_operands);
   B comes off in fp32 once per page and query head (keys) or once per split (values). With the
   launch option INT8_KEYS and a bf16 model the key dots run on int8 instead (int8_keys): the codes
   themselves as int8 operands (s4kv.kernels.quant.int8_code_operands) and q * s rounded to int8 per
   page and query head. A block's
   first token is the exception (exact key, 8-bit value): its score comes from the exact key, and
   the high nibbles of its value codes are added on their own. One page per loop iteration.
3. ``_reduce_kernel``, one program per (row, kv head): merges the page and window partials
   (log-sum-exp), rotates their sum back to the original basis once and normalizes.
"""

import math
from typing import ClassVar

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from s4kv import format as fmt
from s4kv.kernels import (
    capability_major,
    compile_env,
    dot_dtype,
    interpreted,
    kernel_layout,
    launch_options,
    layout,
    padded_group,
    page_kernel_env,
    rotation_operand,
    tl_dtype,
)
from s4kv.kernels.code_ptx import CODE_BIAS as _CODE_BIAS
from s4kv.kernels.quant import (
    biased_code_operands,
    dot_precision,
    int8_code_operands,
    rotate_halves,
    rotate_with_tiles,
    round_to_int8,
    transposed_rotation_tiles,
)
from s4kv.kernels.window import window_slots

LOG2E = 1.4426950408889634


@triton.constexpr_function
def int8_keys(requested, code_dtype) -> int:
    """Whether the page loop's key dots run on int8 operands (1; mma m16n8k32 with int32 sums) or
    16-bit ones (0): the launch option INT8_KEYS where the operands are bf16 (a bf16 model), read
    at compile time. The codes are int8 operands as they lie in their bytes (3 instructions per 8
    codes against 7 for 16-bit operands, and half the MMAs), and q * s is rounded to int8 with one
    scale per page and query head (its largest |q * s| over the channels is 127). On an H100 the
    page kernel is 5-8% faster with the pages in L2 and within 0.7 us from DRAM (2026-12-07, twice:
    docs/results/gpu-2026-12-07-fifteenth/ and -sixteenth/), and SmolLM2's greedy continuations of
    16 prompts agree with bf16's as the shipped kernel's do (36.0% against 34.9% of the tokens,
    sixteenth). Off by default: its rows are 1.3e-2 to 2.6e-2 from the fp32 reference on random
    keys in the kernel tests and 3.0e-2 in the engine's start-up check (s4kv.backend.selfcheck),
    which holds bf16 rows to 1e-2 and refuses to start such an engine. (Two terms, the rounding's
    remainder as a second int8 operand, met that bound but were slower than the 16-bit dots:
    removed, sixteenth session.) fp16 operands (an fp16 model, or fp16_operands) keep 16-bit key
    dots: their q * s rounds finer than int8's."""
    if int(requested) not in (0, 1):
        raise ValueError(f"INT8_KEYS is 0 or 1, not {requested}")
    return int(requested) if code_dtype == tl.bfloat16 else 0


@triton.constexpr_function
def code_bias(code_dtype) -> float:
    """The bias of the unpacked code operands of a kernel's 16-bit code dtype (tl.bfloat16 or
    tl.float16; s4kv.kernels.code_ptx.CODE_BIAS), read at compile time."""
    return _CODE_BIAS["bf16" if code_dtype == tl.bfloat16 else "fp16"]


# The largest key scale the format stores: keys saturate at fp16's largest value
# (s4kv.format._saturate), so a channel's (max - min) / 15 is at most 2 * 65504 / 15, rounded up to fp16
K_SCALE_BOUND = float(fmt.fp16_up(torch.tensor(2 * fmt.FP16_MAX / fmt.CODE_LEVELS)))
_FP16_QUERY_BOUND = tl.constexpr(K_SCALE_BOUND / 2**15)  # fp16_query_scale: |q| * this <= 2^e


@triton.jit
def fp16_query_scale(q_lo, q_hi):
    """Per query head [G], the power of two 2^e (e >= 0) that fp16 dot operands divide the query by
    (bf16 operands have fp32's range and need none): then no q * s (s any key scale the format
    stores) and no query element exceeds 2^15, half of fp16's 65504. The scores are multiplied back
    (exact: powers of two); only products under 2^-14 * 2^e (fp16's smallest normal) lose digits,
    too small for a score of that query to see. log2 is approximate: just above a power of two it
    may give an e one lower, which leaves a product a hair above 2^15, still far under 65504."""
    qmax = tl.maximum(tl.max(tl.abs(q_lo), axis=1), tl.max(tl.abs(q_hi), axis=1))
    return tl.exp2(tl.maximum(tl.ceil(tl.log2(qmax * _FP16_QUERY_BOUND)), 0.0))


@triton.jit
def rotate_query_row(q_ptr, stride_qt, stride_qh, qsl_ptr, qr_ptr, rot_ptr, scale, row, h, hkv,
                     GROUP: tl.constexpr, G_PAD: tl.constexpr, HALF: tl.constexpr,
                     INV_SQRT_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """qr[row, hq] = q[row, hq] @ R * scale in fp32 for the query heads hq of kv head h: the decode
    queries as the pages meet them (model-dtype operands times the +-1 matrix: exact products,
    fp32 sums). Nothing for a row that is not a decode row (padding). Run by _rotate_queries_kernel,
    or by the step's row kernel (s4kv.kernels.store.quantize_rows), which saves the launch."""
    q_start = tl.load(qsl_ptr + row)
    if tl.load(qsl_ptr + row + 1) - q_start == 1:
        g = tl.arange(0, G_PAD)
        c = tl.arange(0, HALF)
        g_ok = g < GROUP
        hq = h * GROUP + g
        qrow = q_ptr + q_start * stride_qt + hq[:, None] * stride_qh
        x_lo = tl.load(qrow + c[None, :], mask=g_ok[:, None], other=0.0)
        x_hi = tl.load(qrow + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
        y_lo, y_hi = rotate_halves(x_lo, x_hi, rot_ptr, HALF, DOT_DTYPE, INV_SQRT_D, False, False)
        out = qr_ptr + (row * GROUP * hkv + hq[:, None]) * (2 * HALF)
        tl.store(out + c[None, :], y_lo * scale, mask=g_ok[:, None])
        tl.store(out + HALF + c[None, :], y_hi * scale, mask=g_ok[:, None])


@triton.jit
def _rotate_queries_kernel(q_ptr, stride_qt, stride_qh, qsl_ptr, qr_ptr, rot_ptr, scale,
                           GROUP: tl.constexpr, HALF: tl.constexpr,
                           INV_SQRT_D: tl.constexpr, DOT_DTYPE: tl.constexpr, PDL: tl.constexpr):
    """rotate_query_row for every (decode row, kv head)."""
    G_PAD: tl.constexpr = padded_group(GROUP)
    if PDL:  # the page kernel may be launched now; its page programs wait for qr (gdc_wait)
        gdc_launch_dependents()
    rotate_query_row(q_ptr, stride_qt, stride_qh, qsl_ptr, qr_ptr, rot_ptr, scale, tl.program_id(0),
                     tl.program_id(1), tl.num_programs(1), GROUP, G_PAD, HALF, INV_SQRT_D, DOT_DTYPE)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _page_region(cache_ptr, bt_row, page, head, stride_cb):
    """Page `page` of the row's block table: its (block, kv head) region's first byte."""
    return cache_ptr + tl.load(bt_row + page).to(tl.int64) * stride_cb + head


@triton.jit
def _narrow_loads(region, tb, c, V_SCALE: tl.constexpr):
    """A page's loads of fewer than 4 bytes per thread, which Triton's async-copy pipeline does
    not take (its copies are 4 to 16 bytes), so that they would wait for memory inside the loop:
    the value scales [BS], token 0's value scale and token 0's key code row [HALF] (its 8-bit
    value's high nibbles). The page loop issues them one page ahead. (Nsight Compute, H200, 8k x 32:
    the two scale loads held 14% of the loop's stall samples when they were issued in the page's
    own iteration. Read as 4-byte words they are pipelined, but unpacking the words cost more than
    the wait: 4% slower. docs/results/gpu-h200-2026-12-02-decode-loads/)"""
    vs_ptr = (region + V_SCALE).to(tl.pointer_type(tl.float16))
    return tl.load(vs_ptr + tb), tl.load(vs_ptr), tl.load(region + c)


@triton.jit
def _page_keys(cache_ptr, bt_row, page, head, stride_cb, q_lo, q_hi, c, f16, k0, HALF: tl.constexpr,
               K_SCALE: tl.constexpr, K_MIN: tl.constexpr, FIRST_KEY: tl.constexpr,
               FIRST_KEY_DTYPE: tl.constexpr, CODE_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
               INT8_KEYS: tl.constexpr):
    """One page's per-query-head terms: (region, the scaled query halves [G, HALF] as dot operands,
    the scores' per-head unit (INT8_KEYS: what one unit of the int8 dots is worth; else 1), the
    scores' per-head constant, the first token's exact score, the first value's high-nibble terms
    [HALF]). f16, k0: token 0's value scale and key code row (_narrow_loads)."""
    region = _page_region(cache_ptr, bt_row, page, head, stride_cb)
    ks_ptr = (region + K_SCALE).to(tl.pointer_type(tl.float16))
    km_ptr = (region + K_MIN).to(tl.pointer_type(tl.float16))
    fk_ptr = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
    if INT8_KEYS:
        # q . (c * s + m) = unit * round((q * s) / unit) . c + q . m, unit = max |q * s| / 127 per head:
        # the dots run on the codes as int8, the rest is one constant per query head
        qs_lo = q_lo * tl.load(ks_ptr + c).to(tl.float32)[None, :]
        qs_hi = q_hi * tl.load(ks_ptr + HALF + c).to(tl.float32)[None, :]
        amax = tl.maximum(tl.maximum(tl.max(tl.abs(qs_lo), axis=1), tl.max(tl.abs(qs_hi), axis=1)), 1e-30)
        inv = 127.0 / amax
        qk_lo = round_to_int8(qs_lo * inv[:, None])
        qk_hi = round_to_int8(qs_hi * inv[:, None])
        k_unit = amax / 127.0
        s_const = tl.sum(q_lo * tl.load(km_ptr + c).to(tl.float32)[None, :]
                         + q_hi * tl.load(km_ptr + HALF + c).to(tl.float32)[None, :], axis=1)
    else:
        # q . (c * s + m) = (q * s) . (B + c) + q . m - B * sum(q * s): the scales go into the query,
        # the dots run on the biased codes, the rest is one constant per query head
        k_unit = 1.0
        qk_lo = (q_lo * tl.load(ks_ptr + c).to(tl.float32)[None, :]).to(DOT_DTYPE)
        qk_hi = (q_hi * tl.load(ks_ptr + HALF + c).to(tl.float32)[None, :]).to(DOT_DTYPE)
        s_const = tl.sum(q_lo * tl.load(km_ptr + c).to(tl.float32)[None, :]
                         + q_hi * tl.load(km_ptr + HALF + c).to(tl.float32)[None, :]
                         - CODE_BIAS * (qk_lo.to(tl.float32) + qk_hi.to(tl.float32)), axis=1)
    s_first = tl.sum(q_lo * tl.load(fk_ptr + c).to(tl.float32)[None, :]
                     + q_hi * tl.load(fk_ptr + HALF + c).to(tl.float32)[None, :], axis=1)
    # the block's first value is 8-bit codes: the page loop reads their low nibbles as 4-bit codes,
    # and code - 127.5 = (low - 7.5) + 16 * (high - 7.5) adds the high nibbles (in the key code row
    # of token 0, contiguous) on their own
    f16s = 16.0 * f16.to(tl.float32)
    fv_lo = ((k0 & 0xF).to(tl.float32) - 7.5) * f16s
    fv_hi = ((k0 >> 4).to(tl.float32) - 7.5) * f16s
    return region, qk_lo, qk_hi, k_unit, s_const, s_first, fv_lo, fv_hi


@triton.jit
def _pages_partial(cache_ptr, stride_cb, head, bt_row, qr_row, page_lo, page_hi, o_ptr, ml_ptr, head_stride,
                   heads, G: tl.constexpr, SUB: tl.constexpr, PAGE_STAGES: tl.constexpr,
                   BS: tl.constexpr, HALF: tl.constexpr, CODE_BIAS: tl.constexpr,
                   V_CODES: tl.constexpr, V_SCALE: tl.constexpr, K_SCALE: tl.constexpr, K_MIN: tl.constexpr,
                   FIRST_KEY: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr, CODE_DTYPE: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, USE_PTX: tl.constexpr, INT8_KEYS: tl.constexpr):
    """One split's share of the pages, pages page_lo..page_hi-1, stored as a partial (rotated
    basis) for `heads` (<= G) query heads at o_ptr / ml_ptr (query head g's at g * head_stride
    partials of 2 * HALF values and of a (max, sum) pair).

    Transposed tiles: tokens are the rows (the dots' M, 16 per MMA) and the G query heads the
    columns (N, 8 per MMA: GQA groups of up to 8 fill it), so no MMA row is padding and score
    tiles hold SUB x G values (G = 8): scores^T = codes [SUB, HALF] @ (q * s)^T, out^T += (value codes)^T
    [HALF, SUB] @ (p * s)^T, both code tiles read as they lie in the page."""
    # fp32 operands (an fp32 model) multiplied in fp32: as tf32 the dots would round q * s and p * s,
    # which the biased codes' constants are computed from unrounded (dot_precision)
    EXACT: tl.constexpr = dot_precision(DOT_DTYPE, False)
    INT8: tl.constexpr = int8_keys(INT8_KEYS, CODE_DTYPE)
    g = tl.arange(0, G)
    c = tl.arange(0, HALF)
    g_ok = g < heads
    q_lo = tl.load(qr_row + g[:, None] * (2 * HALF) + c[None, :], mask=g_ok[:, None], other=0.0)
    q_hi = tl.load(qr_row + g[:, None] * (2 * HALF) + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
    if DOT_DTYPE == tl.float16:  # the page terms come in units of q_pow2 (fp16_query_scale)
        q_pow2 = fp16_query_scale(q_lo, q_hi)
        q_lo = q_lo / q_pow2[:, None]
        q_hi = q_hi / q_pow2[:, None]
    m_i = tl.full([G], -float("inf"), tl.float32)
    l_tile = tl.zeros([SUB, G], tl.float32)
    ps_tile = tl.zeros([SUB, G], tl.float32)  # sum of p * s over tokens: the value bias comes off once
    acc_lo = tl.zeros([HALF, G], tl.float32)
    acc_hi = tl.zeros([HALF, G], tl.float32)
    tb = tl.arange(0, BS)
    # an empty split reads its row's page 0 (every decode row holds one) and uses none of it
    ahead = _page_region(cache_ptr, bt_row, tl.minimum(page_lo, tl.maximum(page_hi - 1, 0)), head, stride_cb)
    vs_next, f16_next, k0_next = _narrow_loads(ahead, tb, c, V_SCALE)
    for page in tl.range(page_lo, page_hi, num_stages=PAGE_STAGES):
        vs_page, f16, k0 = vs_next, f16_next, k0_next
        # the next page's narrow loads (the last page's again at the end: in bounds, and cached)
        ahead = _page_region(cache_ptr, bt_row, tl.minimum(page + 1, page_hi - 1), head, stride_cb)
        vs_next, f16_next, k0_next = _narrow_loads(ahead, tb, c, V_SCALE)
        region, qk_lo, qk_hi, k_unit, s_const, s_first, fv_lo, fv_hi = _page_keys(
            cache_ptr, bt_row, page, head, stride_cb, q_lo, q_hi, c, f16, k0, HALF, K_SCALE, K_MIN,
            FIRST_KEY, FIRST_KEY_DTYPE, CODE_BIAS, DOT_DTYPE, INT8)
        if DOT_DTYPE == tl.float16:
            s_const = s_const * q_pow2
            s_first = s_first * q_pow2
        vs_ptr = (region + V_SCALE).to(tl.pointer_type(tl.float16))
        for sub in tl.static_range(BS // SUB):
            ts = sub * SUB + tl.arange(0, SUB)
            kc = tl.load(region + ts[:, None] * HALF + c[None, :])  # [SUB, HALF] token-major
            if INT8:
                k_lo, k_hi = int8_code_operands(kc, USE_PTX)
                s = tl.dot(k_lo, tl.trans(qk_lo), out_dtype=tl.int32)
                s = tl.dot(k_hi, tl.trans(qk_hi), s, out_dtype=tl.int32)  # [SUB, G]
                s = s.to(tl.float32) * k_unit[None, :] + s_const[None, :]
            else:
                k_lo, k_hi = biased_code_operands(kc, CODE_DTYPE, DOT_DTYPE, USE_PTX)
                s = tl.dot(k_lo, tl.trans(qk_lo), input_precision=EXACT)
                s = tl.dot(k_hi, tl.trans(qk_hi), s, input_precision=EXACT)  # [SUB, G]
                if DOT_DTYPE == tl.float16:
                    s = s * q_pow2[None, :] + s_const[None, :]
                else:
                    s += s_const[None, :]
            m_tile = tl.max(s, axis=0)
            if sub == 0:  # the block's first token: its exact key's score
                s = tl.where(ts[:, None] == 0, -float("inf"), s)
                m_tile = tl.maximum(tl.max(s, axis=0), s_first)
            m_new = tl.maximum(m_i, m_tile)
            alpha = tl.exp2(m_i - m_new)
            pr = tl.exp2(s - m_new[None, :])
            if sub == 0:
                p_first = tl.exp2(s_first - m_new)
                pr = tl.where(ts[:, None] == 0, p_first[None, :], pr)
            # p @ ((c - 7.5) * s) = (p * s) @ (c - 7.5): the per-token scales go into p
            # the scales loaded a page ahead (a sub-tile's own: loaded here)
            vs = vs_page if SUB == BS else tl.load(vs_ptr + ts)
            pv = (pr * vs.to(tl.float32)[:, None]).to(DOT_DTYPE)
            l_tile = l_tile * alpha[None, :] + pr
            ps_tile = ps_tile * alpha[None, :] + pv.to(tl.float32)
            vc = tl.load(region + V_CODES + c[:, None] * BS + ts[None, :])  # [HALF, SUB] channel-major
            v_lo, v_hi = biased_code_operands(vc, CODE_DTYPE, DOT_DTYPE, USE_PTX)
            acc_lo = tl.dot(v_lo, pv, acc_lo * alpha[None, :], input_precision=EXACT)
            acc_hi = tl.dot(v_hi, pv, acc_hi * alpha[None, :], input_precision=EXACT)
            if sub == 0:  # the first value's high nibbles
                acc_lo += fv_lo[:, None] * p_first[None, :]
                acc_hi += fv_hi[:, None] * p_first[None, :]
            m_i = m_new
    l_i, p_sum = tl.reduce((l_tile, ps_tile), 0, _add2)
    acc_lo -= (CODE_BIAS + 7.5) * p_sum[None, :]
    acc_hi -= (CODE_BIAS + 7.5) * p_sum[None, :]
    o = o_ptr + g[None, :] * head_stride * (2 * HALF)
    tl.store(o + c[:, None], acc_lo, mask=g_ok[None, :])
    tl.store(o + HALF + c[:, None], acc_hi, mask=g_ok[None, :])
    tl.store(ml_ptr + g * head_stride * 2, m_i, mask=g_ok)
    tl.store(ml_ptr + g * head_stride * 2 + 1, l_i, mask=g_ok)


# splits is a runtime argument, not a constexpr, and not specialized: it follows the decode batch size,
# and each new value would compile both kernels again in the serving path (about 2 s each for sm90;
# a shrinking batch of 16 SmolLM2 requests met 10 values)
@triton.jit(do_not_specialize=["splits"])
def _decode_kernel(
    qr_ptr,  # [R, Hq, D] fp32: decode queries rotated and scaled by sm_scale * log2(e)
    kc_ptr, vc_ptr, sc_ptr,  # this step's window rows (s4kv.kernels.store.StepRows)
    cache_ptr, stride_cb, stride_ch,  # pages, uint8 (windows included)
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    part_o_ptr, part_ml_ptr,  # [R, Hq, splits + WINDOW_SPLITS, D] fp32, [R, Hq, splits + WINDOW_SPLITS, 2] fp32
    splits,
    GROUP: tl.constexpr, SUB: tl.constexpr,
    PAGE_STAGES: tl.constexpr, TAIL_SUB: tl.constexpr, TAIL_STAGES: tl.constexpr,
    LAYOUT: tl.constexpr,  # s4kv.kernels.kernel_layout: the format's constants, read below
    G_PAGES: tl.constexpr, CODE_DTYPE: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, USE_PTX: tl.constexpr, HKV: tl.constexpr,
    WINDOW_SPLITS: tl.constexpr, PDL: tl.constexpr, INT8_KEYS: tl.constexpr,
):
    # derived here rather than passed: each constexpr argument costs host time in every eager launch
    G_PAD: tl.constexpr = padded_group(GROUP)
    HEAD_CHUNKS: tl.constexpr = (GROUP + G_PAGES - 1) // G_PAGES
    CODE_BIAS: tl.constexpr = code_bias(CODE_DTYPE)
    BS: tl.constexpr = layout(LAYOUT, "block_size")
    UNIT: tl.constexpr = layout(LAYOUT, "unit")
    HALF: tl.constexpr = layout(LAYOUT, "half")
    V_CODES: tl.constexpr = layout(LAYOUT, "v_codes")
    V_SCALE: tl.constexpr = layout(LAYOUT, "v_scale")
    K_SCALE: tl.constexpr = layout(LAYOUT, "k_scale")
    K_MIN: tl.constexpr = layout(LAYOUT, "k_min")
    FIRST_KEY: tl.constexpr = layout(LAYOUT, "first_key")
    W_V_CODES: tl.constexpr = layout(LAYOUT, "w_v_codes")
    W_K_SCALE: tl.constexpr = layout(LAYOUT, "w_k_scale")
    W_V_SCALE: tl.constexpr = layout(LAYOUT, "w_v_scale")
    EXACT: tl.constexpr = dot_precision(DOT_DTYPE, False)  # fp32 operands multiplied in fp32
    if PDL:  # the reduction may be launched once every program here has started; it waits (gdc_wait)
        gdc_launch_dependents()
    row = tl.program_id(0)
    # HEAD_CHUNKS programs per kv head: the page loop's tiles hold 8 query heads (its dots' N; under
    # Triton 3.6 a larger N made Triton choose sm90's wgmma for them, which was slower and wrong here;
    # the kernel is now compiled without wgmma on sm90, s4kv.kernels.mma_sync_env, and N = 16 has not
    # been timed since), so a group of more than 8 reads its pages once per 8 query heads; the
    # window is chunk 0's
    h = tl.program_id(1) // HEAD_CHUNKS
    chunk = tl.program_id(1) % HEAD_CHUNKS
    hkv = tl.num_programs(1) // HEAD_CHUNKS
    split = tl.program_id(2)
    g = tl.arange(0, G_PAD)
    c = tl.arange(0, HALF)
    g_ok = g < GROUP
    hq = h * GROUP + g
    parts = splits + WINDOW_SPLITS  # partials per (row, query head)
    part_base = (row * (GROUP * hkv) + hq) * parts + split

    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    p = tl.load(seq_lens_ptr + row) - 1  # the query's position
    n_pages = (p + 1) // UNIT * (UNIT // BS)  # the blocks of complete units: read from pages

    m_i = tl.full([G_PAD], -float("inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc_lo = tl.zeros([G_PAD, HALF], tl.float32)
    acc_hi = tl.zeros([G_PAD, HALF], tl.float32)

    if (qlen == 1) & (split < splits):
        # pages (rotated basis; the reduction rotates their share back)
        per_split = tl.cdiv(n_pages, splits)
        page_lo = split * per_split
        # partials of query head hq and split s at (hq * parts + s); this chunk's first head
        hq0 = row * (GROUP * hkv) + h * GROUP + chunk * G_PAGES
        if PDL:  # launched while the rotation may still run: its queries are complete after this
            gdc_wait()
        _pages_partial(cache_ptr, stride_cb, h * stride_ch, block_table_ptr + row * stride_bt,
                       qr_ptr + hq0 * (2 * HALF), page_lo, tl.minimum(page_lo + per_split, n_pages),
                       part_o_ptr + (hq0 * parts + split) * (2 * HALF),
                       part_ml_ptr + (hq0 * parts + split) * 2, parts,
                       tl.minimum(GROUP - chunk * G_PAGES, G_PAGES),
                       G_PAGES, SUB, PAGE_STAGES, BS, HALF, CODE_BIAS, V_CODES, V_SCALE, K_SCALE,
                       K_MIN, FIRST_KEY, FIRST_KEY_DTYPE, CODE_DTYPE, DOT_DTYPE, USE_PTX, INT8_KEYS)
    elif chunk == 0:
        if qlen == 1:
            # the window (rotated basis, 8-bit rows): this split's share of positions n_pages*BS .. p-1
            # from their rows in the pages, in TAIL_SUB-row tiles, then (the first window split)
            # this step's token's row. A window is up to 255 rows: one program walking them all
            # outlasted the page programs, which it follows in the grid (H200, 192 rows: +9 us).
            if PDL:
                gdc_wait()
            qrow = qr_ptr + (row * (GROUP * hkv) + hq[:, None]) * (2 * HALF)
            q_lo = tl.load(qrow + c[None, :], mask=g_ok[:, None], other=0.0)
            q_hi = tl.load(qrow + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
            if DOT_DTYPE == tl.float16:  # the window's dots in units of w_pow2 (fp16_query_scale)
                w_pow2 = fp16_query_scale(q_lo, q_hi)
                qd_lo = (q_lo / w_pow2[:, None]).to(DOT_DTYPE)
                qd_hi = (q_hi / w_pow2[:, None]).to(DOT_DTYPE)
            else:
                qd_lo = q_lo.to(DOT_DTYPE)
                qd_hi = q_hi.to(DOT_DTYPE)
            tail = p - n_pages * BS  # window rows before p (-1: the unit just completed)
            w = split - splits
            per_program = tl.cdiv(tl.maximum(tail, 0), WINDOW_SPLITS)  # window rows
            w_lo = w * per_program
            w_hi = tl.minimum(w_lo + per_program, tail)
            bt_row = block_table_ptr + row * stride_bt
            for t0 in tl.range(w_lo, w_hi, TAIL_SUB, num_stages=TAIL_STAGES):
                tt = t0 + tl.arange(0, TAIL_SUB)
                in_tail = tt < w_hi
                base, slot = window_slots(cache_ptr, bt_row, n_pages, tt, h * stride_ch, stride_cb, in_tail, LAYOUT)
                rk = base[:, None] + slot[:, None] * (2 * HALF) + c[None, :]
                m = in_tail[:, None]
                # codes - 127.5 are exact dot operands; the row's scale multiplies the score after
                ck_lo = (tl.load(rk, mask=m, other=0).to(tl.float32) - 127.5).to(DOT_DTYPE)
                ck_hi = (tl.load(rk + HALF, mask=m, other=0).to(tl.float32) - 127.5).to(DOT_DTYPE)
                ks = tl.load((base + W_K_SCALE).to(tl.pointer_type(tl.float16)) + slot, mask=in_tail, other=0.0)
                s = tl.dot(qd_lo, tl.trans(ck_lo), input_precision=EXACT)
                s = tl.dot(qd_hi, tl.trans(ck_hi), s, input_precision=EXACT)  # [G_PAD, TAIL_SUB]
                if DOT_DTYPE == tl.float16:
                    s = s * w_pow2[:, None]
                s = tl.where(in_tail[None, :], s * ks.to(tl.float32)[None, :], -float("inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_safe)
                pr = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(pr, axis=1)
                vs = tl.load((base + W_V_SCALE).to(tl.pointer_type(tl.float16)) + slot, mask=in_tail, other=0.0)
                pv = (pr * vs.to(tl.float32)[None, :]).to(DOT_DTYPE)
                cv_lo = (tl.load(rk + W_V_CODES, mask=m, other=0).to(tl.float32) - 127.5).to(DOT_DTYPE)
                cv_hi = (tl.load(rk + W_V_CODES + HALF, mask=m, other=0).to(tl.float32) - 127.5).to(DOT_DTYPE)
                acc_lo = tl.dot(pv, cv_lo, acc_lo * alpha[:, None], input_precision=EXACT)
                acc_hi = tl.dot(pv, cv_hi, acc_hi * alpha[:, None], input_precision=EXACT)
                m_i = m_new
            # this step's token's row (in the window unless it completed its unit: then in a page)
            own = q_start.to(tl.int64) * HKV + h
            ks_own = tl.load(sc_ptr + own * 2).to(tl.float32)
            vs_own = tl.load(sc_ptr + own * 2 + 1).to(tl.float32)
            nk_lo = (tl.load(kc_ptr + own * (2 * HALF) + c).to(tl.float32) - 127.5) * ks_own
            nk_hi = (tl.load(kc_ptr + own * (2 * HALF) + HALF + c).to(tl.float32) - 127.5) * ks_own
            s_new = tl.sum(q_lo * nk_lo[None, :], axis=1) + tl.sum(q_hi * nk_hi[None, :], axis=1)
            s_new = tl.where((tail >= 0) & (w == 0), s_new, -float("inf"))
            m_new = tl.maximum(m_i, s_new)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p_new = tl.exp2(s_new - m_safe)
            l_i = l_i * alpha + p_new
            nv_lo = (tl.load(vc_ptr + own * (2 * HALF) + c).to(tl.float32) - 127.5) * vs_own
            nv_hi = (tl.load(vc_ptr + own * (2 * HALF) + HALF + c).to(tl.float32) - 127.5) * vs_own
            acc_lo = acc_lo * alpha[:, None] + p_new[:, None] * nv_lo[None, :]
            acc_hi = acc_hi * alpha[:, None] + p_new[:, None] * nv_hi[None, :]
            m_i = m_new

        o_ptr = part_o_ptr + part_base[:, None] * (2 * HALF)
        tl.store(o_ptr + c[None, :], acc_lo, mask=g_ok[:, None])
        tl.store(o_ptr + HALF + c[None, :], acc_hi, mask=g_ok[:, None])
        tl.store(part_ml_ptr + part_base * 2, m_i, mask=g_ok)
        tl.store(part_ml_ptr + part_base * 2 + 1, l_i, mask=g_ok)


@triton.constexpr_function
def reduce_heads(group: int, head_splits: int) -> int:
    """Query-head rows of one reduction program: the padded group (one program per row and kv head),
    or, split over head_splits programs, the next power of two of each one's share."""
    if head_splits == 1:
        return padded_group(group)
    return 1 << (-(-group // head_splits) - 1).bit_length()


@triton.constexpr_function
def part_tile(part_rows: int, g_sub: int) -> int:
    """Partials per query head that _reduce_kernel loads at once for PART_ROWS (a power of two)."""
    return max(part_rows // g_sub, 1)


@triton.jit(do_not_specialize=["parts"])
def _reduce_kernel(part_o_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh, qsl_ptr, rot_ptr, parts,
                   GROUP: tl.constexpr, HALF: tl.constexpr, INV_SQRT_D: tl.constexpr,
                   STAGES: tl.constexpr, HEAD_SPLITS: tl.constexpr, PART_ROWS: tl.constexpr,
                   PDL: tl.constexpr):
    """Merge a row's `parts` partials (its page splits and window splits), all in the rotated basis
    (log-sum-exp), rotate their sum back once and normalize. out: any float dtype.
    HEAD_SPLITS programs per (row, kv head), each for its share of the query heads (a launch
    option: more programs where a small batch gives few rows)."""
    G_SUB: tl.constexpr = reduce_heads(GROUP, HEAD_SPLITS)
    row = tl.program_id(0)
    h = tl.program_id(1) // HEAD_SPLITS
    q_start = tl.load(qsl_ptr + row)
    if tl.load(qsl_ptr + row + 1) - q_start != 1:
        return
    if PDL:  # launched while the page kernel may still run: the row's check above and the
        # rotation's tiles (nothing it writes) load while it finishes; its partials are complete
        # after gdc_wait
        r00, r01, r10, r11 = transposed_rotation_tiles(rot_ptr, HALF)
        gdc_wait()
    g = (tl.program_id(1) % HEAD_SPLITS) * G_SUB + tl.arange(0, G_SUB)
    c = tl.arange(0, HALF)
    g_ok = g < GROUP
    hq = h * GROUP + g
    base = (row * GROUP * (tl.num_programs(1) // HEAD_SPLITS) + hq) * parts  # [G_SUB]
    m_all = tl.full([G_SUB], -float("inf"), tl.float32)
    l_all = tl.zeros([G_SUB], tl.float32)
    rot_lo = tl.zeros([G_SUB, HALF], tl.float32)
    rot_hi = tl.zeros([G_SUB, HALF], tl.float32)
    if PART_ROWS == 0:
        # one pass, merging split after split (log-sum-exp with a running max); the splits' loads do
        # not depend on each other, so the software pipeline keeps several in flight (a first pass
        # for the max and a second for the sums waited on one load after another)
        for s in tl.range(0, parts, num_stages=STAGES):
            m = tl.load(part_ml_ptr + (base + s) * 2, mask=g_ok, other=-float("inf"))
            ln = tl.load(part_ml_ptr + (base + s) * 2 + 1, mask=g_ok, other=0.0)
            o = part_o_ptr + (base + s)[:, None] * (2 * HALF)
            o_lo = tl.load(o + c[None, :], mask=g_ok[:, None], other=0.0)
            o_hi = tl.load(o + HALF + c[None, :], mask=g_ok[:, None], other=0.0)
            m_new = tl.maximum(m_all, m)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            w_old = tl.exp2(m_all - m_safe)
            w = tl.exp2(m - m_safe)  # 0 for an empty split (m = -inf)
            l_all = l_all * w_old + w * ln
            rot_lo = rot_lo * w_old[:, None] + w[:, None] * o_lo
            rot_hi = rot_hi * w_old[:, None] + w[:, None] * o_hi
            m_all = m_new
    else:
        # PART_ROWS (partial, head) rows at once: a row's partials (usually all of them) in one
        # round trip to memory instead of one after another, merged as a tile
        P: tl.constexpr = part_tile(PART_ROWS, G_SUB)
        sp = tl.arange(0, P)
        for s0 in tl.range(0, parts, P):
            idx = base[:, None] + s0 + sp[None, :]  # [G_SUB, P]
            ok = ((s0 + sp) < parts)[None, :] & g_ok[:, None]
            m = tl.load(part_ml_ptr + idx * 2, mask=ok, other=-float("inf"))
            ln = tl.load(part_ml_ptr + idx * 2 + 1, mask=ok, other=0.0)
            o = part_o_ptr + idx[:, :, None] * (2 * HALF) + c[None, None, :]
            o_lo = tl.load(o, mask=ok[:, :, None], other=0.0)
            o_hi = tl.load(o + HALF, mask=ok[:, :, None], other=0.0)
            m_new = tl.maximum(m_all, tl.max(m, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            w_old = tl.exp2(m_all - m_safe)
            w = tl.exp2(m - m_safe[:, None])  # 0 for an empty split or a row past `parts`
            l_all = l_all * w_old + tl.sum(w * ln, axis=1)
            rot_lo = rot_lo * w_old[:, None] + tl.sum(w[:, :, None] * o_lo, axis=1)
            rot_hi = rot_hi * w_old[:, None] + tl.sum(w[:, :, None] * o_hi, axis=1)
            m_all = m_new
    if not PDL:  # loaded after the partials: before them they were 0.5-0.7 us slower (H100, 2026-12-05)
        r00, r01, r10, r11 = transposed_rotation_tiles(rot_ptr, HALF)
    # back to the original basis (fp32 operands as tf32 on tensor cores: 2e-4 of the output under the
    # interpreter with tf32 rounding emulated; nothing is quantized after it)
    out_lo, out_hi = rotate_with_tiles(rot_lo, rot_hi, r00, r01, r10, r11, tl.float32, INV_SQRT_D, True)
    dst = out_ptr + q_start * stride_ot + hq[:, None] * stride_oh
    tl.store(dst + c[None, :], (out_lo / l_all[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
    tl.store(dst + HALF + c[None, :], (out_hi / l_all[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


# Page programs per SM (four 4-warp programs are resident on sm80/sm90, tools/kernel_static.py), the
# most splits of one row, and the programs that share a row's window (up to 255 rows: each takes
# cdiv(rows, WINDOW_SPLITS) of them); launch_options("decode-grid", 0) overrides them
# (tools/gpu/tune_kernels.py). Two window programs of 64-row tiles: with a 254-row window one
# program of 32-row tiles outlasted the page programs by 13-17 us; now 1.6 us more with no window
# (the reduction's one more partial), 13-14 us less with 254 rows (H200, 8k x 32 and 32k x 8,
# docs/results/gpu-h200-2026-12-04-decode-window/)
PROGRAMS_PER_SM = 4
MAX_SPLITS = 32
WINDOW_SPLITS = 2


def window_splits() -> int:
    """Window programs per (decode row, kv head)."""
    return int(launch_options("decode-grid", 0).get("window_splits", WINDOW_SPLITS))


def num_splits(num_rows: int, num_kv_heads: int, num_sms: int, max_splits: int | None = None) -> int:
    """Page splits per (row, kv head), from the batch shape only (graph-safe): as many page programs
    as fit PROGRAMS_PER_SM times on the GPU, rounded down so that no second, nearly empty wave of
    page programs follows (each (row, kv head) also has window_splits() short window programs,
    launched last)."""
    grid = launch_options("decode-grid", 0)
    want = grid.get("programs_per_sm", PROGRAMS_PER_SM) * num_sms
    max_splits = max_splits or grid.get("max_splits", MAX_SPLITS)
    return max(1, min(max_splits, want // max(1, num_rows * num_kv_heads)))


class DecodeWorkspace:
    """Rotated queries and split partials, reserved once per process while the model loads (so
    vLLM's memory profiling counts them) and never reallocated (captured CUDA graphs keep reading
    the same addresses). A row has `splits` page partials and window_splits() for its window."""

    _buffers: ClassVar[dict] = {}
    _reserved: ClassVar[set] = set()

    @staticmethod
    def capacity(max_rows: int, num_kv_heads: int, num_sms: int) -> int:
        """Largest rows * (splits + window splits) over every decode batch size up to max_rows."""
        ws = window_splits()
        return max(r * (num_splits(r, num_kv_heads, num_sms) + ws) for r in range(1, max_rows + 1))

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
    def get(cls, rows: int, hq: int, parts: int, d: int, device):
        """(partial outputs, partial (max, sum), rotated queries) for `rows` decode rows of `parts`
        partials each."""
        key = (str(device), hq, d)
        partials = rows * parts
        if not cls._fits(key, partials, rows, hq, d):
            if key in cls._reserved:
                raise RuntimeError(f"int4_kivi decode workspace reserved too small for {rows} rows "
                                   f"x {parts} partials")
            cls._allocate(key, partials, rows, hq, d, device)  # outside an engine (tests, benchmarks)
        return cls._buffers[key]


# Launch options of the split reduction; launch_options("decode-reduce", d) overrides them
# (tools/gpu/tune_kernels.py). STAGES: splits in flight at once when PART_ROWS is 0. PART_ROWS (a
# power of two, 0 = off): (partial, query head) rows loaded at once as one tile, so a row's partials
# arrive in one round trip to memory instead of one after another. HEAD_SPLITS: programs per (row,
# kv head), each merging its share of the query heads. The tuner's pick on the H100 (2026-12-06),
# 64-row tiles and one program per (row, kv head) at every batch, took the decode call per layer of
# an 8-layer graph from 29.7 / 66.0 / 67.3 to 28.7 / 65.1 / 65.8 us at 1k x 64 / 8k x 32 / 32k x 8,
# against the loop with 4 programs per (row, kv head) where the grid fit in one program per SM, the
# default before (two passes each, docs/results/gpu-h100-2026-12-06-reduce-tile/). (The rotation's
# tiles loaded before the partials, an option from 2026-12-05, was 0.5-0.7 us slower at every
# measured point on the H100 and is gone.)
REDUCE_DEFAULTS = {"STAGES": 3, "PART_ROWS": 64, "HEAD_SPLITS": 1, "num_warps": 4}

# query heads per page-loop program (the N of its dots, see _decode_kernel)
PAGE_HEADS = 8

# Launch options of the decode kernel; launch_options("decode", d) overrides them (tools/gpu/tune_kernels.py).
# SUB: tokens of a page per step. PAGE_STAGES: software-pipeline depth of the page loop; behind the
# block-table indirection Triton 3.6 double-buffers the pages only from 5 stages on (two pages in
# flight while one is computed; with 2-4 the next page's copy is issued after the compute).
# TAIL_SUB / TAIL_STAGES: the window's tiles (its buffers are allocated beside the page
# loop's, so they stay small; 64 rows unpipelined was the fastest of 32/64 rows x 1/2 stages with 1,
# 2 or 4 window programs, and 2 stages spill at 64). maxnreg 128 keeps four 4-warp programs resident per SM without
# spills on sm80-sm90 (tools/kernel_static.py). Fewer warps per program (fewer instructions per
# page, fewer barriers) and the pages' score bounds as the running max were 2-150% slower on the
# H200 (2026-12-05, docs/results/gpu-h200-2026-12-05-decode-configs/). Tried on an H100 and removed
# (2026-12-06, docs/results/gpu-h100-2026-12-06-page-loop-bound/, each change's diff there): the page
# programs' L2 prefetch of their first pages before they wait (PREFETCH_PAGES), the page programs
# rotating their queries themselves so that they need not wait for the row kernel and the store
# (ROTATE_IN_PAGES), and whole code bytes as fp16 operands (BYTE_CODES, 12% fewer instructions per
# page): none made the engine's step or the page kernel shorter, also with the pages in L2.
DECODE_DEFAULTS = {"SUB": fmt.BLOCK_SIZE, "PAGE_STAGES": 5, "TAIL_SUB": 64, "TAIL_STAGES": 1,
                   "num_warps": 4, "maxnreg": 128, "INT8_KEYS": 0}


def programmatic_launch(device) -> bool:
    """Launch the page kernel and the reduction with programmatic dependent launch (sm90+, CUDA
    graphs keep it as programmatic edges): each may start while the kernel before it finishes and
    waits in-kernel (griddepcontrol) where it reads that kernel's output; the reduction loads the
    rotation's tiles before it waits. On by default on sm90+ (launch_options("decode-grid", 0)
    {"pdl": false} turns it off): per call of 8 layers in one CUDA graph it took the H100's decode
    call from 68.3 / 68.9 to 66.1 / 67.3 us at 8k x 32 / 32k x 8 (2026-12-06,
    docs/results/gpu-h100-2026-12-06-reduce-pdl/). capability_major is cached per device."""
    if not launch_options("decode-grid", 0).get("pdl", True):
        return False
    return (capability_major(device) or 0) >= 9


def programmatic_rows(device) -> bool:
    """Where programmatic_launch holds, also the layer's kernels before the page kernel: the step's
    row kernel (s4kv.kernels.store.quantize_rows) and the block store let the kernel after them
    start while they run, and the store is launched programmatically itself; each waits in-kernel
    (gdc_wait) where it reads the kernel before it (the page kernel's programs already do, for the
    rotated queries, before they read anything the row kernel or the store writes). The page
    kernel's launch and first instructions then overlap the two small kernels before it, as the
    reduction's launch overlaps the page kernel. launch_options("decode-grid", 0) {"pdl_rows": true}: an
    option, off: an H100's 32k x 8 decode step was 0.8-0.9% less busy with it in 6 of 6 passes over two
    sessions, and its wall time shorter in 3 of 3 passes in the second (by 11-133 us of about 7,450,
    inside the samples' spread) and not in the first (2026-12-06, docs/results/gpu-h100-2026-12-06-prefetch-pages/,
    docs/results/gpu-h100-2026-12-06-page-loop-bound/). Steps mixing decode rows and chunks have not
    run with it on a GPU (test_mixed_batches_with_programmatic_rows)."""
    return programmatic_launch(device) and bool(launch_options("decode-grid", 0).get("pdl_rows", False))


def page_operand_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The 16-bit dtype of the decode kernel's dot operands (q * s and p * s, the codes): the model's,
    or fp16 for a bf16 model where launch_options("decode-grid", 0) has {"fp16_operands": true}.
    bf16 rounds q * s to 8 bits once per page and channel, which grows with the scores: queries 8x
    and 16x larger put a bf16 decode row 1.1e-2 / 1.9e-2 from the reference on the H100 (2026-12-06),
    and the same roundings emulated on the CPU give 1.11e-2 / 1.89e-2, against 9.6e-4 / 6.6e-4 with
    fp16 operands (docs/results/cpu-2026-12-06-peaky-emulation/). fp16 scales the query per head so
    that nothing overflows (fp16_query_scale). Off: on the H100 it made the decode call 0.4-0.7 us per
    layer slower (2026-12-06, docs/results/gpu-h100-2026-12-06-reduce-tile/)."""
    if model_dtype == torch.bfloat16 and launch_options("decode-grid", 0).get("fp16_operands", False):
        return torch.float16
    return model_dtype


def _workspace(q: torch.Tensor, num_decodes: int, splits: int):
    """DecodeWorkspace's (partial outputs, partial (max, sum), rotated queries) for num_decodes rows of
    `splits` page partials and window_splits() window partials each: one lookup rule for
    decode_attention and for the row kernel that writes the rotated queries before it."""
    return DecodeWorkspace.get(max(num_decodes, 1), q.shape[1], splits + window_splits(), q.shape[2], q.device)


def rotated_queries(q: torch.Tensor, md) -> torch.Tensor:
    """The buffer the page kernel reads the decode rows' rotated queries from (md.num_decodes rows,
    [rows, Hq, D] fp32), for a kernel that rotates them before decode_attention runs."""
    return _workspace(q, md.num_decodes, md.decode_splits)[2]


def decode_attention(q, rows, regions, md, num_decodes: int, sm_scale: float,
                     out: torch.Tensor, splits: int, queries_rotated: bool = False) -> None:
    """out[:num_decodes] = attention of the decode rows (query length 1, rows 0..num_decodes-1).

    q [T, Hq, D] (model dtype); rows: this step's window rows (s4kv.kernels.store.quantize_rows);
    out [T, Hq, D] (any float dtype). Three launches: rotate the queries, pages and windows
    (split-KV), reduce; two when `queries_rotated` (the step's row kernel rotated them into
    rotated_queries(q, md): quantize_rows(decodes=...), which saves a launch per layer and step).
    """
    if num_decodes == 0:
        return
    hq, d = q.shape[1], q.shape[2]
    kc, vc, sc = rows
    hkv = kc.shape[1]
    group = hq // hkv
    head_chunks = -(-group // PAGE_HEADS)  # as the kernel derives HEAD_CHUNKS
    ws = window_splits()
    part_o, part_ml, qr = _workspace(q, num_decodes, splits)
    rot = rotation_operand(d, q.dtype, q.device)
    inv_sqrt_d = 1.0 / math.sqrt(d)
    pdl = programmatic_launch(q.device)
    operands = page_operand_dtype(q.dtype)
    if not queries_rotated:
        _rotate_queries_kernel[(num_decodes, hkv)](
            q, q.stride(0), q.stride(1), md.query_start_loc, qr, rot, sm_scale * LOG2E,
            GROUP=group, HALF=d // 2, INV_SQRT_D=inv_sqrt_d, DOT_DTYPE=dot_dtype(q.dtype), PDL=pdl,
        )
    with compile_env(page_kernel_env(q.device)):  # mma.sync on sm90 (s4kv.kernels.mma_sync_env)
        _decode_kernel[(num_decodes, hkv * head_chunks, splits + ws)](
            qr,
            kc, vc, sc,
            regions, regions.stride(0), regions.stride(1),
            md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0),
            part_o, part_ml, splits,
            GROUP=group, G_PAGES=PAGE_HEADS, LAYOUT=kernel_layout(d),
            CODE_DTYPE=tl_dtype(operands), FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(q.dtype)),
            DOT_DTYPE=dot_dtype(operands), HKV=hkv,
            WINDOW_SPLITS=ws, PDL=pdl,
            **{**DECODE_DEFAULTS, "USE_PTX": not interpreted(), **launch_options("decode", d, q.device)},
            **({"launch_pdl": True} if pdl else {}),
        )
    reduce_opts = {**REDUCE_DEFAULTS, **launch_options("decode-reduce", d, q.device)}
    _reduce_kernel[(num_decodes, hkv * reduce_opts["HEAD_SPLITS"])](
        part_o, part_ml, out, out.stride(0), out.stride(1), md.query_start_loc, rot, splits + ws,
        GROUP=group, HALF=d // 2, INV_SQRT_D=inv_sqrt_d, PDL=pdl, **reduce_opts,
        **({"launch_pdl": True} if pdl else {}),
    )
