"""Probe: the decode page loop in Gluon (Triton 3.6 triton.experimental.gluon), explicit layouts.

One program per (decode row, kv head, page split), 4 warps; each warp owns 32 of a page's 128
tokens (split-K over the warps inside the program): its own keys' scores, its own running max and
sum and its own [D, G] accumulator, merged across the warps once per split. Every tensor of the
loop is in the layout its MMA wants, so the loop has no shared memory and no barrier. The key
terms of a page (q * s, q . m, the first key's score) are computed by every warp for itself.
Writes the same page partials as s4kv.kernels.decode._pages_partial (rotated basis, query head g's
at g * parts), so that the two can be compared element for element.
"""

import os
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from s4kv import format as fmt
from s4kv.kernels import kernel_layout, layout
# 4 code bytes b0..b3 (one 32-bit word) -> fp16 operands, 5 instructions per word (the shr shared
# by the two blocks): (x & 0x000F000F) | 0x64006400 = {1024 + lo(b0), 1024 + lo(b2)}, the same of
# x >> 8 gives b1, b3; mask 0x00F000F0 gives 1024 + 16 * hi (exact in fp16). The elements come in the
# order b0, b2, b1, b3: the dots' k index within each group of 4 has its two low bits swapped, and
# the other operand (q * s for keys, p * s for values) is permuted the same way (_swap2).
def _unpack_ptx(mask: int) -> str:
    return ("{\n.reg .b32 y;\nshr.b32 y, $2, 8;\n"
            f"lop3.b32 $0, $2, {mask:#010x}, 0x64006400, 0xEA;\nlop3.b32 $1, y, {mask:#010x}, 0x64006400, 0xEA;\n}}")


UNPACK_LO = _unpack_ptx(0x000F000F)
UNPACK_HI = _unpack_ptx(0x00F000F0)
CODE_BIAS = 1024.0

W = gl.constexpr(4)  # warps per program
EXTRA_CONSTEXPRS = {"STAGES": 3}
KW = gl.constexpr(8)  # the dot operands' k_width: 8 consecutive code bytes per thread (one 8-byte load)


