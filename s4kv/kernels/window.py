"""Window rows for the kernels (s4kv.format, "The window"): where a request's 8-bit window rows live
inside its pages, where this step's rows wait before they get there, and what a row reads back as.

Row r of the window whose unit starts at block `first` is slot r % SLOTS of the kv head's region
in page block_table[first + s4kv.format.window_page(r)]: a block's rows in its own page and in
pages UNIT_BLOCKS apart after it. This step's tokens are quantized once, before anything
reads them (s4kv.kernels.store.quantize_rows), into a scratch of the same codes and scales: every
kernel that reads a token of this step reads that one copy, so the pages a unit is quantized
into, the windows decode and chunk attention read, and the rows kept for later steps all come
from the same 8-bit row, however the step is cut.
"""

import triton
import triton.language as tl

from s4kv.kernels import layout


@triton.jit
def window_slots(cache_ptr, bt_row_ptr, first_block, rows, head_offset, stride_cb, mask, LAYOUT: tl.constexpr):
    """(first byte of the kv head's region in each row's page, slot) of window rows `rows` ([n]
    int32); bt_row_ptr: the row's block table; head_offset: h * the cache's head stride; LAYOUT:
    s4kv.kernels.kernel_layout. Rows outside `mask` point into the null page (block 0), never into
    another request's."""
    BS: tl.constexpr = layout(LAYOUT, "block_size")
    UNIT_BLOCKS: tl.constexpr = layout(LAYOUT, "unit") // BS
    SLOTS: tl.constexpr = layout(LAYOUT, "slots")
    # s4kv.format.window_page; unsigned: a row is 0..UNIT-1 where `mask` holds (the others load
    # nothing), and unsigned division by a power of two is a shift, with no sign correction
    r = rows.to(tl.uint32)
    page_of_row = r // BS + UNIT_BLOCKS * (r % BS // SLOTS)
    page = tl.load(bt_row_ptr + first_block + page_of_row, mask=mask, other=0).to(tl.int64)
    return cache_ptr + page * stride_cb + head_offset, rows % SLOTS


@triton.jit
def load_window_rows(cache_ptr, bt_row_ptr, first_block, rows, head_offset, stride_cb, from_window,
                     kc_ptr, vc_ptr, sc_ptr, tok, h, from_step, c, HKV: tl.constexpr, LAYOUT: tl.constexpr):
    """n tokens' window rows, each from the window in the pages (rows `rows` where `from_window`) or
    from this step's scratch rows (tokens `tok` where `from_step`): the K and V halves as
    code - 127.5 [n, HALF] (fp32, exact) and their scales [n] (fp32); a row is code * scale in the
    rotated basis. Zeros (scale 0) where neither."""
    HALF: tl.constexpr = layout(LAYOUT, "half")
    D: tl.constexpr = 2 * HALF
    W_V_CODES: tl.constexpr = layout(LAYOUT, "w_v_codes")
    W_K_SCALE: tl.constexpr = layout(LAYOUT, "w_k_scale")
    W_V_SCALE: tl.constexpr = layout(LAYOUT, "w_v_scale")
    base, slot = window_slots(cache_ptr, bt_row_ptr, first_block, rows, head_offset, stride_cb, from_window, LAYOUT)
    wk = base[:, None] + slot[:, None] * D + c[None, :]
    ks_w = tl.load((base + W_K_SCALE).to(tl.pointer_type(tl.float16)) + slot, mask=from_window, other=0.0)
    vs_w = tl.load((base + W_V_SCALE).to(tl.pointer_type(tl.float16)) + slot, mask=from_window, other=0.0)
    tok64 = tok.to(tl.int64)
    sk = (tok64 * HKV + h) * D
    ss = (tok64 * HKV + h) * 2
    ks_s = tl.load(sc_ptr + ss, mask=from_step, other=0.0)
    vs_s = tl.load(sc_ptr + ss + 1, mask=from_step, other=0.0)
    ks = tl.where(from_window, ks_w.to(tl.float32), ks_s.to(tl.float32))
    vs = tl.where(from_window, vs_w.to(tl.float32), vs_s.to(tl.float32))
    fw = from_window[:, None]
    fs = from_step[:, None]
    live = fw | fs
    wv = wk + W_V_CODES
    k_lo = tl.load(wk, mask=fw, other=0) + tl.load(kc_ptr + sk[:, None] + c[None, :], mask=fs, other=0)
    k_hi = tl.load(wk + HALF, mask=fw, other=0) + tl.load(kc_ptr + sk[:, None] + HALF + c[None, :], mask=fs, other=0)
    v_lo = tl.load(wv, mask=fw, other=0) + tl.load(vc_ptr + sk[:, None] + c[None, :], mask=fs, other=0)
    v_hi = tl.load(wv + HALF, mask=fw, other=0) + tl.load(vc_ptr + sk[:, None] + HALF + c[None, :], mask=fs, other=0)
    return (tl.where(live, k_lo.to(tl.float32) - 127.5, 0.0), tl.where(live, k_hi.to(tl.float32) - 127.5, 0.0), ks,
            tl.where(live, v_lo.to(tl.float32) - 127.5, 0.0), tl.where(live, v_hi.to(tl.float32) - 127.5, 0.0), vs)
