"""Triton store kernels: quantize completed blocks into pages; keep incomplete tails exact.

Per layer and step, before attention :func:`store_blocks` quantizes every block that this step
completes (its tokens come from the request's exact tail and from this step's K/V), and after
attention :func:`append_tail` writes this step's tokens of the new incomplete block into its tail.
(The tail write must wait for attention: in a chunk that completes a block, queries before the
block's end still read the old tail tokens exact.)

The tail lives in the pages of its block and the TAIL_BLOCKS - 1 after it (s4kv.format), which
are exactly the pages the store writes when a chunk completes blocks: one program reads the whole
old tail and then stores those pages in order, and a chunk row's old tail must be staged for its
attention before its store runs (s4kv.kernels.chunk).

K/V arrive exact (model dtype); the store rotates them into the pages' basis. Page regions are addressed through the cache tensor's
block and head strides, so any vLLM layout whose (token, byte) dims are innermost works.
"""

import math

import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import dot_dtype, launch_options, rotation_operand, tl_dtype
from s4kv.kernels.quant import fp16_down, fp16_up, rotate_halves, safe_inverse, saturate
from s4kv.kernels.tail import tail_constants, tail_rows


# row0 follows the batch (per-wave launches): a specialized int (0, 1, multiples of 16 are told apart)
# compiled the kernel again in the middle of serving (H200, 2026-12-02: vLLM's JIT monitor, 1k x 64)
@triton.jit(do_not_specialize=["row0"])
def _store_blocks_kernel(
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh,  # this step's K/V [T, Hkv, D]
    cache_ptr, stride_cb, stride_ch,  # pages, uint8 (exact tails included)
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    rot_ptr,  # the +-1 rotation [D, D]
    row0,  # the first batch row of this launch
    BS: tl.constexpr, HALF: tl.constexpr, OP_DTYPE: tl.constexpr, INV_SQRT_D: tl.constexpr,
    V_CODES: tl.constexpr, V_SCALE: tl.constexpr, K_SCALE: tl.constexpr, K_MIN: tl.constexpr,
    FIRST_KEY: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr,
    TAIL_BLOCKS: tl.constexpr, TAIL_ROWS: tl.constexpr, ROW_BYTES: tl.constexpr,
):
    row = row0 + tl.program_id(0)
    h = tl.program_id(1)
    i = tl.program_id(2)
    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    ctx = seq_len - qlen
    first = ctx // BS
    n_new = seq_len // BS - first  # blocks this step completes
    kept = ctx - first * BS  # tokens of block `first` in the old tail
    if (qlen <= 0) | (i >= n_new):
        return
    # The old tail's rows live in pages first .. first + TAIL_BLOCKS - 1: program 0 reads them all
    # and stores those pages one after the other; the programs of the pages after them run alone.
    if (kept > 0) & (i > 0) & (i < TAIL_BLOCKS):
        return
    n_steps = tl.where((kept > 0) & (i == 0), tl.minimum(n_new, TAIL_BLOCKS), 1)

    t = tl.arange(0, BS)
    c = tl.arange(0, HALF)
    bt_row = block_table_ptr + row * stride_bt
    dt = k_ptr.dtype.element_ty
    for step in range(n_steps):
        b = first + i + step
        pos = b * BS + t
        from_tail = pos < ctx  # only in block `first`
        tok = q_start + pos - ctx  # token index in this step's K/V (valid where not from_tail)
        tail_k = tail_rows(cache_ptr, bt_row, first, t, h * stride_ch, stride_cb, from_tail,
                           TAIL_ROWS, ROW_BYTES, dt)[:, None]
        tail_v = tail_rows(cache_ptr, bt_row, first, BS + t, h * stride_ch, stride_cb, from_tail,
                           TAIL_ROWS, ROW_BYTES, dt)[:, None]
        new_k = k_ptr + tok[:, None] * stride_kt + h * stride_kh
        new_v = v_ptr + tok[:, None] * stride_vt + h * stride_vh

        def_mask = from_tail[:, None]
        new_mask = (~from_tail)[:, None]
        k_lo = tl.load(tail_k + c[None, :], mask=def_mask, other=0.0) + \
            tl.load(new_k + c[None, :], mask=new_mask, other=0.0)
        k_hi = tl.load(tail_k + HALF + c[None, :], mask=def_mask, other=0.0) + \
            tl.load(new_k + HALF + c[None, :], mask=new_mask, other=0.0)
        v_lo = tl.load(tail_v + c[None, :], mask=def_mask, other=0.0) + \
            tl.load(new_v + c[None, :], mask=new_mask, other=0.0)
        v_hi = tl.load(tail_v + HALF + c[None, :], mask=def_mask, other=0.0) + \
            tl.load(new_v + HALF + c[None, :], mask=new_mask, other=0.0)

        block_id = tl.load(bt_row + b).to(tl.int64)
        region = cache_ptr + block_id * stride_cb + h * stride_ch

        # Pages hold the rotated basis
        k_lo, k_hi = rotate_halves(k_lo, k_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, False)
        v_lo, v_hi = rotate_halves(v_lo, v_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, False)
        # every thread has read its tail rows before any thread writes this page over them
        tl.debug_barrier()

        # Exact first key (before any saturation)
        first_row = t[:, None] == 0
        fk_lo = tl.sum(tl.where(first_row, k_lo, 0.0), axis=0)
        fk_hi = tl.sum(tl.where(first_row, k_hi, 0.0), axis=0)
        fk_ptr = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
        tl.store(fk_ptr + c, fk_lo.to(FIRST_KEY_DTYPE))
        tl.store(fk_ptr + HALF + c, fk_hi.to(FIRST_KEY_DTYPE))

        # Keys: per channel over tokens 1..BS-1
        x_lo, bad_lo = saturate(k_lo.to(tl.float32))
        x_hi, bad_hi = saturate(k_hi.to(tl.float32))
        stat = t[:, None] > 0
        mn_lo = fp16_down(tl.min(tl.where(stat, x_lo, float("inf")), axis=0))
        mn_hi = fp16_down(tl.min(tl.where(stat, x_hi, float("inf")), axis=0))
        s_lo = fp16_up((tl.max(tl.where(stat, x_lo, -float("inf")), axis=0) - mn_lo) / 15.0)
        s_hi = fp16_up((tl.max(tl.where(stat, x_hi, -float("inf")), axis=0) - mn_hi) / 15.0)
        s_lo = tl.where(tl.max((bad_lo & stat).to(tl.int32), axis=0) > 0, float("nan"), s_lo)
        s_hi = tl.where(tl.max((bad_hi & stat).to(tl.int32), axis=0) > 0, float("nan"), s_hi)
        q_lo = tl.minimum(tl.maximum(tl.floor((x_lo - mn_lo[None, :]) * safe_inverse(s_lo)[None, :] + 0.5), 0.0), 15.0)
        q_hi = tl.minimum(tl.maximum(tl.floor((x_hi - mn_hi[None, :]) * safe_inverse(s_hi)[None, :] + 0.5), 0.0), 15.0)
        packed = q_lo.to(tl.uint8) | (q_hi.to(tl.uint8) << 4)
        # Values: per token, symmetric; token 0 in 8 bits (s4kv.format): the low nibbles in its value
        # code row, the high nibbles in its key code row (unused: the key is exact)
        y_lo, vbad_lo = saturate(v_lo.to(tl.float32))
        y_hi, vbad_hi = saturate(v_hi.to(tl.float32))
        amax = tl.maximum(tl.max(tl.abs(y_lo), axis=1), tl.max(tl.abs(y_hi), axis=1))
        first_tok = t == 0
        vs = fp16_up(amax / tl.where(first_tok, 127.5, 7.5))
        vbad = (tl.max(vbad_lo.to(tl.int32), axis=1) + tl.max(vbad_hi.to(tl.int32), axis=1)) > 0
        vs = tl.where(vbad, float("nan"), vs)
        vinv = safe_inverse(vs)[:, None]
        # one grid per row: codes 0..15 (offset 8), token 0 codes 0..255 (offset 128)
        top = tl.where(first_row, 255.0, 15.0)
        offset = tl.where(first_row, 128.0, 8.0)
        w_lo = tl.minimum(tl.maximum(tl.floor(y_lo * vinv + offset), 0.0), top).to(tl.uint8)
        w_hi = tl.minimum(tl.maximum(tl.floor(y_hi * vinv + offset), 0.0), top).to(tl.uint8)
        packed = tl.where(first_row, (w_lo >> 4) | ((w_hi >> 4) << 4), packed)
        tl.store(region + t[:, None] * HALF + c[None, :], packed)
        ks_ptr = (region + K_SCALE).to(tl.pointer_type(tl.float16))
        km_ptr = (region + K_MIN).to(tl.pointer_type(tl.float16))
        tl.store(ks_ptr + c, s_lo.to(tl.float16))
        tl.store(ks_ptr + HALF + c, s_hi.to(tl.float16))
        tl.store(km_ptr + c, mn_lo.to(tl.float16))
        tl.store(km_ptr + HALF + c, mn_hi.to(tl.float16))

        tl.store(region + V_CODES + c[None, :] * BS + t[:, None],  # channel-major
                 (w_lo & 0xF) | ((w_hi & 0xF) << 4))  # 4-bit codes, or token 0's low nibbles
        tl.store((region + V_SCALE).to(tl.pointer_type(tl.float16)) + t, vs.to(tl.float16))


