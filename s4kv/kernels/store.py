"""Triton store kernels: this step's tokens as 8-bit window rows; completed units quantized into
pages from their rows; the rows of incomplete units kept in their windows.

Per layer and step: first :func:`quantize_rows` rotates this step's K/V and quantizes every token
once into an 8-bit row (s4kv.format, the window rows) in a scratch (:class:`StepRows`), which every
later kernel of the step reads; before attention :func:`store_blocks` quantizes the blocks of
every unit this step completes (their rows come from the request's window and from the scratch);
after attention :func:`append_window` writes this step's rows of the new incomplete unit into its
window. (The window write must wait for attention: the old window's rows may still be read, and
they live where the new ones go.)

The window lives in the pages of its unit and the two after them (s4kv.format), which are exactly
the pages the store writes when a chunk completes units. A block's window rows live in its own page
and the page UNIT_BLOCKS after it (s4kv.format.window_page), so the unit's blocks are stored at
once, each program reading its block's rows before it writes its page; the next unit's blocks,
written over the old rows, follow in the same programs. A chunk row's old window must be staged
for its attention before its store runs (s4kv.kernels.chunk).

Page regions are addressed through the cache tensor's block and head strides, so any vLLM layout
whose (token, byte) dims are innermost works.
"""

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from s4kv import format as fmt
from s4kv.kernels import (
    dot_dtype,
    kernel_layout,
    launch_options,
    layout,
    padded_group,
    rotation_operand,
    tl_dtype,
)
from s4kv.kernels.decode import LOG2E, rotate_query_row, rotated_queries
from s4kv.kernels.quant import fp16_down, fp16_up, rotate_halves, safe_inverse, saturate, to_fp16_saturated
from s4kv.kernels.window import load_window_rows, window_slots
from s4kv.kernels.workspace import ReservedWorkspace

# Launch options of the block store; launch_options("store", d) overrides them. Eight warps: with
# four, each thread holds four [BS, D/2] fp32 tiles (keys and values, both halves) and the kernel
# spilled 968 bytes at the 255-register limit (sm90, head_dim 128, Triton 3.6; tools/kernel_static.py),
# with eight it spills none and runs 6,116 instead of 10,765 instructions per warp. The store's
# time counts whenever a unit completes: a decode row's every 256th step, a chunk's every unit.
STORE_DEFAULTS = {"num_warps": 8}


class StepRows(ReservedWorkspace):
    """This step's window rows (codes [T, Hkv, D] uint8 for K and V, scales [T, Hkv, 2] fp16), one
    per device and layer shape. An engine reserves it for max_num_batched_tokens (and the startup
    check's largest step)."""

    what, unit = "step rows", "tokens"

    @staticmethod
    def allocate(count, num_kv_heads, head_size, device):
        shape = (count, num_kv_heads, head_size)
        return (torch.empty(shape, dtype=torch.uint8, device=device),
                torch.empty(shape, dtype=torch.uint8, device=device),
                torch.empty((count, num_kv_heads, 2), dtype=torch.float16, device=device))


@triton.jit
def _row_codes(x_lo, x_hi):
    """Rotated rows [n, HALF] x 2 (fp32) -> their 8-bit codes (uint8 halves) and scale [n] (fp32)
    (s4kv.format: the first value's rule, codes 0..255, scale fp16_up(max|x| / 127.5))."""
    y_lo, bad_lo = saturate(x_lo)
    y_hi, bad_hi = saturate(x_hi)
    amax = tl.maximum(tl.max(tl.abs(y_lo), axis=1), tl.max(tl.abs(y_hi), axis=1))
    s = fp16_up(amax / 127.5)
    bad = (tl.max(bad_lo.to(tl.int32), axis=1) + tl.max(bad_hi.to(tl.int32), axis=1)) > 0
    s = tl.where(bad, float("nan"), s)
    inv = safe_inverse(s)[:, None]
    c_lo = tl.minimum(tl.maximum(tl.floor(y_lo * inv + 128.0), 0.0), 255.0).to(tl.uint8)
    c_hi = tl.minimum(tl.maximum(tl.floor(y_hi * inv + 128.0), 0.0), 255.0).to(tl.uint8)
    return c_lo, c_hi, s


