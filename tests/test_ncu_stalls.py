"""tools/ncu_stalls.py maps an Nsight Compute source export of the decode kernel to Triton source
lines, and refuses an export of another build. Checked without a GPU: the test compiles the kernel
for sm90 (as the tool does) and writes an export in ncu's CSV format with stall samples planted on
one source line's instructions; the tool must find that line, and must refuse the export once one
instruction in it differs. Runs in a subprocess: the tool replaces Triton's active driver, which
the interpreter tests in this process need (as tests/test_kernel_launch_fit.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r'''
import csv, gzip, sys
sys.path.insert(0, "tools")
import ncu_stalls as ns

out, planted = sys.argv[1], sys.argv[2]
kern = ns.compile_decode("qwen2.5-7b", "bf16", {})
lines, text = ns.line_table(kern.kernel)
lo, hi = ns.page_loop(kern)
target = next(n for n, src in enumerate(open("s4kv/kernels/decode.py"), 1) if planted in src)
reasons = ["stall_long_sb", "stall_wait", "stall_selected"]
hits = 0
def write(path, corrupt=False):
    global hits
    hits = 0
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "_decode_kernel"])
        w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)"] + reasons)
        for i, (off, t) in enumerate(sorted(text.items())):
            on_line = lo <= off <= hi and lines[off] and lines[off][1] == target and lines[off][0].endswith("decode.py")
            hits += on_line
            long_sb, wait = (7, 0) if on_line else (0, 1 if lo <= off <= hi else 0)
            src = ("NOP" if corrupt and i == len(text) // 2 else t)
            w.writerow([hex(0x7f0000000000 + off), "      " + src, long_sb + wait, long_sb, wait, 0])
write(out)
assert hits, "the planted line has no instruction in the page loop"
write(out + ".bad.gz", corrupt=True)
print("TARGET", target, hits)
'''


def _ptxas() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not _ptxas().exists(), reason="this Triton has no NVIDIA backend binaries (ptxas)")
def test_stall_samples_land_on_their_source_line_and_another_build_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    export = str(tmp_path / "export.csv.gz")
    planted = "pv = (pr * vs.to(tl.float32)[:, None]).to(DOT_DTYPE)"
    made = subprocess.run([sys.executable, "-c", _SCRIPT, export, planted], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    target, hits = map(int, made.stdout.split("TARGET")[1].split()[:2])

    run = subprocess.run([sys.executable, "tools/ncu_stalls.py", export, "--top", "3"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout.splitlines()
    by_line = out[out.index(next(ln for ln in out if ln.startswith("by source line"))) + 1]
    assert f"decode.py:{target}" in by_line, run.stdout  # the planted line comes first
    totals = {ln.split()[0]: int(ln.split()[1]) for ln in out[1:] if ln.startswith("  ") and len(ln.split()) == 3}
    assert totals["long_sb"] == 7 * hits, run.stdout  # every planted sample counted, each once

    bad = subprocess.run([sys.executable, "tools/ncu_stalls.py", export + ".bad.gz"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert bad.returncode != 0 and "not this build" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
