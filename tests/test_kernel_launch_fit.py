"""Every kernel's launch fits every GPU the product supports (sm80 A100, sm86 A10G, sm89 L4/L40S,
sm90 H100/H200), checked without a GPU: tools/kernel_static.py compiles the kernels for each
architecture with Triton's own compiler and ptxas and counts the programs that fit on one SM. A
kernel needing more shared memory than a block may have raises OutOfResources at its first launch
on that GPU, which at engine start is the self-check failing: int4_kivi refused on that machine.

The compile runs in a subprocess: the tool replaces Triton's active driver, which the interpreter
tests in this process need. The Triton here is the CPU environment's, not necessarily the GPU
image's (tools/kernel_static.py notes the version); the sizes match closely across versions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from s4kv import kernels

ROOT = Path(__file__).resolve().parents[1]


def test_small_shared_memory_gpus_start_from_their_own_launch_options(monkeypatch):
    monkeypatch.setattr(kernels, "LAUNCH", {("stage", 64): {"num_warps": 2}})
    monkeypatch.setattr(kernels, "SMALL_SHARED_LAUNCH", {("stage", 128): {"num_stages": 1, "num_warps": 8}})
    monkeypatch.setattr(kernels, "max_shared_memory", lambda device: 101_376)  # sm86 / sm89
    assert kernels.launch_options("stage", 128, "cuda:0") == {"num_stages": 1, "num_warps": 8}
    assert kernels.launch_options("stage", 64, "cuda:0") == {"num_warps": 2}
    assert kernels.launch_options("decode", 128, "cuda:0") == {}
    # a tuned entry (S4KV_KERNEL_CONFIG) overrides the small-memory defaults key by key
    kernels.LAUNCH[("stage", 128)] = {"num_warps": 4}
    assert kernels.launch_options("stage", 128, "cuda:0") == {"num_stages": 1, "num_warps": 4}
    monkeypatch.setattr(kernels, "max_shared_memory", lambda device: 232_448)  # sm90
    assert kernels.launch_options("stage", 128, "cuda:0") == {"num_warps": 4}


def test_no_shared_memory_rule_off_the_gpu():
    assert kernels.max_shared_memory("cpu") is None
    assert kernels.max_shared_memory(None) is None


def test_page_kernel_compile_env_is_set_for_the_launch_and_restored(monkeypatch):
    assert kernels.mma_sync_env(9) == {"DISABLE_MMA_V3": "1"}
    assert kernels.mma_sync_env(8) == {} and kernels.mma_sync_env(None) == {}
    assert kernels.page_kernel_env(torch.device("cpu")) == {}
    monkeypatch.delenv("DISABLE_MMA_V3", raising=False)
    monkeypatch.setenv("S4KV_TEST_KEPT", "before")
    with kernels.compile_env({"DISABLE_MMA_V3": "1", "S4KV_TEST_KEPT": "inside"}):
        assert os.environ["DISABLE_MMA_V3"] == "1" and os.environ["S4KV_TEST_KEPT"] == "inside"
    assert "DISABLE_MMA_V3" not in os.environ and os.environ["S4KV_TEST_KEPT"] == "before"
    with pytest.raises(RuntimeError), kernels.compile_env({"DISABLE_MMA_V3": "1"}):
        raise RuntimeError("a launch that fails")
    assert "DISABLE_MMA_V3" not in os.environ


def _ptxas() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def _kernel_static(tmp_path, *args: str) -> list[dict]:
    """tools/kernel_static.py's records for these arguments (compiled in a subprocess)."""
    out = tmp_path / "static.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    # a cache of its own: Triton's cache key holds the kernels' source text, not its line numbers, so
    # a binary compiled before lines above a kernel moved (a comment added) is reused, and its line
    # table then names the wrong source lines (2026-12-06: a dot's instructions on the line two above)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "tools/kernel_static.py", *args, "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not _ptxas().exists(), reason="this Triton has no NVIDIA backend binaries (ptxas)")
