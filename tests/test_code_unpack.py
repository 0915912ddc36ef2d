"""The kernels' inline PTX (s4kv.kernels.code_ptx): packed code bytes into dot operands, and the
saturating fp16 conversion.

CI has no GPU and Triton's interpreter cannot run inline assembly, so these programs run here
through an emulator of exactly the PTX instructions they use; every byte value in every byte
position must come out as CODE_BIAS + its low or high nibble, in the element order the kernels
rely on.
"""

import os
import re

import pytest
import torch

if not torch.cuda.is_available():  # importing s4kv.kernels imports Triton, which reads this once
    os.environ["TRITON_INTERPRET"] = "1"

from s4kv.kernels.code_ptx import BYTE_CODES_PTX, CODE_BIAS, FP16_SATFINITE, unpack_ptx

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


def _f32(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)


def _f16_satfinite(bits: int) -> int:
    """cvt.rn.satfinite.f16.f32 of one fp32 bit pattern (PTX ISA: round to nearest even; a finite or
    infinite result beyond the largest finite fp16 is that value with its sign; NaN stays NaN)."""
    x = _f32(bits)
    h = x.to(torch.float16)
    if torch.isinf(h).item():
        h = torch.tensor([65504.0], dtype=torch.float16) * (1 if x.item() > 0 else -1)
    return int(h.view(torch.int16).to(torch.int32).item()) & 0xFFFF


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
        elif op == "cvt.rn.satfinite.f16x2.f32":  # PTX ISA: the first source into the upper half
            r = _f16_satfinite(x[1]) | _f16_satfinite(x[0]) << 16
        else:
            raise AssertionError(f"the emulator does not know {op!r}: extend it before using it")
        regs[d] = r
    return regs


