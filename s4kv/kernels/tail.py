"""Where a request's exact tail lives inside its pages (s4kv.format, "The exact tail"), for the
kernels: row r of the tail of block b (keys 0..BS-1, values BS..2*BS-1) is row r % ROWS of the
kv head's region in page block_table[b + r // ROWS]."""

import triton
import triton.language as tl

from s4kv import format as fmt


def tail_constants(head_size: int, dtype) -> dict:
    """The constexprs of tail_rows for a layer shape and model dtype."""
    return {"TAIL_ROWS": fmt.tail_rows_per_region(head_size, dtype.itemsize), "ROW_BYTES": head_size * dtype.itemsize}


@triton.jit
def tail_rows(cache_ptr, bt_row_ptr, tail_block, rows, head_offset, stride_cb, mask,
              TAIL_ROWS: tl.constexpr, ROW_BYTES: tl.constexpr, DTYPE: tl.constexpr):
    """Typed pointers to the first element of tail rows `rows` ([n] int32) of the tail of block
    `tail_block`; bt_row_ptr: the row's block table; head_offset: h * the cache's head stride.
    Rows outside `mask` point into the null page (block 0), never into another request's."""
    page = tl.load(bt_row_ptr + tail_block + rows // TAIL_ROWS, mask=mask, other=0).to(tl.int64)
    return (cache_ptr + page * stride_cb + head_offset + (rows % TAIL_ROWS) * ROW_BYTES).to(tl.pointer_type(DTYPE))
