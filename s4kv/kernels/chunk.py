"""Chunk attention (prefill, chunked prefill, prefix-cache extends): stage, then FlashAttention.

Prefill is compute-bound, so instead of a fused int4 attention kernel the chunk rows of a step go
through two launches per wave (s4kv.kernels.chunk_plan):

1. the stage kernel fills a 16-bit scratch ([pages, BS, Hkv, D], the layout FlashAttention pages
   take): each block of a complete unit a row reads is unpacked from its int4 page and rotated
   back into the original basis, and each block whose window rows this step's queries read (the
   request's window + this step's rows, s4kv.kernels.window) gets them dequantized and rotated
   back on a page of its own;
2. vLLM's FlashAttention runs over those pages, one causal sequence per query group, so the
   position rule holds exactly (see chunk_plan).

Unpacking costs about D / (2 * chunk * group) of the attention's FLOPs (under 1% for a chunk of
2,048 tokens with 7 query heads per kv head) and one write + read of the staged pages; the
attention is FlashAttention's own.

The staged pages and the FlashAttention call are fp16 for fp16 and bf16 models alike
(STAGE_DTYPE). A dequantized key rounded to bf16 moves each score by ~2^-9 of |q||k|: with bf16
staging the chunk steps of the startup self-check differed from the reference by up to 9.8e-3
(relative L2, bf16 model, fp32 attention under Triton's interpreter), at the check's 1e-2 limit
before FlashAttention's own rounding; with fp16 staging 1.7-2.2e-3, the same as the decode
kernel's (most of it the bf16 output's rounding). Page and row values lie in the fp16 range by the
format's saturation (staged values are clamped to it); bf16 queries convert exactly when their
magnitude is within it (6.1e-5..65504) and saturate at +-65504, with NaN kept as NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import (
    dot_dtype,
    interpreted,
    kernel_layout,
    launch_options,
    layout,
    rotation_operand,
    tl_dtype,
)
from s4kv.kernels.chunk_plan import PAGE, WINDOW, plan_chunks, to_device
from s4kv.kernels.flash import varlen_paged_attention
from s4kv.kernels.quant import clamp_fp16, rotate_halves, to_fp16_saturated
from s4kv.kernels.store import store_blocks
from s4kv.kernels.window import load_window_rows
from s4kv.kernels.workspace import ReservedWorkspace

STAGE_DTYPE = torch.float16

# jobs_ptr is a view at a wave's offset in one upload buffer (s4kv.kernels.chunk_plan.to_device): its
# 16-byte alignment follows the batch, and Triton specializes pointers on it (a compile in the middle
# of serving, H200 2026-12-02: vLLM's JIT monitor during a 32k prefill)
@triton.jit(do_not_specialize=["jobs_ptr"])
def _stage_kernel(
    jobs_ptr,  # [pages, 3] int32: (row, block, kind)
    kc_ptr, vc_ptr, sc_ptr,  # this step's window rows (s4kv.kernels.store.StepRows)
    cache_ptr, stride_cb, stride_ch,  # int4 pages, uint8 (windows included)
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    kp_ptr, vp_ptr, stride_pp, stride_pt, stride_ph,  # scratch pages [P, BS, Hkv, D], model dtype
    rot_ptr,
    LAYOUT: tl.constexpr,  # s4kv.kernels.kernel_layout: the format's constants, read below
    OP_DTYPE: tl.constexpr, INV_SQRT_D: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr,
    HKV: tl.constexpr, KIND: tl.constexpr, USE_PTX: tl.constexpr,
):
    BS: tl.constexpr = layout(LAYOUT, "block_size")
    UNIT: tl.constexpr = layout(LAYOUT, "unit")
    HALF: tl.constexpr = layout(LAYOUT, "half")
    V_CODES: tl.constexpr = layout(LAYOUT, "v_codes")
    V_SCALE: tl.constexpr = layout(LAYOUT, "v_scale")
    K_SCALE: tl.constexpr = layout(LAYOUT, "k_scale")
    K_MIN: tl.constexpr = layout(LAYOUT, "k_min")
    FIRST_KEY: tl.constexpr = layout(LAYOUT, "first_key")
    page = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(jobs_ptr + page * 3)
    b = tl.load(jobs_ptr + page * 3 + 1)
    kind = tl.load(jobs_ptr + page * 3 + 2)
    if kind != KIND:  # one launch per kind (see chunk_attention)
        return
    t = tl.arange(0, BS)
    c = tl.arange(0, HALF)
    dst = page.to(tl.int64) * stride_pp + t[:, None] * stride_pt + h * stride_ph + c[None, :]
    # staged values are clamped to the fp16 range as they are converted (to_fp16_saturated)
    tl.static_assert(kp_ptr.dtype.element_ty == tl.float16)
    if kind == 0:  # a complete block: unpack, dequantize, rotate back (x = x_rot @ R^T)
        block_id = tl.load(block_table_ptr + row * stride_bt + b).to(tl.int64)
        region = cache_ptr + block_id * stride_cb + h * stride_ch
        ks = (region + K_SCALE).to(tl.pointer_type(tl.float16))
        km = (region + K_MIN).to(tl.pointer_type(tl.float16))
        fk = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
        kc = tl.load(region + t[:, None] * HALF + c[None, :])  # token-major
        first = t[:, None] == 0  # the block's first key is stored exact
        k_lo = (kc & 0xF).to(tl.float32) * tl.load(ks + c).to(tl.float32)[None, :] \
            + tl.load(km + c).to(tl.float32)[None, :]
        k_hi = (kc >> 4).to(tl.float32) * tl.load(ks + HALF + c).to(tl.float32)[None, :] \
            + tl.load(km + HALF + c).to(tl.float32)[None, :]
        # the exact first key was stored before saturation (bf16 models): saturate it for the fp16 operands
        k_lo = tl.where(first, clamp_fp16(tl.load(fk + c).to(tl.float32))[None, :], k_lo)
        k_hi = tl.where(first, clamp_fp16(tl.load(fk + HALF + c).to(tl.float32))[None, :], k_hi)
        k_lo, k_hi = rotate_halves(k_lo, k_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, True, False)
        tl.store(kp_ptr + dst, to_fp16_saturated(k_lo, USE_PTX))
        tl.store(kp_ptr + dst + HALF, to_fp16_saturated(k_hi, USE_PTX))
        vc = tl.load(region + V_CODES + c[None, :] * BS + t[:, None])  # channel-major
        # (code - 7.5) is exact in 16 bits and so is its product with +-1: the only rounding before the
        # per-token scale is fp32 accumulation. Token 0's value is 8-bit codes (code - 127.5, exact
        # in 16 bits too): low nibbles in its value code row, high nibbles in its key code row.
        v_lo = (vc & 0xF).to(tl.float32) + tl.where(first, 16.0 * (kc & 0xF).to(tl.float32) - 120.0, 0.0) - 7.5
        v_hi = (vc >> 4).to(tl.float32) + tl.where(first, 16.0 * (kc >> 4).to(tl.float32) - 120.0, 0.0) - 7.5
        v_lo, v_hi = rotate_halves(v_lo, v_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, True, False)
        vs = tl.load((region + V_SCALE).to(tl.pointer_type(tl.float16)) + t).to(tl.float32)[:, None]
        tl.store(vp_ptr + dst, to_fp16_saturated(v_lo * vs, USE_PTX))
        tl.store(vp_ptr + dst + HALF, to_fp16_saturated(v_hi * vs, USE_PTX))
    else:  # a block's window rows (the old window's, then this step's), zeros after them
        q_start = tl.load(qsl_ptr + row)
        seq_len = tl.load(seq_lens_ptr + row)
        ctx = seq_len - (tl.load(qsl_ptr + row + 1) - q_start)
        pos = b * BS + t
        unit_block = ctx // UNIT * (UNIT // BS)  # the old window's unit: the only one partly there
        live = (pos >= ctx) & (pos < seq_len)
        # keys, then values: one half's four [BS, HALF] tiles live at a time (with both loaded first,
        # the kernel spilled 0.4-1.7 KB per thread, tools/kernel_static.py); the values' loads come
        # from a second call, after the keys' stores (the keys' outputs of it are never used)
        k_lo, k_hi, w_ks, _, _, _ = load_window_rows(
            cache_ptr, block_table_ptr + row * stride_bt, unit_block, pos - unit_block * BS, h * stride_ch, stride_cb,
            pos < ctx, kc_ptr, vc_ptr, sc_ptr, q_start + pos - ctx, h, live, c,
            HKV, LAYOUT)
        # code - 127.5 is exact in 16 bits and so is its product with +-1; a row's scale is one
        # number, so it goes on after the rotation (as the pages' value scales do)
        k_lo, k_hi = rotate_halves(k_lo, k_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, True, False)
        tl.store(kp_ptr + dst, to_fp16_saturated(k_lo * w_ks[:, None], USE_PTX))
        tl.store(kp_ptr + dst + HALF, to_fp16_saturated(k_hi * w_ks[:, None], USE_PTX))
        _, _, _, v_lo, v_hi, w_vs = load_window_rows(
            cache_ptr, block_table_ptr + row * stride_bt, unit_block, pos - unit_block * BS, h * stride_ch, stride_cb,
            pos < ctx, kc_ptr, vc_ptr, sc_ptr, q_start + pos - ctx, h, live, c,
            HKV, LAYOUT)
        v_lo, v_hi = rotate_halves(v_lo, v_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, True, False)
        tl.store(vp_ptr + dst, to_fp16_saturated(v_lo * w_vs[:, None], USE_PTX))
        tl.store(vp_ptr + dst + HALF, to_fp16_saturated(v_hi * w_vs[:, None], USE_PTX))


class ChunkWorkspace(ReservedWorkspace):
    """The 16-bit scratch pages, one pair (K, V) [pages, BS, Hkv, D] in STAGE_DTYPE per device and
    layer shape. The planner cuts steps into waves that fit the reserved pages."""

    what, unit = "chunk scratch", "pages"

    @staticmethod
    def page_bytes(num_kv_heads: int, head_size: int) -> int:
        """Bytes of one scratch page (K and V)."""
        return 2 * fmt.BLOCK_SIZE * num_kv_heads * head_size * STAGE_DTYPE.itemsize

    @staticmethod
    def allocate(count, num_kv_heads, head_size, device):
        shape = (count, fmt.BLOCK_SIZE, num_kv_heads, head_size)
        return (torch.empty(shape, dtype=STAGE_DTYPE, device=device),
                torch.empty(shape, dtype=STAGE_DTYPE, device=device))


def stage_pages(wave, rows, regions, md, model_dtype, k_pages, v_pages, kind: int) -> None:
    """Fill the scratch pages of the wave's jobs of `kind` (PAGE or WINDOW), every kv head."""
    kc, vc, sc = rows
    d, hkv = kc.shape[2], kc.shape[1]
    _stage_kernel[(len(wave.jobs), hkv)](
        wave.device["jobs"],
        kc, vc, sc,
        regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0),
        k_pages, v_pages, k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        rotation_operand(d, STAGE_DTYPE, kc.device),
        LAYOUT=kernel_layout(d), OP_DTYPE=dot_dtype(STAGE_DTYPE), INV_SQRT_D=d ** -0.5,
        FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(model_dtype)),
        HKV=hkv, KIND=kind, USE_PTX=not interpreted(),
        **launch_options("stage", d, kc.device),
    )


