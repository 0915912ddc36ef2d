"""Triton helpers that mirror the scalar rules of ``s4kv.format`` (fp16 rounding, codes), the
rotation, and the code operands of the attention dots."""

import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import code_ptx

# Constants reach the kernels through constexpr functions, not global tl.constexpr values: Triton
# compares every global constexpr a kernel read with its value at compile time on every launch
# (constexpr.__ne__, about 2.5 us of host time each on the project's CPU machine; 2 per stage launch),
# and a function call is resolved at compile time only (tools/layer_host_profile.py).


@triton.constexpr_function
def fp16_max() -> float:
    """The largest finite fp16 (s4kv.format.FP16_MAX)."""
    return fmt.FP16_MAX


@triton.jit
def fp16_up(x):
    """Nearest fp16 >= x (x fp32, finite, |x| <= 65504), returned as fp32. NaN stays NaN."""
    h = x.to(tl.float16)
    bits = h.to(tl.int16, bitcast=True)
    # next fp16 toward +inf: +1 ulp for positive values, -1 for negative, +0 -> smallest subnormal
    up_bits = tl.where(bits >= 0, bits + 1, bits - 1)
    up_bits = tl.where(bits.to(tl.int32) == -32768, 1, up_bits)  # -0.0
    up = up_bits.to(tl.float16, bitcast=True)
    return tl.where(h.to(tl.float32) < x, up.to(tl.float32), h.to(tl.float32))


@triton.jit
def fp16_down(x):
    """Nearest fp16 <= x (x fp32, finite, |x| <= 65504), returned as fp32. NaN stays NaN."""
    h = x.to(tl.float16)
    bits = h.to(tl.int16, bitcast=True)
    down_bits = tl.where(bits > 0, bits - 1, bits + 1)  # toward -inf
    down_bits = tl.where(bits == 0, -32767, down_bits)  # +0 -> -smallest subnormal (0x8001)
    down_bits = tl.where(bits.to(tl.int32) == -32768, -32767, down_bits)  # -0.0 likewise
    down = down_bits.to(tl.float16, bitcast=True)
    return tl.where(h.to(tl.float32) > x, down.to(tl.float32), h.to(tl.float32))


@triton.jit
def saturate(x):
    """fp32 copy with NaN -> 0 and values clamped to the fp16 range; plus the non-finite mask."""
    is_nan = x != x  # noqa: PLR0124 - the NaN test Triton lowers everywhere
    bad = is_nan | (tl.abs(x) == float("inf"))
    y = tl.where(is_nan, 0.0, x)
    y = tl.minimum(tl.maximum(y, -fp16_max()), fp16_max())
    return y, bad


@triton.jit
def clamp_fp16(x):
    """x clamped to the finite fp16 range with NaN kept as NaN (comparisons with NaN are false),
    unlike `saturate`, which zeroes NaN for the quantizer and reports it in a mask."""
    return tl.where(x > fp16_max(), fp16_max(), tl.where(x < -fp16_max(), -fp16_max(), x))


@triton.constexpr_function
def fp16_satfinite_ptx() -> str:
    """s4kv.kernels.code_ptx.FP16_SATFINITE, for inline_asm_elementwise."""
    return code_ptx.FP16_SATFINITE


@triton.jit
def to_fp16_saturated(x, USE_PTX: tl.constexpr):
    """x (fp32) -> fp16 inside the finite range with NaN kept (clamp_fp16 then the conversion).
    USE_PTX: one inline-PTX conversion per two elements (s4kv.kernels.code_ptx.FP16_SATFINITE); else
    Triton operations (the interpreter)."""
    if USE_PTX:
        return tl.inline_asm_elementwise(fp16_satfinite_ptx(), "=r,r,r", [x], dtype=tl.float16, is_pure=True, pack=2)
    else:
        return clamp_fp16(x).to(tl.float16)


@triton.jit
def safe_inverse(s):
    return tl.where(s > 0, 1.0 / tl.where(s > 0, s, 1.0), 0.0)