@gluon.jit
def _unpack(packed, ASM: gl.constexpr, DT: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,=r,r", [packed], dtype=DT.value, is_pure=True, pack=4)


@gluon.jit
def _swap2_2d(x, R: gl.constexpr, C: gl.constexpr):
    """x [R, C] with its columns' two low index bits swapped (within a thread's registers here)."""
    return gl.reshape(gl.permute(gl.reshape(x, [R, C // 4, 2, 2]), [0, 1, 3, 2]), [R, C])


@gluon.jit
def _swap2_3d(x, D0: gl.constexpr, D1: gl.constexpr, D2: gl.constexpr):
    """x [D0, D1, D2] with dim 1's two low index bits swapped."""
    return gl.reshape(gl.permute(gl.reshape(x, [D0, D1 // 4, 2, 2, D2]), [0, 1, 3, 2, 4]), [D0, D1, D2])


@gluon.jit
def _page_kernel(qr_ptr, cache_ptr, stride_cb, stride_ch, seq_lens_ptr, block_table_ptr, stride_bt,
                 part_o_ptr, part_ml_ptr, splits, parts,
                 GROUP: gl.constexpr, HKV: gl.constexpr, BS: gl.constexpr, UNIT: gl.constexpr,
                 HALF: gl.constexpr, V_CODES: gl.constexpr, V_SCALE: gl.constexpr,
                 K_SCALE: gl.constexpr, K_MIN: gl.constexpr, FIRST_KEY: gl.constexpr,
                 FIRST_KEY_DTYPE: gl.constexpr, DOT: gl.constexpr, CODE_BIAS: gl.constexpr,
                 ASM_LO: gl.constexpr, ASM_HI: gl.constexpr, QBOUND: gl.constexpr, STAGES: gl.constexpr):
    G: gl.constexpr = 8
    T: gl.constexpr = BS // W  # tokens per warp and page
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    # code bytes as loaded: the A operand's threads and elements (8 consecutive bytes per thread)
    LC: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, KW], threads_per_warp=[1, 8, 4],
                                        warps_per_cta=[W, 1, 1], order=[2, 1, 0])
    SB: gl.constexpr = gl.SliceLayout(1, B)  # [W, G] per-head values as B holds them
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
    acc_ps = gl.zeros([W, 16, G], gl.float32, layout=mma)
    ones_a = gl.full([W, 16, T], 1.0, DOT, layout=A)
    acc_lo = gl.zeros([W, HALF, G], gl.float32, layout=mma)
    acc_hi = gl.zeros([W, HALF, G], gl.float32, layout=mma)
    # the pages' codes through a ring of STAGES shared-memory slots filled by cp.async (16 bytes per
    # copy), STAGES - 1 pages ahead; the page's barrier (the key terms' exchange) also makes every
    # thread's copies visible, and a slot is refilled only after every warp passed that barrier in
    # the page after the one that read it. Swizzled: no bank conflicts for the copies or the reads
    # (gl.bank_conflicts)
    CS: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=4, order=[2, 1, 0])
    CPK: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[1, 8, 4],
                                         warps_per_cta=[W, 1, 1], order=[2, 1, 0])
    CPV: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[1, 16, 2],
                                         warps_per_cta=[W, 1, 1], order=[2, 1, 0])
    pw = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, CPK)))[:, None, None]
    pr_ = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, CPK)))[None, :, None]
    pb_ = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(1, CPK)))[None, None, :]
    k_cp = (pw * T + pr_) * HALF + pb_
    qw = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, CPV)))[:, None, None]
    qi = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(2, CPV)))[None, :, None]
    qt = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(1, CPV)))[None, None, :]
    v_cp = V_CODES + qi * BS + qw * T + qt
    kc_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, W, T, HALF], CS)
    vc_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, W, HALF, T], CS)
    last = gl.maximum(page_hi - 1, 0)  # an empty split reads its row's page 0 and uses none of it
    for i in gl.static_range(STAGES - 1):
        ahead = cache_ptr + gl.load(bt_row + gl.minimum(page_lo + i, last)).to(gl.int64) * stride_cb + head_off
        async_copy.async_copy_global_to_shared(kc_ring.index(i), ahead + k_cp)
        async_copy.async_copy_global_to_shared(vc_ring.index(i), ahead + v_cp)
        async_copy.commit_group()
    for page in range(page_lo, page_hi):
        j = page - page_lo
        buf = j % 2
        ahead = cache_ptr + gl.load(bt_row + gl.minimum(page + STAGES - 1, last)).to(gl.int64) * stride_cb + head_off
        region = cache_ptr + gl.load(bt_row + page).to(gl.int64) * stride_cb + head_off
        ks_ptr = (region + K_SCALE).to(gl.pointer_type(gl.float16))
        km_ptr = (region + K_MIN).to(gl.pointer_type(gl.float16))
        fk_ptr = (region + FIRST_KEY).to(gl.pointer_type(FIRST_KEY_DTYPE))
        vs_ptr = (region + V_SCALE).to(gl.pointer_type(gl.float16))
        # the page's key terms: q * s (the B operand), q . m - B * sum(q * s), the first key's score
        qk_lo = (q_lo * gl.load(ks_ptr + kk).to(gl.float32)).to(DOT)
        # the high half's codes come as 16 * c: its operand is q * s / 16 (exact: a power of two)
        qk_hi = (q_hi * gl.load(ks_ptr + HALF + kk).to(gl.float32) * 0.0625).to(DOT)
        s_const = gl.sum(q_lo * gl.load(km_ptr + kk).to(gl.float32) + q_hi * gl.load(km_ptr + HALF + kk).to(gl.float32)
                         - CODE_BIAS * (qk_lo.to(gl.float32) + qk_hi.to(gl.float32)), axis=1)
        s_first = gl.sum(q_lo * gl.load(fk_ptr + kk).to(gl.float32) + q_hi * gl.load(fk_ptr + HALF + kk).to(gl.float32),
                         axis=1)
        k0 = gl.load(region + kk)  # [1, HALF]: token 0's key code row holds its value's high nibbles
        f16s = 16.0 * gl.load(vs_ptr).to(gl.float32)
        qk_smem.index(2 * buf).store(gl.permute(gl.convert_layout(_swap2_2d(qk_lo, G, HALF), KB, assert_trivial=True), [1, 0]))
        qk_smem.index(2 * buf + 1).store(gl.permute(gl.convert_layout(_swap2_2d(qk_hi, G, HALF), KB, assert_trivial=True), [1, 0]))
        sc_smem.index(2 * buf).store(s_const)
        sc_smem.index(2 * buf + 1).store(s_first)
        # stored so that a thread's 8 channels (c = g + 8 i, the accumulators' rows) lie together
        fv_smem.index(2 * buf).reshape([HALF // 8, 8]).permute([1, 0]).reshape([HALF]).store(
            gl.reshape(((k0 & 0xF).to(gl.float32) - 7.5) * f16s, [HALF]))
        fv_smem.index(2 * buf + 1).reshape([HALF // 8, 8]).permute([1, 0]).reshape([HALF]).store(
            gl.reshape(((k0 >> 4).to(gl.float32) - 7.5) * (16.0 * f16s), [HALF]))
        async_copy.wait_group(STAGES - 2)  # this page's copies (this thread's), before the barrier
        gl.thread_barrier()
        slot_next = (j + STAGES - 1) % STAGES
        async_copy.async_copy_global_to_shared(kc_ring.index(slot_next), ahead + k_cp)
        async_copy.async_copy_global_to_shared(vc_ring.index(slot_next), ahead + v_cp)
        async_copy.commit_group()
        qb_lo = gl.broadcast(qk_smem.index(2 * buf).load(BS2)[None, :, :], gl.zeros([W, HALF, G], DOT, layout=B))[0]
        qb_hi = gl.broadcast(qk_smem.index(2 * buf + 1).load(BS2)[None, :, :], gl.zeros([W, HALF, G], DOT, layout=B))[0]
        s_const = sc_smem.index(2 * buf).load(gl.SliceLayout(0, SM))[None, :] + zero_wg
        s_first = sc_smem.index(2 * buf + 1).load(gl.SliceLayout(0, SM))[None, :] + zero_wg
        if DOT == gl.float16:
            s_const = s_const * pow2_m
            s_first = s_first * pow2_m
        kc = kc_ring.index(j % STAGES).load(LC)
        vc = vc_ring.index(j % STAGES).load(LC)
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
        v_lo = gl.convert_layout(_unpack(vc, ASM_LO, DOT), A, assert_trivial=True)
        v_hi = gl.convert_layout(_unpack(vc, ASM_HI, DOT), A, assert_trivial=True)
        pb = gl.convert_layout(_swap2_3d(gl.convert_layout(pv, B), W, T, G), B, assert_trivial=True)
        acc_lo = mma_v2(v_lo, pb, acc_lo * alpha[:, None, :])
        acc_hi = mma_v2(v_hi, pb, acc_hi * alpha[:, None, :])
        acc_ps = mma_v2(ones_a, pb, acc_ps * alpha[:, None, :])  # every row: sum of p * s over the tokens
        # the block's first value: its codes' high nibbles
        fv_lo = fv_smem.index(2 * buf).reshape([HALF // 8, 8]).permute([1, 0]).reshape([HALF]).load(FV)[None, :, None]
        fv_hi = fv_smem.index(2 * buf + 1).reshape([HALF // 8, 8]).permute([1, 0]).reshape([HALF]).load(FV)[None, :, None]
        acc_lo += fv_lo * p_first[:, None, :]
        acc_hi += fv_hi * p_first[:, None, :]
        m_i = m_new
    async_copy.wait_group(0)
    l_w = gl.sum(l_t, axis=1)
    ps_w = gl.max(acc_ps, axis=1)  # its rows are equal
    acc_lo -= (CODE_BIAS + 7.5) * ps_w[:, None, :]
    acc_hi = acc_hi * 0.0625 - (CODE_BIAS * 0.0625 + 7.5) * ps_w[:, None, :]
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


def page_partials(qr, regions, md, num_decodes: int, group: int, hkv: int, d: int, model_dtype, operands,
                  part_o, part_ml, splits: int, parts: int, L):
    """Launch the probe over the page splits; L: s4kv.format.kernel_layout(d) as a dict."""
    from s4kv.kernels.decode import _FP16_QUERY_BOUND
    _page_kernel[(num_decodes, hkv, splits)](
        qr, regions, regions.stride(0), regions.stride(1), md.seq_lens, md.block_table, md.block_table.stride(0),
        part_o, part_ml, splits, parts,
        GROUP=group, HKV=hkv, BS=L["block_size"], UNIT=L["unit"], HALF=d // 2, V_CODES=L["v_codes"],
        V_SCALE=L["v_scale"], K_SCALE=L["k_scale"], K_MIN=L["k_min"], FIRST_KEY=L["first_key"],
        FIRST_KEY_DTYPE=_dt(fmt.first_key_dtype(model_dtype)), DOT=gl.float16,
        CODE_BIAS=CODE_BIAS, ASM_LO=UNPACK_LO, ASM_HI=UNPACK_HI,
        QBOUND=float(_FP16_QUERY_BOUND.value if hasattr(_FP16_QUERY_BOUND, "value") else _FP16_QUERY_BOUND),
        STAGES=int(os.environ.get("GLUON_STAGES", "3")), num_warps=int(W), **({"maxnreg": int(os.environ["GLUON_MAXNREG"])} if os.environ.get("GLUON_MAXNREG") else {}))
