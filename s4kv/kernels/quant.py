"""Triton helpers that mirror the scalar rules of ``s4kv.format`` (fp16 rounding, codes)."""

import triton
import triton.language as tl

FP16_MAX = tl.constexpr(65504.0)


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
    y = tl.minimum(tl.maximum(y, -FP16_MAX), FP16_MAX)
    return y, bad


@triton.jit
def safe_inverse(s):
    return tl.where(s > 0, 1.0 / tl.where(s > 0, s, 1.0), 0.0)


@triton.jit
def rotate_halves(x_lo, x_hi, r_ptr, HALF: tl.constexpr, OP_DTYPE: tl.constexpr, INV_SQRT_D: tl.constexpr,
                  TRANSPOSE: tl.constexpr):
    """(x @ R) or (x @ R^T) for x given as its two column halves [M, HALF]; R = r_ptr / sqrt(D).

    r_ptr points at the +-1 matrix [D, D] (row-major, any float dtype: +-1 is exact), so the
    products are exact and only the fp32 accumulation rounds. Returns fp32 halves.
    """
    i = tl.arange(0, HALF)
    d = 2 * HALF
    if TRANSPOSE:  # tile (a, b) of R^T is R[b, a]^T
        r00 = tl.load(r_ptr + i[None, :] * d + i[:, None])
        r01 = tl.load(r_ptr + (HALF + i[None, :]) * d + i[:, None])
        r10 = tl.load(r_ptr + i[None, :] * d + HALF + i[:, None])
        r11 = tl.load(r_ptr + (HALF + i[None, :]) * d + HALF + i[:, None])
    else:
        r00 = tl.load(r_ptr + i[:, None] * d + i[None, :])
        r01 = tl.load(r_ptr + i[:, None] * d + HALF + i[None, :])
        r10 = tl.load(r_ptr + (HALF + i[:, None]) * d + i[None, :])
        r11 = tl.load(r_ptr + (HALF + i[:, None]) * d + HALF + i[None, :])
    a = x_lo.to(OP_DTYPE)
    b = x_hi.to(OP_DTYPE)
    y_lo = tl.dot(a, r00.to(OP_DTYPE)) + tl.dot(b, r10.to(OP_DTYPE))
    y_hi = tl.dot(a, r01.to(OP_DTYPE)) + tl.dot(b, r11.to(OP_DTYPE))
    return y_lo * INV_SQRT_D, y_hi * INV_SQRT_D


# Packed code bytes -> dot operands, 8 codes (4 bytes) per inline-PTX block, without the
# integer-to-float conversion (a quarter-rate instruction per code, which bounded the decode loop).
# Each nibble is moved into the low mantissa bits of a 16-bit float B whose ulp makes it count
# one unit, prmt interleaves those bytes with B's high byte, and one packed op takes B off:
#   keys   -> c           bf16: B = 128 (0x43, c in bits 0-3)     fp16: B = 64 (0x54, c in bits 4-7)
#   values -> c - 7.5     bf16: B = 16  (0x41, 0x80 | c << 3), subtract 23.5   fp16: B = 64, subtract 71.5
# Every intermediate is an exact small integer or half-integer. tests/test_code_unpack.py runs these
# programs through an emulator of the instructions they use.
_NIBBLES = {  # (16-bit dtype, keys or values) -> low nibbles into x, high nibbles into y (low bytes)
    ("bf16", "k"): ["and.b32 x, $4, 0x0F0F0F0F;", "shr.u32 y, $4, 4;", "and.b32 y, y, 0x0F0F0F0F;"],
    ("bf16", "v"): ["shl.b32 x, $4, 3;", "and.b32 x, x, 0x78787878;", "or.b32 x, x, 0x80808080;",
                    "shr.u32 y, $4, 1;", "and.b32 y, y, 0x78787878;", "or.b32 y, y, 0x80808080;"],
    ("fp16", "k"): ["shl.b32 x, $4, 4;", "and.b32 x, x, 0xF0F0F0F0;", "and.b32 y, $4, 0xF0F0F0F0;"],
    ("fp16", "v"): ["shl.b32 x, $4, 4;", "and.b32 x, x, 0xF0F0F0F0;", "and.b32 y, $4, 0xF0F0F0F0;"],
}
_HIGH_BYTE = {("bf16", "k"): 0x43, ("bf16", "v"): 0x41, ("fp16", "k"): 0x54, ("fp16", "v"): 0x54}
_TAKE_OFF = {  # the packed op that subtracts B (and 7.5 for values); fma: bf16x2 has no sub before sm90
    ("bf16", "k"): ("fma.rn.bf16x2 {d}, {d}, one, off;", 0x3F803F80, 0xC300C300),  # x * 1 + -128
    ("bf16", "v"): ("fma.rn.bf16x2 {d}, {d}, one, off;", 0x3F803F80, 0xC1BCC1BC),  # x * 1 + -23.5
    ("fp16", "k"): ("sub.f16x2 {d}, {d}, off;", 0, 0x54005400),  # x - 64
    ("fp16", "v"): ("sub.f16x2 {d}, {d}, off;", 0, 0x54785478),  # x - 71.5
}