# n_tiles, n_decodes and stage_from follow the batch: not specialized (a new value would compile the
# kernel again mid-serving)
@triton.jit(do_not_specialize=["n_tiles", "n_decodes", "stage_from"])
def _quantize_rows_kernel(
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh, n_tokens,
    kc_ptr, vc_ptr, sc_ptr,  # StepRows: [T, Hkv, D] uint8 x 2, [T, Hkv, 2] fp16
    rot_ptr,
    # the decode rows (DECODES): their queries rotated (s4kv.kernels.decode.rotate_query_row) and
    # their rows written into their windows, in the same launch
    n_tiles, n_decodes, q_ptr, stride_qt, stride_qh, qr_ptr, q_scale,
    cache_ptr, stride_cb, stride_ch, qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    # STAGE_QUERIES: the queries of tokens stage_from.. in fp16 for chunk attention, [T, Hq, D] contiguous
    qs_ptr, stage_from,
    HKV: tl.constexpr, TILE: tl.constexpr, OP_DTYPE: tl.constexpr,
    INV_SQRT_D: tl.constexpr, DECODES: tl.constexpr, GROUP: tl.constexpr, STAGE_QUERIES: tl.constexpr,
    LAYOUT: tl.constexpr,  # s4kv.kernels.kernel_layout: the format's constants, read below
    PDL: tl.constexpr,
):
    """Programs (tile, kv head, 0 for keys / 1 for values) quantize TILE tokens' rows; with DECODES,
    programs (n_tiles + r, kv head, 0) rotate decode row r's queries; with STAGE_QUERIES, programs
    (tile, kv head, 2) write the tile's queries of that kv head's group as chunk attention's
    FlashAttention takes them. PDL: the kernel after it may be launched now (it waits in-kernel
    for this one's output: s4kv.kernels.decode.programmatic_rows)."""
    if PDL:
        gdc_launch_dependents()
    G_PAD: tl.constexpr = padded_group(GROUP)
    BS: tl.constexpr = layout(LAYOUT, "block_size")
    UNIT: tl.constexpr = layout(LAYOUT, "unit")
    HALF: tl.constexpr = layout(LAYOUT, "half")
    W_V_CODES: tl.constexpr = layout(LAYOUT, "w_v_codes")
    W_K_SCALE: tl.constexpr = layout(LAYOUT, "w_k_scale")
    W_V_SCALE: tl.constexpr = layout(LAYOUT, "w_v_scale")
    tile = tl.program_id(0)
    h = tl.program_id(1)
    which = tl.program_id(2)
    if STAGE_QUERIES and which == 2:
        t = tile * TILE + tl.arange(0, TILE)
        ok = t < n_tokens
        t64 = t.to(tl.int64)
        # the chunk rows' queries in the staged pages' dtype (s4kv.kernels.chunk.to_stage_dtype: fp16,
        # saturated at its range, NaN kept), which saves the layer two elementwise launches per wave
        # (a cast and a clamp: 29 us of device time with a 2,048-token chunk, H200). Programs of their
        # own, one query head after another: unrolled over the heads, or in the key and value
        # programs after their rows, the kernel spilled more (tools/kernel_static.py --kernel rows-stage).
        tl.static_assert(qs_ptr.dtype.element_ty == tl.float16)
        d = tl.arange(0, 2 * HALF)
        staged = (ok & (t >= stage_from))[:, None]
        q_src = q_ptr + t64[:, None] * stride_qt + d[None, :]
        q_dst = qs_ptr + t64[:, None] * (GROUP * HKV * 2 * HALF) + d[None, :]
        for g in tl.range(0, GROUP):
            x = tl.load(q_src + (h * GROUP + g) * stride_qh, mask=staged)
            tl.store(q_dst + (h * GROUP + g) * (2 * HALF), to_fp16_saturated(x.to(tl.float32), False), mask=staged)
        return
    if DECODES and tile >= n_tiles:
        if which == 0:
            rotate_query_row(q_ptr, stride_qt, stride_qh, qsl_ptr, qr_ptr, rot_ptr, q_scale, tile - n_tiles,
                             h, HKV, GROUP, G_PAD, HALF, INV_SQRT_D, OP_DTYPE)
        return
    t = tile * TILE + tl.arange(0, TILE)
    ok = t < n_tokens
    c = tl.arange(0, HALF)
    t64 = t.to(tl.int64)
    row = (t64 * HKV + h)
    m = ok[:, None]
    if which == 0:
        src = k_ptr + t64[:, None] * stride_kt + h * stride_kh
        dst = kc_ptr
    else:
        src = v_ptr + t64[:, None] * stride_vt + h * stride_vh
        dst = vc_ptr
    x_lo = tl.load(src + c[None, :], mask=m, other=0.0)
    x_hi = tl.load(src + HALF + c[None, :], mask=m, other=0.0)
    x_lo, x_hi = rotate_halves(x_lo, x_hi, rot_ptr, HALF, OP_DTYPE, INV_SQRT_D, False, False)
    c_lo, c_hi, s = _row_codes(x_lo, x_hi)
    tl.store(dst + row[:, None] * (2 * HALF) + c[None, :], c_lo, mask=m)
    tl.store(dst + row[:, None] * (2 * HALF) + HALF + c[None, :], c_hi, mask=m)
    tl.store(sc_ptr + row * 2 + which, s.to(tl.float16), mask=ok)
    if DECODES:
        # Decode rows come first, token t being row t's only token. Its row goes into its window now,
        # not after attention (append_window): it lands in the slot after the window rows attention
        # reads, in pages no other request reads. A token that completes its unit has no window
        # slot: the block store writes its unit into pages from these scratch rows.
        dec = ok & (t < n_decodes)
        dec = dec & (tl.load(qsl_ptr + t, mask=dec, other=-1) == t)
        dec = dec & (tl.load(qsl_ptr + t + 1, mask=dec, other=-1) == t + 1)
        seq = tl.load(seq_lens_ptr + t, mask=dec, other=0)
        dec = dec & (seq % UNIT != 0)
        base, slot = window_slots(cache_ptr, block_table_ptr + t64 * stride_bt, seq // UNIT * (UNIT // BS),
                                  (seq - 1) % UNIT, h * stride_ch, stride_cb, dec, LAYOUT)
        codes = base[:, None] + slot[:, None] * (2 * HALF) + c[None, :] + which * W_V_CODES
        tl.store(codes, c_lo, mask=dec[:, None])
        tl.store(codes + HALF, c_hi, mask=dec[:, None])
        scale_at = tl.where(which == 0, W_K_SCALE, W_V_SCALE)
        tl.store((base + scale_at).to(tl.pointer_type(tl.float16)) + slot, s.to(tl.float16), mask=dec)


