"""Inline PTX of the kernels (text only): packed 4-bit code bytes into 16-bit float dot operands
(used by s4kv.kernels.quant.biased_code_operands) and the saturating fp16 conversion
(s4kv.kernels.quant.to_fp16_saturated). CPU tests run them through an instruction emulator
without importing any kernel (tests/test_code_unpack.py)."""

# Packed code bytes -> dot operands B + c, 4 codes of one half per inline-PTX block, without the
# integer-to-float conversion (a quarter-rate instruction per code, which bounded the decode loop).
# A byte holds channel i's code in its low nibble and channel i + D/2's in its high nibble. Each
# nibble is moved into the low mantissa bits of a 16-bit float B whose ulp makes it count one
# unit, and prmt interleaves those bytes with B's high byte:
#   bf16: B = 128 (0x43, c in bits 0-3)     fp16: B = 64 (0x54, c in bits 4-7)
# B + c is exact (128..143 in bf16, 64..79 in fp16); the kernel takes B (and 7.5 for values) off in
# fp32 once per page and query head rather than once per code (s4kv.kernels.decode).
# Each half is an asm block of its own, with one result: Triton 3.8 and 3.9 give only the first
# result of a multi-result op the dot operand's register layout and send the other through shared
# memory (sm80 decode page loop 910 instructions per warp and page against 755, one program per SM
# fewer; tools/kernel_static.py --lines), while the same instructions as two blocks compile to the
# same code as before under Triton 3.6. 7 instructions per 8 codes (the shared B register is set
# once outside the loop). tests/test_code_unpack.py runs these programs through an emulator of the
# instructions they use.
_NIBBLES = {  # (16-bit dtype, half) -> the half's 4 nibbles into the low mantissa bits of x's bytes
    ("bf16", "lo"): ["and.b32 x, $2, 0x0F0F0F0F;"],
    ("bf16", "hi"): ["shr.u32 x, $2, 4;", "and.b32 x, x, 0x0F0F0F0F;"],
    ("fp16", "lo"): ["shl.b32 x, $2, 4;", "and.b32 x, x, 0xF0F0F0F0;"],
    ("fp16", "hi"): ["and.b32 x, $2, 0xF0F0F0F0;"],
}
_HIGH_BYTE = {"bf16": 0x43, "fp16": 0x54}
CODE_BIAS = {"bf16": 128.0, "fp16": 64.0}


def unpack_ptx(dtype: str, half: str) -> str:
    """The inline PTX: $2 = 4 packed code bytes -> $0, $1 = CODE_BIAS[dtype] + their low nibbles
    (half "lo": channels 0..D/2-1) or high nibbles ("hi": channels D/2..D-1), two 16-bit values per
    register, element order = byte order. $2 is read before any output is written (an output may
    share its register)."""
    lines = [".reg .b32 x, hb;", f"mov.b32 hb, {_HIGH_BYTE[dtype] * 0x01010101:#010x};", *_NIBBLES[dtype, half],
             "prmt.b32 $0, x, hb, 0x4140;", "prmt.b32 $1, x, hb, 0x4342;"]
    return "{\n" + "\n".join(lines) + "\n}"


# Packed code bytes -> int8 dot operands (the decode page loop's key dots with a bf16 model, mma
# m16n8k32 on int8): a byte's low nibble (half "lo") or high nibble ("hi") as the byte itself, 4 codes
# per register in byte order; 3 instructions per 8 codes against the 16-bit operands' 7, and the dot
# takes twice the codes per instruction. $1 = 4 packed code bytes, $0 = 4 int8 codes.
BYTE_CODES_PTX = {
    "lo": "and.b32 $0, $1, 0x0F0F0F0F;",
    "hi": "{\n.reg .b32 x;\nshr.u32 x, $1, 4;\nand.b32 $0, x, 0x0F0F0F0F;\n}",
}


# fp32 pair -> fp16 pair, rounded to nearest, clamped to +-65504, NaN kept: what clamp_fp16(x).to(fp16)
# gives (a value that rounds past 65504 is clamped before or after rounding alike), one conversion per
# two elements instead of a compare, a min and a select per element. Triton hands a pack of two
# elements over as $1, $2 in element order; cvt puts its first source in the high half, so $2 goes first.
FP16_SATFINITE = "cvt.rn.satfinite.f16x2.f32 $0, $2, $1;"

# every unpack_ptx string, for the kernels' constexpr functions (s4kv.kernels.quant.unpack_asm), which
# may read module attributes but not call plain functions
UNPACK_PTX = {(dtype, half): unpack_ptx(dtype, half) for dtype in ("bf16", "fp16") for half in ("lo", "hi")}