@triton.constexpr_function
def dot_precision(op_dtype, tf32: bool) -> str:
    """tl.dot's input_precision for the rotations and the decode kernel's dots: fp32 operands are
    multiplied in full fp32 ("ieee", FMAs) unless tf32 is asked for. On tensor cores fp32 operands
    are tf32 by default, whose 10-bit mantissas moved an fp32 model's 8-bit rows and int4 codes off
    the reference's (a chunk after 200 cached tokens 1.7e-2 from the reference on the H100,
    2026-12-05; 1.1e-2 under the interpreter with tf32 rounding emulated, 5e-4 without), and in the
    decode page loop broke the biased codes' cancellation (the dot rounds q * s to tf32, the
    constant B * sum(q * s) did not: a decode row 6.6e-2 from the reference on the H200). 16-bit
    operands ignore it (exact products anyway). Triton's interpreter computes either in fp32."""
    return "tf32" if tf32 or op_dtype != tl.float32 else "ieee"


@triton.jit
def transposed_rotation_tiles(r_ptr, HALF: tl.constexpr):
    """The four [HALF, HALF] tiles (00, 01, 10, 11) of R^T from the +-1 matrix R [D, D] at r_ptr
    (row-major, any float dtype: +-1 is exact), for rotate_with_tiles: apart, so that a kernel can
    issue them before it waits for its inputs. (x @ R needs two tiles of R: rotate_halves.)"""
    i = tl.arange(0, HALF)
    d = 2 * HALF
    # tile (a, b) of R^T is R[b, a]^T
    r00 = tl.load(r_ptr + i[None, :] * d + i[:, None])
    r01 = tl.load(r_ptr + (HALF + i[None, :]) * d + i[:, None])
    r10 = tl.load(r_ptr + i[None, :] * d + HALF + i[:, None])
    r11 = tl.load(r_ptr + (HALF + i[None, :]) * d + HALF + i[:, None])
    return r00, r01, r10, r11


@triton.jit
def rotate_with_tiles(x_lo, x_hi, r00, r01, r10, r11, OP_DTYPE: tl.constexpr, INV_SQRT_D: tl.constexpr,
                      TF32: tl.constexpr):
    """[x_lo, x_hi] @ [[r00, r01], [r10, r11]] / sqrt(D) (transposed_rotation_tiles): the products are
    exact and only the fp32 accumulation rounds (with TF32, fp32 operands lose 13 bits first:
    dot_precision). Returns fp32 halves."""
    a = x_lo.to(OP_DTYPE)
    b = x_hi.to(OP_DTYPE)
    p: tl.constexpr = dot_precision(OP_DTYPE, TF32)
    y_lo = tl.dot(a, r00.to(OP_DTYPE), input_precision=p) + tl.dot(b, r10.to(OP_DTYPE), input_precision=p)
    y_hi = tl.dot(a, r01.to(OP_DTYPE), input_precision=p) + tl.dot(b, r11.to(OP_DTYPE), input_precision=p)
    return y_lo * INV_SQRT_D, y_hi * INV_SQRT_D


@triton.jit
def rotate_halves(x_lo, x_hi, r_ptr, HALF: tl.constexpr, OP_DTYPE: tl.constexpr, INV_SQRT_D: tl.constexpr,
                  TRANSPOSE: tl.constexpr, TF32: tl.constexpr):
    """(x @ R) or (x @ R^T) for x given as its two column halves [M, HALF]; R = r_ptr / sqrt(D), the
    +-1 matrix [D, D]. Returns fp32 halves."""
    if TRANSPOSE:
        r00, r01, r10, r11 = transposed_rotation_tiles(r_ptr, HALF)
        return rotate_with_tiles(x_lo, x_hi, r00, r01, r10, r11, OP_DTYPE, INV_SQRT_D, TF32)
    # R = diag(s) @ [[H, H], [H, -H]] (s4kv.format.rotation_pm1), so R's right half is its left half
    # with the lower tile negated: x @ R = [a R00 + b R10, a R00 + (-b) R10], two tiles instead of four.
    # The products are the four tiles' (a sign flip is exact) and each half's two dots chain in one
    # accumulator as the four tiles' did, so the results are the same. The row kernel loads half the
    # tiles: 9 instead of 6 programs per SM on sm90; with R's left half as its operand (the same code
    # but R's row stride) it and the query rotation were 0.7-1.0 us faster per layer on the H100
    # (docs/results/gpu-2026-12-07-eighteenth/). R^T's kernels (the reduction, the stage kernel) keep
    # the four tiles: with two, the reduction fitted fewer programs on sm80 and the stage kernel spilled
    # more (docs/results/cpu-2026-12-07-one-tile-rotation/).
    i = tl.arange(0, HALF)
    t0 = tl.load(r_ptr + i[:, None] * (2 * HALF) + i[None, :]).to(OP_DTYPE)
    t1 = tl.load(r_ptr + (HALF + i[:, None]) * (2 * HALF) + i[None, :]).to(OP_DTYPE)
    p: tl.constexpr = dot_precision(OP_DTYPE, TF32)
    a = x_lo.to(OP_DTYPE)
    b = x_hi.to(OP_DTYPE)
    a_t0 = tl.dot(a, t0, input_precision=p)  # both halves' first term
    y_lo = tl.dot(b, t1, a_t0, input_precision=p)
    y_hi = tl.dot(-b, t1, a_t0, input_precision=p)
    return y_lo * INV_SQRT_D, y_hi * INV_SQRT_D