def quantize_rows(k, v, tile: int = 16, decodes=None, stage=None, pdl: bool = False):
    """This step's window rows: k, v [T, Hkv, D] (model dtype) -> StepRows buffers (codes K, codes V,
    scales), filled for the T tokens.

    decodes: (q, regions, md, sm_scale), or None. Then the same launch also does two things for the
    decode rows (md.num_decodes, first): writes their rows into their windows, so append_window
    starts after them (first_row=md.num_decodes), and rotates their queries for the page kernel
    (s4kv.kernels.decode.rotated_queries, decode_attention(queries_rotated=True)).
    stage: (q, staged, first_token), or None. Then the same launch also writes q's tokens from
    first_token on into staged ([T, Hq, D] fp16, contiguous) as s4kv.kernels.chunk.to_stage_dtype
    would (s4kv.kernels.chunk.staged_queries).
    pdl: let the next kernel, launched programmatically, start while this one runs
    (s4kv.kernels.decode.programmatic_rows).
    """
    t, hkv, d = k.shape
    kc, vc, sc = StepRows.get(t, hkv, d, k.device)
    n_tiles = -(-t // tile)  # cdiv (triton.cdiv is a constexpr function: slow on the host)
    q = None if decodes is None and stage is None else (decodes or stage)[0]
    group = 1 if q is None else q.shape[1] // hkv
    if decodes is None:
        n_dec = 0
        q_args = (k, 0, 0) if q is None else (q, q.stride(0), q.stride(1))
        q_args += (sc, 1.0, kc, 0, 0, sc, sc, sc, 0)  # unused pointers and strides
    else:
        _, regions, md, sm_scale = decodes
        n_dec = md.num_decodes
        qr = rotated_queries(q, md) if n_dec else sc  # no decode row: nothing writes or reads it
        q_args = (q, q.stride(0), q.stride(1), qr, sm_scale * LOG2E,
                  regions, regions.stride(0), regions.stride(1), md.query_start_loc, md.seq_lens,
                  md.block_table, md.block_table.stride(0))
    staged, stage_from = (sc, 0) if stage is None else stage[1:]  # sc: an unused pointer
    if t or n_dec:
        _quantize_rows_kernel[(n_tiles + n_dec, hkv, 2 if stage is None else 3)](
            k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1), t, kc, vc, sc,
            rotation_operand(d, k.dtype, k.device), n_tiles, n_dec, *q_args, staged, stage_from,
            HKV=hkv, TILE=tile, OP_DTYPE=dot_dtype(k.dtype),
            INV_SQRT_D=1.0 / math.sqrt(d), DECODES=decodes is not None, GROUP=group,
            STAGE_QUERIES=stage is not None, LAYOUT=kernel_layout(d),
            **{"PDL": pdl, **launch_options("rows", d, k.device)})
    return kc, vc, sc


