#!/usr/bin/env python3
"""Host time of a whole eager mixed layer (s4kv.backend.triton_ops.forward), on a machine without a GPU.

    python tools/layer_host_profile.py [--decodes 8] [--chunk 256] [--context 1000]
                                       [--source CHECKOUT ...] [--cprofile N]

Every kernel is compiled for sm90 and launched through Triton's warm path with a launcher that does
nothing (tools/launch_host_time.py's driver); vLLM's FlashAttention is replaced by a no-op; PyTorch's
own ops run on small CPU tensors. Where tools/launch_host_time.py times each wrapper's launches
alone, this times the layer as the backend runs it in a step with `decodes` decode rows and one
chunk row (its plan made once, as every layer after a step's first finds it), so the glue between
the launches counts too: workspace lookups, launch options, slicing, the chunk waves' loop.
--cprofile N: where this checkout's time goes, the N largest entries by own time. Absolute times
are this CPU's; the ratio between trees in one run is the signal.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import timeit
from pathlib import Path

import torch
from tree_timing import best_of_trees

ROOT = Path(__file__).resolve().parents[1]


def layer_call(decodes: int, chunk: int, context: int):
    """The backend's forward for one layer of the step, as a no-argument callable (compiled and
    planned by its first call)."""
    from launch_host_time import _timing_driver
    from triton.runtime.driver import driver

    driver.set_active(_timing_driver(90))
    from kernel_static import _cache_tensors

    from s4kv import format as fmt
    from s4kv.backend import triton_ops
    from s4kv.kernels import chunk as chunk_mod
    from s4kv.kernels.batch import S4KVMetadata, plan_launch

    chunk_mod.varlen_paged_attention = lambda *a, **k: None  # FlashAttention's host cost is not s4kv's
    hq, hkv, d, dt = 28, 4, 128, torch.bfloat16  # Qwen2.5-7B's attention shape
    lens = [context] * decodes + [context // fmt.UNIT * fmt.UNIT + chunk]
    qlens = [1] * decodes + [chunk]
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    qsl = i32([0, *torch.tensor(qlens).cumsum(0).tolist()])
    n = len(lens)
    width = max(fmt.blocks_held(x, d, 2) for x in lens)
    md = S4KVMetadata(n, int(qsl[-1]), max(qlens), max(lens), qsl, i32(lens),
                      torch.zeros(n, width, dtype=torch.int32), qsl.clone(), i32(lens))
    plan_launch(md, hkv, num_sms=132)
    q = torch.zeros(int(qsl[-1]), hq, d, dtype=dt)
    k = torch.zeros(int(qsl[-1]), hkv, d, dtype=dt)
    out = torch.zeros_like(q)
    regions = _cache_tensors(n, hkv, d, dt)
    call = lambda: triton_ops.forward(q, k, k, regions, md, d ** -0.5, out)
    call()
    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decodes", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=1000)
    ap.add_argument("--source", action="append", default=[], help="another checkout to time next to this one")
    ap.add_argument("--cprofile", type=int, default=0, help="print this checkout's N largest entries by own time")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one tree's timing (tree_timing)
    args = ap.parse_args(argv)
    shape = ["--decodes", str(args.decodes), "--chunk", str(args.chunk), "--context", str(args.context)]
    if args.child:
        import s4kv

        print(f"    s4kv from {Path(s4kv.__file__).parent}", file=sys.stderr, flush=True)
        call = layer_call(args.decodes, args.chunk, args.context)
        us = min(timeit.repeat(call, number=args.repeat, repeat=5)) / args.repeat * 1e6
        print(json.dumps({"layer": us}))
        return 0
    best = best_of_trees(args.source, [sys.executable, __file__, "--child", "--repeat", str(args.repeat), *shape])
    import triton

    print(f"# µs of host time per eager layer ({args.decodes} decode rows of {args.context} tokens and a "
          f"{args.chunk}-token chunk; Qwen2.5-7B shape, bf16; kernels compiled for sm90, launcher and "
          f"FlashAttention no-ops), Triton {triton.__version__}, best of 2 rounds x 5 x {args.repeat}")
    for name, r in best.items():
        print(f"{name}: {r['layer']:.1f}")
    if args.cprofile:
        call = layer_call(args.decodes, args.chunk, args.context)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.repeat):
            call()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.cprofile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
