"""Probe: the decode page loop in Gluon (Triton 3.6 triton.experimental.gluon), explicit layouts.

One program per (decode row, kv head, page split), 4 warps; each warp owns 32 of a page's 128
tokens (split-K over the warps inside the program): its own keys' scores, its own running max and
sum and its own [D, G] accumulator, merged across the warps once per split. Every tensor of the
loop is in the layout its MMA wants. The key terms of a page (q * s, q . m, the first key's score,
the first value's high nibbles) are computed once per program and handed to the warps through
shared memory. (The later versions, gluon_pagesN.diff, change this; README.md says how.)
Writes the same page partials as s4kv.kernels.decode._pages_partial (rotated basis, query head g's
at g * parts), so that the two can be compared element for element.
"""

import os
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from s4kv import format as fmt
from s4kv.kernels.code_ptx import UNPACK_PTX, CODE_BIAS as _CODE_BIAS

W = gl.constexpr(4)  # warps per program
KW = gl.constexpr(8)  # the dot operands' k_width: 8 consecutive code bytes per thread (one 8-byte load)


@gluon.jit
def _unpack(packed, ASM: gl.constexpr, DT: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,=r,r", [packed], dtype=DT.value, is_pure=True, pack=4)


@gluon.jit
def _page_kernel(qr_ptr, cache_ptr, stride_cb, stride_ch, seq_lens_ptr, block_table_ptr, stride_bt,
                 part_o_ptr, part_ml_ptr, splits, parts,
                 GROUP: gl.constexpr, HKV: gl.constexpr, BS: gl.constexpr, UNIT: gl.constexpr,
                 HALF: gl.constexpr, V_CODES: gl.constexpr, V_SCALE: gl.constexpr,
                 K_SCALE: gl.constexpr, K_MIN: gl.constexpr, FIRST_KEY: gl.constexpr,
                 FIRST_KEY_DTYPE: gl.constexpr, DOT: gl.constexpr, CODE_BIAS: gl.constexpr,
                 ASM_LO: gl.constexpr, ASM_HI: gl.constexpr, QBOUND: gl.constexpr):
    G: gl.constexpr = 8
    T: gl.constexpr = BS // W  # tokens per warp and page
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    # code bytes as loaded: the A operand's threads and elements (8 consecutive bytes per thread)
    LC: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, KW], threads_per_warp=[1, 8, 4],
                                        warps_per_cta=[W, 1, 1], order=[2, 1, 0])
    SM: gl.constexpr = gl.SliceLayout(1, mma)  # [W, G] per-head values of the score tiles
    ST: gl.constexpr = gl.SliceLayout(2, mma)  # [W, T] / [W, HALF] per-row values of the MMA tiles

    row = gl.program_id(0)
    h = gl.program_id(1)
    split = gl.program_id(2)
    p = gl.load(seq_lens_ptr + row) - 1
    n_pages = (p + 1) // UNIT * (UNIT // BS)
    per_split = gl.cdiv(n_pages, splits)
    page_lo = split * per_split
    page_hi = gl.minimum(page_lo + per_split, n_pages)
    bt_row = block_table_ptr + row * stride_bt
    head_off = h * stride_ch

    # the page's key terms are computed once per program, spread over its 128 threads (KB: one
    # query head and 4 channels of each half per thread), and handed to the warps through shared
    # memory (two buffers by page parity: one barrier per page)
    KB: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[2, 16],
                                        warps_per_cta=[W, 1], order=[1, 0])
    kn = gl.arange(0, G, layout=gl.SliceLayout(1, KB))[:, None]
    kk = gl.arange(0, HALF, layout=gl.SliceLayout(0, KB))[None, :]
    hq0 = row * (GROUP * HKV) + h * GROUP
    qrow = qr_ptr + hq0 * (2 * HALF) + kn * (2 * HALF) + kk
    n_ok = (kn < GROUP) & (kk >= 0)
    q_lo = gl.load(qrow, mask=n_ok, other=0.0)
    q_hi = gl.load(qrow + HALF, mask=n_ok, other=0.0)
    if DOT == gl.float16:  # fp16 operands: the query per head over a power of two (decode.fp16_query_scale)
        qmax = gl.maximum(gl.max(gl.abs(q_lo), axis=1), gl.max(gl.abs(q_hi), axis=1))
        q_pow2 = gl.exp2(gl.maximum(gl.ceil(gl.log2(qmax * QBOUND)), 0.0))  # [G]
        q_lo = q_lo / q_pow2[:, None]
        q_hi = q_hi / q_pow2[:, None]
        pow2_m = gl.convert_layout(q_pow2, gl.SliceLayout(0, SM))[None, :]
    PLAIN2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    PLAIN1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    qk_smem = gl.allocate_shared_memory(DOT, [4, HALF, G], PLAIN2)  # (buffer, half) -> [k, n]
    sc_smem = gl.allocate_shared_memory(gl.float32, [4, G], PLAIN1)  # (buffer, s_const | s_first)
    fv_smem = gl.allocate_shared_memory(gl.float32, [4, HALF], PLAIN1)  # (buffer, half): first value's high nibbles
    BS2: gl.constexpr = gl.SliceLayout(0, B)  # [HALF, G] as every warp holds the B operand
    # code tiles' index tensors: keys [W, T, HALF] (token r of warp w), values [W, HALF, T]
    cw = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, LC)))[:, None, None]
    cr = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, LC)))[None, :, None]
    cb = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(1, LC)))[None, None, :]
    k_off = (cw * T + cr) * HALF + cb
    vi = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(2, LC)))[None, :, None]
    vt = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(1, LC)))[None, None, :]
    v_off = V_CODES + vi * BS + cw * T + vt
    # score-tile index tensors [W, T] / [W, G]
    tw = gl.arange(0, W, layout=gl.SliceLayout(1, ST))[:, None]
    tr = gl.arange(0, T, layout=gl.SliceLayout(0, ST))[None, :]
    first = (tw == 0) & (tr == 0)  # the page's token 0: exact key, 8-bit value
    mw = gl.arange(0, W, layout=gl.SliceLayout(1, SM))[:, None]
    is_w0 = mw == 0
    zero_wg = gl.zeros([W, G], gl.float32, layout=SM)
    FV: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, mma))  # [HALF] along the accumulators' rows

    m_i = gl.full([W, G], -float("inf"), gl.float32, layout=SM)
    l_t = gl.zeros([W, T, G], gl.float32, layout=mma)
    ps_t = gl.zeros([W, T, G], gl.float32, layout=mma)
    acc_lo = gl.zeros([W, HALF, G], gl.float32, layout=mma)
    acc_hi = gl.zeros([W, HALF, G], gl.float32, layout=mma)
    for page in range(page_lo, page_hi):
        buf = (page - page_lo) % 2
        region = cache_ptr + gl.load(bt_row + page).to(gl.int64) * stride_cb + head_off
        ks_ptr = (region + K_SCALE).to(gl.pointer_type(gl.float16))
        km_ptr = (region + K_MIN).to(gl.pointer_type(gl.float16))
        fk_ptr = (region + FIRST_KEY).to(gl.pointer_type(FIRST_KEY_DTYPE))
        vs_ptr = (region + V_SCALE).to(gl.pointer_type(gl.float16))
        kc = gl.load(region + k_off)
        vc = gl.load(region + v_off)
        # the page's key terms: q * s (the B operand), q . m - B * sum(q * s), the first key's score
        qk_lo = (q_lo * gl.load(ks_ptr + kk).to(gl.float32)).to(DOT)
        qk_hi = (q_hi * gl.load(ks_ptr + HALF + kk).to(gl.float32)).to(DOT)
        s_const = gl.sum(q_lo * gl.load(km_ptr + kk).to(gl.float32) + q_hi * gl.load(km_ptr + HALF + kk).to(gl.float32)
                         - CODE_BIAS * (qk_lo.to(gl.float32) + qk_hi.to(gl.float32)), axis=1)
        s_first = gl.sum(q_lo * gl.load(fk_ptr + kk).to(gl.float32) + q_hi * gl.load(fk_ptr + HALF + kk).to(gl.float32),
                         axis=1)
        k0 = gl.load(region + kk)  # [1, HALF]: token 0's key code row holds its value's high nibbles
        f16s = 16.0 * gl.load(vs_ptr).to(gl.float32)
        qk_smem.index(2 * buf).store(gl.permute(qk_lo, [1, 0]))
        qk_smem.index(2 * buf + 1).store(gl.permute(qk_hi, [1, 0]))
        sc_smem.index(2 * buf).store(s_const)
        sc_smem.index(2 * buf + 1).store(s_first)
        fv_smem.index(2 * buf).store(gl.reshape(((k0 & 0xF).to(gl.float32) - 7.5) * f16s, [HALF]))
        fv_smem.index(2 * buf + 1).store(gl.reshape(((k0 >> 4).to(gl.float32) - 7.5) * f16s, [HALF]))
        gl.thread_barrier()
        qb_lo = gl.broadcast(qk_smem.index(2 * buf).load(BS2)[None, :, :], gl.zeros([W, HALF, G], DOT, layout=B))[0]
        qb_hi = gl.broadcast(qk_smem.index(2 * buf + 1).load(BS2)[None, :, :], gl.zeros([W, HALF, G], DOT, layout=B))[0]
        s_const = sc_smem.index(2 * buf).load(gl.SliceLayout(0, SM))[None, :] + zero_wg
        s_first = sc_smem.index(2 * buf + 1).load(gl.SliceLayout(0, SM))[None, :] + zero_wg
        if DOT == gl.float16:
            s_const = s_const * pow2_m
            s_first = s_first * pow2_m
        k_lo = gl.convert_layout(_unpack(kc, ASM_LO, DOT), A, assert_trivial=True)
        k_hi = gl.convert_layout(_unpack(kc, ASM_HI, DOT), A, assert_trivial=True)
        s = mma_v2(k_lo, qb_lo, gl.zeros([W, T, G], gl.float32, layout=mma))
        s = mma_v2(k_hi, qb_hi, s)
        if DOT == gl.float16:
            s = s * pow2_m[:, None, :] + s_const[:, None, :]
        else:
            s = s + s_const[:, None, :]
        s = gl.where(first[:, :, None], -float("inf"), s)
        m_tile = gl.where(is_w0, gl.maximum(gl.max(s, axis=1), s_first), gl.max(s, axis=1))
        m_new = gl.maximum(m_i, m_tile)
        alpha = gl.exp2(m_i - m_new)
        pr = gl.exp2(s - m_new[:, None, :])
        p_first = gl.where(is_w0, gl.exp2(s_first - m_new), 0.0)
        pr = gl.where(first[:, :, None], p_first[:, None, :], pr)
        vs = gl.load(vs_ptr + tw * T + tr).to(gl.float32)
        pv = (pr * vs[:, :, None]).to(DOT)
        l_t = l_t * alpha[:, None, :] + pr
        ps_t = ps_t * alpha[:, None, :] + pv.to(gl.float32)
        v_lo = gl.convert_layout(_unpack(vc, ASM_LO, DOT), A, assert_trivial=True)
        v_hi = gl.convert_layout(_unpack(vc, ASM_HI, DOT), A, assert_trivial=True)
        pb = gl.convert_layout(pv, B)
        acc_lo = mma_v2(v_lo, pb, acc_lo * alpha[:, None, :])
        acc_hi = mma_v2(v_hi, pb, acc_hi * alpha[:, None, :])
        # the block's first value: its codes' high nibbles
        fv_lo = fv_smem.index(2 * buf).load(FV)[None, :, None]
        fv_hi = fv_smem.index(2 * buf + 1).load(FV)[None, :, None]
        acc_lo += fv_lo * p_first[:, None, :]
        acc_hi += fv_hi * p_first[:, None, :]
        m_i = m_new
    l_w = gl.sum(l_t, axis=1)
    ps_w = gl.sum(ps_t, axis=1)
    acc_lo -= (CODE_BIAS + 7.5) * ps_w[:, None, :]
    acc_hi -= (CODE_BIAS + 7.5) * ps_w[:, None, :]
    # the warps' partials into one (log-sum-exp over the warps)
    m_all = gl.max(m_i, axis=0)  # [G]
    m_safe = gl.where(m_all == -float("inf"), 0.0, m_all)
    sc = gl.exp2(m_i - m_safe[None, :])  # [W, G]
    l_all = gl.sum(l_w * sc, axis=0)
    o_lo = gl.sum(acc_lo * sc[:, None, :], axis=0)  # [HALF, G]
    o_hi = gl.sum(acc_hi * sc[:, None, :], axis=0)
    OL: gl.constexpr = gl.SliceLayout(0, mma)
    oc = gl.arange(0, HALF, layout=gl.SliceLayout(1, OL))[:, None]
    og = gl.arange(0, G, layout=gl.SliceLayout(0, OL))[None, :]
    o = part_o_ptr + ((hq0 + og) * parts + split) * (2 * HALF) + oc
    gl.store(o, o_lo, mask=og < GROUP)
    gl.store(o + HALF, o_hi, mask=og < GROUP)
    mg = gl.arange(0, G, layout=gl.SliceLayout(0, SM))
    ml = part_ml_ptr + ((hq0 + mg) * parts + split) * 2
    gl.store(ml, m_all, mask=mg < GROUP)
    gl.store(ml + 1, l_all, mask=mg < GROUP)


