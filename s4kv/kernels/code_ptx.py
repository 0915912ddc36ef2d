"""Inline PTX that turns packed 4-bit code bytes into 16-bit float dot operands (text only: the
Triton helper that uses it is s4kv.kernels.quant.code_operands; CPU tests run it
through an instruction emulator without importing any kernel)."""

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


# Biased: B + c for keys and values alike (7 instructions per 8 codes instead of 11: no packed op),
# where the kernel takes B (and 7.5 for values) off in fp32 once per page and query head rather
# than once per code (s4kv.kernels.decode). B + c is exact: 128..143 in bf16, 64..79 in fp16.
CODE_BIAS = {"bf16": 128.0, "fp16": 64.0}


def unpack_ptx(dtype: str, kind: str) -> str:
    """The inline PTX: $4 = 4 packed code bytes -> $0, $1 = low nibbles, $2, $3 = high nibbles
    (two 16-bit values per register, element order = byte order). $4 is read before any output
    is written (an output may share its register). kind "k": codes, "v": codes - 7.5,
    "biased": CODE_BIAS[dtype] + codes."""
    if kind == "biased":
        lines = [".reg .b32 x, y, hb;", f"mov.b32 hb, {_HIGH_BYTE[dtype, 'k'] * 0x01010101:#010x};"]
        lines += _NIBBLES[dtype, "k"]
        lines += ["prmt.b32 $0, x, hb, 0x4140;", "prmt.b32 $1, x, hb, 0x4342;",
                  "prmt.b32 $2, y, hb, 0x4140;", "prmt.b32 $3, y, hb, 0x4342;"]
        return "{\n" + "\n".join(lines) + "\n}"
    op, one, off = _TAKE_OFF[dtype, kind]
    lines = [".reg .b32 x, y, hb, one, off;", f"mov.b32 hb, {_HIGH_BYTE[dtype, kind] * 0x01010101:#010x};",
             f"mov.b32 off, {off:#010x};"] + ([f"mov.b32 one, {one:#010x};"] if one else [])
    lines += _NIBBLES[dtype, kind]
    lines += ["prmt.b32 $0, x, hb, 0x4140;", "prmt.b32 $1, x, hb, 0x4342;",
              "prmt.b32 $2, y, hb, 0x4140;", "prmt.b32 $3, y, hb, 0x4342;"]
    lines += [op.format(d=d) for d in ("$0", "$1", "$2", "$3")]
    return "{\n" + "\n".join(lines) + "\n}"