def test_every_kernel_launch_fits_every_supported_gpu(tmp_path):
    rows = _kernel_static(tmp_path, "--kernel", "decode,stage,stage-window,store,rows,rows-stage,append",
                          "--arch", "80,86,89,90", "--shape", "qwen2.5-7b,smollm2", "--dtype", "bf16")
    assert len(rows) == 4 * 2 * 7
    no_fit = [(r["kernel"], r["arch"], r["shape"], r["options"], r["shared_bytes"]) for r in rows
              if r["programs_per_sm"] < 1]
    assert not no_fit, f"kernels that cannot launch (kernel, arch, shape, options, shared bytes): {no_fit}"
    by = {(r["kernel"], r["arch"], r["shape"]): r for r in rows}
    # every architecture got the launch options it starts from on the device
    for (kernel, arch, shape), r in by.items():
        kernel = {"stage-window": "stage", "rows-stage": "rows"}.get(kernel, kernel)  # one kernel, two specializations
        d = 128 if shape == "qwen2.5-7b" else 64
        smem = 101_376 if arch in ("sm86", "sm89") else 232_448
        assert r["options"] == kernels.launch_options_for(kernel, d, smem), (kernel, arch, shape)
    # the decode page loop compiles to mma.sync without spills and keeps four programs per SM on
    # sm80 and sm90 under the Triton here: Triton 3.8+ chose wgmma on sm90 (48-64 bytes spilled) and,
    # with both code halves from one inline-asm op, sent one half through shared memory (52.7 KB per
    # program: three on sm80); docs/results/kernel-static-2026-12-04-triton38/
    for arch in ("sm80", "sm86", "sm89", "sm90"):
        for shape in ("qwen2.5-7b", "smollm2"):
            r = by[("decode", arch, shape)]
            assert r["page_loop"]["wgmma_per_warp"] == 0 and r["spill_bytes"] == 0, (arch, shape, r["spill_bytes"])
            if arch in ("sm80", "sm90"):
                assert r["programs_per_sm"] >= 4, (arch, shape, r["shared_bytes"])
    # the block store spills nothing: it did under Triton 3.8 (40-120 bytes on sm80/sm90) while it
    # saturated every element of its rows; docs/results/kernel-static-2026-12-05-store/
    spilled = [(arch, shape, r["spill_bytes"]) for (kernel, arch, shape), r in by.items()
               if kernel == "store" and r["spill_bytes"]]
    assert not spilled, f"block store spills (arch, shape, bytes): {spilled}"
    # the step's row kernel spills nothing as decode steps launch it (CUDA graphs); as mixed steps
    # launch it (the chunk rows' queries staged for FlashAttention) ptxas keeps 72 registers at
    # head_dim 128 and reloads one 64-bit value from local memory on sm86/sm89 (8 bytes; capped at
    # 96 registers it spills none): more is a change to look at
    spilled = [(kernel, arch, shape, r["spill_bytes"]) for (kernel, arch, shape), r in by.items()
               if kernel in ("rows", "rows-stage") and r["spill_bytes"] > (8 if kernel == "rows-stage" else 0)]
    assert not spilled, f"row kernel spills (kernel, arch, shape, bytes): {spilled}"
    # the stage kernel's window specialization keeps one half's tiles live at a time: loading keys
    # and values first, it spilled 448-1,712 bytes per thread (docs/results/kernel-static-2026-12-05-store/)
    window = {(arch, shape): r["spill_bytes"] for (kernel, arch, shape), r in by.items() if kernel == "stage-window"}
    assert max(window.values()) <= 64, f"stage (window rows) spills, bytes: {window}"
    # the page loop's instructions by source line (--lines) account for the whole loop, and its
    # tensor-core instructions sit on the decode kernel's dot lines
    for arch in ("sm80", "sm90"):
        loop = by[("decode", arch, "qwen2.5-7b")]["page_loop"]
        assert sum(ln["instructions"] for ln in loop["by_line"]) == loop["instructions_per_warp"]
        mma_lines = {ln["source"].split("=")[0].strip() for ln in loop["by_line"]
                     if any(op.startswith(("HMMA", "HGMMA")) for op in ln["top"]) and ln["file"].endswith("decode.py")}
        assert mma_lines and all(s.startswith(("s", "acc_lo", "acc_hi")) for s in mma_lines), mma_lines


@pytest.mark.skipif(not _ptxas().exists(), reason="this Triton has no NVIDIA backend binaries (ptxas)")
def test_fp32_models_rotate_and_decode_in_full_fp32(tmp_path):
    """An fp32 model's row kernel (its 8-bit rows, which the int4 pages are quantized from, and the
    decode queries) and its decode kernel multiply in fp32, not as tf32 on tensor cores: tf32 moved
    the row kernel's codes off the reference's, and in the decode page loop it rounded q * s and
    p * s inside the dots while the biased codes' constants were computed from the unrounded values
    (a decode row 6.6e-2 from the reference on the H200, 2026-12-05; s4kv.kernels.quant.dot_precision;
    Triton's interpreter, which CI runs the kernels under, computes either in fp32). The reduction's
    rotation back keeps tf32, so the check sees tf32 products where there are some. No engine serves
    an fp32 model."""
    rows = _kernel_static(tmp_path, "--kernel", "rows,decode,reduce", "--arch", "80,90", "--shape", "smollm2",
                          "--dtype", "fp32")
    tf32 = {(r["kernel"], r["arch"]): r["tf32_mma"] for r in rows}
    assert tf32[("rows", "sm80")] == tf32[("rows", "sm90")] == 0, tf32
    assert tf32[("decode", "sm80")] == tf32[("decode", "sm90")] == 0, tf32
    assert tf32[("reduce", "sm80")] > 0 and tf32[("reduce", "sm90")] > 0, tf32
    # and each architecture's kernels are built as its GPU launches them: with programmatic dependent
    # launch on sm90+ (s4kv.kernels.decode.programmatic_launch). Built without it, the sm90 reduction
    # showed 96 registers and 5 programs per SM instead of 160 and 3, and an Nsight Compute export
    # from a GPU did not match the build tools/ncu_stalls.py maps it with (2026-12-07)
    programmatic = {(r["kernel"], r["arch"]): r["programmatic"] for r in rows if r["kernel"] != "rows"}
    assert programmatic == {("decode", "sm80"): False, ("reduce", "sm80"): False,
                            ("decode", "sm90"): True, ("reduce", "sm90"): True}, programmatic
