#!/usr/bin/env python3
"""Host time of each kernel launch of an eager int4_kivi layer, on a machine without a GPU.

    python tools/launch_host_time.py [--shape qwen2.5-7b] [--dtype bf16] [--repeat 2000] [--wrappers rows,...]
                                     [--source CHECKOUT ...]

A step that is not decode-only runs attention outside CUDA graphs, and every launch is paid on the
host: 569-684 µs per layer on the H200's host for 12-13 launches (2026-12-04,
docs/results/gpu-h200-2026-12-04-engine-step/), most of it Triton's launch path (argument
binding, specialization, cache key). This times what that path costs in s4kv's wrappers, call by
call, with the kernels compiled for sm90 (Triton's bundled ptxas, tools/kernel_static.py's
compile-only driver) and a launcher that does nothing: the CUDA driver's own launch cost is not in
it. Absolute times are this CPU's; the ratio between two trees in one run is the signal.

Per wrapper (the backend's calls in a mixed step; a launch each, decode_attention two):
  rows           s4kv.kernels.store.quantize_rows with the decode rows' queries
  store          s4kv.kernels.store.store_blocks
  decode         s4kv.kernels.decode.decode_attention (queries rotated by rows: page + reduce)
  stage-window   s4kv.kernels.chunk.stage_pages, window blocks
  stage          the same, page blocks
  append         s4kv.kernels.store.append_window

--source: time another checkout's s4kv next to this one (a subprocess each, alternating, best of
the rounds).
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

from tree_timing import best_of_trees

ROOT = Path(__file__).resolve().parents[1]
WRAPPERS = ("rows", "store", "decode", "stage-window", "stage", "append")


def _timing_driver(cc: int):
    """kernel_static's compile-only driver with a module handle, so that a compiled kernel is
    loaded once (its handle set) and every later launch takes Triton's warm path."""
    sys.path.insert(0, str(ROOT / "tools"))
    from kernel_static import CompileOnlyDriver

    drv = CompileOnlyDriver(cc)
    load = drv.utils.load_binary
    drv.utils.load_binary = lambda name, cubin, shared, device: (1, 1, *load(name, cubin, shared, device)[2:])
    drv.utils.unload_module = lambda module: None
    return drv


def _calls(shape: str, dtype: str) -> dict:
    """The wrappers' calls, as the backend makes them in a mixed step (8 decode rows, 2 chunk rows
    of 256 tokens)."""
    import torch
    from kernel_static import DTYPES, SHAPES, _metadata, _step_rows, decode_batch

    from s4kv import format as fmt
    from s4kv.kernels import chunk, decode, store
    from s4kv.kernels.chunk_plan import PAGE, WINDOW, plan_chunks, to_device

    _, hkv, d = SHAPES[shape]
    dt = DTYPES[dtype]
    q, md, regions = decode_batch(shape, dtype)
    rows = md.num_reqs
    k = torch.zeros(rows, hkv, d, dtype=dt)
    step = _step_rows(rows, hkv, d)
    out = torch.zeros_like(q)
    cmd = _metadata(2, 256, 1000)
    (wave,) = to_device(plan_chunks(cmd.query_start_loc_cpu.numpy(), cmd.seq_lens_cpu.numpy(), 0, None), "cpu")
    kp = torch.zeros(len(wave.jobs), fmt.BLOCK_SIZE, hkv, d, dtype=chunk.STAGE_DTYPE)
    vp = kp.clone()
    crows = _step_rows(2 * 256, hkv, d)
    umd, urows = _metadata(2, fmt.UNIT, fmt.UNIT), _step_rows(2 * fmt.UNIT, hkv, d)
    amd, arows = _metadata(2, 100, fmt.UNIT + 100), _step_rows(2 * 100, hkv, d)
    return {
        "rows": lambda: store.quantize_rows(k, k, decodes=(q, regions, md, d ** -0.5)),
        "store": lambda: store.store_blocks(urows, regions, umd, 1, dt),
        "decode": lambda: decode.decode_attention(q, step, regions, md, rows, d ** -0.5, out, md.decode_splits,
                                                  queries_rotated=True),
        "stage-window": lambda: chunk.stage_pages(wave, crows, regions, cmd, dt, kp, vp, WINDOW),
        "stage": lambda: chunk.stage_pages(wave, crows, regions, cmd, dt, kp, vp, PAGE),
        "append": lambda: store.append_window(arows, regions, amd),
    }


def measure(shape: str, dtype: str, repeat: int, wrappers=WRAPPERS) -> dict:
    """µs per call of each wrapper in this process's s4kv (best of 5 × repeat)."""
    from triton.runtime.driver import driver

    import s4kv

    # first on stderr: tools/tree_timing.py passes it on
    print(f"    s4kv from {Path(s4kv.__file__).parent}", file=sys.stderr, flush=True)
    driver.set_active(_timing_driver(90))
    calls = _calls(shape, dtype)
    res = {}
    for name in wrappers:
        call = calls[name]
        call()  # compiles (sm90) and loads once
        res[name] = min(timeit.repeat(call, number=repeat, repeat=5)) / repeat * 1e6
        print(f"    {name}: {res[name]:.1f} µs", file=sys.stderr, flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-7b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--wrappers", default=",".join(WRAPPERS), help="which wrappers (comma-separated)")
    ap.add_argument("--source", action="append", default=[], help="another checkout to time next to this one")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one tree's timing (tree_timing)
    args = ap.parse_args(argv)
    if args.child:  # this process's s4kv: the first entry of PYTHONPATH
        print(json.dumps(measure(args.shape, args.dtype, args.repeat, args.wrappers.split(","))))
        return 0
    best = best_of_trees(args.source, [sys.executable, __file__, "--child", "--shape", args.shape, "--dtype",
                                       args.dtype, "--repeat", str(args.repeat), "--wrappers", args.wrappers])
    import triton

    print(f"# µs per wrapper call on the host, kernels compiled for sm90, launcher a no-op; {args.shape} {args.dtype}, "
          f"Triton {triton.__version__}")
    cols = list(best)
    print("| wrapper | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for w in [*args.wrappers.split(","), "total"]:
        vals = [sum(best[c].values()) if w == "total" else best[c][w] for c in cols]
        print(f"| {w} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