def step_waves(md, first_row: int, num_kv_heads: int, head_size: int, device) -> list:
    """The step's waves, planned once and kept on the metadata (every layer of the step reads the
    same lengths)."""
    plan = getattr(md, "chunk_waves", None)
    if plan is None or plan[0] != first_row:
        n = md.num_reqs
        capacity = ChunkWorkspace.capacity(num_kv_heads, head_size, device)
        waves = plan_chunks(md.query_start_loc_cpu[:n + 1].numpy(), md.seq_lens_cpu[:n].numpy(), first_row,
                            capacity)
        plan = (first_row, to_device(waves, device))
        md.chunk_waves = plan
    return plan[1]


def to_stage_dtype(x: torch.Tensor) -> torch.Tensor:
    """x in STAGE_DTYPE, saturated at the fp16 range (NaN kept); x itself if it already is."""
    if x.dtype == STAGE_DTYPE:
        return x
    return x.to(STAGE_DTYPE).clamp_(-fmt.FP16_MAX, fmt.FP16_MAX)


def staged_queries(q: torch.Tensor, md) -> torch.Tensor | None:
    """A buffer for the step's queries in STAGE_DTYPE ([T, Hq, D], contiguous), for the step's row
    kernel to fill from the first chunk row's token on (s4kv.kernels.store.quantize_rows(stage=...))
    and chunk_attention(staged_q=...) to read; None when the step has no chunk row or q already is
    STAGE_DTYPE."""
    if md.num_reqs <= md.num_decodes or q.dtype == STAGE_DTYPE:
        return None
    return torch.empty(q.shape, dtype=STAGE_DTYPE, device=q.device)