@triton.jit
def _append_tail_kernel(
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
    cache_ptr, stride_cb, stride_ch,
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    BS: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr,
    TAIL_ROWS: tl.constexpr, ROW_BYTES: tl.constexpr,
):
    row = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    ctx = seq_len - qlen
    tail_block = seq_len // BS
    tail_start = tail_block * BS
    t = tile * TILE + tl.arange(0, TILE)  # index inside the tail block
    pos = tail_start + t
    if (qlen <= 0) | (tail_start + tile * TILE >= seq_len):
        return
    ok = (pos >= ctx) & (pos < seq_len)
    tok = q_start + pos - ctx
    d = tl.arange(0, D)
    m = ok[:, None] & (d[None, :] < D)
    kv = tl.load(k_ptr + tok[:, None] * stride_kt + h * stride_kh + d[None, :], mask=m)
    vv = tl.load(v_ptr + tok[:, None] * stride_vt + h * stride_vh + d[None, :], mask=m)
    bt_row = block_table_ptr + row * stride_bt
    dt = k_ptr.dtype.element_ty
    dst_k = tail_rows(cache_ptr, bt_row, tail_block, t, h * stride_ch, stride_cb, ok, TAIL_ROWS, ROW_BYTES, dt)
    dst_v = tail_rows(cache_ptr, bt_row, tail_block, BS + t, h * stride_ch, stride_cb, ok, TAIL_ROWS, ROW_BYTES, dt)
    tl.store(dst_k[:, None] + d[None, :], kv, mask=m)
    tl.store(dst_v[:, None] + d[None, :], vv, mask=m)