@triton.constexpr_function
def unpack_asm(code: str, half: str) -> str:
    """s4kv.kernels.code_ptx.unpack_ptx(code, half), for inline_asm_elementwise."""
    return code_ptx.UNPACK_PTX[(code, half)]


@triton.jit
def _unpack_half(packed, ASM: tl.constexpr, DT: tl.constexpr):
    """4 packed code bytes -> 4 16-bit operands of one half (s4kv.kernels.code_ptx.unpack_ptx)."""
    return tl.inline_asm_elementwise(ASM, "=r,=r,r", [packed], dtype=DT.value, is_pure=True, pack=4)


@triton.jit
def biased_code_operands(packed, CODE_DTYPE: tl.constexpr, OP_DTYPE: tl.constexpr, USE_PTX: tl.constexpr):
    """Packed code bytes -> both halves as OP_DTYPE dot operands holding B + c, B = CODE_BIAS of
    CODE_DTYPE (s4kv.kernels.code_ptx: the cheapest unpack; the caller takes B off after the dot).
    USE_PTX: compiled (inline PTX); else the same values with Triton operations (the interpreter)."""
    if USE_PTX:
        if CODE_DTYPE == tl.bfloat16:
            lo = _unpack_half(packed, unpack_asm("bf16", "lo"), tl.bfloat16)
            hi = _unpack_half(packed, unpack_asm("bf16", "hi"), tl.bfloat16)
        else:
            lo = _unpack_half(packed, unpack_asm("fp16", "lo"), tl.float16)
            hi = _unpack_half(packed, unpack_asm("fp16", "hi"), tl.float16)
    else:
        bias: tl.constexpr = 128.0 if CODE_DTYPE == tl.bfloat16 else 64.0
        lo = (packed & 0xF).to(tl.float32) + bias
        hi = (packed >> 4).to(tl.float32) + bias
    return lo.to(OP_DTYPE), hi.to(OP_DTYPE)


@triton.constexpr_function
def byte_code_asm(half: str) -> str:
    """s4kv.kernels.code_ptx.BYTE_CODES_PTX[half], for inline_asm_elementwise."""
    return code_ptx.BYTE_CODES_PTX[half]


@triton.jit
def int8_code_operands(packed, USE_PTX: tl.constexpr):
    """Packed code bytes -> both halves as int8 dot operands holding the codes (0..15) themselves
    (s4kv.kernels.code_ptx.BYTE_CODES_PTX); USE_PTX: compiled, else Triton operations (the interpreter)."""
    if USE_PTX:
        lo = tl.inline_asm_elementwise(byte_code_asm("lo"), "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
        hi = tl.inline_asm_elementwise(byte_code_asm("hi"), "=r,r", [packed], dtype=tl.int8, is_pure=True, pack=4)
    else:
        lo = (packed & 0xF).to(tl.int8)
        hi = (packed >> 4).to(tl.int8)
    return lo, hi


# 1.5 * 2^23: for |x| <= 2^22, the fp32 sum x + this is exact to the integer nearest x (ties to even),
# which its low mantissa bits hold as a two's-complement integer
_ROUND_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def round_to_int8(x):
    """round(x) as int8 for |x| < 127.5: one add and a byte of its bits instead of a rounding and a
    float-to-integer conversion (a quarter-rate instruction) per element."""
    return (x + _ROUND_MAGIC).to(tl.int32, bitcast=True).to(tl.int8)
