"""Inline PTX of the kernels (text only): packed 4-bit code bytes into 16-bit float dot operands
(used by s4kv.kernels.quant.biased_code_operands) and the saturating fp16 conversion
(s4kv.kernels.quant.to_fp16_saturated). CPU tests run them through an instruction emulator
without importing any kernel (tests/test_code_unpack.py)."""

# Packed code bytes -> dot operands B + S * c, 4 codes of one half per inline-PTX block, without the
# integer-to-float conversion (a quarter-rate instruction per code, which bounded the decode loop).
# A byte holds channel i's code in its low nibble and channel i + D/2's in its high nibble. The kernel
# takes B (and 7.5 for values) off in fp32 once per page and query head rather than once per code, and
# S (CODE_SCALE, 1 or 16) out of the half's operand on the other side of the dot (s4kv.kernels.decode).
#   bf16 (B = 128, S = 1 in both halves; c must land in bits 0-3: bf16 has 7 mantissa bits): the half's
#   nibbles are isolated (and; for the high ones shr first), and prmt interleaves those bytes with 0x43,
#   128's high byte: 7 instructions per 8 codes.
#   fp16 (B = 1024, S = 1 low / 16 high; fp16 has 10 mantissa bits): prmt interleaves the whole bytes
#   with 0x64, 1024's high byte, giving 16-bit words 1024 + lo + 16 * hi, and one and per register
#   keeps the low nibble (1024 + lo) or the high one (1024 + 16 * hi): both halves' blocks compute the
#   same two prmt, which ptxas computes once (tools/kernel_static.py counts them), so 6 instructions
#   per 8 codes. B + S * c is exact (128..143 in bf16; 1024..1039 and 1024..1264 in fp16).
#   fp16x, the same values in another order: one lop3 per register, (x & nibble mask) | 0x64006400,
#   takes the half's nibbles of bytes 0 and 2 where they lie, and the same of x >> 8 those of bytes 1
#   and 3 (the shr shared by both halves' blocks): 5 instructions per 8 codes, the elements in the order
#   of bytes 0, 2, 1, 3 (CODE_ORDER). A dot over these takes its other operand in the same order:
#   the decode kernel uses them for the value tiles, whose k is the page's tokens, by reading the key
#   tile's rows (and so p) in that order for free (s4kv.kernels.decode._pages_partial).
# Each half is an asm block of its own, with one result: Triton 3.8 and 3.9 give only the first
# result of a multi-result op the dot operand's register layout and send the other through shared
# memory (sm80 decode page loop 910 instructions per warp and page against 755, one program per SM
# fewer; tools/kernel_static.py --lines), while the same instructions as two blocks compile to the
# same code as before under Triton 3.6. The shared B register is set once outside the loop.
# tests/test_code_unpack.py runs these programs through an emulator of the instructions they use.
CODES = ("bf16", "fp16", "fp16x")  # the unpacks: bf16 or fp16 operands; fp16x fp16's in swapped order
_HIGH_BYTE = {"bf16": 0x43, "fp16": 0x64, "fp16x": 0x64}
CODE_BIAS = {"bf16": 128.0, "fp16": 1024.0, "fp16x": 1024.0}
CODE_SCALE = {("bf16", "lo"): 1.0, ("bf16", "hi"): 1.0, ("fp16", "lo"): 1.0, ("fp16", "hi"): 16.0,
              ("fp16x", "lo"): 1.0, ("fp16x", "hi"): 16.0}
CODE_ORDER = {"bf16": (0, 1, 2, 3), "fp16": (0, 1, 2, 3), "fp16x": (0, 2, 1, 3)}  # the byte of 4 each output is
_BF16_NIBBLES = {"lo": ["and.b32 x, $2, 0x0F0F0F0F;"],  # the half's 4 nibbles into the low bits of x's bytes
                 "hi": ["shr.u32 x, $2, 4;", "and.b32 x, x, 0x0F0F0F0F;"]}
_FP16_KEEP = {"lo": "0xFF0FFF0F", "hi": "0xFFF0FFF0"}  # 1024's high byte and the half's nibble
_FP16X_NIBBLE = {"lo": "0x000F000F", "hi": "0x00F000F0"}  # the half's nibbles of bytes 0 and 2


def unpack_ptx(dtype: str, half: str) -> str:
    """The inline PTX of unpack `dtype` (CODES): $2 = 4 packed code bytes -> $0, $1 = CODE_BIAS[dtype]
    + CODE_SCALE[dtype, half] times their low nibbles (half "lo": channels 0..D/2-1) or high nibbles
    ("hi": channels D/2..D-1), two 16-bit values per register, in the byte order CODE_ORDER[dtype].
    $2 is read before any output is written (an output may share its register)."""
    hb = f"mov.b32 hb, {_HIGH_BYTE[dtype] * 0x01010101:#010x};"
    if dtype == "bf16":
        lines = [".reg .b32 x, hb;", hb, *_BF16_NIBBLES[half],
                 "prmt.b32 $0, x, hb, 0x4140;", "prmt.b32 $1, x, hb, 0x4342;"]
    elif dtype == "fp16x":
        keep = _FP16X_NIBBLE[half]
        lines = [".reg .b32 y;", "shr.b32 y, $2, 8;", f"lop3.b32 $0, $2, {keep}, 0x64006400, 0xEA;",
                 f"lop3.b32 $1, y, {keep}, 0x64006400, 0xEA;"]
    else:
        lines = [".reg .b32 x, y, hb;", hb, "prmt.b32 x, $2, hb, 0x4140;", "prmt.b32 y, $2, hb, 0x4342;",
                 f"and.b32 $0, x, {_FP16_KEEP[half]};", f"and.b32 $1, y, {_FP16_KEEP[half]};"]
    return "{\n" + "\n".join(lines) + "\n}"


# fp32 pair -> fp16 pair, rounded to nearest, clamped to +-65504, NaN kept: what clamp_fp16(x).to(fp16)
# gives (a value that rounds past 65504 is clamped before or after rounding alike), one conversion per
# two elements instead of a compare, a min and a select per element. Triton hands a pack of two
# elements over as $1, $2 in element order; cvt puts its first source in the high half, so $2 goes first.
FP16_SATFINITE = "cvt.rn.satfinite.f16x2.f32 $0, $2, $1;"

# every unpack_ptx string, for the kernels' constexpr functions (s4kv.kernels.quant.unpack_asm), which
# may read module attributes but not call plain functions
UNPACK_PTX = {(dtype, half): unpack_ptx(dtype, half) for dtype in CODES for half in ("lo", "hi")}