def unpack_ptx(dtype: str, kind: str) -> str:
    """The inline PTX: $4 = 4 packed code bytes -> $0, $1 = low nibbles, $2, $3 = high nibbles
    (two 16-bit values per register, element order = byte order). $4 is read before any output
    is written (an output may share its register)."""
    op, one, off = _TAKE_OFF[dtype, kind]
    lines = [".reg .b32 x, y, hb, one, off;", f"mov.b32 hb, {_HIGH_BYTE[dtype, kind] * 0x01010101:#010x};",
             f"mov.b32 off, {off:#010x};"] + ([f"mov.b32 one, {one:#010x};"] if one else [])
    lines += _NIBBLES[dtype, kind]
    lines += ["prmt.b32 $0, x, hb, 0x4140;", "prmt.b32 $1, x, hb, 0x4342;",
              "prmt.b32 $2, y, hb, 0x4140;", "prmt.b32 $3, y, hb, 0x4342;"]
    lines += [op.format(d=d) for d in ("$0", "$1", "$2", "$3")]
    return "{\n" + "\n".join(lines) + "\n}"


UNPACK_K_BF16 = tl.constexpr(unpack_ptx("bf16", "k"))
UNPACK_V_BF16 = tl.constexpr(unpack_ptx("bf16", "v"))
UNPACK_K_FP16 = tl.constexpr(unpack_ptx("fp16", "k"))
UNPACK_V_FP16 = tl.constexpr(unpack_ptx("fp16", "v"))


@triton.jit
def _unpack(packed, ASM: tl.constexpr, DT: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,r", [packed], dtype=(DT.value, DT.value), is_pure=True,
                                     pack=4)


@triton.jit
def key_operands(packed, CODE_DTYPE: tl.constexpr, OP_DTYPE: tl.constexpr, USE_PTX: tl.constexpr):
    """Packed key code bytes (uint8: channel i in the low nibble, i + D/2 in the high) -> the codes
    c of both halves as OP_DTYPE dot operands. USE_PTX: compiled (inline PTX); else the same values
    with Triton operations (the interpreter)."""
    if USE_PTX:
        if CODE_DTYPE == tl.bfloat16:
            lo, hi = _unpack(packed, UNPACK_K_BF16, tl.bfloat16)
        else:
            lo, hi = _unpack(packed, UNPACK_K_FP16, tl.float16)
    else:
        lo = (packed & 0xF).to(tl.float32)
        hi = (packed >> 4).to(tl.float32)
    return lo.to(OP_DTYPE), hi.to(OP_DTYPE)


@triton.jit
def value_operands(packed, CODE_DTYPE: tl.constexpr, OP_DTYPE: tl.constexpr, USE_PTX: tl.constexpr):
    """Packed value code bytes -> c - 7.5 of both halves (the value grid before its per-token scale)."""
    if USE_PTX:
        if CODE_DTYPE == tl.bfloat16:
            lo, hi = _unpack(packed, UNPACK_V_BF16, tl.bfloat16)
        else:
            lo, hi = _unpack(packed, UNPACK_V_FP16, tl.float16)
    else:
        lo = (packed & 0xF).to(tl.float32) - 7.5
        hi = (packed >> 4).to(tl.float32) - 7.5
    return lo.to(OP_DTYPE), hi.to(OP_DTYPE)