def _dt(t: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[t]


# the kernel's format constants and the kernel_layout names they are read from
_FORMAT_CONSTANTS = {"BS": "block_size", "UNIT": "unit", "V_CODES": "v_codes", "V_SCALE": "v_scale",
                     "K_SCALE": "k_scale", "K_MIN": "k_min", "FIRST_KEY": "first_key"}


def launch_constexprs(d: int, model_dtype, operands, group: int, hkv: int) -> dict:
    """The probe's constexpr arguments for head size d: page_partials launches with them,
    static_gl.py compiles with them."""
    from s4kv.kernels.decode import _FP16_QUERY_BOUND
    lay = fmt.kernel_layout(d)
    code = "bf16" if operands == torch.bfloat16 else "fp16"
    return dict(GROUP=group, HKV=hkv, HALF=d // 2,
                **{const: fmt.layout_value(lay, name) for const, name in _FORMAT_CONSTANTS.items()},
                FIRST_KEY_DTYPE=_dt(fmt.first_key_dtype(model_dtype)), DOT=_dt(operands),
                CODE_BIAS=_CODE_BIAS[code], ASM_LO=UNPACK_PTX[(code, "lo")], ASM_HI=UNPACK_PTX[(code, "hi")],
                QBOUND=float(_FP16_QUERY_BOUND.value))


def page_partials(qr, regions, md, num_decodes: int, group: int, hkv: int, d: int, model_dtype, operands,
                  part_o, part_ml, splits: int, parts: int):
    """Launch the probe over the page splits."""
    _page_kernel[(num_decodes, hkv, splits)](
        qr, regions, regions.stride(0), regions.stride(1), md.seq_lens, md.block_table, md.block_table.stride(0),
        part_o, part_ml, splits, parts, **launch_constexprs(d, model_dtype, operands, group, hkv),
        num_warps=int(W), **({"maxnreg": int(os.environ["GLUON_MAXNREG"])} if os.environ.get("GLUON_MAXNREG") else {}))
