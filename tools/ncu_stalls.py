#!/usr/bin/env python3
"""Where the decode page loop stalls, per line of Triton source, from an Nsight Compute source export.

    python tools/ncu_stalls.py SOURCE.csv[.gz] [--shape qwen2.5-7b] [--dtype bf16] [--options JSON]
                               [--source CHECKOUT] [--top 25]

SOURCE.csv is what `tools/gpu/run-on-device.sh profile-source` writes on the GPU machine
(`ncu -i REPORT --page source --csv --print-source sass`: one row per SASS instruction of
_decode_kernel, with its warp-stall samples by reason). That export names instructions, not
source lines, and the GPU machine has no Triton source map to hand, so this tool compiles the same
kernel here for sm90 (tools/kernel_static.py's compile-only driver, the device's Triton pinned by
`nox -s kernels-static`), reads the line table of that build (nvdisasm -g), checks that the opcodes
agree instruction by instruction (a differing build is refused, not mapped), and sums the samples
of the page loop (the loop with the most tensor-core instructions) by stall reason and by line.
Run it from the tree that was profiled, or give that tree with --source.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import json
import linecache
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def compile_decode(shape: str, dtype: str, options: dict):
    """The decode kernel compiled for sm90 with this shape and launch options (kernel_static's build)."""
    import kernel_static as ks
    from triton.compiler import compiler as triton_compiler
    from triton.runtime.driver import driver

    driver.set_active(ks.CompileOnlyDriver(90))
    triton_compiler.max_shared_mem.cache_clear()
    return ks.compiled_decode(90, shape, dtype, options)[0]


def line_table(cubin: bytes) -> tuple[dict[int, tuple[str, int]], dict[int, str]]:
    """(offset -> (file, line), offset -> instruction text): kernel_static's reading of nvdisasm's
    line-annotated listing."""
    import kernel_static as ks

    return ks.line_table(cubin)


def page_loop(kern) -> tuple[int, int]:
    """(first, last) offset of the page loop: kernel_static's pick (kernel_static.page_loop), from the
    same build's cuobjdump listing (its offsets are nvdisasm's)."""
    import kernel_static as ks

    loop = ks.page_loop(ks._sass(kern))
    if loop is None:
        raise SystemExit("no loop in the kernel")
    return loop[0], loop[1]


def read_export(path: str) -> tuple[list[str], list[list[str]]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[header], [r for r in rows[header + 1:] if r and r[0].startswith("0x")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export")
    ap.add_argument("--shape", default="qwen2.5-7b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--options", default="{}", help="the profiled launch's options over the defaults (JSON)")
    ap.add_argument("--source", help="import s4kv from this checkout (the tree that was profiled)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if args.source:
        sys.path.insert(0, os.path.abspath(args.source))
    # a fresh cache: Triton keys compiled kernels by source text, not path, so a cached build of the
    # same text from another checkout would carry that checkout's paths in its line table
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ncu-stalls-triton-")
    kern = compile_decode(args.shape, args.dtype, json.loads(args.options))
    from kernel_static import opcode
    lines, text = line_table(kern.kernel)
    lo, hi = page_loop(kern)
    header, rows = read_export(args.export)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    base = int(rows[0][0], 16)
    mismatched = sum(1 for r in rows if int(r[0], 16) - base in text
                     and opcode(text[int(r[0], 16) - base]) != opcode(r[1]))
    if mismatched or len(rows) != len(text):
        raise SystemExit(f"the export is not this build: {len(rows)} instructions there, {len(text)} here, "
                         f"{mismatched} opcodes differ (profile and map the same tree and options)")
    total = collections.Counter()
    by_line: dict = collections.defaultdict(collections.Counter)
    samples = {"kernel": 0, "loop": 0}
    for r in rows:
        off = int(r[0], 16) - base
        n = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        samples["kernel"] += n
        if lo <= off <= hi:
            samples["loop"] += n
            for h in reasons:
                v = int(r[col[h]] or 0)
                total[h] += v
                by_line[lines.get(off)][h] += v
    loop = max(samples["loop"], 1)
    print(f"page loop: {samples['loop']} of the kernel's {samples['kernel']} warp-stall samples "
          f"({hi - lo + 16 >> 4} instructions)")
    for h, v in total.most_common():
        if v:
            print(f"  {h[6:]:<20} {v:6d} {100 * v / loop:5.1f}%")
    print(f"by source line (top {args.top}):")
    for key, c in sorted(by_line.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]:
        n = sum(c.values())
        where = f"{os.path.basename(key[0])}:{key[1]}" if key else "?"
        src = linecache.getline(key[0], key[1]).strip()[:70] if key else ""
        top = ", ".join(f"{h[6:]} {v}" for h, v in c.most_common(3) if v)
        print(f"  {n:5d} {100 * n / loop:5.1f}%  {where:<18} {src}\n{'':32}{top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