def chunk_attention(q, rows, regions, md, first_row: int, sm_scale: float, out: torch.Tensor,
                    store: bool = True, staged_q: torch.Tensor | None = None) -> None:
    """out for the rows first_row.. (any query lengths); q (model dtype); rows: this step's window
    rows (s4kv.kernels.store.quantize_rows). Stores the blocks of the units these rows complete
    (store_blocks), wave by wave; the windows are appended afterwards. staged_q: q in STAGE_DTYPE
    from the rows' first token on (staged_queries), or None to convert q here.

    Per wave: the window blocks are staged first, because the old window they read lives in the
    pages the store then writes (s4kv.format); then the store; then the blocks of complete
    units, which include the ones just stored."""
    if first_row >= md.num_reqs:
        return
    hkv, d = rows[0].shape[1], rows[0].shape[2]
    for wave in step_waves(md, first_row, hkv, d, q.device):
        k_pages, v_pages = ChunkWorkspace.get(len(wave.jobs), hkv, d, q.device)
        if wave.window_jobs:
            stage_pages(wave, rows, regions, md, q.dtype, k_pages, v_pages, WINDOW)
        if store:
            store_blocks(rows, regions, md, wave.max_new_blocks, q.dtype, rows_range=(wave.row0, wave.row1))
        if wave.page_jobs:  # none when no row of the wave reads a complete unit (prompts under UNIT tokens)
            stage_pages(wave, rows, regions, md, q.dtype, k_pages, v_pages, PAGE)
        dev = wave.device
        wave_q = to_stage_dtype(q[wave.tok0:wave.tok1]) if staged_q is None else staged_q[wave.tok0:wave.tok1]
        varlen_paged_attention(wave_q, k_pages, v_pages, dev["cu_seqlens_q"],
                               wave.max_seqlen_q, dev["seqused_k"], wave.max_seqlen_k, dev["block_table"], sm_scale,
                               out[wave.tok0:wave.tok1],
                               host=(wave.cu_seqlens_q, wave.seqused_k, wave.block_table))