@pytest.mark.parametrize("half", ["lo", "hi"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_code_byte_unpacks_exactly(dtype, half):
    program = unpack_ptx(dtype, half)
    assert set(re.findall(r"\$\d", program)) == {"$0", "$1", "$2"}
    t = DTYPES[dtype]
    for value in range(256):
        for rot in range(4):  # every byte value in every byte position, beside bytes that differ
            data = [(value + 0x35 * ((i + rot) % 4)) % 256 for i in range(4)]  # in both nibbles
            out = run_ptx(program, {"$2": int.from_bytes(bytes(data), "little")})
            got = torch.cat([_lanes(out["$0"], t), _lanes(out["$1"], t)])
            codes = torch.tensor(data, dtype=torch.float64)
            nibbles = codes.remainder(16) if half == "lo" else codes.div(16, rounding_mode="floor")
            assert torch.equal(got, nibbles + CODE_BIAS[dtype]), (dtype, half, data, got)


def test_input_is_read_before_any_output_is_written():
    # "=r" outputs may share the input's register: the programs must finish reading $2 first
    for dtype in DTYPES:
        for half in ("lo", "hi"):
            lines = [ln for ln in unpack_ptx(dtype, half).splitlines() if ln.strip()]
            last_read = max(i for i, ln in enumerate(lines) if "$2" in ln)
            first_write = min(i for i, ln in enumerate(lines) if re.match(r"\s*\S+\s+\$[01],", ln))
            assert last_read < first_write, (dtype, half)


def test_seven_instructions_per_eight_codes():
    # both halves of 4 bytes, B's register set once outside the loop: the count the decode loop's
    # instruction budget assumes (docs/results/gpu-h200-2026-12-02-decode/)
    for dtype in DTYPES:
        ops = [ln for half in ("lo", "hi") for ln in unpack_ptx(dtype, half).splitlines()
               if ln.strip() and not ln.startswith((".reg", "mov.b32 hb", "{", "}"))]
        assert len(ops) == 7, (dtype, ops)


def test_emulator_prmt_and_lanes():
    # the emulator itself, on hand-checked values (PTX ISA: prmt default mode; 16-bit lanes)
    assert _prmt(0x44332211, 0x88776655, 0x4140) == 0x55225511
    assert _prmt(0x44332211, 0x88776655, 0x7362) == 0x88447733
    one_and_two = _word(torch.tensor([1.0, 2.0]), torch.bfloat16)
    assert one_and_two == 0x40003F80
    assert _lanes(one_and_two, torch.bfloat16).tolist() == [1.0, 2.0]
    assert run_ptx("{\nshr.u32 r, a, 4;\nand.b32 r, r, 0x0F0F0F0F;\n}", {"a": 0xA1B2C3D4})["r"] == 0x0A0B0C0D


def test_the_saturating_fp16_conversion_is_clamp_then_round_in_element_order():
    # quant.to_fp16_saturated: Triton packs two elements as $1 (first) and $2; the first must come out
    # in the low lane, as the element order of a 16-bit tensor in one register has it
    values = [0.0, -0.0, 1.0, -2.5, 1e-8, -6e-8, 3.14159, 65504.0, -65504.0, 65519.0, 65520.0, -70000.0,
              1e30, float("inf"), float("-inf"), float("nan"), 2.0 ** -24, 0.1]
    for first in values:
        for second in values:
            x = torch.tensor([first, second], dtype=torch.float32)
            bits = x.view(torch.int32).tolist()
            out = run_ptx(FP16_SATFINITE, {"$1": bits[0] & MASK, "$2": bits[1] & MASK})["$0"]
            got = _lanes(out, torch.float16)
            want = torch.where(x > 65504, 65504.0, torch.where(x < -65504, -65504.0, x)).to(torch.float16).double()
            assert torch.equal(got.isnan(), want.isnan()), (first, second, got)
            ok = ~want.isnan()
            assert torch.equal(got[ok], want[ok]) and torch.equal(got[ok].signbit(), want[ok].signbit()), (first, second, got)


_LAYOUT_AFTER_CHANGE = """
import sys
from s4kv.kernels import code_ptx
change = sys.argv[1]
if change == "unpack":
    code_ptx.UNPACK_PTX = {**code_ptx.UNPACK_PTX, ("bf16", "hi"): code_ptx.UNPACK_PTX["bf16", "hi"] + "\\n// changed"}
elif change == "bias":
    code_ptx.CODE_BIAS = {**code_ptx.CODE_BIAS, "fp16": 65.0}
elif change == "satfinite":
    code_ptx.FP16_SATFINITE += " // changed"
elif change == "bytes":
    code_ptx.BYTE_CODES_PTX = {**code_ptx.BYTE_CODES_PTX, "lo": code_ptx.BYTE_CODES_PTX["lo"] + " // changed"}
from s4kv.kernels import kernel_layout
print(kernel_layout(128))
"""


def test_a_changed_ptx_text_or_bias_changes_every_kernels_cache_key():
    """Triton keys its on-disk kernel cache by a kernel's source, its arguments and the constexpr
    globals it reads, not by a table a constexpr function reads through another module, as the
    kernels read code_ptx's: a changed unpack PTX reused the kernels compiled with the old one (a
    probe of 2026-12-05 compiled to the shipped SASS). Every kernel takes s4kv.kernels.kernel_layout
    as its LAYOUT argument, which carries a digest of the PTX texts and code biases: each change,
    made before the kernels are imported, must change it, and no kernel module may launch with the
    format's layout string alone."""
    import pathlib
    import subprocess
    import sys

    def layout(change: str) -> str:
        return subprocess.run([sys.executable, "-c", _LAYOUT_AFTER_CHANGE, change], check=True,
                              capture_output=True, text=True).stdout.strip()

    base = layout("none")
    assert base == layout("none") and ";ptx=" in base
    for change in ("unpack", "bias", "satfinite", "bytes"):
        assert layout(change) != base, change
    kernels = pathlib.Path(__file__).resolve().parents[1] / "s4kv" / "kernels"
    launches = {f.name: f.read_text().count("LAYOUT=") for f in kernels.glob("*.py")}
    assert sum(launches.values()) >= 5, launches
    for f in kernels.glob("*.py"):
        assert "LAYOUT=fmt.kernel_layout" not in f.read_text(), f.name


@pytest.mark.parametrize("half", ["lo", "hi"])
def test_every_code_byte_becomes_its_int8_code(half):
    """The int8 key dots' operands (s4kv.kernels.code_ptx.BYTE_CODES_PTX): each byte's low or high
    nibble as that byte, in byte order, 1 and 2 instructions (3 per 8 codes)."""
    program = BYTE_CODES_PTX[half]
    assert set(re.findall(r"\$\d", program)) == {"$0", "$1"}
    ops = [ln for ln in program.replace("{", "").replace("}", "").split(";") if ln.strip() and ".reg" not in ln]
    assert len(ops) == (1 if half == "lo" else 2), ops
    for value in range(256):
        for rot in range(4):
            data = [(value + 0x35 * ((i + rot) % 4)) % 256 for i in range(4)]
            out = run_ptx(program, {"$1": int.from_bytes(bytes(data), "little")})["$0"]
            want = [d % 16 if half == "lo" else d // 16 for d in data]
            assert list(out.to_bytes(4, "little")) == want, (half, data, hex(out))
