"""The inline PTX that turns packed code bytes into dot operands (s4kv.kernels.code_ptx).

CI has no GPU and Triton's interpreter cannot run inline assembly, so these programs run here
through an emulator of exactly the PTX instructions they use; every byte value in every byte
position must come out as the code (keys) or the code - 7.5 (values), in the element order the
kernels rely on.
"""

import os
import re

import pytest
import torch

if not torch.cuda.is_available():  # importing s4kv.kernels imports Triton, which reads this once
    os.environ["TRITON_INTERPRET"] = "1"

from s4kv.kernels.code_ptx import CODE_BIAS, unpack_ptx

MASK = 0xFFFFFFFF
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _lanes(word: int, dtype: torch.dtype) -> torch.Tensor:
    """A 32-bit register as its two 16-bit floats (low lane first)."""
    bits = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).double()


def _word(lanes: torch.Tensor, dtype: torch.dtype) -> int:
    bits = lanes.to(dtype).view(torch.int16).to(torch.int32) & 0xFFFF
    return int(bits[0]) | int(bits[1]) << 16


def _prmt(a: int, b: int, sel: int) -> int:
    pool = (b << 32 | a).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(sel >> (4 * i)) & 0x7] for i in range(4)), "little")


def run_ptx(program: str, inputs: dict[str, int]) -> dict[str, int]:
    """Run the straight-line PTX of one asm block over 32-bit registers."""
    regs = dict(inputs)

    def val(x: str) -> int:
        return int(x, 0) & MASK if x[0].isdigit() else regs[x]

    for line in program.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        x = [val(s) for s in src]
        if op == "mov.b32":
            r = x[0]
        elif op == "and.b32":
            r = x[0] & x[1]
        elif op == "or.b32":
            r = x[0] | x[1]
        elif op == "shl.b32":
            r = (x[0] << x[1]) & MASK
        elif op == "shr.u32":
            r = x[0] >> x[1]
        elif op == "prmt.b32":
            r = _prmt(x[0], x[1], x[2])
        elif op == "fma.rn.bf16x2":
            t = torch.bfloat16
            r = _word(_lanes(x[0], t) * _lanes(x[1], t) + _lanes(x[2], t), t)
        elif op == "sub.f16x2":
            t = torch.float16
            r = _word(_lanes(x[0], t) - _lanes(x[1], t), t)
        else:
            raise AssertionError(f"the emulator does not know {op!r}: extend it before using it")
        regs[d] = r
    return regs


@pytest.mark.parametrize("kind", ["k", "v", "biased"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_code_byte_unpacks_exactly(dtype, kind):
    program = unpack_ptx(dtype, kind)
    assert set(re.findall(r"\$\d", program)) == {"$0", "$1", "$2", "$3", "$4"}
    shift = {"k": 0.0, "v": 7.5, "biased": -CODE_BIAS[dtype]}[kind]
    t = DTYPES[dtype]
    for value in range(256):
        for rot in range(4):  # every byte value in every byte position, beside bytes that differ
            data = [(value + 0x35 * ((i + rot) % 4)) % 256 for i in range(4)]  # in both nibbles
            out = run_ptx(program, {"$4": int.from_bytes(bytes(data), "little")})
            lo = torch.cat([_lanes(out["$0"], t), _lanes(out["$1"], t)])
            hi = torch.cat([_lanes(out["$2"], t), _lanes(out["$3"], t)])
            codes = torch.tensor(data, dtype=torch.float64)
            assert torch.equal(lo, codes.remainder(16) - shift), (dtype, kind, data, lo)
            assert torch.equal(hi, codes.div(16, rounding_mode="floor") - shift), (dtype, kind, data, hi)


def test_input_is_read_before_any_output_is_written():
    # "=r" outputs may share the input's register: the programs must finish reading $4 first
    for dtype in DTYPES:
        for kind in ("k", "v", "biased"):
            lines = [ln for ln in unpack_ptx(dtype, kind).splitlines() if ln.strip()]
            last_read = max(i for i, ln in enumerate(lines) if "$4" in ln)
            first_write = min(i for i, ln in enumerate(lines) if re.match(r"\s*\S+\s+\$[0-3],", ln))
            assert last_read < first_write, (dtype, kind)


def test_emulator_prmt_and_packed_ops():
    # the emulator itself, on hand-checked values (PTX ISA: prmt default mode, packed halves)
    assert _prmt(0x44332211, 0x88776655, 0x4140) == 0x55225511
    assert _prmt(0x44332211, 0x88776655, 0x7362) == 0x88447733
    one_and_two = _word(torch.tensor([1.0, 2.0]), torch.bfloat16)
    assert one_and_two == 0x40003F80
    out = run_ptx("{\nfma.rn.bf16x2 r, a, a, a;\n}", {"a": one_and_two})
    assert _lanes(out["r"], torch.bfloat16).tolist() == [2.0, 6.0]