def store_blocks(k, v, regions, md, max_new_blocks: int, rows: tuple[int, int] | None = None) -> None:
    """Quantize the blocks this step completes into their pages, for the batch rows `rows`
    (first, end; default all).

    k, v [T, Hkv, D] (model dtype); regions [num_blocks, Hkv, region_bytes] uint8 view;
    ``max_new_blocks``: the most blocks any of those rows completes (host value).
    """
    row0, row1 = rows if rows is not None else (0, md.num_reqs)
    if row1 <= row0 or max_new_blocks <= 0:
        return
    hkv, d = k.shape[1], k.shape[2]
    lay = fmt.PageLayout(d)
    assert regions.stride(2) == 1
    _store_blocks_kernel[(row1 - row0, hkv, max_new_blocks)](
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0),
        rotation_operand(d, k.dtype, k.device), row0,
        BS=fmt.BLOCK_SIZE, HALF=d // 2, OP_DTYPE=dot_dtype(k.dtype), INV_SQRT_D=1.0 / math.sqrt(d),
        V_CODES=lay.v_codes, V_SCALE=lay.v_scale, K_SCALE=lay.k_scale, K_MIN=lay.k_min,
        FIRST_KEY=lay.first_key, FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(k.dtype)),
        TAIL_BLOCKS=fmt.tail_blocks(d, k.dtype.itemsize), **tail_constants(d, k.dtype),
        **launch_options("store", d, k.device),
    )


def append_tail(k, v, regions, md, tile: int = 16) -> None:
    """Write this step's tokens of each row's incomplete last block into its exact tail."""
    num_reqs = md.num_reqs
    if num_reqs == 0:
        return
    hkv, d = k.shape[1], k.shape[2]
    _append_tail_kernel[(num_reqs, hkv, fmt.BLOCK_SIZE // tile)](
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0),
        BS=fmt.BLOCK_SIZE, D=d, TILE=tile, **tail_constants(d, k.dtype),
    )