# row0 follows the batch (per-wave launches): a specialized int (0, 1, multiples of 16 are told apart)
# compiled the kernel again in the middle of serving (H200, 2026-12-02: vLLM's JIT monitor, 1k x 64)
@triton.jit(do_not_specialize=["row0"])
def _store_blocks_kernel(
    kc_ptr, vc_ptr, sc_ptr,  # this step's rows (StepRows)
    cache_ptr, stride_cb, stride_ch,  # pages, uint8 (windows included)
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt,
    row0,  # the first batch row of this launch
    LAYOUT: tl.constexpr, HKV: tl.constexpr, FIRST_KEY_DTYPE: tl.constexpr,
    PDL: tl.constexpr,  # launched programmatically after the row kernel (store_blocks)
):
    BS: tl.constexpr = layout(LAYOUT, "block_size")
    UNIT: tl.constexpr = layout(LAYOUT, "unit")
    HALF: tl.constexpr = layout(LAYOUT, "half")
    V_CODES: tl.constexpr = layout(LAYOUT, "v_codes")
    V_SCALE: tl.constexpr = layout(LAYOUT, "v_scale")
    K_SCALE: tl.constexpr = layout(LAYOUT, "k_scale")
    K_MIN: tl.constexpr = layout(LAYOUT, "k_min")
    FIRST_KEY: tl.constexpr = layout(LAYOUT, "first_key")
    WINDOW_PAGES: tl.constexpr = layout(LAYOUT, "window_pages")
    row = row0 + tl.program_id(0)
    h = tl.program_id(1)
    i = tl.program_id(2)
    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    ctx = seq_len - qlen
    first = ctx // UNIT * (UNIT // BS)  # the first block of the unit that was incomplete
    n_new = seq_len // UNIT * (UNIT // BS) - first  # blocks of the units this step completes
    kept = ctx - first * BS  # rows of that unit in the old window
    UNIT_BLOCKS: tl.constexpr = UNIT // BS
    idle = (qlen <= 0) | (i >= n_new)  # from the engine's metadata: the row kernel writes none of it
    if PDL:
        # the page kernel may be launched now; it waits for this kernel (gdc_wait). Launched while
        # the row kernel may still run, a program that stores reads the rows it writes, so it waits
        # for it here; so does program (0, 0, 0) always: this kernel then ends after the row kernel,
        # and the page kernel's wait for it covers the rows and rotated queries the row kernel
        # writes. The others (in most steps all of them: a decode row completes a unit once in
        # 256 steps) end at once. Waiting, a store program holds an SM's whole register file
        # (255 registers x 8 warps), which the page kernel's programs could not start beside.
        gdc_launch_dependents()
        if (idle == 0) | ((row == row0) & (h == 0) & (i == 0)):
            gdc_wait()
    if idle:
        return
    # The old window's rows live in pages first .. first + WINDOW_PAGES - 1, block first + j's in
    # pages first + j, first + j + UNIT_BLOCKS, ... (s4kv.format.window_page). The page an old block
    # is stored into holds only that block's rows, so the old unit's blocks are stored at once; but
    # the next unit's blocks are stored over the old blocks' other rows. So program j < UNIT_BLOCKS
    # stores block first + j and then the window pages' blocks UNIT_BLOCKS apart after it, whose own
    # programs do nothing; the programs of the pages after the window run alone.
    chained = (kept > 0) & (i < WINDOW_PAGES)
    if chained & (i >= UNIT_BLOCKS):
        return
    n_steps = tl.where(chained, tl.minimum(tl.cdiv(n_new - i, UNIT_BLOCKS), WINDOW_PAGES // UNIT_BLOCKS), 1)

    t = tl.arange(0, BS)
    c = tl.arange(0, HALF)
    bt_row = block_table_ptr + row * stride_bt
    for step in range(n_steps):
        b = first + i + step * UNIT_BLOCKS
        pos = b * BS + t
        from_window = pos < ctx  # only in the blocks of the first unit
        k_lo, k_hi, ks, v_lo, v_hi, vs = load_window_rows(
            cache_ptr, bt_row, first, pos - first * BS, h * stride_ch, stride_cb, from_window,
            kc_ptr, vc_ptr, sc_ptr, q_start + pos - ctx, h, ~from_window, c, HKV, LAYOUT)
        # the rows as s4kv.format dequantizes them: (code - 127.5) * scale, fp32, rotated basis
        k_lo, k_hi = k_lo * ks[:, None], k_hi * ks[:, None]
        v_lo, v_hi = v_lo * vs[:, None], v_hi * vs[:, None]
        block_id = tl.load(bt_row + b).to(tl.int64)
        region = cache_ptr + block_id * stride_cb + h * stride_ch
        # every thread has read its rows before any thread writes this page over them
        tl.debug_barrier()

        # The first key: its row as it is (NaN kept)
        first_row = t[:, None] == 0
        fk_lo = tl.sum(tl.where(first_row, k_lo, 0.0), axis=0)
        fk_hi = tl.sum(tl.where(first_row, k_hi, 0.0), axis=0)
        fk_ptr = (region + FIRST_KEY).to(tl.pointer_type(FIRST_KEY_DTYPE))
        tl.store(fk_ptr + c, fk_lo.to(FIRST_KEY_DTYPE))
        tl.store(fk_ptr + HALF + c, fk_hi.to(FIRST_KEY_DTYPE))

        # The format quantizes a block from its rows after saturating them (s4kv.format: clamp to the
        # fp16 range, a non-finite element poisons its groups). A row (code - 127.5) * scale is always
        # inside the fp16 range (|code - 127.5| <= 127.5, scale <= fp16_up(65504 / 127.5)), and it has
        # a non-finite element exactly when its scale is NaN (the whole row). So saturation is the
        # row's: a NaN row is read as zeros and marks its groups, with no per-element test or clamp
        # (a sixth of the kernel's instructions, and its spills under Triton 3.8: tools/kernel_static.py,
        # docs/results/kernel-static-2026-12-05-store/).
        k_bad = ks != ks  # noqa: PLR0124 - the NaN test Triton lowers everywhere
        x_lo = tl.where(k_bad[:, None], 0.0, k_lo)
        x_hi = tl.where(k_bad[:, None], 0.0, k_hi)

        # Keys: per channel over tokens 1..BS-1
        stat = t[:, None] > 0
        mn_lo = fp16_down(tl.min(tl.where(stat, x_lo, float("inf")), axis=0))
        mn_hi = fp16_down(tl.min(tl.where(stat, x_hi, float("inf")), axis=0))
        s_lo = fp16_up((tl.max(tl.where(stat, x_lo, -float("inf")), axis=0) - mn_lo) / 15.0)
        s_hi = fp16_up((tl.max(tl.where(stat, x_hi, -float("inf")), axis=0) - mn_hi) / 15.0)
        k_poisoned = tl.max((k_bad & (t > 0)).to(tl.int32), axis=0) > 0  # every channel of the block
        s_lo = tl.where(k_poisoned, float("nan"), s_lo)
        s_hi = tl.where(k_poisoned, float("nan"), s_hi)
        q_lo = tl.minimum(tl.maximum(tl.floor((x_lo - mn_lo[None, :]) * safe_inverse(s_lo)[None, :] + 0.5), 0.0), 15.0)
        q_hi = tl.minimum(tl.maximum(tl.floor((x_hi - mn_hi[None, :]) * safe_inverse(s_hi)[None, :] + 0.5), 0.0), 15.0)
        packed = q_lo.to(tl.uint8) | (q_hi.to(tl.uint8) << 4)
        # Values: per token, symmetric; token 0 in 8 bits (s4kv.format): the low nibbles in its value
        # code row, the high nibbles in its key code row (unused: the key is exact)
        v_bad = vs != vs  # noqa: PLR0124
        y_lo = tl.where(v_bad[:, None], 0.0, v_lo)
        y_hi = tl.where(v_bad[:, None], 0.0, v_hi)
        amax = tl.maximum(tl.max(tl.abs(y_lo), axis=1), tl.max(tl.abs(y_hi), axis=1))
        first_tok = t == 0
        vs = fp16_up(amax / tl.where(first_tok, 127.5, 7.5))
        vs = tl.where(v_bad, float("nan"), vs)
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
        # (The chain's next block is written over rows this one read: every thread read them before
        # the barrier above. Its own rows are this step's, none in a page.)


# row0 follows the batch (the decode rows before it): not specialized, like the block store's
@triton.jit(do_not_specialize=["row0"])
def _append_window_kernel(
    kc_ptr, vc_ptr, sc_ptr,
    cache_ptr, stride_cb, stride_ch,
    qsl_ptr, seq_lens_ptr, block_table_ptr, stride_bt, row0,
    LAYOUT: tl.constexpr, HKV: tl.constexpr, TILE: tl.constexpr,
):
    BS: tl.constexpr = layout(LAYOUT, "block_size")
    UNIT: tl.constexpr = layout(LAYOUT, "unit")
    D: tl.constexpr = layout(LAYOUT, "head_size")
    W_V_CODES: tl.constexpr = layout(LAYOUT, "w_v_codes")
    W_K_SCALE: tl.constexpr = layout(LAYOUT, "w_k_scale")
    W_V_SCALE: tl.constexpr = layout(LAYOUT, "w_v_scale")
    row = row0 + tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(qsl_ptr + row)
    qlen = tl.load(qsl_ptr + row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + row)
    ctx = seq_len - qlen
    unit_start = seq_len // UNIT * UNIT
    t = tile * TILE + tl.arange(0, TILE)  # row index inside the window
    pos = unit_start + t
    if (qlen <= 0) | (unit_start + tile * TILE >= seq_len):
        return
    ok = (pos >= ctx) & (pos < seq_len)
    tok = (q_start + pos - ctx).to(tl.int64)
    d = tl.arange(0, D)
    m = ok[:, None]
    src = (tok * HKV + h)[:, None] * D + d[None, :]
    base, slot = window_slots(cache_ptr, block_table_ptr + row * stride_bt, unit_start // BS, t, h * stride_ch,
                              stride_cb, ok, LAYOUT)
    dst = base[:, None] + slot[:, None] * D + d[None, :]
    tl.store(dst, tl.load(kc_ptr + src, mask=m), mask=m)
    tl.store(dst + W_V_CODES, tl.load(vc_ptr + src, mask=m), mask=m)
    sc = sc_ptr + (tok * HKV + h) * 2
    tl.store((base + W_K_SCALE).to(tl.pointer_type(tl.float16)) + slot, tl.load(sc, mask=ok), mask=ok)
    tl.store((base + W_V_SCALE).to(tl.pointer_type(tl.float16)) + slot, tl.load(sc + 1, mask=ok), mask=ok)


def store_blocks(rows, regions, md, max_new_blocks: int, model_dtype: torch.dtype,
                 rows_range: tuple[int, int] | None = None, pdl: bool = False) -> None:
    """Quantize the blocks of the units this step completes into their pages, for the batch rows
    `rows_range` (first, end; default all).

    rows: this step's rows (quantize_rows); regions [num_blocks, Hkv, region_bytes] uint8 view;
    ``max_new_blocks``: the most blocks any of those rows completes (host value; a row whose old
    window has rows stores its first WINDOW_PAGES blocks in its first UNIT_BLOCKS programs).
    pdl: launched programmatically after the row kernel (quantize_rows(pdl=True)), and the next
    kernel may be launched while this one runs (s4kv.kernels.decode.programmatic_rows).
    """
    row0, row1 = rows_range if rows_range is not None else (0, md.num_reqs)
    if row1 <= row0 or max_new_blocks <= 0:
        return
    kc, vc, sc = rows
    hkv, d = kc.shape[1], kc.shape[2]
    assert regions.stride(2) == 1
    _store_blocks_kernel[(row1 - row0, hkv, max_new_blocks)](
        kc, vc, sc, regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0), row0,
        LAYOUT=kernel_layout(d), HKV=hkv, FIRST_KEY_DTYPE=tl_dtype(fmt.first_key_dtype(model_dtype)),
        **{**STORE_DEFAULTS, "PDL": pdl, **launch_options("store", d, kc.device)},
        **({"launch_pdl": True} if pdl else {}),
    )


def append_window(rows, regions, md, tile: int = 16, first_row: int = 0) -> None:
    """Write this step's rows of each row's incomplete unit into its window, for the batch rows from
    `first_row` on (the decode rows before it had theirs written by quantize_rows(decodes=...))."""
    num_rows = md.num_reqs - first_row
    if num_rows <= 0:
        return
    kc, vc, sc = rows
    hkv, d = kc.shape[1], kc.shape[2]
    _append_window_kernel[(num_rows, hkv, fmt.UNIT // tile)](
        kc, vc, sc, regions, regions.stride(0), regions.stride(1),
        md.query_start_loc, md.seq_lens, md.block_table, md.block_table.stride(0), first_row,
        LAYOUT=kernel_layout(d), HKV=hkv, TILE=tile,
    )
